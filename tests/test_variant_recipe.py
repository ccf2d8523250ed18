"""CONTRIBUTING.md's "A variant that combines existing rules: one row", executed as written in a
copy of the repository: the row of its example (``lstm_identity_out``, h_t = c_t) goes into the
copy's ``variants.py``, and every file of its list of files to touch gets what the list says;
nothing else changes.  The copy's tests that iterate over the table then run in a subprocess for
the new row (and the ones that check the table as a whole): a file the recipe does not list
that a new row needs makes them fail.  The count of files CONTRIBUTING.md states is the list's."""
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import requires_kernel

ROOT = Path(__file__).resolve().parents[1]
TEXT = (ROOT / "CONTRIBUTING.md").read_text()
NAME = "lstm_identity_out"

#: the tests that iterate over the table, run in the copy: their tests of the new row, and those
#: that take no parameter (the table as a whole)
TABLE_TESTS = ["test_variant_table.py", "test_reference_equations.py", "test_golden_runs.py",
               "integrations/test_allennlp_configs.py", "integrations/test_allennlp_modules.py",
               "integrations/test_allennlp_init.py", "test_rnn_state_dict.py",
               "integrations/test_onmt_init.py", "kernels/test_bidirectional_concurrent.py",
               "test_contributing_recipe.py"]


def _listed_files():
    m = re.search(r"<!-- new-variant files[^>]*-->\n(.*?)<!-- end of new-variant files -->", TEXT,
                  re.S)
    assert m, "CONTRIBUTING.md has no list of the files a new variant touches between its markers"
    files = []
    for line in m.group(1).strip().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] == "file" or set(cells[0]) <= set("-: "):
            continue
        path = re.fullmatch(r"`([^`]+)`", cells[0])
        assert path and len(cells) == 2, f"not a row of file | what: {line!r}"
        files.append(path.group(1).replace("<name>", NAME))
    return files


FILES = _listed_files()


def _row_text():
    """The ``Variant(...)`` of the recipe's example, as CONTRIBUTING.md writes it."""
    blocks = re.findall(r"```python\n(.*?)```", TEXT, re.S)
    assert len(blocks) == 1, "CONTRIBUTING.md should hold one python example"
    m = re.search(rf"^{NAME} = (Variant\(.*?\))\nVARIANTS_TABLE\[", blocks[0], re.S | re.M)
    assert m, f"the example does not build {NAME} = Variant(...) and put it in VARIANTS_TABLE"
    return m.group(1)


def _anchored(text, anchor, new, where):
    n = text.count(anchor)
    assert n == 1, (f"{where}: the recipe's anchor is found {n} times (the text there changed: "
                    f"update this test and CONTRIBUTING.md):\n{anchor}")
    return text.replace(anchor, new)


_REFERENCE_CELL = '''

def lstm_identity_out_cell(x, h, c, Wx, Wh, b, H):
    # the LSTM without o and without the output tanh: blocks i, f, g; h_t = c_t
    def pre(k):
        return _rows(Wx, k, H) @ x + _rows(Wh, k, H) @ h + _rows(b, k, H)
    c_new = sigmoid(pre(0)) * tanh(pre(2)) + sigmoid(pre(1)) * c
    return c_new, c_new
'''


