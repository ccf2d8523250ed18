"""`rnn-ablations reproduce ptb --time-budget S` ends within S seconds even when a run's
evaluation does not fit (here: every evaluation made slow, in the child processes, by a
sitecustomize on their path): the runs still going at the end of the budget are stopped, and
the rows are still written, the cut run with the epochs it did and the perplexities it had
time for, marked cut.  Without the stop the command would wait for the evaluation."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from _lm_corpus import write_ptb

pytestmark = pytest.mark.slow  # trains under a time budget

REPO = Path(__file__).resolve().parents[2]

SLOW_EVALUATION = """
import os, time

if os.environ.get("SLOW_EVALUATION_S"):
    import rnn_ablations.lm.evaluation as _ev
    _evaluate = _ev.evaluate
    def evaluate(*args, **kwargs):
        time.sleep(float(os.environ["SLOW_EVALUATION_S"]))
        return _evaluate(*args, **kwargs)
    _ev.evaluate = evaluate
"""


def test_a_run_whose_evaluation_does_not_fit_is_stopped_and_its_row_written(tmp_path):
    budget, slow = 20, 300
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(SLOW_EVALUATION)
    env = dict(os.environ, OMP_NUM_THREADS="1", SLOW_EVALUATION_S=str(slow),
               PYTHONPATH=os.pathsep.join([str(hook), str(REPO)]))
    data = write_ptb(tmp_path / "ptb", 4000, 300)
    out = tmp_path / "run"
    t = time.time()
    # under a new SID (start_new_session): when the command overruns, it and its runs are stopped here
    p = subprocess.Popen(
        [sys.executable, "-m", "rnn_ablations.cli", "reproduce", "ptb", "--config", "tiny",
         "--data", str(data), "--variants", "srnn", "--device", "cpu", "--epochs", "50",
         "--checkpoint-every", "20", "--time-budget", str(budget), "--out", str(out)],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)
    try:
        stdout, stderr = p.communicate(timeout=budget + 60)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        stdout, stderr = p.communicate()
    took = time.time() - t
    said = stdout[-3000:] + stderr[-3000:]
    assert took < budget + 60, f"the command did not end within its budget ({took:.0f} s): {said}"
    results = json.loads((out / "results.json").read_text())
    # the command's own clock starts after the interpreter's start-up
    assert results["wall_seconds"] <= budget + 3, said
    assert "time budget: stopping srnn_s0" in stdout, said
    (row,) = results["rows"]
    # the trainer's validation when it stopped may have fitted (a perplexity above the
    # vocabulary's size, early in training, is reported as diverged); the test evaluation not
    assert row["status"] in ("incomplete", "diverged") and row["cut"] is True, row
    assert row["complete"] is False and 0 < row["epochs"] < 50 and row["test_ppl"] is None, row
    assert row["note"].startswith("cut by the time budget before its"), row
    assert "cut by the time budget (continue with --resume): srnn_s0" in stdout, said
