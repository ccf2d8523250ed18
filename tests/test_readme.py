"""The README's code runs as written, and its numbers equal their results files.

* Every fenced ``bash`` block preceded by the line ``<!-- readme-test -->`` (or
  ``<!-- readme-test slow -->``) is run with ``bash -euo pipefail`` from the repository root, as
  a user would after ``bash scripts/setup.sh``; outputs go to ``runs/`` (git-ignored).  The slow
  ones (the AllenNLP trainings, about a minute each on 2 idle cores) run only with
  ``RNN_ABLATIONS_README_SLOW=1``, so that the suite's time stays bounded; the blocks for the
  real data (no marker) need the data sets and are not run.
* Every marked ``python`` block is run by this interpreter in a fresh process.
* Every table between ``<!-- table: NAME -->`` and ``<!-- /table -->`` in the README and in
  ``docs/performance.md`` is rendered again from its results files
  (``benchmarks/results_tables.py``) and must be exactly what the document holds.
* The README stays a manual: at most 300 lines, the two framework commands in its first 150, its
  relative links pointing at files that exist, and the first two commands byte-identical to the
  ones ``.ci/run`` runs."""
import importlib.util
import os
import re
import subprocess
import sys

import pytest

from conftest import REPO

README = REPO / "README.md"
MARK = re.compile(r"^<!-- readme-test( slow)? -->\n```(bash|python)\n(.*?)^```", re.M | re.S)


def _results_tables():
    spec = importlib.util.spec_from_file_location("results_tables",
                                                  REPO / "benchmarks" / "results_tables.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def blocks(language):
    text = README.read_text()
    found = []
    for m in MARK.finditer(text):
        if m.group(2) != language:
            continue
        line = text[:m.start()].count("\n") + 1
        found.append(pytest.param(m.group(3), id=f"README.md:{line}",
                                  marks=[pytest.mark.skipif(
                                      bool(m.group(1)) and os.environ.get("RNN_ABLATIONS_README_SLOW") != "1",
                                      reason="slow README block: set RNN_ABLATIONS_README_SLOW=1")]))
    return found


def test_readme_marks_blocks():
    assert len(blocks("bash")) >= 2 and len(blocks("python")) >= 1


@pytest.mark.parametrize("script", blocks("bash"))
def test_readme_bash_block_runs_as_written(script):
    needs = set(re.findall(r"\.venv/bin/([\w-]+)", script))
    missing = [n for n in needs if not (REPO / ".venv" / "bin" / n).exists()]
    if missing:
        pytest.skip(f".venv lacks {', '.join(missing)}: run `bash scripts/setup.sh` first")
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=REPO,
                          capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, f"{script}\n--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-5000:]}"


@pytest.mark.parametrize("code", blocks("python"))
def test_readme_python_block_runs_as_written(code, tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, timeout=600, env=env)
    assert proc.returncode == 0, f"{code}\n--- stderr\n{proc.stderr[-5000:]}"


@pytest.mark.parametrize("doc", ["README.md", "docs/performance.md"])
def test_tables_equal_their_results_files(doc):
    rt = _results_tables()
    tables = rt.tables_in((REPO / doc).read_text())
    if doc == "README.md":
        assert {name for name, _ in tables} >= {"speed_cpu_avx2", "speed_cpu_avx512",
                                                 "speed_cuda_h100"}
    for name, text in tables:
        assert name in rt.TABLES, f"{doc}: unknown table {name!r}"
        assert text == rt.render(name), (
            f"{doc}: table {name!r} differs from its results files "
            f"({', '.join(rt.TABLES[name].get('files', []))}); rewrite it with "
            f"`python benchmarks/results_tables.py --write {doc}`")


def test_results_tables_render_what_the_files_hold():
    """The renderer reads the numbers it prints: one cell checked against the JSON by hand."""
    import json
    rt = _results_tables()
    meta = json.loads((REPO / "benchmarks" / "results" / "speed_cuda_h100.json").read_text())
    row = next(r for r in meta["rows"] if r["model"] == "ran" and r["hidden"] == 256
               and r["dtype"] == "float32" and r["mode"] == "train")
    inf = next(r for r in meta["rows"] if r["model"] == "ran" and r["hidden"] == 256
               and r["dtype"] == "float32" and r["mode"] == "inference")
    line = next(ln for ln in rt.render("speed_cuda_h100").splitlines()
                if ln.startswith("| H = 256 | float32 |"))
    assert f"| {row['ratio_vs_nn_lstm']:.2f} / {inf['ratio_vs_nn_lstm']:.2f} |" in line


def test_readme_is_a_manual():
    lines = README.read_text().splitlines()
    assert len(lines) <= 300, f"the README has {len(lines)} lines: move detail into docs/"
    text = "\n".join(lines[:150])
    assert ".venv/bin/allennlp train" in text and ".venv/bin/onmt_train" in text, \
        "the AllenNLP and OpenNMT-py commands must be within the README's first 150 lines"
    ci = (REPO / ".ci" / "run").read_text()
    test_cmd = 'bash scripts/setup.sh && .venv/bin/python -m pytest -q -m "not slow" tests'
    slow_cmd = ".venv/bin/python -m pytest -q -m slow tests"
    assert test_cmd in ci and test_cmd in README.read_text()
    assert slow_cmd in ci and slow_cmd in README.read_text()
    assert "bash scripts/setup.sh && .venv/bin/rnn-ablations ablate --out runs/ablate" in lines


def test_documents_link_to_files_that_exist():
    docs = ["README.md", "docs/install.md", "docs/internals.md", "docs/performance.md",
            "docs/reproduction.md", "benchmarks/results/README.md"]
    for doc in (REPO / d for d in docs):
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", doc.read_text()):
            if re.match(r"[a-z]+://", target):
                continue
            assert (doc.parent / target).exists(), f"{doc.relative_to(REPO)} links to {target}"


def _expand(name):
    """``a.{md,json}`` -> ``[a.md, a.json]``."""
    m = re.match(r"^(.*)\{([^}]*)\}(.*)$", name)
    if not m:
        return [name]
    return [x for part in m.group(2).split(",") for x in _expand(m.group(1) + part + m.group(3))]


def test_results_index_names_every_entry():
    """``benchmarks/results/README.md`` names every file and folder of the results folder, and
    names nothing that is not there."""
    folder = REPO / "benchmarks" / "results"
    text = (folder / "README.md").read_text()
    named = set()
    for token in re.findall(r"`([\w.{},/-]+)`", text):
        for name in _expand(token):
            if not name.startswith(".") and "/" not in name.rstrip("/") and (re.search(r"\.(md|json|jsonl|csv|png|txt|log)$", name)
                                                or name.endswith("/")):
                named.add(name.rstrip("/"))
    entries = {p.name for p in folder.iterdir()} - {"README.md"}
    assert not entries - named, f"not in benchmarks/results/README.md: {sorted(entries - named)}"
    inside = {p.name for d in folder.iterdir() if d.is_dir() for p in d.iterdir()}
    missing = sorted(n for n in named if n not in entries and n not in inside)
    assert not missing, f"benchmarks/results/README.md names entries that are not there: {missing}"
