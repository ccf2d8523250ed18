#!/usr/bin/env bash
# GPU check, for a machine with CUDA and a torch that sees it (run from the repo root):
#   bash benchmarks/gpu_check.sh [OUT_DIR]
# 0. builds the CUDA kernel in place (rnn_ablations/_C_cuda*.so) with this machine's torch and
#    nvcc, unless it is importable already (the CPU kernel is not rebuilt: RNN_ABLATIONS_NO_KERNEL);
# 1. the CUDA tests (generic path on the GPU against the CPU, cuDNN's nn.LSTM, nn.RNN,
#    gradcheck, weighted sum) and the core numerics tests, on the generic path;
# 2. the speed table on CUDA (every variant's generic path against cuDNN's nn.LSTM).
# Without the compiled CPU kernel (e.g. another Python than the one it was built for) the
# package runs its generic path; test_kernel_is_built is then deselected.
set -o pipefail
out=${1:-benchmarks/results}
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | tee "$out/gpu_env.txt"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" | tee -a "$out/gpu_env.txt"
if ! python3 -c "import rnn_ablations._C_cuda" 2>/dev/null; then
    start=$(date +%s)
    RNN_ABLATIONS_NO_KERNEL=1 python3 setup.py -q build_ext --inplace 2>&1 | tail -40 | tee "$out/gpu_build.log"
    echo "CUDA kernel build: $(( $(date +%s) - start )) s" | tee -a "$out/gpu_build.log"
fi
python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py tests/test_core.py \
    --deselect tests/test_core.py::test_kernel_is_built 2>&1 | tee "$out/gpu_tests.log"
status=$?
python3 benchmarks/speed.py --device cuda --repeats 7 --out "$out" 2>&1 | tee "$out/gpu_speed.log"
exit $status
