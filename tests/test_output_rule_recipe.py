"""CONTRIBUTING.md's "Adding an element-wise rule" executed as written, for the rule it names:
h_t = o∘c_t (called "o_cell" here).

The package's sources are copied into a temporary folder; at each place of CONTRIBUTING.md's list
(read by ``test_contributing_recipe.PLACES``) the text below is written, anchored on text that
is there today; nothing else of the copy changes.  The copy's CPU kernel is then built with the
package's own build code, and in a subprocess with the copy first on the path a row using the
rule is added to the copy's table twice (a cell that reads h_{t-1}: the step kernels; a cell
whose gates read x_t only: the element-wise scan) and checked: kernel == generic path == a
hand-written float64 cell, and a traced model against the eager one
(``tests/_output_rule_recipe_check.py``).  The copy's CUDA programs
that the rule reaches are compiled with NVRTC for sm_90.  The count CONTRIBUTING.md states is the
number of edits applied here, and the edits are only at listed places."""
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from test_contributing_recipe import PLACES, TEXT

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent

#: (file, place) of CONTRIBUTING.md's list -> (text there today, what the recipe writes instead)
EDITS = {
    ("rnn_ablations/variants.py", "OUTPUT_RULES"): (
        'OUTPUT_RULES = ("o_tanh", "tanh", "identity", "content")',
        'OUTPUT_RULES = ("o_tanh", "tanh", "identity", "content", "o_cell")'),
    ("rnn_ablations/variants.py", "_GATED_OUTPUTS"): (
        '_GATED_OUTPUTS = ("o_tanh",)',
        '_GATED_OUTPUTS = ("o_tanh", "o_cell")'),
    ("rnn_ablations/variants.py", "SPEC_OUTPUT"): (
        'SPEC_OUTPUT: Dict[str, int] = {"content": 0, "o_tanh": 1, "tanh": 2, "identity": 3}',
        'SPEC_OUTPUT: Dict[str, int] = {"content": 0, "o_tanh": 1, "tanh": 2, "identity": 3,\n'
        '                               "o_cell": 4}'),
    ("rnn_ablations/csrc/common/kernel_spec.h", "OutputRule"): (
        'kOutCell = 3 };',
        'kOutCell = 3,\n                        kOutGatedCell = 4 };'),
    ("rnn_ablations/csrc/common/kernel_spec.h", "output_rule_name"): (
        '    case kOutCell: return "identity";\n',
        '    case kOutCell: return "identity";\n'
        '    case kOutGatedCell: return "o_cell";\n'),
    ("rnn_ablations/csrc/common/kernel_spec.h", "output_has_gate"): (
        '{ return out == kOutGatedTanh; }',
        '{\n  return out == kOutGatedTanh || out == kOutGatedCell;\n}'),
    ("rnn_ablations/csrc/common/kernel_spec.h", "with_output_rule"): (
        '    case kOutCell: f(std::integral_constant<int, kOutCell>()); break;\n',
        '    case kOutCell: f(std::integral_constant<int, kOutCell>()); break;\n'
        '    case kOutGatedCell: f(std::integral_constant<int, kOutGatedCell>()); break;\n'),
    ("rnn_ablations/csrc/common/elementwise.h", "cell_output"): (
        '  if (out == kOutTanh) return tc;           // h_t = tanh(c_t)\n',
        '  if (out == kOutTanh) return tc;           // h_t = tanh(c_t)\n'
        '  if (out == kOutGatedCell) return o * c;   // h_t = o*c_t\n'),
    ("rnn_ablations/csrc/common/elementwise.h", "cell_grad"): (
        '  if (out == kOutTanh) return dc + gh * (T(1) - tc * tc);\n',
        '  if (out == kOutTanh) return dc + gh * (T(1) - tc * tc);\n'
        '  if (out == kOutGatedCell) return dc + gh * o;\n'),
    ("rnn_ablations/csrc/common/elementwise.h", "out_gate_grad"): (
        '  return gh * tc * o * (T(1) - o);  // kOutGatedTanh',
        '  if (out == kOutGatedCell) return gh * c * o * (T(1) - o);  // h_t = o*c_t\n'
        '  return gh * tc * o * (T(1) - o);  // kOutGatedTanh'),
}
RULE_NUMBER = 4

LISTED = [(path, name) for path, names in PLACES for name in names]


def test_the_recipe_is_the_list_and_its_count():
    """One edit per listed place, no edit elsewhere, and the count CONTRIBUTING.md states is
    the number of edits and of files."""
    assert len(set(LISTED)) == len(LISTED), "a place is listed twice in CONTRIBUTING.md"
    missing = sorted(set(LISTED) - set(EDITS))
    extra = sorted(set(EDITS) - set(LISTED))
    assert not missing, f"CONTRIBUTING.md lists places this test has no edit for: {missing}"
    assert not extra, f"the recipe needs edits at places CONTRIBUTING.md does not list: {extra}"
    stated = re.search(r"changes \*\*(\d+) places in (\d+) files\*\*", TEXT)
    assert stated, "CONTRIBUTING.md states no count of places for a new output rule"
    assert (int(stated.group(1)), int(stated.group(2))) == (
        len(EDITS), len({p for p, _ in EDITS})), "the stated count is not the recipe's edits"


