#!/usr/bin/env bash
# One call on a lent GPU machine (run from the repo root there): the GPU checks and the host CPU's
# vector-path checks at once, on disjoint CPUs, everything packed into one file.
#
#   bash benchmarks/gpu_machine_check.sh OUT [BUDGET_SECONDS]        (default budget 540)
#
# - CPU side, pinned to two logical CPUs on different physical cores:
#   benchmarks/cpu_isa_check.sh (the AVX-512 / AVX2 / portable kernel tests and the
#   experiments' speed table with --isas avx512 avx2 where the host has AVX-512).
#   Needs the CPU kernel built for the machine's Python and torch (carry
#   rnn_ablations/_C.cpython-312-*.so built with the same torch, or it is built here first).
# - GPU side, on all the other CPUs: the CUDA kernels compiled at run time (no nvcc build:
#   benchmarks/gpu_setup.sh, timed), tests/kernels/test_scan.py -k cuda, then benchmarks/gpu_check.sh's steps
#   ($GPU_CHECK_STEPS, default "tests tests_nographs persistent speed autocast experiments
#   long_bi") in what is left of the
#   budget, then benchmarks/speed_minus_hidden.py --device cuda --shapes gpu.
#   GPU timings run while the CPU side runs on its own two cores; the two share memory bandwidth
#   and the last-level cache, not cores.
# OUT receives results.tgz (all logs, JSON and Markdown) and summary.txt: the device tool brings
# back at most 8 files.  Unpack with: tar -xzf OUT/results.tgz -C DIR
set -o pipefail
out=${1:?usage: bash benchmarks/gpu_machine_check.sh OUT [BUDGET_SECONDS]}
budget=${2:-540}
t_start=$(date +%s)
py=${PYTHON:-python3}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
work=$(mktemp -d /tmp/gpu_machine_check.XXXXXX)
mkdir -p "$out" "$work/cpu" "$work/gpu"
left() { echo $(( budget - ($(date +%s) - t_start) )); }
say() { echo "[gpu_machine_check +$(( $(date +%s) - t_start ))s] $*" | tee -a "$work/summary.txt"; }

say "host: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-), $(nproc) CPUs; budget ${budget}s"
if ! "$py" -c "import rnn_ablations._C" 2>/dev/null; then
    say "building the CPU kernel for this Python/torch (not carried)"
    MAX_JOBS=8 "$py" setup.py -q build_ext --inplace > "$work/cpu/cpu_build.log" 2>&1
    "$py" -c "import rnn_ablations._C" 2>>"$work/cpu/cpu_build.log" || say "CPU kernel build FAILED (cpu/cpu_build.log)"
fi
cpus=$(CPU_ISA_CHECK_PRINT_CPUS=1 bash benchmarks/cpu_isa_check.sh)
rest=$("$py" -c "import os; c = {int(x) for x in '$cpus'.split(',')}; \
print(','.join(str(i) for i in sorted(os.sched_getaffinity(0) - c)))")
say "CPU side on CPUs $cpus; GPU side on CPUs $rest"

( CPUS=$cpus timeout --kill-after=10 $(( budget - 25 )) bash benchmarks/cpu_isa_check.sh "$work/cpu" \
      > "$work/cpu/console.log" 2>&1
  echo "cpu_isa_check exit $? at +$(( $(date +%s) - t_start ))s" >> "$work/cpu/console.log" ) &
cpu_pid=$!

gpu() { if [ -n "$rest" ]; then taskset -c "$rest" "$@"; else "$@"; fi; }
if [ "$("$py" -c 'import torch; print(int(torch.cuda.is_available()))' 2>/dev/null)" != 1 ]; then
    say "no CUDA device (torch sees none): the GPU side is skipped"
else
# no nvcc build: the CUDA kernels compile at run time (precompiled here, timed; the CPU kernel
# stays, the CPU side needs it)
gpu env PYTHON="$py" CPU_KERNEL=build bash -c 'source benchmarks/gpu_setup.sh && gpu_setup_kernels "$1" cuda' \
    _ "$work/gpu/setup" > "$work/gpu/setup_console.log" 2>&1
say "CUDA kernels: $(grep -E "CUDA kernels|package's CUDA kernels" "$work/gpu/setup_console.log" | tr '\n' ' ')"
gpu timeout --kill-after=10 $(( $(left) > 120 ? 90 : 30 )) "$py" -m pytest -q -p no:cacheprovider -rs \
    tests/kernels/test_scan.py -k cuda > "$work/gpu/minus_hidden_tests.log" 2>&1
say "tests/kernels/test_scan.py -k cuda: exit $? ($(tail -n 1 "$work/gpu/minus_hidden_tests.log"))"
mh_time=${MINUS_HIDDEN_SPEED_S:-60}
GPU_CHECK_STEPS=${GPU_CHECK_STEPS:-tests tests_nographs persistent speed autocast experiments long_bi} \
    GPU_CHECK_BUDGET=$(( $(left) - mh_time - 30 )) gpu bash benchmarks/gpu_check.sh "$work/gpu" \
    > "$work/gpu/check_console.log" 2>&1
say "gpu_check exit $?:"
sed 's/^/    /' "$work/gpu/gpu_check_summary.txt" 2>/dev/null | tee -a "$work/summary.txt"
if [ "$(left)" -gt 40 ]; then
    gpu timeout --kill-after=10 $(( $(left) - 30 )) "$py" benchmarks/speed_minus_hidden.py \
        --device cuda --shapes gpu --out "$work/gpu" > "$work/gpu/speed_minus_hidden.log" 2>&1
    say "speed_minus_hidden --device cuda: exit $?"
fi
fi  # CUDA

wait "$cpu_pid"
say "CPU side: $(tail -n 1 "$work/cpu/console.log")"
grep -E "^== |passed|failed" "$work/cpu/console.log" | tail -8 | sed 's/^/    /' | tee -a "$work/summary.txt"
cp "$work/summary.txt" "$out/summary.txt"
tar -czf "$out/results.tgz" -C "$work" .
say "packed $(du -h "$out/results.tgz" | cut -f1) into $out/results.tgz"
for f in "$work"/cpu/speed_cpu_experiments_*.md "$work"/gpu/speed_cuda.md "$work"/gpu/speed_cuda_persistent.md; do
    [ -f "$f" ] && { echo "---- $f"; cat "$f"; }
done
exit 0
