#!/usr/bin/env bash
# The papers' PTB table on one GPU, in one command (run from the repo root on a CUDA machine):
#
#   bash benchmarks/gpu_reproduce.sh [OUT] [BUDGET_SECONDS] [STEPS]
#
#   STEPS > 0   timing mode: the CUDA checks of tests/lm/test_reproduce.py (graphed step against
#               eager, bit-identical resume with graphs), then STEPS training steps of every run
#               at once; prints steps/s per run and the projected wall time of the full run
#               (OUT/timing.md), twice: one process per run (processes on one GPU take turns
#               unless MPS runs), and all runs in one process, one thread and CUDA stream each
#               (their kernels can overlap). With MPS_COMPARE=1 and nvidia-cuda-mps-control on
#               the PATH, a third time: one process per run under MPS.
#   STEPS = 0   (default) the full run: `rnn-ablations reproduce ptb --config $CONFIG` for the
#               five variants, all at once, stopped so that the whole script ends within
#               BUDGET_SECONDS (default 450; runs cut short are reported as incomplete): the
#               command is given what is left after the set-up, less a Python start (timed in
#               the data preparation) and 10 s for the rows, and stops its runs at its budget,
#               their evaluations included (`reproduce ptb --time-budget`).
#   FULL=1      with STEPS > 0: the timing, then the full run in the same command, with what is
#               left of BUDGET_SECONDS (one machine start and one set-up for both).
#   CHECKS=1    with STEPS = 0: the CUDA checks of the graphed step first (as in timing mode).
#   RESUME=1    continue the full run in WORK/run (`reproduce ptb --resume`) instead of starting
#               it afresh: a second command on a machine that is still warm (WORK must then be an
#               ignored folder inside the repo, e.g. WORK=runs/gpu_work, which survives between
#               commands while the machine is held; /tmp does not).
#
# Set-up (benchmarks/gpu_setup.sh, each step timed in the log, all within BUDGET_SECONDS): no nvcc
# build (the CUDA kernels compile at run time: `python -m rnn_ablations.kernels.cuda.precompile`
# first, where the checkout has it), the CPU kernel not compiled where the call can go without it
# (CPU_KERNEL), one import saying whether the package's CUDA kernels are in use, then the PTB
# corpus read once (data preparation, timed).
#
# Environment: RNN_ABLATIONS_PTB (default .data/ptb: a folder with ptb.train.txt, ptb.valid.txt,
# ptb.test.txt; copy it into the repo's ignored .data/ and carry it), CONFIG (medium), VARIANTS
# ("lstm srnn lstm_minus_srnn ran identity_ran"), SEEDS (0), LRS (learning rates other than the
# papers', "VARIANT=LR ..." passed as --lr VARIANT=LR each, e.g. "srnn=0.25 srnn=0.1"),
# VISUALIZE (run names, e.g. "lstm_s1 ran_s1": after training, `rnn-ablations visualize` of
# each trained run on a PTB test sentence, the heat map and arrows as visualize_<run>.png and
# the norms as visualize_<run>.json in OUT), WORK (where the runs and their
# checkpoints live, outside OUT: /tmp/rnn_ablations_reproduce), MPS=1 (run the full run under
# MPS), RUNS_PER_PROCESS (runs per process in the full run: 1, the number of runs = all in one
# process, or auto = the faster of the two timings when STEPS > 0, else 1; default auto),
# CUDA_GRAPH (auto),
# MAX_PARALLEL (processes at once: all), DEVICE (cuda).
#
# OUT receives gpu_reproduce.log (everything printed, the runs' logs at the end), timing.md,
# results.{json,md,csv,png}, ptb_${CONFIG}_gpu_call.json (device, command and one row per run:
# variant, seed, learning_rate, epochs, valid_ppl, test_ppl, seconds, status; merged into
# benchmarks/results/ptb_medium_gpu.json by benchmarks/ptb_medium_merge.py) and, with
# VISUALIZE, two files per run named there.  Checkpoints stay in WORK.
set -o pipefail
out=${1:-benchmarks/results/tmp/gpu_reproduce}
budget=${2:-450}
steps=${3:-0}
t_start=$(date +%s)
data=${RNN_ABLATIONS_PTB:-.data/ptb}
config=${CONFIG:-medium}
variants=${VARIANTS:-lstm srnn lstm_minus_srnn ran identity_ran}
seeds=${SEEDS:-0}
lr_args=()
for item in ${LRS:-}; do lr_args+=(--lr "$item"); done
work=${WORK:-/tmp/rnn_ablations_reproduce}
graph=${CUDA_GRAPH:-auto}
device=${DEVICE:-cuda}   # DEVICE=cpu CONFIG=tiny: a check of this script on a machine without a GPU
mkdir -p "$out" "$work"
log="$out/gpu_reproduce.log"
: > "$log"
exec > >(tee -a "$log") 2>&1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1