def _apply(root: Path) -> None:
    for (path, name), (anchor, text) in EDITS.items():
        f = root / path
        assert f.is_file(), f"{path} (listed for {name}) is not in the package"
        source = f.read_text()
        n = source.count(anchor)
        assert n == 1, (f"the recipe's anchor for {name} in {path} is found {n} times "
                        f"(the text there changed: update the edit in this test and "
                        f"CONTRIBUTING.md):\n{anchor}")
        f.write_text(source.replace(anchor, text))


def test_every_anchor_is_there_once(tmp_path):
    shutil.copytree(ROOT / "rnn_ablations", tmp_path / "rnn_ablations", ignore=_IGNORE)
    _apply(tmp_path)


_IGNORE = shutil.ignore_patterns("__pycache__", "*.so", "*.pyd", "*.o", "_C.build.json*",
                                 "build", "*.egg-info")


def _names_a_rule(path: Path) -> bool:
    text = path.read_text(errors="replace")
    if path.suffix == ".py":
        return '"o_tanh"' in text or "'o_tanh'" in text
    return re.search(r"\bkOut(GatedTanh|Tanh|Cell)\b", text) is not None


def test_only_the_listed_files_enumerate_the_rules():
    """Every module that spells out the output rules (a Python literal naming one, a C++ use of
    the numbering) is among the listed files: a rule added at the listed places is complete."""
    pkg = ROOT / "rnn_ablations"
    naming = {p.relative_to(ROOT).as_posix() for p in pkg.rglob("*")
              if p.suffix in (".py", ".h", ".cpp", ".cu", ".cuh") and "__pycache__" not in p.parts
              and _names_a_rule(p)}
    listed = {p for p, _ in EDITS}
    assert naming <= listed, f"files that enumerate output rules but are not in the recipe: " \
                             f"{sorted(naming - listed)}"


def _env(copy: Path, cache: Path) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(copy), str(TESTS)])
    env["RNN_ABLATIONS_CACHE"] = str(cache)
    env.pop("RNN_ABLATIONS_BACKEND", None)
    return env


_BUILD = """
import importlib.util, sys, torch
spec = importlib.util.spec_from_file_location("copy_build", sys.argv[1])
b = importlib.util.module_from_spec(spec); spec.loader.exec_module(b)
path = b.build_into(sys.argv[2], sys.argv[3])
b.write_installed_record(path, torch.__version__)
print(path)
"""


@pytest.fixture(scope="module")
def recipe_copy(tmp_path_factory):
    """The package copied (sources only), the recipe applied, its CPU kernel built in place."""
    root = tmp_path_factory.mktemp("output_rule_recipe")
    copy = root / "src"
    shutil.copytree(ROOT / "rnn_ablations", copy / "rnn_ablations", ignore=_IGNORE)
    _apply(copy)
    copy_build = copy / "rnn_ablations" / "kernels" / "build.py"
    # the loader (kernels/loader.py) looks for the installed module in the package's folder
    out_dir = copy / "rnn_ablations"
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", _BUILD, str(copy_build), str(out_dir),
                           str(root / "build_temp")], cwd=root, env=_env(copy, root / "cache"),
                          capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, f"building the copy's CPU kernel failed:\n{done.stdout[-3000:]}" \
                                 f"\n{done.stderr[-6000:]}"
    print(f"\nthe copy's CPU kernel built in {time.perf_counter() - start:.0f} s")
    return copy, root / "cache"


@pytest.mark.slow  # builds a copy of the package
def test_the_new_rule_runs_and_matches_on_cpu(recipe_copy):
    copy, cache = recipe_copy
    done = subprocess.run([sys.executable, str(TESTS / "_output_rule_recipe_check.py"),
                           str(copy)], cwd=copy.parent, env=_env(copy, cache),
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-8000:]}"
    assert ("o_cell: kernel == generic == hand-written reference in 8 configurations; "
            "traced == eager for 2 rows") in done.stdout, done.stdout


_NVRTC = """
import sys
from rnn_ablations.kernels.cuda import cache, nvrtc, programs
missing = nvrtc.library_error()
if missing:
    print("NVRTC-MISSING", missing)
    sys.exit(0)
rule = int(sys.argv[1])
progs = [programs.Program(f, "float32", rule, hw) for f in ("scan_forward", "scan_backward")
         for hw in (False, True)]
progs += [programs.Program(f, "float32") for f in ("step_forward", "step_backward",
                                                    "persistent_forward", "persistent_backward")]
for p in progs:
    b = cache.binary(p, 90, quiet=True, force=True)
    assert b.data, p.name
print("compiled", len(progs), [p.name for p in progs])
"""


@pytest.mark.slow  # builds a copy of the package
def test_the_new_rule_compiles_for_cuda(recipe_copy):
    """The copy's CUDA programs the rule reaches (its scan instantiations; the step and
    persistent kernels read the rule at run time) compile with NVRTC for sm_90."""
    copy, cache = recipe_copy
    done = subprocess.run([sys.executable, "-c", _NVRTC, str(RULE_NUMBER)], cwd=copy.parent,
                          env=_env(copy, cache), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-8000:]}"
    if "NVRTC-MISSING" in done.stdout:
        pytest.skip(f"NVRTC cannot be loaded here: {done.stdout.strip()}")
    assert "compiled 8" in done.stdout, done.stdout
