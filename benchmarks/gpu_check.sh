#!/usr/bin/env bash
# GPU check, for a machine with an NVIDIA GPU and a CUDA torch (run from the repo root):
#   bash benchmarks/gpu_check.sh [OUT_DIR]          (default OUT_DIR: benchmarks/results)
# Fits a lent GPU from a bare machine: nothing CUDA is built (the CUDA kernels are compiled at
# first use by NVRTC, which the CUDA torch brings); needs no network.  Steps, in this order,
# each under its own time limit, logs in OUT_DIR, a summary at the end (exit 1 if any failed):
#   gate        FIRST, before anything costs time: exits 1 at once, saying why, when this
#               machine cannot run the package's CUDA kernels (no CUDA in torch, no visible
#               GPU, no NVRTC, no driver, RNN_ABLATIONS_NO_KERNEL=1 set);
#   install     pip install -e . with nothing built (RNN_ABLATIONS_NO_KERNEL=1 at install time,
#               --no-build-isolation --no-deps: no network), unless the package is installed;
#   cpu_kernel  the CPU kernel's first-use build (the operators' schemas are defined with it),
#               in the background under a limit (CPU_KERNEL_LIMIT s, default 150) while the
#               GPU steps run without it (RNN_ABLATIONS_NO_CPU_KERNEL=1: nothing waits for it);
#               the tests step waits for it at most until that limit, and runs without it
#               (said so: the operator tests then fail) when it is not there;
#   precompile  python -m rnn_ablations.kernels.cuda.precompile: every CUDA instantiation for
#               this GPU, timed (the table: OUT_DIR/gpu_precompile.log), into the disk cache the
#               tests then read;
#   in_use      benchmarks/gpu_in_use.py: the package's CUDA kernels are the ones running:
#               layers forward + backward on the GPU through each kernel family (step, scan,
#               persistent), each family's first-use check passed, and the eager step loop's
#               microseconds per step (with its driver launches per step); stops the check
#               (exit 1) otherwise, so that no speed table times another path;
#   tests       tests/kernels/test_cuda*.py and test_ops_cuda.py (every test of the NVRTC kernels, graphs, persistent
#               kernels, bfloat16 / float16);
#   speed       speed_cuda_<gpu>.{json,md}: B=32, T=64, H=256/650, one layer, ran / lstm /
#               lstm_minus_srnn_minus_hidden in float32 and bfloat16, graphs on, against cuDNN's
#               nn.LSTM eager AND replayed from a CUDA graph in the same rounds
#               (ratio_vs_nn_lstm, ratio_vs_nn_lstm_graphed; the JSON's machine.cuda_kernel says
#               the CUDA kernels were in use);
#   eager       speed_cuda_<gpu>_eager.{json,md}: the same with graphs off (the eager step loop,
#               which training on variable-length batches runs);
#   experiments speed_cuda_<gpu>_experiments.{json,md}: the experiments' shapes, float32.
# The steps share GPU_CHECK_BUDGET seconds (default 240): each runs under the smaller of its own
# limit and what is left; a step that would start with under 15 s left is skipped (said so).
# GPU_CHECK_STEPS picks the steps (default: all but experiments; `build` is read as
# `precompile`).  PYTHON picks the interpreter (default python3).
# DEVICE=cpu: a dry run on a machine without a GPU: no gate, no install; precompile for
# GPU_CHECK_ARCH (default sm_90), in_use on the CUDA emulation (tests/cuda_emulation: the device
# code compiled by g++ and run on the CPU), tests/kernels/test_cuda*.py (their CPU tests), a CPU speed table
# of one shape; it exercises the script, not the GPU.
set -o pipefail
out=${1:-benchmarks/results}
mkdir -p "$out"
py=${PYTHON:-python3}
device=${DEVICE:-cuda}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
# the GPU steps do not load (or wait for) the CPU kernel; the cpu_kernel step builds it apart
export RNN_ABLATIONS_NO_CPU_KERNEL=${RNN_ABLATIONS_NO_CPU_KERNEL:-1}
cpu_kernel_limit=${CPU_KERNEL_LIMIT:-150}
declare -a summary
failed=0
t_start=$(date +%s)
budget=${GPU_CHECK_BUDGET:-240}
steps=" ${GPU_CHECK_STEPS:-gate install cpu_kernel precompile in_use tests speed eager} "
steps=${steps/ build / precompile }
want() { [[ "$steps" == *" $1 "* ]]; }
note() { summary+=("$1"); echo "== $1"; }
step() {  # step NAME LIMIT_S LOG CMD...: run CMD under a time limit, log it, record the result
    local name=$1 limit=$2 log=$3
    shift 3
    local t0 rc left
    t0=$(date +%s)
    left=$(( budget - (t0 - t_start) ))
    if [ "$left" -lt 15 ]; then
        note "SKIP  $name: the time budget (GPU_CHECK_BUDGET=${budget} s) is spent"
        return 0
    fi
    [ "$left" -lt "$limit" ] && limit=$left
    timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$out/$log"
    rc=$?
    local took=$(( $(date +%s) - t0 ))
    if [ $rc -eq 0 ]; then
        note "PASS  $name (${took} s, $out/$log)"
    elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
        note "FAIL  $name: TIMED OUT after ${limit} s ($out/$log)"; failed=1
    else
        note "FAIL  $name: exit $rc (${took} s, $out/$log)"; failed=1
    fi
    return $rc
}
finish() {
    echo
    echo "================ gpu_check summary ($(( $(date +%s) - t_start )) s) ================"
    printf '%s\n' "${summary[@]}" | tee "$out/gpu_check_summary.txt"
    [ -f "$out/gpu_tests.log" ] && grep -E "^(FAILED|ERROR)|[0-9]+ (passed|failed)" \
        "$out/gpu_tests.log" | tail -15 | sed "s|^|gpu_tests.log: |" | tee -a "$out/gpu_check_summary.txt"
    exit "$1"
}