elapsed() { echo $(( $(date +%s) - t_start )); }
say() { echo "[gpu_reproduce +$(elapsed)s] $*"; }

say "config $config, variants: $variants, seeds: $seeds, lrs: ${LRS:-as in the papers}, data $data, budget ${budget}s, steps $steps"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'python', __import__('sys').version.split()[0])"
for f in ptb.train.txt ptb.valid.txt ptb.test.txt; do
    if [ ! -f "$data/$f" ]; then
        say "ERROR: $data/$f is missing: copy the PTB folder (ptb.train/valid/test.txt) to .data/ptb in the repo and carry it, or set RNN_ABLATIONS_PTB"
        exit 2
    fi
done

# ---- the kernels: no nvcc build (the CUDA kernels compile at run time with NVRTC, precompiled
# here, timed); the CPU kernel only where the call needs it (benchmarks/gpu_setup.sh)
source benchmarks/gpu_setup.sh
gpu_setup_kernels "$out" "$device" || { say "ERROR: the set-up failed (see above)"; exit 3; }

# ---- data preparation, timed (every run reads the corpus again: this says what that costs)
# (the seconds of a Python start with torch, py_start, are kept back from the runs' budget: the
# runs' command counts its budget from after its imports)
t_data=$(date +%s)
py_start=$(python3 -c "import math, sys, time; t = time.perf_counter(); from rnn_ablations.lm.data import load_corpus; \
i = time.perf_counter() - t; c = load_corpus(sys.argv[1]); \
print(c.summary(), f'(read in {time.perf_counter() - t - i:.1f} s, imports {i:.1f} s)', file=sys.stderr); \
print(math.ceil(i) + 1)" "$data") \
    || { say "ERROR: the PTB corpus in $data could not be read"; exit 2; }
say "data preparation: $(( $(date +%s) - t_data )) s (a Python start with torch: ${py_start} s)"

mps_start() {
    export CUDA_MPS_PIPE_DIRECTORY=/tmp/rnn_ablations_mps/pipe CUDA_MPS_LOG_DIRECTORY=/tmp/rnn_ablations_mps/log
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    nvidia-cuda-mps-control -d && say "MPS daemon started"
}
mps_stop() {
    echo quit | nvidia-cuda-mps-control 2>/dev/null && say "MPS daemon stopped"
    sleep 1
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
}

status=0
nruns=$(( ($(echo $variants | wc -w) + $(echo ${LRS:-} | wc -w)) * $(echo $seeds | wc -w) ))
# ---- timing
timing() {   # timing NAME TITLE [extra reproduce args]: appends its table to OUT/timing.md
    local name=$1 title=$2; shift 2
    say "timing ($title): $steps steps of every run at once"
    rm -rf "$work/$name"
    timeout 200 python3 -m rnn_ablations.cli reproduce ptb --config "$config" --data "$data" \
        --variants $variants --seeds $seeds "${lr_args[@]}" --device $device --cuda-graph "$graph" \
        --out "$work/$name" --timing "$steps" "$@" || say "timing ($title) FAILED"
    { echo "## $config, $steps steps per run, all runs at once: $title"; echo;
      cat "$work/$name/timing.md" 2>/dev/null || echo "(failed: see gpu_reproduce.log)"; echo; } >> "$out/timing.md"
}
if [ "$steps" -gt 0 ] || [ "${CHECKS:-0}" = 1 ]; then
    say "CUDA checks of the graphed step"
    timeout 120 python3 -m pytest -q -p no:cacheprovider tests/lm/test_reproduce.py -k cuda 2>&1 | tail -15
