"""benchmarks/gpu_reproduce.sh and benchmarks/gpu_ptb_call.sh at tiny scale on the CPU (the
device commands of the PTB medium table, checked here so that a GPU machine only runs them):
several learning rates of one variant, the −HIDDEN variant, seeds, the weight pictures of the
trained runs, and the merge of the call's rows into the results file."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from _lm_corpus import write_ptb

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")



def _env(tmp_path, **kw):
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env.update(RNN_ABLATIONS_PTB=str(write_ptb(tmp_path / "ptb", 2400, 300)), DEVICE="cpu", CONFIG="tiny",
               WORK=str(tmp_path / "work"), OMP_NUM_THREADS="1")
    env.update(kw)
    return env


def test_the_call_for_the_s_rnn_lrs_and_hidden_runs_and_merges(tmp_path):
    """Call 1 of the plan at tiny scale: the S-RNN at three lrs and −S-RNN−HIDDEN at once, the
    weight pictures of two trained runs, the rows merged into a results file."""
    out = tmp_path / "out"
    target = tmp_path / "ptb_tiny_gpu.json"
    env = _env(tmp_path, MERGE_INTO=str(target), VISUALIZE="lstm_minus_srnn_minus_hidden_s0")
    p = subprocess.run(["bash", "benchmarks/gpu_ptb_call.sh", "1", str(out), "200"], cwd=REPO,
                       env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    call = json.loads((out / "ptb_tiny_gpu_call.json").read_text())
    runs = {(r["variant"], r["seed"], r["learning_rate"]) for r in call["rows"]}
    assert runs == {("srnn", 0, 0.25), ("srnn", 0, 0.1), ("srnn", 0, 0.05),
                    ("lstm_minus_srnn_minus_hidden", 0, 1.0)}
    assert all(r["status"] == "complete" for r in call["rows"])
    for r in ("lstm_minus_srnn_minus_hidden_s0",):
        assert (out / f"visualize_{r}.png").stat().st_size > 1000
        norms = json.loads((out / f"visualize_{r}.json").read_text())
        assert norms
    merged = json.loads(target.read_text())
    assert len(merged["rows"]) == 4 and len(merged["calls"]) == 1
    assert (tmp_path / "ptb_tiny_gpu.md").exists() and (tmp_path / "ptb_tiny_gpu.png").exists()
    srnn = [s for s in merged["summary"] if s["variant"] == "srnn"][0]
    assert srnn["learning_rate"] in (0.25, 0.1, 0.05) and "lr lowered" in srnn["note"]
    # a second call's rows are added, and a row of the same run replaced, not doubled
    p = subprocess.run([sys.executable, "benchmarks/ptb_medium_merge.py", str(target),
                        str(out / "ptb_tiny_gpu_call.json"), "--device-time", "100"], cwd=REPO,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    merged = json.loads(target.read_text())
    assert len(merged["rows"]) == 4 and len(merged["calls"]) == 2
