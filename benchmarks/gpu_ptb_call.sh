#!/usr/bin/env bash
# The device commands that complete the PTB medium table (benchmarks/results/ptb_medium_gpu.json),
# one call per command (each fits one 10-minute command on one GPU), run from the repo root:
#
#   bash benchmarks/gpu_ptb_call.sh CALL [OUT] [BUDGET_SECONDS]
#
#   CALL 1  −GATES (srnn) at lr 0.25, 0.1 and 0.05 and −S-RNN−HIDDEN at lr 1.0, seed 0: four runs
#           at once (an S-RNN step has one 650×650 product where the LSTM has four, −HIDDEN none).
#           The table reports −GATES at the lr with the best final validation perplexity.
#   CALL 2  LSTM seeds 1 and 2, then the weight pictures of the trained LSTM (seed 1).
#   CALL 3  LSTM seeds 3 and 4.
#   CALL 4  −S-RNN and tanh RAN seed 1, then the weight pictures of both.
#
# Each call runs benchmarks/gpu_reproduce.sh (the full run with a time budget; the pictures with
# `rnn-ablations visualize` on a PTB test sentence) and merges its rows into MERGE_INTO (default
# benchmarks/results/ptb_${CONFIG}_gpu.json, with its .md and .png) with
# benchmarks/ptb_medium_merge.py.  OUT (default benchmarks/results/tmp/gpu_ptb_call<CALL>)
# receives the call's log, tables, rows and pictures; BUDGET_SECONDS (default 570) bounds the
# whole command.  A call cut by its budget continues with RESUME=1 on a machine that is still
# warm (WORK=runs/gpu_work).  Environment as in gpu_reproduce.sh (RNN_ABLATIONS_PTB, WORK,
# DEVICE, CONFIG; DEVICE=cpu CONFIG=tiny checks the commands without a GPU, as
# tests/test_lm_gpu_script.py does); VISUALIZE overrides the runs drawn.
set -o pipefail
call=${1:?usage: bash benchmarks/gpu_ptb_call.sh CALL [OUT] [BUDGET_SECONDS] (CALL 1-4)}
out=${2:-benchmarks/results/tmp/gpu_ptb_call$call}
budget=${3:-570}
config=${CONFIG:-medium}
case "$call" in
    1) variants="srnn lstm_minus_srnn_minus_hidden"; seeds=0
       lrs="srnn=0.25 srnn=0.1 srnn=0.05"; pictures="" ;;
    2) variants="lstm"; seeds="1 2"; lrs=""; pictures="lstm_s1" ;;
    3) variants="lstm"; seeds="3 4"; lrs=""; pictures="" ;;
    4) variants="lstm_minus_srnn ran"; seeds=1; lrs=""; pictures="lstm_minus_srnn_s1 ran_s1" ;;
    *) echo "gpu_ptb_call.sh: CALL must be 1, 2, 3 or 4, got $call" >&2; exit 2 ;;
esac
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
t_start=$(date +%s)
VARIANTS="$variants" SEEDS="$seeds" LRS="$lrs" VISUALIZE="${VISUALIZE-$pictures}" \
    RUNS_PER_PROCESS=${RUNS_PER_PROCESS:-1} bash benchmarks/gpu_reproduce.sh "$out" "$budget"
status=$?
rows="$out/ptb_${config}_gpu_call.json"
if [ -f "$rows" ]; then
    python3 benchmarks/ptb_medium_merge.py "${MERGE_INTO:-benchmarks/results/ptb_${config}_gpu.json}" \
        "$rows" --device-time $(( $(date +%s) - t_start )) || status=$?
else
    echo "gpu_ptb_call.sh: no $rows (the run failed; see $out/gpu_reproduce.log)" >&2
    [ "$status" = 0 ] && status=1
fi
exit $status
