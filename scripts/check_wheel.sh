#!/usr/bin/env bash
# Build the wheel as a user's `pip wheel .` does (isolated build: no torch there, so a pure-Python
# wheel), install it into a clean venv next to the pinned torch, and check that importing it
# compiles and uses the CPU kernel, that the configs are shipped and that `rnn-ablations ablate`
# names its missing extra.  Then, each in a clean venv of its own with the wheel and one extra
# (`[allennlp]`, `[onmt]`) plus the framework installed with --no-deps, from empty directories
# and the installed package's configs only (the data: the repository's fixtures):
#   * AllenNLP trains the BiDAF and the parser fixtures three times, finding the encoders through
#     --include-package rnn_ablations, through a .allennlp_plugins file, and through
#     `import rnn_ablations` after `import allennlp`;
#   * OpenNMT-py runs onmt_build_vocab, onmt_train and onmt_translate on the toy config and the
#     toy data shipped in the wheel.
# Run by .ci/run after the tests; it prints the seconds of each part.
# Usage: bash scripts/check_wheel.sh [WORKDIR]   (default: a fresh temporary folder, removed after)
# CHECK_WHEEL_FRAMEWORKS="allennlp onmt" (default) names the framework checks to run ("" = none).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
if [ $# -ge 1 ]; then W=$1; mkdir -p "$W"; else W=$(mktemp -d); trap 'rm -rf "$W"' EXIT; fi
torch_pin=$(grep -E '^torch==' requirements/constraints.txt)

"$PY" -m venv "$W/venv"
echo "check_wheel: building the wheel (isolated build) in $W"
"$W/venv/bin/python" -m pip wheel -q --no-deps -w "$W/dist" "$REPO"
whl=$(ls "$W"/dist/*.whl)
case "$whl" in *-py3-none-any.whl) ;; *) echo "check_wheel: expected a pure wheel, got $whl"; exit 1;; esac
"$W/venv/bin/python" -m pip install -q "$torch_pin"
"$W/venv/bin/python" -m pip install -q -c requirements/constraints.txt "$whl"

cd "$W"   # not the checkout: the installed package only
export RNN_ABLATIONS_CACHE="$W/cache"
# a fresh install answers at once: the import and the commands that run no layer compile nothing
for cmd in "--help" "--version" "variants" "configs path onmt_toy_data" "kernels --help"; do
  start=$EPOCHREALTIME
  # shellcheck disable=SC2086  # the words of $cmd are the command's arguments
  out=$("$W/venv/bin/rnn-ablations" $cmd 2>&1) || { echo "check_wheel: rnn-ablations $cmd failed: $out"; exit 1; }
  if grep -q "compiling the CPU kernel" <<<"$out" || [ -n "$(ls -A "$RNN_ABLATIONS_CACHE" 2>/dev/null)" ]; then
    echo "check_wheel: rnn-ablations $cmd built the kernel: $out"; exit 1
  fi
  echo "check_wheel: rnn-ablations $cmd answered in $(awk "BEGIN { printf \"%.1f\", $EPOCHREALTIME - $start }") s from an empty cache"
done
"$W/venv/bin/python" -c "import rnn_ablations, sys; assert 'torch._dynamo' not in sys.modules"
[ -z "$(ls -A "$RNN_ABLATIONS_CACHE" 2>/dev/null)" ] || { echo "check_wheel: import rnn_ablations built the kernel"; exit 1; }
"$W/venv/bin/python" - <<'PY'
import torch
import rnn_ablations as ra
from rnn_ablations.kernels import registry
assert ra.kernel_available(), registry._KERNEL_ERROR   # the first use: compiled now
assert registry._KERNEL_SOURCE == "compiled", registry._KERNEL_SOURCE
m = ra.AblatedRNN("ran", 8, 16, bidirectional=True)
x = torch.randn(5, 3, 8)
with ra.use_backend("kernel"):
    out = m(x)[0]
with ra.use_backend("generic"):
    ref = m(x)[0]
torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-4)
print("check_wheel: kernel compiled on first use and used; ISA", ra.kernel_isa(),
      "of", ra.supported_kernel_isas())
PY
"$W/venv/bin/python" -c "import rnn_ablations as ra; from rnn_ablations.kernels import registry; assert registry._KERNEL_SOURCE == 'cache', registry._KERNEL_SOURCE"
built=$("$W/venv/bin/rnn-ablations" kernels build)   # the explicit build step: the cache holds it now
grep -q "already in the cache" <<<"$built" || { echo "check_wheel: rnn-ablations kernels build: $built"; exit 1; }
test -f "$("$W/venv/bin/rnn-ablations" configs path bidaf_srnn)"
set +e
msg=$("$W/venv/bin/rnn-ablations" ablate --out "$W/runs" 2>&1); rc=$?
set -e
if [ "$rc" != 2 ] || ! grep -qF 'pip install "$PKG[lm]"' <<<"$msg"; then
  echo "check_wheel: ablate without [lm] should name the extra (rc=$rc): $msg"; exit 1
fi
echo "check_wheel: core checks done in ${SECONDS}s"

FIXTURES="$REPO/tests/fixtures"
CONSTRAINTS="$REPO/requirements/constraints.txt"
framework_venv() {  # framework_venv NAME EXTRA NODEPS...: a clean venv with torch, the wheel[EXTRA], NODEPS
  local v="$W/venv-$1" extra=$2
  shift 2
  "$PY" -m venv "$v"
  "$v/bin/python" -m pip install -q "$torch_pin"
  "$v/bin/python" -m pip install -q -c "$CONSTRAINTS" "$whl[$extra]"
  "$v/bin/python" -m pip install -q --no-deps "$@"
}

for framework in ${CHECK_WHEEL_FRAMEWORKS-allennlp onmt}; do
  start=$SECONDS
  case "$framework" in
  allennlp)
    framework_venv allennlp allennlp allennlp==2.10.1 allennlp-models==2.10.1
    AV="$W/venv-allennlp/bin"
    export SQUAD_TRAIN="$FIXTURES/allennlp/squad_tiny.json" SQUAD_DEV="$FIXTURES/allennlp/squad_tiny.json"
    export UD_TRAIN="$FIXTURES/allennlp/ud_tiny.conllu" UD_DEV="$FIXTURES/allennlp/ud_tiny.conllu"
    export GLOVE_6B_100D=""
    one_epoch='{"trainer.num_epochs": 1}'
    for how in include-package plugins-file import-after; do
      run="$W/allennlp-$how"; mkdir -p "$run"; cd "$run"
      for cfg in bidaf_srnn biaffine_parser_ran; do
        path=$("$AV/rnn-ablations" configs path "$cfg")
        case "$how" in
        include-package)
          "$AV/allennlp" train "$path" -s "out-$cfg" -o "$one_epoch" --include-package rnn_ablations \
            >"$cfg.log" 2>&1 ;;
        plugins-file)
          echo rnn_ablations >.allennlp_plugins
          "$AV/allennlp" train "$path" -s "out-$cfg" -o "$one_epoch" >"$cfg.log" 2>&1 ;;
        import-after)
          "$AV/python" - "$path" "out-$cfg" "$one_epoch" >"$cfg.log" 2>&1 <<'PY' ;;
import sys
import allennlp        # AllenNLP first,
import rnn_ablations   # then the package: this import registers the encoders
from allennlp.commands import main
sys.argv = ["allennlp", "train", sys.argv[1], "-s", sys.argv[2], "-o", sys.argv[3]]
main()
PY
        esac || { tail -40 "$cfg.log"; echo "check_wheel: AllenNLP $cfg via $how failed"; exit 1; }
        test -f "out-$cfg/model.tar.gz" || { tail -40 "$cfg.log"; echo "check_wheel: no model for $cfg via $how"; exit 1; }
      done
      echo "check_wheel: AllenNLP trained bidaf_srnn and biaffine_parser_ran via $how"
    done
    # a user's config changed by one line from a stock one (no prevent_regexes): the parser's
    # nn.LSTM-style initializer regexes leave the stacked drop-in alone, as the stock encoder
    run="$W/allennlp-stock-initializer"; mkdir -p "$run"; cd "$run"
    sed '/prevent_regexes/d' "$("$AV/rnn-ablations" configs path biaffine_parser_ran)" >p.jsonnet
    "$AV/allennlp" train p.jsonnet -s out -o "$one_epoch" --include-package rnn_ablations >p.log 2>&1 ||
      { tail -40 p.log; echo "check_wheel: AllenNLP parser without prevent_regexes failed"; exit 1; }
    if grep "Initializing encoder._module" p.log; then
      echo "check_wheel: a stock initializer re-initialised the ablated encoder"; exit 1
    fi
    echo "check_wheel: a stock initializer leaves stacked_bidirectional_ran alone"
    ;;
  onmt)
    framework_venv onmt onmt OpenNMT-py==3.5.1
    OV="$W/venv-onmt/bin"
    run="$W/onmt-toy"; mkdir -p "$run"; cd "$run"
    export ONMT_TOY_DATA; ONMT_TOY_DATA=$("$OV/rnn-ablations" configs path onmt_toy_data)
    cfg=$("$OV/rnn-ablations" configs path toy_fixture)
    { "$OV/onmt_build_vocab" -config "$cfg" -n_sample -1 &&
      "$OV/onmt_train" -config "$cfg" -encoder_type bran &&
      "$OV/onmt_translate" -model runs/onmt_toy/model_step_20.pt -src "$ONMT_TOY_DATA/src-val.txt" \
        -output runs/onmt_toy/pred.txt; } >onmt.log 2>&1 || { tail -40 onmt.log; echo "check_wheel: OpenNMT-py toy run failed"; exit 1; }
    lines=$(wc -l <runs/onmt_toy/pred.txt)
    want=$(wc -l <"$ONMT_TOY_DATA/src-val.txt")
    [ "$lines" = "$want" ] || { echo "check_wheel: $lines translations for $want sentences"; exit 1; }
    echo "check_wheel: OpenNMT-py built the vocabulary, trained bran and translated $lines sentences"
    ;;
  *) echo "check_wheel: unknown framework check '$framework' (allennlp, onmt)"; exit 2 ;;
  esac
  echo "check_wheel: $framework checks took $((SECONDS - start))s"
  cd "$W"
done
echo "check_wheel: OK ($(basename "$whl")) in ${SECONDS}s"
