#!/usr/bin/env bash
# GPU check, for a machine with CUDA and a torch that sees it (run from the repo root):
#   bash benchmarks/gpu_check.sh [OUT_DIR]          (default OUT_DIR: benchmarks/results)
# A few minutes of GPU time; needs no network.  Steps (each under its own time limit, logs in
# OUT_DIR; a summary at the end says which step failed; exit status 1 if any did):
#   build   the CUDA kernel in place (rnn_ablations/_C_cuda*.so) with this machine's torch and
#           nvcc, for this GPU's architecture only (the CPU kernel is not built:
#           RNN_ABLATIONS_NO_KERNEL=1), unless it is importable already and its stamp
#           build/cuda_sources.stamp (a hash of csrc/ and setup.py, written after a build)
#           matches the sources: a module built elsewhere for the same Python and torch can be
#           carried in with its stamp to save the build's minute (GPU_CHECK_STAMP_ONLY=1 bash
#           benchmarks/gpu_check.sh writes the stamp of the current sources and exits);
#   tests   tests/test_cuda.py with CUDA graphs on (the default), then the kernel tests again
#           with RNN_ABLATIONS_CUDA_GRAPHS=0 (both without the persistent kernels' tests, which
#           the persistent step runs);
#   persistent  the persistent kernels (off by default): their tests
#           (tests/test_cuda.py -k persistent, graphs off and on inside the tests), then
#           speed_cuda_persistent.{json,md}: ran and lstm at B=32, T=64, H=256/650, float32 and
#           bfloat16, each on the step kernel and as "<variant> [persistent]" (persistent
#           forward, step backward), against cuDNN, graphs on; speed_cuda_persistent_bwd: the
#           same with the persistent backward too (RNN_ABLATIONS_PERSISTENT_BACKWARD=1);
#   speed   speed_cuda.{json,md}: B=32, T=64, H=256/650, one layer, every variant against cuDNN's
#           nn.LSTM in float32, bfloat16 and float16, graphs on (autocast: the autocast step);
#           speed_cuda_nographs.{json,md}: the same in float32 and bfloat16 with graphs off;
#           speed_cuda_experiments.{json,md}: the experiments' shapes, float32 and bfloat16;
#   long_bi speed_cuda_long_bi.{json,md}: the bidirectional T = 200 experiment shapes (BiDAF,
#           DrQA: the step kernel's weakest shapes against cuDNN in float32), ran and lstm,
#           each on the step kernel and on the persistent forward ("[persistent]");
#   autocast speed_cuda_autocast.{json,md}: every variant under torch.autocast(bfloat16 and
#           float16) against cuDNN under the same autocast;
#   core    tests/test_core.py on the GPU machine's Python (the CPU kernel _C, built for another
#           Python, is usually not importable there: the generic path runs and
#           test_kernel_is_built is deselected), last and optional (GPU_CHECK_CORE=0 skips it,
#           GPU_CHECK_CORE_K=EXPR runs only the tests that pytest -k EXPR selects).
# Without a CUDA device the CUDA steps are skipped (said so) and the script still exits 0 when
# what ran passed.  PYTHON picks the interpreter (default python3).
# Time: the steps share GPU_CHECK_BUDGET seconds (default 170): each runs under the smaller of
# its own limit and what is left, and a step that would start with under 15 s left is skipped
# (said so in the summary).  GPU_CHECK_STEPS picks the steps (default: all, in this order:
# build tests persistent speed nographs tests_nographs experiments long_bi autocast core).
set -o pipefail
out=${1:-benchmarks/results}
mkdir -p "$out"
py=${PYTHON:-python3}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
declare -a summary
failed=0
t_start=$(date +%s)
budget=${GPU_CHECK_BUDGET:-170}
steps=" ${GPU_CHECK_STEPS:-build tests persistent speed nographs tests_nographs experiments long_bi autocast core} "
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

{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 || echo "no nvidia-smi"; } \
    | tee "$out/gpu_env.txt"
"$py" - <<'EOF' 2>&1 | tee -a "$out/gpu_env.txt"
import sys, torch
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda,
      "cudnn", torch.backends.cudnn.version() if torch.cuda.is_available() else None)
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("device", p.name, "cc", f"{p.major}.{p.minor}", "SMs", p.multi_processor_count)
else:
    print("device none: torch sees no CUDA device")
EOF
has_cuda=$("$py" -c "import torch; print(int(torch.cuda.is_available()))" 2>/dev/null || echo 0)

# the sources a _C_cuda build comes from: a prebuilt module (carried in) is used only when its
# stamp build/cuda_sources.stamp matches them
src_hash=$( (find rnn_ablations/csrc -type f \( -name '*.cu' -o -name '*.h' -o -name '*.cpp' \) | LC_ALL=C sort
             echo setup.py) | xargs cat 2>/dev/null | sha256sum | cut -c1-16)
if [ "${GPU_CHECK_STAMP_ONLY:-0}" = 1 ]; then
    mkdir -p build && echo "$src_hash" > build/cuda_sources.stamp && echo "stamp $src_hash" && exit 0
