#!/usr/bin/env bash
# The NMT table of the ACL 2018 paper (Table 4) on one GPU: OpenNMT's default RNN model on
# Multi30k En->De (onmt_configs/multi30k_<type>.yaml, the schedule as written: 5889 steps of 64
# sentences, SGD, lr 1.0 halved every 453 steps from step 3625), every encoder type trained at once
# (one onmt_train process each, all on GPU 0, with the package's CUDA kernel), then test 2016
# translated with beam 5 and -replace_unk and scored with sacreBLEU on the tokenised lower-cased
# reference.  Run from the repository root:
#
#   bash benchmarks/gpu_nmt.sh timing [STEPS]     # first call: STEPS (300) steps of every type at
#                                                 # once; s / 100 steps and the projected time
#   bash benchmarks/gpu_nmt.sh run [BUDGET_S]     # (timing first when not measured yet) train on
#                                                 # from the last checkpoints so that the whole
#                                                 # script ends within BUDGET_S seconds (540,
#                                                 # the set-up included), translate and score the
#                                                 # runs that reached the last step; call again on
#                                                 # the warm machine until every row is complete
#
# Set-up (benchmarks/gpu_setup.sh, timed in the log): no nvcc build (the CUDA kernels compile at
# run time: `python -m rnn_ablations.kernels.cuda.precompile` first, where the checkout has it),
# the CPU kernel not compiled where the call can go without it (CPU_KERNEL), one import saying
# whether the package's CUDA kernels are in use; then OpenNMT-py and the vocabularies (the data
# preparation), each timed.
#
# A run stopped by the budget ends on its last checkpoint (every 453 steps) and the next call
# continues it with -train_from (step, optimiser and learning-rate schedule continue).  The
# checkpoints live in WORK (default runs/gpu_nmt, an ignored folder inside the repository, which
# stays on the machine between calls while it is held; checkpoints cannot be brought back).
#
# On a device call, set RESULTS=$OUT/nmt_multi30k_gpu so that the table comes back with the call
# (then merge it into benchmarks/results/ here).
#
# Environment: TYPES (default: blstm bsrnn blstm_minus_srnn bran bidentity_ran
# blstm_minus_srnn_minus_hidden), DATA (a folder holding multi30k/; default .data, i.e. copy
# ../shared/data/multi30k to .data/multi30k and carry .data), WORK, RESULTS (results prefix,
# default benchmarks/results/nmt_multi30k_gpu: .json and .md), DEVICE (cuda; cpu for a check
# without a GPU), EXTRA (more options of benchmarks/nmt_multi30k.py, e.g. for a check:
# "--subset 200 --steps 4 --onmt-opt -hidden_size 16").
#
# OpenNMT-py is not installed on the lent machines and nothing can be fetched there.  Prepare its
# wheels here once (OpenNMT-py, ConfigArgParse, pyonmttok, rapidfuzz, pyahocorasick; they travel
# in .whl: carry .whl and .data, and keep the carried tree under the 64 MiB a call takes):
#   bash benchmarks/gpu_nmt.sh wheels
# spaCy and fastText, which OpenNMT-py 3.5.1 imports only for its terminology and clean
# transforms (not used by these configs), are too large to carry: when they are missing, the
# script puts stand-ins on PYTHONPATH that refuse to be used (an ImportError naming the transform).
set -o pipefail
mode=${1:-run}
arg=${2:-}
types=${TYPES:-blstm bsrnn blstm_minus_srnn bran bidentity_ran blstm_minus_srnn_minus_hidden}
data=${DATA:-.data}
work=${WORK:-runs/gpu_nmt}
results=${RESULTS:-benchmarks/results/nmt_multi30k_gpu}
device=${DEVICE:-cuda}
python=${PYTHON:-python3}
t_start=$(date +%s)
say() { echo "[gpu_nmt +$(( $(date +%s) - t_start ))s] $*"; }

if [ "$mode" = wheels ]; then
    # here (a machine with pip and the network), for the lent machine's Python 3.12
    grep -qx /.whl/ .git/info/exclude 2>/dev/null || echo /.whl/ >> .git/info/exclude
    mkdir -p .whl
    $python -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d .whl \
        OpenNMT-py==3.5.1 ConfigArgParse==1.9.0 pyonmttok rapidfuzz pyahocorasick || exit 1
    du -sh .whl
    exit 0
