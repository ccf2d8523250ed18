# The start of every GPU call (sourced by gpu_reproduce.sh, gpu_nmt.sh, gpu_machine_check.sh and
# gpu_loan.sh; run from the repo root): the machine and the kernels, each step timed in the log.
#
#   source benchmarks/gpu_setup.sh
#   gpu_setup_kernels LOG_DIR [DEVICE]     (DEVICE: cuda, the default, or cpu for a check)
#
# 1. The CPU kernel is not needed by a call that trains on the GPU.  When
#    RNN_ABLATIONS_NO_CPU_KERNEL=1 (the CPU kernel alone off) leaves the CUDA kernels running (a
#    small layer run with it on the GPU, as in 3.), the call sets it (nothing is compiled for the
#    CPU); else the package loads its CPU kernel, or compiles it on first use into its cache
#    (RNN_ABLATIONS_CACHE, default ~/.cache/rnn_ablations, which stays on a warm machine: a second
#    call loads it).
#    CPU_KERNEL=build skips the probe and keeps the CPU kernel; CPU_KERNEL=off sets
#    RNN_ABLATIONS_NO_CPU_KERNEL=1 whatever it does.
# 2. No nvcc build: the CUDA kernels are compiled at run time by NVRTC.  When the checkout has
#    `python -m rnn_ablations.kernels.cuda.precompile`, it is run here (PRECOMPILE_ARGS, default
#    "--jobs <CPUs>" where the entry point takes --jobs; limit PRECOMPILE_TIMEOUT seconds, default
#    240) so that the runs find every instantiation in the cache; its output goes to
#    LOG_DIR/precompile.log.  Without it the call says so and goes on.
# 3. One import of the package, timed, and one small layer run forward and backward on the GPU:
#    the package's CUDA kernels are in use when it ran the package's own operators, or (without
#    the CPU kernel, which defines the operators) launched its NVRTC programs
#    (GPU_SETUP_CUDA_KERNELS=1 or 0 afterwards; why not, in the log).  REQUIRE_CUDA_KERNELS=1
#    makes a missing kernel an error (exit status 3 of gpu_setup_kernels).
#
# Each step prints "[setup +Ns] ..." lines; GPU_SETUP_SECONDS holds the seconds of the whole set-up.

gpu_setup_say() { echo "[setup +$(( $(date +%s) - ${gpu_setup_t0:-$(date +%s)} ))s] $*"; }

# gpu_setup_probe DEVICE: import the package (timed) and run one small layer forward and backward on
# DEVICE; the last line says "CUDA_KERNELS 1" when it ran operators of the package's own (its
# kernels) on a CUDA device, else "CUDA_KERNELS 0 <why>".
gpu_setup_probe() {
    "${PYTHON:-python3}" - "$1" <<'EOF'
import sys, time
t0 = time.perf_counter()
import torch
from torch.utils._python_dispatch import TorchDispatchMode
import rnn_ablations as ra
took = time.perf_counter() - t0
device = sys.argv[1]
print(f"import rnn_ablations: {took:.1f} s; torch {torch.__version__}, CUDA {torch.version.cuda}, "
      f"CPU kernel {'loaded' if ra.kernel_available() else 'not loaded'}")


class Ops(TorchDispatchMode):
    seen = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if getattr(func, "namespace", None) == "rnn_ablations":
            self.seen.add(func.__name__.split(".")[0])
        return func(*args, **(kwargs or {}))


if device == "cpu":
    print("CUDA_KERNELS 0 device cpu")
elif not torch.cuda.is_available():
    print("CUDA_KERNELS 0 torch sees no CUDA device")
else:
    t1 = time.perf_counter()
    layer = ra.AblatedRNN("ran", 16, 16).cuda()
    x = torch.randn(5, 3, 16, device="cuda", requires_grad=True)
    with Ops():
        out, _ = layer(x)
        out.sum().backward()
    torch.cuda.synchronize()
    print(f"a small ran layer, forward and backward on the GPU: {time.perf_counter() - t1:.1f} s; "
          f"the package's operators it ran: {sorted(Ops.seen) or 'none'}")
    from rnn_ablations.kernels.cuda import driver
    programs = sorted(p.name for _, p in getattr(driver, "_kernels", {}))
    print(f"NVRTC programs loaded: {programs or 'none'}")
    try:  # the first-use check of the CUDA kernels: a failed family ran the generic path
        from rnn_ablations.kernels.cuda import selfcheck
        failed = {k: v for k, v in selfcheck.status().items() if v is not None}
    except ImportError:
        failed = {}
    if failed:
        print(f"CUDA_KERNELS 0 the CUDA kernels failed their first-use check: {failed}")
    elif Ops.seen or programs:
        print("CUDA_KERNELS 1")
    else:
        from rnn_ablations.kernels import registry
        why = getattr(backend, "_CUDA_KERNEL_ERROR", None) or "no reason given by the package"
        print(f"CUDA_KERNELS 0 the layer ran the generic PyTorch path ({why})")
EOF
}

