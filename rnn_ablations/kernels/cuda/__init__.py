"""The CUDA kernels, compiled at first use with NVRTC from the device sources in
``rnn_ablations/csrc``."""