fi
case "$mode" in
    timing) phase=(--phase timing --timing-steps "${arg:-300}") ;;
    run) phase=(--phase all) ;;
    *) echo "usage: bash benchmarks/gpu_nmt.sh timing [STEPS] | run [BUDGET_S] | wheels"; exit 2 ;;
esac

mkdir -p "$work" "$(dirname "$results")"
exec > >(tee -a "$work/gpu_nmt.log") 2>&1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
say "mode $mode, types: $types, data $data, work $work, device $device"
if [ "$device" != cpu ]; then
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1
fi
for f in train.lc.norm.tok.en train.lc.norm.tok.de val.lc.norm.tok.en val.lc.norm.tok.de \
         test_2016_flickr.lc.norm.tok.en test_2016_flickr.lc.norm.tok.de; do
    if [ ! -f "$data/multi30k/$f" ]; then
        say "ERROR: $data/multi30k/$f is missing: copy ../shared/data/multi30k to .data/multi30k and carry .data, or set DATA"
        exit 2
    fi
done

# ---- OpenNMT-py from the carried wheels, when the machine lacks it (timed)
t_onmt=$(date +%s)
has() { $python -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('$1') is None)" 2>/dev/null; }
if ! has onmt || ! has spacy || ! has fasttext; then
    if ! has onmt && [ -d .whl ]; then
        $python -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target /tmp/site .whl/*.whl || { say "ERROR: installing .whl failed"; exit 3; }
        export PYTHONPATH=$PYTHONPATH:/tmp/site
    fi
    for missing in spacy fasttext; do
        if ! has $missing; then
            mkdir -p /tmp/site_standins
            cat > "/tmp/site_standins/$missing.py" <<EOF
"""Stand-in: $missing is not installed here.  OpenNMT-py imports it only for the transforms
that need it (terminology: spacy, clean: fasttext), which onmt_configs/multi30k_*.yaml do not use."""
def __getattr__(name):
    raise ImportError("$missing is not installed on this machine (a stand-in let OpenNMT-py "
                      "import); the OpenNMT-py transform that needs $missing cannot run here")
EOF
            export PYTHONPATH=$PYTHONPATH:/tmp/site_standins
            say "stand-in for $missing (not installed; only unused OpenNMT-py transforms need it)"
        fi
    done
    $python -c "import onmt" || { say "ERROR: OpenNMT-py cannot be imported: run 'bash benchmarks/gpu_nmt.sh wheels' here and carry .whl"; exit 3; }
fi
say "OpenNMT-py ready in $(( $(date +%s) - t_onmt )) s"

# ---- the kernels: no nvcc build (the CUDA kernels compile at run time with NVRTC, precompiled
# here, timed); the CPU kernel only where the call needs it (benchmarks/gpu_setup.sh)
source benchmarks/gpu_setup.sh
PYTHON=$python gpu_setup_kernels "$work/setup" "$device" || { say "ERROR: the set-up failed (see above)"; exit 3; }

gpu=()
[ "$device" != cpu ] && gpu=(--gpu)
if [ "$mode" = run ]; then   # the budget counts from the start of this script (set-up included)
    left=$(( ${arg:-540} - ($(date +%s) - t_start) ))
    [ "$left" -lt 60 ] && { say "ERROR: less than 60 s of the budget left after the set-up"; exit 4; }
    phase+=(--budget "$left")
fi
had_vocab=0
[ -f "$work/run/multi30k/vocab.en" ] && [ -f "$work/run/multi30k/vocab.de" ] && had_vocab=1
t_py=$(date +%s)
export RNN_ABLATIONS_GPU_NMT="bash benchmarks/gpu_nmt.sh $mode $arg (TYPES=\"$types\"${EXTRA:+ EXTRA=\"$EXTRA\"})"
# shellcheck disable=SC2086
$python benchmarks/nmt_multi30k.py --full --concurrent --types "$(echo $types | tr ' ' ,)" \
    --data "$data" --work "$work" --results "$results" "${gpu[@]}" "${phase[@]}" $EXTRA
status=$?
if [ "$had_vocab" = 1 ]; then
    say "data preparation: the vocabularies were there from an earlier call"
elif [ -f "$work/logs/build_vocab.log" ]; then
    say "data preparation: the OpenNMT vocabularies built within $(( $(stat -c %Y "$work/logs/build_vocab.log") - t_py )) s of the start of nmt_multi30k.py ($work/logs/build_vocab.log)"
fi
say "done (exit $status); results in $results.md"
exit $status
