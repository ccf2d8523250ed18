# The start of every GPU call (sourced by gpu_reproduce.sh, gpu_nmt.sh, gpu_machine_check.sh and
# gpu_loan.sh; run from the repo root): the machine and the kernels, each step timed in the log.
#
#   source benchmarks/gpu_setup.sh
#   gpu_setup_kernels LOG_DIR [DEVICE]     (DEVICE: cuda, the default, or cpu for a check)
#
# 1. The CPU kernel is not needed by a call that trains on the GPU.  When RNN_ABLATIONS_NO_KERNEL=1
#    leaves the CUDA kernels on, the call sets it (nothing is compiled for the CPU); when it would
#    turn them off too, the CPU kernel is compiled on first use into RNN_ABLATIONS_CACHE (default
#    runs/kernel_cache, an ignored folder that stays on a warm machine: a second call loads it).
#    CPU_KERNEL=build skips the probe and keeps the CPU kernel; CPU_KERNEL=off sets
#    RNN_ABLATIONS_NO_KERNEL=1 whatever it does.
# 2. No nvcc build: the CUDA kernels are compiled at run time by NVRTC.  When the checkout has
#    `python -m rnn_ablations.kernels.cuda.precompile`, it is run here (PRECOMPILE_ARGS, limit
#    PRECOMPILE_TIMEOUT seconds, default 240) so that the runs find every instantiation in the
#    cache; its output goes to LOG_DIR/precompile.log.  Without it the call says so and goes on.
# 3. One import of the package, timed, which says whether the package's CUDA kernels are in use
#    (GPU_SETUP_CUDA_KERNELS=1 or 0 afterwards) and why not.  REQUIRE_CUDA_KERNELS=1 makes a
#    missing kernel an error (exit status 3 of gpu_setup_kernels).
#
# Each step prints "[setup +Ns] ..." lines; GPU_SETUP_SECONDS holds the seconds of the whole set-up.

gpu_setup_say() { echo "[setup +$(( $(date +%s) - ${gpu_setup_t0:-$(date +%s)} ))s] $*"; }

