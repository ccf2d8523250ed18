#!/usr/bin/env bash
# Create .venv/ in the repository root with everything the project needs, from pinned files:
# torch 2.13 + the package (with its C++ kernel), AllenNLP 2.10.1 and OpenNMT-py 3.5.1.
# Idempotent: a second run only checks.  Usage: bash scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
PIP=".venv/bin/python -m pip"
# Every install is constrained to the exact versions of a working environment
# (requirements/constraints.txt, made with `pip freeze` minus the --no-deps packages and this one).
C="-c requirements/constraints.txt"
stamp=.venv/.rnn_ablations_setup
shopt -s globstar  # csrc/** : the kernel sources in every sub-folder
want=$(cat requirements/*.txt setup.py pyproject.toml rnn_ablations/kernels/build.py rnn_ablations/csrc/**/*.cpp \
  rnn_ablations/csrc/**/*.cuh rnn_ablations/csrc/**/*.h | sha1sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && .venv/bin/python -c "import rnn_ablations._C" 2>/dev/null; then
  echo "setup: .venv is up to date"
  exit 0
fi
$PIP install -q $C -r requirements/core.txt
# (pip then prints "dependency conflicts" about their declared pins: expected, see docs/install.md)
$PIP install -q --no-deps -r requirements/allennlp-nodeps.txt
$PIP install -q $C -r requirements/allennlp.txt
$PIP install -q --no-deps -r requirements/onmt-nodeps.txt
$PIP install -q $C -r requirements/onmt.txt
# The kernel is compiled now against the installed torch: no build isolation (a plain
# `pip install .` would compile it on first use instead; docs/install.md).
$PIP install -q --no-build-isolation --no-deps -e .
.venv/bin/python -c "
import rnn_ablations
from rnn_ablations.kernels import registry
assert registry._KERNEL_SOURCE == 'installed', (registry._KERNEL_SOURCE, registry._KERNEL_ERROR)
print('setup: rnn_ablations', rnn_ablations.__version__, 'with its CPU kernel, vector path',
      rnn_ablations.kernel_isa())"
echo "$want" > "$stamp"