fi
if [ "$steps" -gt 0 ]; then
    : > "$out/timing.md"
    timing timing_procs "one process per run (RUNS_PER_PROCESS=1)"
    timing timing_threads "one process, a thread and a CUDA stream per run (RUNS_PER_PROCESS=$nruns)" \
        --runs-per-process "$nruns"
    if [ "${MPS_COMPARE:-0}" = 1 ] && command -v nvidia-cuda-mps-control >/dev/null; then
        if mps_start; then
            timing timing_mps "one process per run under MPS (MPS=1)"
            mps_stop
        fi
    fi
    cat "$out/timing.md"
fi

# ---- the full run
if [ "$steps" -eq 0 ] || [ "${FULL:-0}" = 1 ]; then
    # kept back from the runs' budget: the rows file and the weight pictures (VISUALIZE_S each)
    # and the runs' command's Python start (py_start), which its own budget does not count
    reserve=$(( 10 + ${VISUALIZE_S:-30} * $(echo ${VISUALIZE:-} | wc -w) ))
    left=$(( budget - $(elapsed) - reserve - py_start ))
    if [ "$left" -lt 60 ]; then
        say "ERROR: only ${left}s of the ${budget}s budget left for the full run"
        exit 4
    fi
    rpp=${RUNS_PER_PROCESS:-auto}
    if [ "$rpp" = auto ]; then
        rpp=1
        if [ "$steps" -gt 0 ]; then   # the faster of the two timings (a failed one never wins)
            rpp=$(python3 - "$work" "$nruns" <<'EOF'
import json, sys
from pathlib import Path
work, n = Path(sys.argv[1]), sys.argv[2]
best = ("1", float("inf"))
for name, k in (("timing_procs", "1"), ("timing_threads", n)):
    try:
        t = json.loads((work / name / "timing.json").read_text())
    except (OSError, ValueError):
        continue
    ok = t.get("projected_wall_s") is not None and not any(r.get("failed") for r in t["rows"])
    if ok and t["projected_wall_s"] < best[1]:
        best = (k, t["projected_wall_s"])
print(best[0])
EOF
)
            say "runs per process for the full run: $rpp (the faster projection of the timings)"
        fi
    fi
    [ "${MPS:-0}" = 1 ] && mps_start
    say "full run: reproduce ptb --config $config, time budget ${left}s, $rpp run(s) per process"
    resume=
    if [ "${RESUME:-0}" = 1 ] && [ -d "$work/run" ]; then
        resume=--resume
        say "continuing the runs in $work/run"
    else
        [ "${RESUME:-0}" = 1 ] && say "RESUME=1 but no $work/run on this machine (a fresh machine?): starting the runs afresh"
        rm -rf "$work/run"
    fi
    # the command stops its runs at its budget and still writes their rows; `timeout` (its whole
    # process group) only if it does not end 10 s after that
    timeout --kill-after=5 $(( left + py_start + 10 )) \
    python3 -m rnn_ablations.cli reproduce ptb --config "$config" --data "$data" \
        --variants $variants --seeds $seeds "${lr_args[@]}" --device $device --cuda-graph "$graph" \
        --out "$work/run" --time-budget "$left" --runs-per-process "$rpp" $resume \
        ${MAX_PARALLEL:+--max-parallel $MAX_PARALLEL} || status=$?
    [ "$status" = 124 ] || [ "$status" = 137 ] && say "ERROR: the runs' command did not end within its budget + 10 s: stopped"
    [ "${MPS:-0}" = 1 ] && mps_stop
    for f in results.json results.md results.csv results.png; do
        cp "$work/run/$f" "$out/" 2>/dev/null || say "no $f"
    done
    GPU_SETUP_SECONDS=$GPU_SETUP_SECONDS GPU_SETUP_CUDA_KERNELS=$GPU_SETUP_CUDA_KERNELS \
    RESUMED=${resume:+1} CALL_DEVICE=$device python3 - "$work/run/results.json" "$out/ptb_${config}_gpu_call.json" "$config" \
        "rnn-ablations reproduce ptb --config $config --data DIR --variants $variants --seeds $seeds ${lr_args[*]} --device $device --cuda-graph $graph --time-budget $left --runs-per-process $rpp" <<'EOF' || status=$?