gpu_setup_kernels() {
    local logdir=${1:?gpu_setup_kernels LOG_DIR [DEVICE]} device=${2:-cuda}
    local py=${PYTHON:-python3} t rc
    gpu_setup_t0=$(date +%s)
    mkdir -p "$logdir"
    export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
    export RNN_ABLATIONS_CACHE=${RNN_ABLATIONS_CACHE:-$PWD/runs/kernel_cache}
    mkdir -p "$RNN_ABLATIONS_CACHE"
    GPU_SETUP_CUDA_KERNELS=0

    # ---- 1. the CPU kernel
    case "${CPU_KERNEL:-auto}" in
        off) export RNN_ABLATIONS_NO_KERNEL=1
             gpu_setup_say "CPU kernel: off (CPU_KERNEL=off: RNN_ABLATIONS_NO_KERNEL=1)" ;;
        build) gpu_setup_say "CPU kernel: kept (CPU_KERNEL=build; compiled on first use into $RNN_ABLATIONS_CACHE unless built)" ;;
        auto)
            if [ "$device" = cpu ]; then
                gpu_setup_say "CPU kernel: kept (device cpu)"
            elif [ -f "rnn_ablations/_C$("$py" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')" ]; then
                gpu_setup_say "CPU kernel: built in the package for this Python (nothing to compile)"
            elif [ "$(RNN_ABLATIONS_NO_KERNEL=1 timeout 120 "$py" -c \
                    'import rnn_ablations as ra; print(int(bool(ra.cuda_kernel_available())))' \
                    2>/dev/null | tail -n 1)" = 1 ]; then
                export RNN_ABLATIONS_NO_KERNEL=1
                gpu_setup_say "CPU kernel: not compiled (RNN_ABLATIONS_NO_KERNEL=1 keeps the CUDA kernels on; no CPU run needs it)"
            else
                gpu_setup_say "CPU kernel: RNN_ABLATIONS_NO_KERNEL=1 would turn the CUDA kernels off too, so the CPU kernel is compiled on first use (cache $RNN_ABLATIONS_CACHE; timed in the import below)"
            fi ;;
        *) gpu_setup_say "ERROR: CPU_KERNEL must be auto, build or off, got ${CPU_KERNEL}"; return 2 ;;
    esac

    # ---- 2. the CUDA kernels, compiled at run time (no nvcc build)
    if [ "$device" = cpu ]; then
        gpu_setup_say "CUDA kernels: not precompiled (device cpu)"
    elif [ -f rnn_ablations/kernels/cuda/precompile.py ]; then
        t=$(date +%s)
        # shellcheck disable=SC2086
        timeout --kill-after=10 "${PRECOMPILE_TIMEOUT:-240}" "$py" -m rnn_ablations.kernels.cuda.precompile \
            ${PRECOMPILE_ARGS:-} > "$logdir/precompile.log" 2>&1
        rc=$?
        tail -n 40 "$logdir/precompile.log"
        gpu_setup_say "CUDA kernels: python -m rnn_ablations.kernels.cuda.precompile ${PRECOMPILE_ARGS:-}exit $rc in $(( $(date +%s) - t )) s ($logdir/precompile.log)"
    else
        gpu_setup_say "CUDA kernels: this checkout has no python -m rnn_ablations.kernels.cuda.precompile (the run-time compile with NVRTC is not in it yet): nothing precompiled, no nvcc build; the package runs the CUDA kernels it can load, else its generic path"
    fi

    # ---- 3. one import, timed: are the package's CUDA kernels in use?
    t=$(date +%s)
    local report
    report=$("$py" - "$device" <<'EOF' 2>&1
import sys, time
t0 = time.perf_counter()
import torch
import rnn_ablations as ra
from rnn_ablations import backend
took = time.perf_counter() - t0
device = sys.argv[1]
print(f"import rnn_ablations: {took:.1f} s; torch {torch.__version__}, CUDA {torch.version.cuda}, "
      f"CPU kernel {'loaded' if ra.kernel_available() else 'not loaded'}")
if device == "cpu":
    print("CUDA_KERNELS 0 device cpu")
elif not torch.cuda.is_available():
    print("CUDA_KERNELS 0 torch sees no CUDA device")
elif ra.cuda_kernel_available():
    print("CUDA_KERNELS 1")
else:
    why = getattr(backend, "_CUDA_KERNEL_ERROR", None) or "(the package gives no reason)"
    print(f"CUDA_KERNELS 0 {why}")
EOF
)
    rc=$?
    echo "$report" | grep -v '^CUDA_KERNELS'
    local line
    line=$(echo "$report" | grep '^CUDA_KERNELS' | tail -n 1)
    if [ $rc -ne 0 ] || [ -z "$line" ]; then
        gpu_setup_say "ERROR: import rnn_ablations failed (exit $rc)"
        GPU_SETUP_SECONDS=$(( $(date +%s) - gpu_setup_t0 ))
        return 3
    fi
    if [ "${line#CUDA_KERNELS }" = 1 ]; then
        GPU_SETUP_CUDA_KERNELS=1
        gpu_setup_say "the package's CUDA kernels are in use (import $(( $(date +%s) - t )) s)"
    else
        gpu_setup_say "WARNING: the package's CUDA kernels are NOT in use: ${line#CUDA_KERNELS 0 } (import $(( $(date +%s) - t )) s)"
    fi
    GPU_SETUP_SECONDS=$(( $(date +%s) - gpu_setup_t0 ))
    gpu_setup_say "set-up done in ${GPU_SETUP_SECONDS} s"
    if [ "$device" != cpu ] && [ "$GPU_SETUP_CUDA_KERNELS" != 1 ] && [ "${REQUIRE_CUDA_KERNELS:-0}" = 1 ]; then
        gpu_setup_say "ERROR: REQUIRE_CUDA_KERNELS=1 and the package's CUDA kernels are not in use"
        return 3
    fi
    return 0
}
