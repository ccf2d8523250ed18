#!/usr/bin/env bash
# The prepared work for the next lent GPU (15 minutes of device time, machine start included),
# in this order, run from the repo root on the device machine:
#
#   1. check   benchmarks/gpu_check.sh: the run-time compile of the CUDA kernels (timed),
#              tests/kernels/test_cuda*.py and the standard speed tables against eager and graph-captured
#              cuDNN (GPU_CHECK_BUDGET seconds, default 200).  Skipped, said so, while the
#              checkout has no `python -m rnn_ablations.kernels.cuda.precompile` (the gpu_check.sh
#              of an nvcc build would spend the loan building).
#   2. ptb1    PTB call 1 (benchmarks/gpu_ptb_call.sh 1): −GATES at lr 0.25 / 0.1 / 0.05 and
#              −HIDDEN at 1.0, medium config, four runs at once, with what is left of the budget
#              (in the command that continues, RESUME=1, or with KEEP_SPEED=1: after SPEED_S
#              seconds are kept for step 3); cut by the budget, its rows are merged as incomplete
#              and the next command continues it (RESUME=1).
#   3. speed   benchmarks/speed_variable_length.py --device cuda (BiDAF/DrQA-like variable-length
#              training, float32 and bfloat16, against nn.LSTM in the same loop), within SPEED_S
#              seconds (default 100).
#
#   bash benchmarks/gpu_loan.sh OUT [BUDGET_SECONDS]          (default budget 560)
#   RESUME=1 bash benchmarks/gpu_loan.sh OUT [BUDGET_SECONDS]
#
# Before the loan, here: `mkdir -p .data && cp -r ../shared/data/ptb .data/` (the PTB text, about
# 5 MB; .data is ignored and travels with carry).
# The plan for a 15-minute loan (device time counts from the machine's start, about 1-2 min):
#   first command:  run(command="bash benchmarks/gpu_loan.sh $OUT 560", carry=[".data"],
#                       timeout_s=600)
#       (check, then PTB call 1 with all that is left)
#   second command on the warm machine, at once, with the device time left (say 240 s):
#       run(command="RESUME=1 bash benchmarks/gpu_loan.sh $OUT 230", carry=[".data"],
#           timeout_s=260)
#       (steps done are skipped: PTB call 1 continues from its checkpoints with what is left
#       after SPEED_S, then the speed table)
#   then give the machine back.  Arithmetic: about 90 s start + 560 + 230 = 880 s of 900; PTB call
#   1 gets about 560 - 200 (check) - 30 (set-up) + 230 - 100 (speed) - 30 = 430 s of training:
#   the medium runs timed so far took 410-770 s each on an H100 (two and five at once), so call 1
#   may end cut, its rows merged as incomplete (after the epochs shown).  Its checkpoints (about
#   60 MB each) cannot come back from a loan: a later loan starts call 1 afresh.  Bring the
#   merged table and the speed table into benchmarks/results/ from OUT.
# Each command stays within BUDGET_SECONDS (its steps are given what is left, less BACK_S seconds,
# default 10, kept for packing what comes back; a step that would start with under 60 s left is
# skipped, said so).  Each step runs under setsid(1), as the leader of a new process tree, and is stopped at its budget:
# every process with that leader's SID gets SIGTERM, SIGKILL 5 s later (a nested `timeout` makes a process
# group of its own, which a `timeout` around the step would not reach); PTB call 1 stops its
# runs itself before that and still merges their rows, and the summary names the runs cut.  State lives in runs/gpu_loan (ignored, kept on
# a warm machine): the marks of the steps done and the merged PTB table (started from
# benchmarks/results/ptb_medium_gpu.json, which each call's copy of the repo resets).
#
# OUT receives at most 8 files (what a device call brings back): summary.txt, loan.tgz (every
# log, table and result), the merged ptb_medium_gpu.{json,md,png} (copy them into
# benchmarks/results/) and speed_cuda_variable_length_<gpu>.{json,md} (likewise).
# Environment: RNN_ABLATIONS_PTB (.data/ptb, carried), DEVICE (cuda; cpu with CONFIG=tiny checks
# the script without a GPU, end to end: gpu_check.sh's dry run with the kernels on the CUDA
# emulation, a tiny PTB call and a CPU speed table), CONFIG (medium), GPU_CHECK_BUDGET, SPEED_S, SPEED_ARGS (more options
# of speed_variable_length.py), STAGES (default "check ptb1 speed"), CHECK_GATE (1: ptb1 and speed
# run only after a check that passed; 0: whatever it said).
set -o pipefail
out=${1:?usage: bash benchmarks/gpu_loan.sh OUT [BUDGET_SECONDS]}
budget=${2:-560}
case "$budget" in
    ''|*[!0-9]*) echo "gpu_loan.sh: BUDGET_SECONDS must be a whole number of seconds, got $budget" >&2; exit 2 ;;
