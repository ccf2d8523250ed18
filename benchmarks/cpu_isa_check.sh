#!/usr/bin/env bash
# The CPU kernel's vector paths on this machine's CPU: run from the repo root with the
# CPU kernel built (pip install -e ., or python setup.py build_ext --inplace):
#
#   bash benchmarks/cpu_isa_check.sh [OUT_DIR]       (default OUT_DIR: benchmarks/results/tmp/cpu_isa)
#
# Meant for a machine with AVX-512 (a lent GPU machine's host CPU, a cloud VM): the tests and the
# speed table that an AVX2-only machine cannot run.  Pinned to two logical CPUs on different
# physical cores (2 threads, as the speed tables), so that it can run beside other work on a larger
# machine; CPUS=0,1 picks them by hand.  Steps, logs in OUT_DIR:
#   env    cpu_env.txt: the CPUs used and the machine (rnn_ablations.commands.machine: the CPU
#          model and vector flags, torch, the kernel's vector paths and the one in use);
#   tests  cpu_isa_tests.log: every test of tests/kernels/test_cpu_kernel.py that runs a vector path against the
#          float64 generic path or checks the path choice (-k "isa or packed"), each path the
#          CPU supports (avx512, avx2, the AVX-512 blocking emulated with AVX2, portable);
#   speed  speed_cpu_experiments_<isa>.{json,md}: benchmarks/speed.py --shapes experiments
#          --threads 2, every variant against nn.LSTM, train and inference, with --isas avx512 avx2
#          where the CPU has AVX-512 (the A/B in the same interleaved rounds), else the path in use;
#   gemm   step_gemm_library_<cpu>.{json,md}: benchmarks/step_gemm_library.py, the step GEMM on
#          the kernel's own packed GEMM against MKL's packed GEMM per shape, train and inference,
#          and the plan.POLICY.library_step_gemm entry the numbers support (cpu_gemm.log);
#   proj   projection_library_<cpu>.{json,md}: benchmarks/projection_library.py, each layer's
#          input projection on MKL against oneDNN, train and inference, and the
#          plan.POLICY.onednn_min_weight the numbers support (cpu_projection.log; the entry of
#          Policy.onednn_min_weight_by_vendor for this CPU's vendor);
#   bf16   speed_cpu_experiments_bfloat16.{json,md}: benchmarks/speed.py --dtype bfloat16 (every
#          variant against nn.LSTM in bfloat16, oneDNN / AMX where the CPU has it);
#   bf16 step  bf16_step_gemm_<cpu>.{json,md}: benchmarks/bf16_step_gemm.py, lstm and ran in
#          bfloat16 with the step GEMM in float32 and in bfloat16 against nn.LSTM in bfloat16
#          (plan.POLICY.bf16_step_gemm; cpu_bf16_step.log);
#   layout projection_layout_<cpu>.{json,md}: benchmarks/projection_layout.py, a no-gradient
#          projection of a batch-first input as F.linear on the (T, B, d) view (T batched GEMMs)
#          against the package's one GEMM, float32 and bfloat16, and the weight gradients as
#          the kernel's g^T in against (in^T g)^T copied (cpu_projection_layout.log).
# Environment: PYTHON (python3), CPUS (auto), REPEATS (5), WARMUP (1), SHAPE_NAMES (all rows),
# CPU_ISA_CHECK_PRINT_CPUS=1 (print the CPUs it would pin to, as a taskset list, and exit).
set -o pipefail
out=${1:-benchmarks/results/tmp/cpu_isa}
py=${PYTHON:-python3}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1

pick_cpus() {  # two logical CPUs of this process's affinity on different physical cores
    "$py" - <<'EOF'
import os
seen, picked = set(), []
for cpu in sorted(os.sched_getaffinity(0)):
    top = f"/sys/devices/system/cpu/cpu{cpu}/topology"
    try:
        key = (open(f"{top}/physical_package_id").read().strip(), open(f"{top}/core_id").read().strip())
    except OSError:
        key = ("?", str(cpu))
    if key not in seen:
        seen.add(key)
        picked.append(cpu)
    if len(picked) == 2:
        break
print(",".join(map(str, picked)))
EOF
}
cpus=${CPUS:-$(pick_cpus)}
if [ "${CPU_ISA_CHECK_PRINT_CPUS:-0}" = 1 ]; then echo "$cpus"; exit 0; fi
if [ -z "$cpus" ]; then echo "cpu_isa_check: no CPUs to pin to (set CPUS=0,1)"; exit 2; fi
mkdir -p "$out"
pin=(taskset -c "$cpus")
command -v taskset >/dev/null || { echo "taskset not found: running unpinned"; pin=(); }
t0=$(date +%s)
failed=0

