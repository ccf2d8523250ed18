#!/usr/bin/env bash
# Build the wheel as a user's `pip wheel .` does (isolated build: no torch there, so a pure-Python
# wheel), install it into a clean venv next to the pinned torch, and check that importing it
# compiles and uses the CPU kernel, that the configs are shipped and that `rnn-ablations ablate`
# names its missing extra.  Run by .ci/run after the tests; a few minutes (the kernel's compile).
# Usage: bash scripts/check_wheel.sh [WORKDIR]   (default: a fresh temporary folder, removed after)
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
"$W/venv/bin/python" - <<'PY'
import torch
import rnn_ablations as ra
from rnn_ablations import dispatch
assert ra.kernel_available(), dispatch._KERNEL_ERROR
assert dispatch._KERNEL_SOURCE == "compiled", dispatch._KERNEL_SOURCE
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
"$W/venv/bin/python" -c "import rnn_ablations as ra; from rnn_ablations import dispatch; assert dispatch._KERNEL_SOURCE == 'cache', dispatch._KERNEL_SOURCE"
test -f "$("$W/venv/bin/rnn-ablations" configs path bidaf_srnn)"
set +e
msg=$("$W/venv/bin/rnn-ablations" ablate --out "$W/runs" 2>&1); rc=$?
set -e
if [ "$rc" != 2 ] || ! grep -q 'pip install "rnn-ablations\[lm\]"' <<<"$msg"; then
  echo "check_wheel: ablate without [lm] should name the extra (rc=$rc): $msg"; exit 1
fi
echo "check_wheel: OK ($(basename "$whl"))"