def _edit(copy: Path, path: str) -> None:
    """Write at ``path`` of the copy what CONTRIBUTING.md's list says for it."""
    f = copy / path
    if path == "rnn_ablations/variants.py":
        f.write_text(_anchored(f.read_text(), "    )\n}\n\n#: Canonical variant names",
                               "        " + _row_text() + ",\n    )\n}\n\n#: Canonical variant names",
                               path))
    elif path == "tests/test_reference_equations.py":
        text = _anchored(f.read_text(), "\n\n#: variant -> (cell,", _REFERENCE_CELL
                         + "\n\n#: variant -> (cell,", path)
        f.write_text(_anchored(text, '    "lstm": (lstm_cell, 4, 0, 4),\n',
                               '    "lstm": (lstm_cell, 4, 0, 4),\n'
                               f'    "{NAME}": (lstm_identity_out_cell, 3, 0, 3),\n', path))
    elif path == "tests/fixtures/golden_runs.json":
        pass  # written by test_the_recipe_is_enough with the command the list gives
    elif path.startswith("allennlp_configs/"):
        lstm = (copy / path.replace(NAME, "lstm")).read_text()
        f.write_text(_anchored(lstm, 'local encoder = "ablated_lstm";',
                               f'local encoder = "{NAME}";', path))
    elif path.startswith("onmt_configs/"):
        lstm = (copy / path.replace(NAME, "lstm")).read_text()
        text = _anchored(lstm, "\nencoder_type: blstm\n", f"\nencoder_type: b{NAME}\n", path)
        f.write_text(_anchored(text, "run/multi30k/blstm/", f"run/multi30k/b{NAME}/", path))
    elif path == "README.md":
        row = "| `lstm_minus_srnn_minus_hidden` | LSTM − S-RNN − HIDDEN"
        text = f.read_text()
        at = text.index(row)
        end = text.index("\n", at) + 1
        f.write_text(text[:end] + f"| `{NAME}` | LSTM with h_t = c_t | tanh(W_ch h_{{t-1}} + "
                     "W_cx x_t + b_c) | i, f | i_t∘c̃_t + f_t∘c_{t-1} | c_t |\n" + text[end:])
    elif path == "rnn_ablations/rnn.py":
        f.write_text(_anchored(f.read_text(), "        identity_ran    as ``ran`` with h_t = c_t\n",
                               "        identity_ran    as ``ran`` with h_t = c_t\n"
                               f"        {NAME}   the LSTM without o and the output tanh: "
                               "h_t = c_t\n", path))
    else:
        raise AssertionError(f"CONTRIBUTING.md lists {path}; this test does not know what to "
                             "write there")


def test_the_stated_count_is_the_list():
    stated = re.search(r"\*\*Files to touch: (\d+)\*\*: 1 code file \(`variants.py`\)", TEXT)
    assert stated, "CONTRIBUTING.md states no count of files for a new variant"
    assert int(stated.group(1)) == len(FILES) == len(set(FILES))
    code = [p for p in FILES if p.startswith("rnn_ablations/") and p.endswith(".py")
            and p != "rnn_ablations/rnn.py"]  # rnn.py: its docstring only
    assert code == ["rnn_ablations/variants.py"]
    for path in FILES:
        if NAME not in path:
            assert (ROOT / path).is_file(), f"CONTRIBUTING.md lists {path}; it does not exist"


_IGNORE = shutil.ignore_patterns("__pycache__", ".pytest_cache", "*.egg-info")


@pytest.mark.slow  # builds a copy of the package
@requires_kernel
def test_the_recipe_is_enough(tmp_path):
    copy = tmp_path / "repo"
    for folder in ("rnn_ablations", "tests", "allennlp_configs", "onmt_configs"):
        shutil.copytree(ROOT / folder, copy / folder, ignore=_IGNORE)
    for f in ("README.md", "CONTRIBUTING.md", "pyproject.toml"):
        shutil.copy(ROOT / f, copy / f)
    for path in FILES:
        _edit(copy, path)
    env = dict(os.environ, PYTHONPATH=str(copy))
    env.pop("RNN_ABLATIONS_WRITE_GOLDEN", None)
    pytest_cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x"]
    start = time.perf_counter()
    # the golden data: recorded by the command the list gives
    golden = subprocess.run(pytest_cmd + ["tests/test_golden_runs.py", "-k", "operators"],
                            cwd=copy, env=dict(env, RNN_ABLATIONS_WRITE_GOLDEN="1"),
                            capture_output=True, text=True, timeout=900)
    assert golden.returncode == 0, golden.stdout[-4000:] + golden.stderr[-2000:]
    listed = subprocess.run(pytest_cmd + ["--co"] + [f"tests/{t}" for t in TABLE_TESTS],
                            cwd=copy, env=env, capture_output=True, text=True, timeout=600)
    assert listed.returncode == 0, listed.stdout[-4000:] + listed.stderr[-2000:]
    ids = [line for line in listed.stdout.splitlines() if "::" in line
           and (NAME in line or "[" not in line)]
    assert any(NAME in i for i in ids), "no test of the copy ran the new row"
    done = subprocess.run(pytest_cmd + ids, cwd=copy, env=env, capture_output=True, text=True,
                          timeout=1200)
    assert done.returncode == 0, (f"the copy's table tests fail with the recipe applied:\n"
                                  f"{done.stdout[-6000:]}\n{done.stderr[-2000:]}")
    print(f"\n{len(ids)} table tests pass in the copy with {NAME} added "
          f"({time.perf_counter() - start:.0f} s)")