{
    echo "pinned to CPUs $cpus"
    "${pin[@]}" "$py" - <<'EOF'
import json, sys, torch, rnn_ablations as ra
from rnn_ablations.commands.machine import machine_info
torch.set_num_threads(2)
info = machine_info()
print(info["machine"])
print(json.dumps(info, indent=1))
if not ra.kernel_available():
    print("the CPU kernel rnn_ablations._C is NOT importable: build it first (pip install -e .)")
    sys.exit(3)
EOF
} 2>&1 | tee "$out/cpu_env.txt"
[ $? -eq 0 ] || exit 3

"${pin[@]}" "$py" -m pytest -q -p no:cacheprovider -rs tests/kernels/test_cpu_kernel.py -k "isa or packed" 2>&1 \
    | tee "$out/cpu_isa_tests.log"
rc=$?
echo "== tests: exit $rc ($(( $(date +%s) - t0 )) s)"
[ $rc -eq 0 ] || failed=1

isas=$("${pin[@]}" "$py" -c "import rnn_ablations as ra; s = ra.supported_kernel_isas(); \
print(' '.join(['avx512', 'avx2'] if 'avx512' in s else [ra.kernel_isa()]))")
name=speed_cpu_experiments_${isas%% *}
shape_names=()
if [ -n "${SHAPE_NAMES:-}" ]; then
    mapfile -t shape_names < <(printf '%s\n' "$SHAPE_NAMES" | tr ',' '\n')
    shape_names=(--shape-names "${shape_names[@]}")
fi
# shellcheck disable=SC2086
"${pin[@]}" "$py" benchmarks/speed.py --shapes experiments --threads 2 --isas $isas \
    --repeats "${REPEATS:-5}" --warmup "${WARMUP:-1}" "${shape_names[@]}" --name "$name" \
    --out "$out" 2>&1 | tee "$out/cpu_speed.log"
rc=$?
echo "== speed ($isas): exit $rc ($(( $(date +%s) - t0 )) s, $out/$name.md)"
[ $rc -eq 0 ] || failed=1

"${pin[@]}" "$py" benchmarks/step_gemm_library.py --threads 2 --repeats "${REPEATS:-5}" \
    --warmup "${WARMUP:-1}" --out "$out" 2>&1 | tee "$out/cpu_gemm.log"
rc=$?
echo "== step GEMM library: exit $rc ($(( $(date +%s) - t0 )) s)"
[ $rc -eq 0 ] || failed=1

# shellcheck disable=SC2086
"${pin[@]}" "$py" benchmarks/projection_library.py --threads 2 --repeats "${REPEATS:-5}" \
    --warmup "${WARMUP:-1}" "${shape_names[@]}" --out "$out" 2>&1 | tee "$out/cpu_projection.log"
rc=$?
echo "== projection library: exit $rc ($(( $(date +%s) - t0 )) s)"
[ $rc -eq 0 ] || failed=1

# shellcheck disable=SC2086
"${pin[@]}" "$py" benchmarks/speed.py --shapes experiments --threads 2 --dtype bfloat16 \
    --repeats "${REPEATS:-5}" --warmup "${WARMUP:-1}" "${shape_names[@]}" \
    --name speed_cpu_experiments_bfloat16 --out "$out" 2>&1 | tee "$out/cpu_speed_bf16.log"
rc=$?
echo "== speed (bfloat16): exit $rc ($(( $(date +%s) - t0 )) s)"
[ $rc -eq 0 ] || failed=1

# shellcheck disable=SC2086
"${pin[@]}" "$py" benchmarks/bf16_step_gemm.py --threads 2 --repeats "${REPEATS:-5}" \
    --warmup "${WARMUP:-1}" "${shape_names[@]}" --out "$out" 2>&1 | tee "$out/cpu_bf16_step.log"
rc=$?
echo "== bf16 step GEMM: exit $rc ($(( $(date +%s) - t0 )) s)"
[ $rc -eq 0 ] || failed=1

# shellcheck disable=SC2086
"${pin[@]}" "$py" benchmarks/projection_layout.py --threads 2 --repeats "${REPEATS:-5}" \
    --warmup "${WARMUP:-1}" "${shape_names[@]}" --out "$out" 2>&1 \
    | tee "$out/cpu_projection_layout.log"
rc=$?
echo "== projection layout: exit $rc ($(( $(date +%s) - t0 )) s)"
[ $rc -eq 0 ] || failed=1
exit $failed
