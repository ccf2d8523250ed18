#!/usr/bin/env bash
# The device commands that complete the PTB medium table (benchmarks/results/ptb_medium_gpu.json),
# one call per command, each within one command of at most 9 minutes on one GPU from a bare
# machine (set-up included), run from the repo root:
#
#   bash benchmarks/gpu_ptb_call.sh CALL [OUT] [BUDGET_SECONDS]
#
#   CALL 1  −GATES (srnn) at lr 0.25, 0.1 and 0.05 and −S-RNN−HIDDEN at lr 1.0, seed 0: four runs
#           at once (an S-RNN step has one 650×650 product where the LSTM has four, −HIDDEN none).
#           The table reports −GATES at the lr with the best final validation perplexity ("lr
#           chosen by validation; the papers do not state it").
#   CALL 2  LSTM seeds 1 and 2, then the weight pictures of the trained LSTM (seed 1).
#   CALL 3  LSTM seeds 3 and 4.
#   CALL 4  −S-RNN and tanh RAN seed 1, then the weight pictures of both.
#
# Each call runs benchmarks/gpu_reproduce.sh (set-up: no nvcc build, the run-time compile of the
# CUDA kernels and the data preparation timed in its log; then the runs with a time budget; the
# pictures with `rnn-ablations visualize` on a PTB test sentence) and merges its rows into
# MERGE_INTO (default benchmarks/results/ptb_${CONFIG}_gpu.json, with its .md and .png) with
# benchmarks/ptb_medium_merge.py — also when the runs were cut by the budget: their rows are
# merged as "incomplete" (after the epochs shown) and the call is marked "cut".  A copy of the
# merged table comes back in OUT.
#
# A call cut by its budget continues on a machine that is still warm with RESUME=1 (same CALL;
# the checkpoints live in WORK, default runs/gpu_work, an ignored folder that stays on the machine
# while it is held): its rows then replace the cut ones.  A fresh machine has no checkpoints:
# RESUME=1 there starts afresh (said so in the log).
#
# OUT (default benchmarks/results/tmp/gpu_ptb_call<CALL>) receives the call's log, tables, rows
# and pictures; with PACK=1 (the default) everything but gpu_reproduce.log, the call's rows
# ptb_${CONFIG}_gpu_call.json and the merged table (ptb_${CONFIG}_gpu.{json,md,png}) goes into
# OUT/call<CALL>.tgz (a device call brings back at most 8 files).  BUDGET_SECONDS (default 540)
# bounds the whole command: gpu_reproduce.sh gets it less MERGE_S seconds (default 20) kept for
# the merge, which gets what is left (at least 10 s).  Environment as in gpu_reproduce.sh (RNN_ABLATIONS_PTB, WORK,
# DEVICE, CONFIG, CPU_KERNEL, PRECOMPILE_ARGS; DEVICE=cpu CONFIG=tiny checks the commands
# without a GPU, as tests/lm/test_lm_gpu_script.py does); VISUALIZE overrides the runs drawn.
set -o pipefail
call=${1:?usage: bash benchmarks/gpu_ptb_call.sh CALL [OUT] [BUDGET_SECONDS] (CALL 1-4)}
out=${2:-benchmarks/results/tmp/gpu_ptb_call$call}
budget=${3:-540}
config=${CONFIG:-medium}
case "$call" in
    1) variants="srnn lstm_minus_srnn_minus_hidden"; seeds=0
       lrs="srnn=0.25 srnn=0.1 srnn=0.05"; pictures="" ;;
    2) variants="lstm"; seeds="1 2"; lrs=""; pictures="lstm_s1" ;;
    3) variants="lstm"; seeds="3 4"; lrs=""; pictures="" ;;
    4) variants="lstm_minus_srnn ran"; seeds=1; lrs=""; pictures="lstm_minus_srnn_s1 ran_s1" ;;
    *) echo "gpu_ptb_call.sh: CALL must be 1, 2, 3 or 4, got $call" >&2; exit 2 ;;
esac
case "$budget" in
    ''|*[!0-9]*) echo "gpu_ptb_call.sh: BUDGET_SECONDS must be a whole number of seconds, got $budget" >&2; exit 2 ;;
esac
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export WORK=${WORK:-runs/gpu_work}
t_start=$(date +%s)
target=${MERGE_INTO:-benchmarks/results/ptb_${config}_gpu.json}
merge_s=${MERGE_S:-20}   # kept back for the merge (a Python start, the table and its picture)
# gpu_reproduce.sh keeps its budget (its runs are stopped there, their rows written); `timeout`
# (on its whole process group) only if it does not end 10 s after that
VARIANTS="$variants" SEEDS="$seeds" LRS="$lrs" VISUALIZE="${VISUALIZE-$pictures}" \
    RUNS_PER_PROCESS=${RUNS_PER_PROCESS:-1} timeout --kill-after=5 $(( budget - merge_s + 10 )) \
    bash benchmarks/gpu_reproduce.sh "$out" $(( budget - merge_s ))
status=$?
[ "$status" = 124 ] || [ "$status" = 137 ] && echo "gpu_ptb_call.sh: benchmarks/gpu_reproduce.sh did not end within its budget + 10 s: stopped" >&2
rows="$out/ptb_${config}_gpu_call.json"
if [ -f "$rows" ]; then
    # what is left of the budget, at least 10 s: the merged .json is written first, the table
    # and its picture after it
    merge_left=$(( budget - ($(date +%s) - t_start) ))
    [ "$merge_left" -lt 10 ] && merge_left=10
    timeout --kill-after=3 "$merge_left" python3 benchmarks/ptb_medium_merge.py "$target" "$rows" \
        --device-time $(( $(date +%s) - t_start )) --call "$call" || status=$?
    stem=$(basename "$target" .json)
    for ext in json md png; do
        [ -f "${target%.json}.$ext" ] && cp "${target%.json}.$ext" "$out/$stem.$ext"
    done
else
    echo "gpu_ptb_call.sh: no $rows (the runs wrote no results; see $out/gpu_reproduce.log): nothing merged" >&2
    [ "$status" = 0 ] && status=1
fi
if [ "${PACK:-1}" = 1 ]; then
    keep="gpu_reproduce.log ptb_${config}_gpu_call.json $(basename "${target%.json}").json $(basename "${target%.json}").md $(basename "${target%.json}").png"
    pack=()
    for f in "$out"/*; do
        name=$(basename "$f")
        [[ " $keep call$call.tgz " == *" $name "* ]] || pack+=("$name")
    done
    if [ ${#pack[@]} -gt 0 ]; then
        tar -czf "$out/call$call.tgz" -C "$out" "${pack[@]}" && (cd "$out" && rm -rf "${pack[@]}")
    fi
fi
echo "gpu_ptb_call.sh: call $call exit $status in $(( $(date +%s) - t_start )) s"
exit $status