gpu_setup_kernels() {
    local logdir=${1:?gpu_setup_kernels LOG_DIR [DEVICE]} device=${2:-cuda}
    local py=${PYTHON:-python3} t rc
    gpu_setup_t0=$(date +%s)
    mkdir -p "$logdir"
    export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
    GPU_SETUP_CUDA_KERNELS=0

    # ---- 1. the CPU kernel
    case "${CPU_KERNEL:-auto}" in
        off) export RNN_ABLATIONS_NO_CPU_KERNEL=1
             gpu_setup_say "CPU kernel: off (CPU_KERNEL=off: RNN_ABLATIONS_NO_CPU_KERNEL=1)" ;;
        build) gpu_setup_say "CPU kernel: kept (CPU_KERNEL=build: loaded, or compiled on first use into the package's cache)" ;;
        auto)
            if [ "$device" = cpu ]; then
                gpu_setup_say "CPU kernel: kept (device cpu)"
            elif [ "$(RNN_ABLATIONS_NO_CPU_KERNEL=1 PYTHON=$py timeout 180 bash -c \
                    'source benchmarks/gpu_setup.sh && gpu_setup_probe cuda' 2>/dev/null \
                    | grep '^CUDA_KERNELS' | tail -n 1)" = "CUDA_KERNELS 1" ]; then
                export RNN_ABLATIONS_NO_CPU_KERNEL=1
                gpu_setup_say "CPU kernel: not compiled (RNN_ABLATIONS_NO_CPU_KERNEL=1 keeps the CUDA kernels on; no CPU run needs it)"
            else
                gpu_setup_say "CPU kernel: without it the CUDA kernels did not run a layer, so the CPU kernel is loaded, or compiled on first use into the package's cache (RNN_ABLATIONS_CACHE; timed in the import below)"
            fi ;;
        *) gpu_setup_say "ERROR: CPU_KERNEL must be auto, build or off, got ${CPU_KERNEL}"; return 2 ;;
    esac

    # ---- 2. the CUDA kernels, compiled at run time (no nvcc build)
    if [ "$device" = cpu ]; then
        gpu_setup_say "CUDA kernels: not precompiled (device cpu)"
    elif [ -f rnn_ablations/kernels/cuda/precompile.py ]; then
        t=$(date +%s)
        local pargs=${PRECOMPILE_ARGS-}
        # the instantiations compiled side by side, one per CPU, where the entry point can
        if [ -z "${PRECOMPILE_ARGS+x}" ] && grep -q -- "--jobs" rnn_ablations/kernels/cuda/precompile.py; then
            pargs="--jobs $(nproc)"
        fi
        # shellcheck disable=SC2086
        timeout --kill-after=10 "${PRECOMPILE_TIMEOUT:-240}" "$py" -m rnn_ablations.kernels.cuda.precompile \
            $pargs > "$logdir/precompile.log" 2>&1
        rc=$?
        tail -n 12 "$logdir/precompile.log"
        gpu_setup_say "CUDA kernels: python -m rnn_ablations.kernels.cuda.precompile $pargs: exit $rc in $(( $(date +%s) - t )) s ($logdir/precompile.log)"
    else
        gpu_setup_say "CUDA kernels: this checkout has no python -m rnn_ablations.kernels.cuda.precompile (the run-time compile with NVRTC is not in it yet): nothing precompiled, no nvcc build; the package runs the CUDA kernels it can load, else its generic path"
    fi

    # ---- 3. one import and a small layer, timed: are the package's CUDA kernels in use?
    t=$(date +%s)
    local report
    report=$(PYTHON=$py gpu_setup_probe "$device" 2>&1)
    rc=$?
    echo "$report" | grep -v '^CUDA_KERNELS'
    local line
    line=$(echo "$report" | grep '^CUDA_KERNELS' | tail -n 1)
    if [ $rc -ne 0 ] || [ -z "$line" ]; then
        echo "$report" | tail -n 20
        gpu_setup_say "ERROR: importing rnn_ablations or running a small layer failed (exit $rc)"
        GPU_SETUP_SECONDS=$(( $(date +%s) - gpu_setup_t0 ))
        return 3
    fi
    if [ "$device" = cpu ]; then
        gpu_setup_say "CUDA kernels: not used (device cpu; import $(( $(date +%s) - t )) s)"
    elif [ "${line#CUDA_KERNELS }" = 1 ]; then
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