# gate: the first thing run.  It imports only the CUDA loader's checks (RNN_ABLATIONS_NO_KERNEL=1
# keeps the package import from building the CPU kernel; the switch's own value is read first).
if [ "$device" = cuda ] && want gate; then
    switch=${RNN_ABLATIONS_NO_KERNEL:-${RNN_ABLATIONS_DISABLE_KERNEL:-}}
    if ! why=$(RNN_ABLATIONS_NO_KERNEL=1 RNN_ABLATIONS_DISABLE_KERNEL=1 RNN_ABLATIONS_SWITCH="$switch" \
            "$py" - <<'EOF' 2>&1
import os, sys
if os.environ["RNN_ABLATIONS_SWITCH"].strip() == "1":
    sys.exit("RNN_ABLATIONS_NO_KERNEL=1 is set: the CUDA kernels would not run; unset it")
from rnn_ablations.kernels.cuda import unavailable_reason
why = unavailable_reason(respect_switch=False)
if why:
    sys.exit(why)
import torch
print(torch.cuda.get_device_name(0), "cc %d.%d" % torch.cuda.get_device_capability(0),
      "torch", torch.__version__, "CUDA", torch.version.cuda)
EOF
    ); then
        echo "$why" | tee "$out/gpu_gate.log"
        note "FAIL  gate: the package's CUDA kernels cannot run here: $why"
        finish 1
    fi
    echo "$why" | tee "$out/gpu_gate.log"
    note "PASS  gate: $why"
fi

{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 || echo "no nvidia-smi"; } \
    > "$out/gpu_env.txt"

if [ "$device" = cuda ] && want install; then
    if "$py" -c "import importlib.metadata as m; m.version('rnn-ablations')" >/dev/null 2>&1; then
        note "SKIP  install: rnn-ablations is installed"
    else
        RNN_ABLATIONS_NO_KERNEL=1 step "install (pip install -e ., nothing built)" 60 gpu_install.log \
            "$py" -m pip install -q --no-build-isolation --no-deps -e .
    fi
fi

cpu_pid=
if want cpu_kernel; then
    # the CPU kernel's first use builds it (minutes on 2 cores, less on a GPU host) while the GPU
    # steps run without it; bounded, so that nothing waits for it longer than the limit
    ( t0=$(date +%s)
      RNN_ABLATIONS_NO_CPU_KERNEL=0 timeout --kill-after=10 "$cpu_kernel_limit" "$py" -c "
import sys
from rnn_ablations.kernels import registry as b
print('CPU kernel:', b._KERNEL_SOURCE or b._KERNEL_ERROR)
sys.exit(0 if b._C is not None else 1)" > "$out/gpu_cpu_kernel.log" 2>&1
      echo "rc $? after $(( $(date +%s) - t0 )) s (limit ${cpu_kernel_limit} s)" >> "$out/gpu_cpu_kernel.log" ) &
    cpu_pid=$!