fi
if [ "$has_cuda" = 1 ] && want build; then
    if "$py" -c "import rnn_ablations._C_cuda" 2>/dev/null \
            && [ "$(cat build/cuda_sources.stamp 2>/dev/null)" = "$src_hash" ]; then
        note "SKIP  build: rnn_ablations._C_cuda is importable and built from these sources ($src_hash)"
    else
        rm -f rnn_ablations/_C_cuda*.so build/cuda_sources.stamp
        # this GPU's architecture only (a build for every architecture takes several times longer)
        arch=$("$py" -c "import torch; print('%d.%d' % torch.cuda.get_device_capability())")
        TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-$arch} RNN_ABLATIONS_NO_KERNEL=1 MAX_JOBS=8 \
            step "build (sm ${arch})" 240 gpu_build.log "$py" setup.py -q build_ext --inplace
        if "$py" -c "import rnn_ablations._C_cuda" 2>&1 | tee -a "$out/gpu_build.log"; then
            mkdir -p build && echo "$src_hash" > build/cuda_sources.stamp
        else
            note "FAIL  build: rnn_ablations._C_cuda does not import (see $out/gpu_build.log)"
            failed=1
        fi
    fi
elif [ "$has_cuda" != 1 ]; then
    note "SKIP  build, CUDA tests with graphs off, speed: no CUDA device"
fi

xdist=()
if "$py" -c "import xdist" 2>/dev/null && [ "$has_cuda" = 1 ]; then xdist=(-n 4); fi
want tests && step "tests/test_cuda.py, CUDA graphs on" 90 gpu_tests.log \
    "$py" -m pytest -q -p no:cacheprovider "${xdist[@]}" -rs tests/test_cuda.py -k "not persistent"
if [ "$has_cuda" = 1 ] && want persistent; then
    step "persistent kernel tests" 150 gpu_persistent_tests.log \
        "$py" -m pytest -q -p no:cacheprovider "${xdist[@]}" -rs tests/test_cuda.py -k persistent
    step "speed, persistent kernel beside the step kernel" 60 gpu_speed_persistent.log \
        "$py" benchmarks/speed.py --device cuda --repeats 7 --cuda-graphs on \
        --cuda-recurrence both --name speed_cuda_persistent --dtype float32 bfloat16 \
        --variants ran lstm --out "$out"
    RNN_ABLATIONS_PERSISTENT_BACKWARD=1 \
        step "speed, persistent forward and backward" 60 gpu_speed_persistent_bwd.log \
        "$py" benchmarks/speed.py --device cuda --repeats 7 --cuda-graphs on \
        --cuda-recurrence both --name speed_cuda_persistent_bwd --dtype float32 bfloat16 \
        --variants ran lstm --out "$out"
fi
if [ "$has_cuda" = 1 ]; then
    want speed && step "speed, standard shapes, graphs on" 60 gpu_speed.log \
        "$py" benchmarks/speed.py --device cuda --repeats 7 --cuda-graphs on --name speed_cuda \
        --dtype float32 bfloat16 float16 --out "$out"
    want nographs && step "speed, standard shapes, graphs off" 40 gpu_speed_nographs.log \
        "$py" benchmarks/speed.py --device cuda --repeats 7 --cuda-graphs off \
        --name speed_cuda_nographs --dtype float32 bfloat16 --variants ran lstm --out "$out"
    want tests_nographs && RNN_ABLATIONS_CUDA_GRAPHS=0 \
        step "tests/test_cuda.py kernel tests, CUDA graphs off" 60 gpu_tests_nographs.log \
        "$py" -m pytest -q -p no:cacheprovider "${xdist[@]}" tests/test_cuda.py \
        -k "(kernel or half or autocast or gradcheck or caller) and not persistent"
    want experiments && step "speed, experiments' shapes" 90 gpu_speed_experiments.log \
        "$py" benchmarks/speed.py --device cuda --repeats 5 --cuda-graphs on --shapes experiments \
        --name speed_cuda_experiments --dtype float32 bfloat16 --variants ran lstm_minus_srnn lstm \
        --out "$out"
    want long_bi && step "speed, bidirectional T = 200 shapes, step and persistent kernels" 60 \
        gpu_speed_long_bi.log \
        "$py" benchmarks/speed.py --device cuda --repeats 5 --cuda-graphs on --shapes experiments \
        --shape-names "BiDAF phrase" "BiDAF modeling" DrQA --cuda-recurrence both \
        --name speed_cuda_long_bi --dtype float32 --variants ran lstm --out "$out"
    want autocast && step "speed, autocast (bfloat16, float16), graphs on" 60 gpu_speed_autocast.log \
        "$py" benchmarks/speed.py --device cuda --repeats 7 --cuda-graphs on \
        --name speed_cuda_autocast --dtype autocast-bfloat16 autocast-float16 --out "$out"
fi
if want core && [ "${GPU_CHECK_CORE:-1}" = 1 ]; then
    deselect=()
    if ! "$py" -c "import rnn_ablations._C" 2>/dev/null; then
        deselect=(--deselect tests/test_core.py::test_kernel_is_built)
        echo "the CPU kernel rnn_ablations._C is not importable here: generic path, test_kernel_is_built deselected"
    fi
    core_k=()
    if [ -n "${GPU_CHECK_CORE_K:-}" ]; then core_k=(-k "$GPU_CHECK_CORE_K"); fi
    step "tests/test_core.py (optional)" 120 gpu_core_tests.log \
        "$py" -m pytest -q -p no:cacheprovider "${xdist[@]}" tests/test_core.py "${deselect[@]}" \
        "${core_k[@]}"
fi

echo
echo "================ gpu_check summary ($(( $(date +%s) - t_start )) s) ================"
printf '%s\n' "${summary[@]}" | tee "$out/gpu_check_summary.txt"
for f in gpu_tests.log gpu_persistent_tests.log gpu_tests_nographs.log; do
    [ -f "$out/$f" ] && grep -E "^(FAILED|ERROR)|[0-9]+ (passed|failed)" "$out/$f" | tail -15 \
        | sed "s|^|$f: |" | tee -a "$out/gpu_check_summary.txt"
done
exit $failed