import json, os, sys
src, dst, config, command = sys.argv[1:5]
r = json.load(open(src))
keys = ("variant", "paper_name", "seed", "learning_rate", "paper_learning_rate", "epochs",
        "epochs_planned", "valid_ppl", "test_ppl", "seconds", "status", "step_mode")
table = {"device": r["device"], "config": config, "runs_at_once": r["max_parallel"],
         "wall_seconds": r["wall_seconds"], "time_budget_s": r.get("time_budget_s"),
         "over_budget_s": r.get("over_budget_s"), "cuda_graph": r["cuda_graph"],
         "processes": r.get("processes"), "command": command,
         "resumed": os.environ.get("RESUMED") == "1",
         "setup_seconds": int(os.environ.get("GPU_SETUP_SECONDS") or 0),
         "cuda_kernels": (None if os.environ.get("CALL_DEVICE") == "cpu"
                          else os.environ.get("GPU_SETUP_CUDA_KERNELS") == "1"),
         "rows": [dict({k: row.get(k) for k in keys},
                       **{k: row[k] for k in ("cut", "note") if row.get(k)}) for row in r["rows"]]}
cut = [row["run"] for row in r["rows"] if row.get("cut") or row.get("status") == "incomplete"]
not_run = [row["run"] for row in r["rows"] if row.get("status") == "not run"]
json.dump(table, open(dst, "w"), indent=2)
open(dst, "a").write("\n")
print(json.dumps(table, indent=2))
print("runs cut by the time budget: " + (", ".join(cut) or "none")
      + ("; not run: " + ", ".join(not_run) if not_run else ""))
EOF
    for d in "$work"/run/*/; do
        [ -f "$d/run.log" ] && { echo "=== $(basename "$d")/run.log"; grep -v "UserWarning\|warnings.warn" "$d/run.log"; }
    done
    # ---- the weight pictures of the trained runs, on the first PTB test sentence of 15-30
    # words (or the longest, cut at 30 words, when none has that length)
    if [ -n "${VISUALIZE:-}" ]; then
        sentence=$(python3 - "$data/ptb.test.txt" <<'EOF'
import sys
lines = [line.split() for line in open(sys.argv[1])]
print(" ".join(next((w for w in lines if 15 <= len(w) <= 30), max(lines, key=len)[:30])))
EOF
)
        say "visualize on: $sentence"
        for r in $VISUALIZE; do
            if [ ! -f "$work/run/$r/checkpoint.pt" ]; then
                say "visualize: no trained run $r in $work/run"; status=5; continue
            fi
            vis_s=$(( budget - $(elapsed) - 5 ))
            [ "$vis_s" -gt 120 ] && vis_s=120
            if [ "$vis_s" -lt 10 ]; then
                say "visualize $r: SKIPPED: ${vis_s}s of the budget left"; status=5; continue
            fi
            timeout --kill-after=5 "$vis_s" python3 -m rnn_ablations.cli visualize --model "$work/run/$r" \
                --text "$sentence" --out "$out/visualize_$r.png" --json "$out/visualize_$r.json" \
                || { say "visualize $r FAILED"; status=5; }
        done
    fi
fi
say "done (exit $status)"
exit $status