fi

if want precompile; then
    arch_args=()
    [ "$device" = cpu ] && arch_args=(--arch "${GPU_CHECK_ARCH:-sm_90}")
    RNN_ABLATIONS_NO_KERNEL=1 step "precompile (every CUDA instantiation, timed)" 120 gpu_precompile.log \
        "$py" -m rnn_ablations.kernels.cuda.precompile "${arch_args[@]}" --jobs "$(nproc)"
fi

if want in_use; then
    in_use_device=cuda
    [ "$device" = cpu ] && in_use_device=emulation
    if ! step "in_use: the package's CUDA kernels run a layer, each family" 90 gpu_in_use.log \
            "$py" benchmarks/gpu_in_use.py --device "$in_use_device"; then
        note "FAIL  in_use: stopping here (the speed tables would not time the package's kernels)"
        finish 1
    fi
    while IFS= read -r line; do
        note "INFO  in_use: $line"
    done < <(grep -E "^(family|check|eager step loop)" "$out/gpu_in_use.log")
fi

xdist=()
if "$py" -c "import xdist" 2>/dev/null && [ "$device" = cuda ]; then xdist=(-n 4); fi
if [ -n "$cpu_pid" ] && want tests; then
    wait "$cpu_pid"   # bounded: the build runs under cpu_kernel_limit
    note "INFO  cpu_kernel: $(tr '\n' ' ' < "$out/gpu_cpu_kernel.log")"
    if grep -q "^rc 0 " "$out/gpu_cpu_kernel.log"; then
        export RNN_ABLATIONS_NO_CPU_KERNEL=0
    else
        note "INFO  tests: without the CPU kernel (not built within ${cpu_kernel_limit} s): the operator tests fail"
    fi
fi
want tests && step "tests/kernels/test_cuda*.py" 120 gpu_tests.log \
    "$py" -m pytest -q -p no:cacheprovider "${xdist[@]}" -rs tests/kernels/test_cuda.py tests/kernels/test_cuda_conversions.py tests/kernels/test_cuda_half.py tests/kernels/test_cuda_graphs.py tests/kernels/test_cuda_recurrence.py tests/kernels/test_ops_cuda.py

# the GPU's model for the result names: "NVIDIA H100 80GB HBM3" -> h100, "NVIDIA H200" -> h200
gpu=$("$py" -c "
import re, torch
name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'cpu'
words = [w for w in re.split(r'[\s_-]+', name.replace('NVIDIA', '')) if re.search(r'\d', w)]
print((words[0] if words else name.split()[-1]).lower())" 2>/dev/null || echo cpu)
if [ "$device" = cuda ]; then
    want speed && step "speed, graphs on, eager and graphed cuDNN" 60 gpu_speed.log \
        "$py" benchmarks/speed.py --device cuda --repeats 7 --cuda-graphs on \
        --name "speed_cuda_${gpu}" --dtype float32 bfloat16 \
        --variants ran lstm lstm_minus_srnn_minus_hidden --out "$out"
    want eager && step "speed, graphs off (the eager step loop)" 60 gpu_speed_eager.log \
        "$py" benchmarks/speed.py --device cuda --repeats 5 --cuda-graphs off \
        --name "speed_cuda_${gpu}_eager" --dtype float32 bfloat16 --variants ran lstm --out "$out"
    want experiments && step "speed, experiments' shapes" 90 gpu_speed_experiments.log \
        "$py" benchmarks/speed.py --device cuda --repeats 5 --cuda-graphs on --shapes experiments \
        --name "speed_cuda_${gpu}_experiments" --dtype float32 --variants ran lstm --out "$out"
else
    want speed && step "speed (dry run on the CPU: one shape)" 60 gpu_speed.log \
        "$py" benchmarks/speed.py --device cpu --repeats 1 --warmup 0 --hidden 32 --batch 4 \
        --seq-len 8 --name speed_dry_run_cpu --variants ran --out "$out"
fi

finish $failed