esac
t_start=$(date +%s)
device=${DEVICE:-cuda}
config=${CONFIG:-medium}
stages=" ${STAGES:-check ptb1 speed} "
speed_s=${SPEED_S:-100}
state=${LOAN_STATE:-runs/gpu_loan}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export WORK=${WORK:-runs/gpu_work}
mkdir -p "$out" "$state/logs"
if [ "${RESUME:-0}" != 1 ]; then   # a fresh start: no marks, no table, no logs of an earlier one
    rm -rf "$state"/done_* "$state"/ptb1_* "$state"/speed "$state"/gpu_check "$state/started_ptb1" \
        "$state/check_rc" \
        "$state/summary.txt" "$state"/ptb_*_gpu.* "$state"/logs/*
fi
exec > >(tee -a "$state/logs/gpu_loan.log") 2>&1
back_s=${BACK_S:-10}
left() { echo $(( budget - back_s - ($(date +%s) - t_start) )); }
# the processes whose SID (setsid id) is $1 (Linux /proc: the fields after the command's name are
# state, ppid, pgrp, sid)
sid_pids() {
    local sid=$1 f st
    for f in /proc/[0-9]*/stat; do
        st=$(cat "$f" 2>/dev/null) || continue
        st=${st##*) }
        # shellcheck disable=SC2086
        set -- $st
        [ "${4:-}" = "$sid" ] && { f=${f#/proc/}; echo "${f%/stat}"; }
    done
}
# run_within LIMIT CMD...: CMD under setsid(1); after LIMIT seconds every process with its SID
# gets SIGTERM, 5 s later SIGKILL; the exit status is CMD's, or 124 when it was stopped
run_within() {
    local limit=$1 end pid p
    shift
    end=$(( $(date +%s) + limit ))
    setsid "$@" &
    pid=$!   # setsid(1) started from a script is no group leader: CMD is this pid, the SID's
    while kill -0 "$pid" 2>/dev/null && [ "$(date +%s)" -lt "$end" ]; do sleep 1; done
    if ! kill -0 "$pid" 2>/dev/null; then
        wait "$pid"
        return
    fi
    for p in $(sid_pids "$pid"); do kill -TERM "$p" 2>/dev/null; done
    end=$(( $(date +%s) + 5 ))
    while [ -n "$(sid_pids "$pid")" ] && [ "$(date +%s)" -lt "$end" ]; do sleep 0.5; done
    for p in $(sid_pids "$pid"); do kill -KILL "$p" 2>/dev/null; done
    wait "$pid" 2>/dev/null
    return 124
}
say() { echo "[gpu_loan +$(( $(date +%s) - t_start ))s] $*" | tee -a "$state/summary.txt"; }
want() { [[ "$stages" == *" $1 "* ]] && [ ! -f "$state/done_$1" ]; }
: >> "$state/summary.txt"
say "command start: budget ${budget}s, stages:${stages}RESUME=${RESUME:-0}, device $device, config $config"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | sed 's/^/    /'

# ---- 1. gpu_check.sh
if want check; then
    if [ ! -f rnn_ablations/kernels/cuda/precompile.py ]; then
        say "check: SKIPPED: no python -m rnn_ablations.kernels.cuda.precompile in this checkout (its gpu_check.sh would build with nvcc, which does not fit a loan)"
    else
        b=$(( ${GPU_CHECK_BUDGET:-200} < $(left) - 60 ? ${GPU_CHECK_BUDGET:-200} : $(left) - 60 ))
        t=$(date +%s)
        # DEVICE=cpu: gpu_check.sh's dry run (the kernels on the CUDA emulation); it is given
        # 10 s less than its budget for its own steps, and stopped at the budget
        DEVICE=$device GPU_CHECK_BUDGET=$(( b - 10 )) run_within "$b" bash benchmarks/gpu_check.sh \
            "$state/gpu_check" > "$state/logs/gpu_check.log" 2>&1
        rc=$?
        echo "$rc" > "$state/check_rc"
        say "check: benchmarks/gpu_check.sh exit $rc in $(( $(date +%s) - t )) s (budget $b s)$(
            [ $rc = 124 ] && echo ": STOPPED at its budget")"
        sed 's/^/    /' "$state/gpu_check/gpu_check_summary.txt" 2>/dev/null | tee -a "$state/summary.txt"
    fi
    touch "$state/done_check"
fi
# The later stages time and train with the package's CUDA kernels: they run only when the check
# passed (exit 0) or was not run in this loan's stages; a failed or unfinished check (a kernel
# that differs from the generic path, a conversion that is not torch's, a family that failed its
# first-use check) stops them, and the summary says so (CHECK_GATE=0 runs them anyway).
if [ -f "$state/check_rc" ] && [ "$(cat "$state/check_rc")" != 0 ] && [ "${CHECK_GATE:-1}" != 0 ]; then
    say "ptb1, speed: SKIPPED: the check failed (benchmarks/gpu_check.sh exit $(cat "$state/check_rc"); see logs/gpu_check.log); CHECK_GATE=0 runs them anyway"
    stages=" ${stages// ptb1 / } "
    stages=" ${stages// speed / } "
fi

# ---- 2. PTB call 1
target="$state/ptb_${config}_gpu.json"
if [ ! -f "$target" ] && [ -f "benchmarks/results/ptb_${config}_gpu.json" ]; then
    cp "benchmarks/results/ptb_${config}_gpu.json" "$target"
fi
if want ptb1; then
    # the time kept for the speed table: in the command that continues (RESUME=1) or with
    # KEEP_SPEED=1; a first command gives PTB call 1 all it has (it needs the most)
    keep=0
    if [[ "$stages" == *" speed "* ]] && [ ! -f "$state/done_speed" ] \
            && { [ "${RESUME:-0}" = 1 ] || [ "${KEEP_SPEED:-0}" = 1 ]; }; then
        keep=$speed_s
    fi
    b=$(( $(left) - keep - 10 ))   # 10 s: the margin of its run_within
    if [ "$b" -lt 60 ]; then
        say "ptb1: SKIPPED: ${b}s left for it (RESUME=1 in a later command)"
    else
        resume=0
        [ -f "$state/started_ptb1" ] && resume=1
        echo x >> "$state/started_ptb1"
        attempt=$(wc -l < "$state/started_ptb1")
        call_out="$state/ptb1_$attempt"
        t=$(date +%s)
        # the call keeps its budget (its runs stopped, their rows merged); stopped 10 s after it
        RESUME=$resume MERGE_INTO="$target" PACK=0 run_within $(( b + 10 )) \
            bash benchmarks/gpu_ptb_call.sh 1 "$call_out" "$b" > "$state/logs/ptb1_$attempt.log" 2>&1
        rc=$?
        say "ptb1: benchmarks/gpu_ptb_call.sh 1 (RESUME=$resume) exit $rc in $(( $(date +%s) - t )) s (budget $b s)$(
            [ $rc = 124 ] && echo ": STOPPED 10 s after its budget")"
        grep -E "^\[setup|data preparation" "$call_out/gpu_reproduce.log" 2>/dev/null | sed 's/^/    /' | tee -a "$state/summary.txt"
        if python3 - "$call_out/ptb_${config}_gpu_call.json" 2>&1 <<'EOF' | tee -a "$state/summary.txt"
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
def cut(r):
    if r["status"] == "not run":
        return ": NOT RUN (no time left in the budget)"
    if r["status"] == "incomplete" or r.get("cut"):
        return ": CUT by the time budget"
    return ""
