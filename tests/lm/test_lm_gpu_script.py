"""benchmarks/gpu_reproduce.sh, benchmarks/gpu_ptb_call.sh and benchmarks/gpu_setup.sh at tiny
scale on the CPU (the device commands of the PTB medium table, checked here so that a GPU machine
only runs them): the set-up (no nvcc build, each step timed in the log), several learning rates of
one variant, the −HIDDEN variant, the weight pictures of a trained run, the merge of the call's
rows into the results file (cut calls marked, resumed rows replacing them, LSTM mean ± std over
seeds, each row's GPU and seconds) and the packing of what comes back."""
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from _lm_corpus import write_ptb

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")]  # runs the GPU loan scripts' training on the CPU


def _env(tmp_path, **kw):
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env.update(RNN_ABLATIONS_PTB=str(write_ptb(tmp_path / "ptb", 2400, 300)), DEVICE="cpu", CONFIG="tiny",
               WORK=str(tmp_path / "work"), OMP_NUM_THREADS="1")
    env.update(kw)
    return env


def _merge_module():
    spec = importlib.util.spec_from_file_location("ptb_medium_merge",
                                                  REPO / "benchmarks" / "ptb_medium_merge.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_call_for_the_s_rnn_lrs_and_hidden_runs_and_merges(tmp_path):
    """Call 1 of the plan at tiny scale: the S-RNN at three lrs and −S-RNN−HIDDEN at once, the
    weight pictures of a trained run, the rows merged into a results file; the set-up and the
    data preparation timed in the log; RESUME=1 on a machine without the runs starts afresh."""
    out = tmp_path / "out"
    target = tmp_path / "ptb_tiny_gpu.json"
    env = _env(tmp_path, MERGE_INTO=str(target), VISUALIZE="lstm_minus_srnn_minus_hidden_s0",
               RESUME="1")
    p = subprocess.run(["bash", "benchmarks/gpu_ptb_call.sh", "1", str(out), "300"], cwd=REPO,
                       env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    log = (out / "gpu_reproduce.log").read_text()
    for said in ("CUDA kernels: not precompiled (device cpu)", "import rnn_ablations:",
                 "set-up done in", "data preparation:", "RESUME=1 but no"):
        assert said in log, log[-3000:]
    assert "build_ext" not in log and "nvcc" not in log
    call = json.loads((out / "ptb_tiny_gpu_call.json").read_text())
    runs = {(r["variant"], r["seed"], r["learning_rate"]) for r in call["rows"]}
    assert runs == {("srnn", 0, 0.25), ("srnn", 0, 0.1), ("srnn", 0, 0.05),
                    ("lstm_minus_srnn_minus_hidden", 0, 1.0)}
    assert all(r["status"] == "complete" for r in call["rows"])
    assert call["resumed"] is False and call["setup_seconds"] >= 0
    # what comes back: the log, the rows, the merged table, and one tarball with the rest
    assert sorted(f.name for f in out.iterdir()) == sorted(
        ["gpu_reproduce.log", "ptb_tiny_gpu_call.json", "ptb_tiny_gpu.json", "ptb_tiny_gpu.md",
         "ptb_tiny_gpu.png", "call1.tgz"])
    with tarfile.open(out / "call1.tgz") as tar:
        names = set(tar.getnames())
        norms = json.load(tar.extractfile("visualize_lstm_minus_srnn_minus_hidden_s0.json"))
    assert {"results.json", "results.md", "visualize_lstm_minus_srnn_minus_hidden_s0.png"} <= names
    assert norms
    merged = json.loads(target.read_text())
    assert len(merged["rows"]) == 4 and len(merged["calls"]) == 1
    assert merged["calls"][0]["status"] == "complete" and merged["calls"][0]["call"] == "1"
    assert (tmp_path / "ptb_tiny_gpu.png").exists()
    srnn = [s for s in merged["summary"] if s["variant"] == "srnn"][0]
    assert srnn["learning_rate"] in (0.25, 0.1, 0.05)
    assert srnn["note"].startswith("lr chosen by validation among 0.25, 0.1, 0.05")
    assert "the papers do not state it" in srnn["note"]
    best = min((r for r in merged["rows"] if r["variant"] == "srnn"), key=lambda r: r["valid_ppl"])
    assert srnn["learning_rate"] == best["learning_rate"]
    md = (tmp_path / "ptb_tiny_gpu.md").read_text()
    assert "| GPU | seconds |" in md and "lr chosen by validation" in md


def _row(variant, seed, valid, test, status="complete", lr=1.0, epochs=39, seconds=400.0):
    return {"variant": variant, "seed": seed, "learning_rate": lr, "paper_learning_rate": 1.0,
            "epochs": epochs, "epochs_planned": 39, "valid_ppl": valid, "test_ppl": test,
            "seconds": seconds, "status": status, "step_mode": "graph"}


def _call(rows, device="NVIDIA H200", resumed=False):
    return {"device": device, "config": "medium", "runs_at_once": len(rows), "wall_seconds": 500.0,
            "command": "bash benchmarks/gpu_ptb_call.sh", "resumed": resumed, "setup_seconds": 30,
            "cuda_kernels": True, "rows": rows}


def test_merge_cut_calls_resumes_and_lstm_seeds(tmp_path):
    """The merge on its own: a cut call's rows go in marked incomplete and the call "cut"; the
    resumed call's rows replace them; LSTM seeds give mean ± sample std; each run keeps its GPU
    and seconds; a file that is not a call's rows is refused with what to give."""
    m = _merge_module()
    merged = m.merge({}, _call([_row("lstm", 0, 86.0, 83.0)], "NVIDIA H100 80GB HBM3"), 450, "0")
    cut = _call([_row("lstm", 1, 95.0, 92.0, "incomplete", epochs=20, seconds=250.0),
                 _row("lstm", 2, 96.0, 93.0, "incomplete", epochs=20, seconds=250.0)])
    merged = m.merge(merged, cut, 540, "2")
    assert merged["calls"][-1]["status"] == "cut"
    assert "(incomplete)" in merged["calls"][-1]["runs"][0]
    lstm = merged["summary"][0]
    assert lstm["n"] == 1 and lstm["test_ppl_mean"] == 83.0  # cut seeds do not count beside a complete one
    resumed = _call([_row("lstm", 1, 87.0, 84.0, seconds=480.0), _row("lstm", 2, 88.0, 85.0)],
                    resumed=True)
    merged = m.merge(merged, resumed, 300, "2")
    assert merged["calls"][-1]["status"] == "complete" and merged["calls"][-1]["resumed"]
    assert len(merged["rows"]) == 3 and len(merged["calls"]) == 3
    lstm = merged["summary"][0]
    assert lstm["n"] == 3 and lstm["seeds"] == [0, 1, 2]
    assert lstm["test_ppl_mean"] == pytest.approx(84.0)
    assert lstm["test_ppl_std"] == pytest.approx(1.0)
    assert lstm["gpus"] == ["NVIDIA H100 80GB HBM3", "NVIDIA H200"]
    assert {r["seed"]: r["device"] for r in merged["rows"]} == {
        0: "NVIDIA H100 80GB HBM3", 1: "NVIDIA H200", 2: "NVIDIA H200"}
    target = tmp_path / "t.json"
    m.render(merged, target)
    md = target.with_suffix(".md").read_text()
    assert "84.00 ± 1.00 (n=3)" in md and "CUT by its time budget" in md and "resumed" in md
    assert "| lstm | LSTM | 1 | 1 | 39 | 87.00 | 84.00 | 83.9 ± 0.3 | 82.7 | complete | NVIDIA H200 | 480 | graph |" in md
    with pytest.raises(ValueError, match="lacks"):
        m.merge({}, {"rows": []})
    with pytest.raises(ValueError, match="not a finite number"):
        m.merge({}, _call([_row("lstm", 3, float("nan"), 80.0)]))
    with pytest.raises(ValueError, match="config"):
        m.merge(merged, dict(_call([_row("lstm", 3, 80.0, 80.0)]), config="small"))


def test_setup_on_a_machine_without_a_gpu_names_what_is_missing(tmp_path):
    """benchmarks/gpu_setup.sh for a CUDA call on this CPU machine: no nvcc build; the package's
    CUDA kernels are said not to be in use, and REQUIRE_CUDA_KERNELS=1 makes that an error."""
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    env = _env(tmp_path, REQUIRE_CUDA_KERNELS="1", PRECOMPILE_TIMEOUT="60", CPU_KERNEL="build")
    p = subprocess.run(["bash", "-c", f"source benchmarks/gpu_setup.sh && gpu_setup_kernels "
                        f"{tmp_path / 'logs'} cuda"], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 3, p.stdout + p.stderr
    assert "the package's CUDA kernels are NOT in use: torch sees no CUDA device" in p.stdout
    assert "ERROR: REQUIRE_CUDA_KERNELS=1" in p.stdout
    assert "CUDA kernels: " in p.stdout and "nvcc" not in p.stdout.replace("no nvcc build", "")


def test_the_loan_script_keeps_its_budget_and_brings_back_few_files(tmp_path):
    """benchmarks/gpu_loan.sh on the CPU: the check runs gpu_check.sh's dry run (its in-use step
    on the CUDA emulation: every kernel family ran and passed its first-use check); with too
    little budget left for PTB call 1 it says so and skips it, runs the variable-length speed
    table (tiny), and leaves at most 8 files in OUT (what a device call brings back): the
    summary, the tarball, the merged table and the speed table; a second command with RESUME=1
    skips the steps done."""
    out = tmp_path / "out"
    env = _env(tmp_path, LOAN_STATE=str(tmp_path / "state"), SPEED_S="80", KEEP_SPEED="1",
               GPU_CHECK_STEPS="in_use",
               SPEED_ARGS="--shape-spec tiny:1:6:5:bi:3 --median-length 8 --min-length 2 "
                          "--max-length 12 --batches 2 --warmup 1 --variants ran --dtype float32")
    p = subprocess.run(["bash", "benchmarks/gpu_loan.sh", str(out), "120"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    summary = (out / "summary.txt").read_text()
    assert "check: benchmarks/gpu_check.sh exit 0" in summary, summary
    for family in ("step", "scan", "persistent"):
        assert f"INFO  in_use: family {family}: [" in summary, summary
    assert "passed" in summary and "FAILED" not in summary and "eager step loop" in summary
    assert "ptb1: SKIPPED" in summary and "RESUME=1" in summary
    assert "speed: benchmarks/speed_variable_length.py exit 0" in summary, summary
    names = sorted(f.name for f in out.iterdir())
    assert names == ["loan.tgz", "speed_cpu_variable_length.json", "speed_cpu_variable_length.md",
                     "summary.txt"], names
    with tarfile.open(out / "loan.tgz") as tar:
        assert "./logs/gpu_loan.log" in tar.getnames()
    p = subprocess.run(["bash", "benchmarks/gpu_loan.sh", str(out), "120"], cwd=REPO,
                       env=dict(env, RESUME="1", STAGES="speed"), capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    summary = (out / "summary.txt").read_text()
    assert summary.count("speed: benchmarks/speed_variable_length.py") == 1  # not run again
    assert "RESUME=1" in summary.splitlines()[-2]
