"""The CUDA kernels executed on the CPU (README.md)."""