for r in rows:
    print(f"    {r['variant']} lr {r['learning_rate']}: {r['status']}, {r['epochs']} of "
          f"{r['epochs_planned']} epochs, valid {r['valid_ppl']}, test {r['test_ppl']}, "
          f"{r['seconds']} s{cut(r)}")
names = [f"{r['variant']} lr {r['learning_rate']}" for r in rows if cut(r)]
if names:
    print("    cut or not run: " + ", ".join(names))
sys.exit(0 if rows and all(r["status"] in ("complete", "diverged") and not r.get("cut")
                           for r in rows) else 1)
EOF
        then
            touch "$state/done_ptb1"; say "ptb1: every run finished"
        else
            say "ptb1: not finished (cut by the budget or failed): continue with RESUME=1"
        fi
    fi
fi

# ---- 3. the variable-length speed table
if want speed; then
    b=$(( $(left) - 15 ))
    if [ "$b" -lt 30 ]; then
        say "speed: SKIPPED: ${b}s left"
    else
        t=$(date +%s)
        dev_args=(--device "$device")
        [ "$device" != cpu ] && dev_args+=(--require-cuda-kernels)
        # shellcheck disable=SC2086
        run_within "$b" python3 benchmarks/speed_variable_length.py "${dev_args[@]}" \
            --time-budget $(( b * 2 / 3 )) --out "$state/speed" ${SPEED_ARGS:-} \
            > "$state/logs/speed_variable_length.log" 2>&1
        rc=$?
        say "speed: benchmarks/speed_variable_length.py exit $rc in $(( $(date +%s) - t )) s (budget $b s)$(
            [ $rc = 124 ] && echo ": STOPPED at its budget")"
        grep -E "^# (WARNING|time budget|wrote)" "$state/logs/speed_variable_length.log" | sed 's/^/    /' | tee -a "$state/summary.txt"
        [ $rc -eq 0 ] && touch "$state/done_speed"
    fi
fi

# ---- what comes back
say "command end: $(( $(date +%s) - t_start )) s of ${budget}s"
cp "$state/summary.txt" "$out/summary.txt"
for f in "$target" "${target%.json}.md" "${target%.json}.png" "$state"/speed/*.json "$state"/speed/*.md; do
    [ -f "$f" ] && cp "$f" "$out/"
done
tar -czf "$out/loan.tgz" --exclude='*.pt' -C "$state" . 2>/dev/null
exit 0
