"""`rnn-ablations reproduce ptb` and the static (CUDA-graph) training step.

On the CPU: the static step run eagerly equals the trainer's own step bit for bit; the static
evaluator equals `evaluate`; a deadline stops training like max_steps; the command trains two
variants in two processes, is killed mid-run, resumes and ends with exactly the uninterrupted
result; the tables mark diverged and incomplete runs.  On CUDA (skipped without it): the graphed
step against the eager one, and bit-identical resume with graphs."""
import json
import math
import os
import re
import signal
import time
from pathlib import Path

import pytest
import torch

from _lm_corpus import write_ptb
from rnn_ablations.lm import SyntheticSpec, get_config, load_checkpoint, synthetic_corpus, train_lm
from rnn_ablations.lm.graph_step import StaticEvaluator, StaticTrainStep
from rnn_ablations.lm.model import LanguageModel
from rnn_ablations.lm.distributed import DistContext
from rnn_ablations.lm.evaluation import evaluate
from rnn_ablations.lm.reproduce import reproduce_ptb, row_of
from rnn_ablations.lm.reproduce_child import child_train
from rnn_ablations.lm.reproduce_report import PAPER_TEST_PPL, format_results, write_results
from rnn_ablations.lm.reproduce_timing import run_timing

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.usefixtures("one_thread")

SPEC = SyntheticSpec(train_sentences=120, valid_sentences=15, test_sentences=15)


@pytest.fixture(scope="module")
def corpus():
    return synthetic_corpus(SPEC)


def _cfg(**kw):
    base = dict(dropout=0.3, epochs=2, decay_after=1, hidden_size=24)
    base.update(kw)
    return get_config("tiny", **base)


def _same_params(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# ------------------------------------------------------------------ the static step (CPU)
def test_static_step_equals_the_trainer_step_bit_for_bit(corpus, tmp_path):
    """`cuda_graph="on"` on the CPU runs the static step (what a graph captures) eagerly: with
    dropout, over two epochs (an lr decay), it gives exactly the trainer's eager result."""
    cfg = _cfg()
    r_off = train_lm("lstm", cfg, corpus, tmp_path / "off", seed=3, cuda_graph="off", log=None)
    r_on = train_lm("lstm", cfg, corpus, tmp_path / "on", seed=3, cuda_graph="on", log=None)
    assert _same_params(load_checkpoint(tmp_path / "off")["model"],
                        load_checkpoint(tmp_path / "on")["model"])
    for key in ("valid_ppl", "test_ppl", "train_ppl"):
        assert r_on[key] == r_off[key], key
    assert [h["train_ppl"] for h in r_on["history"]] == [h["train_ppl"] for h in r_off["history"]]


def test_static_step_resumes_mid_epoch_bit_identically(corpus, tmp_path):
    cfg = _cfg(epochs=2)
    full = train_lm("ran", cfg, corpus, tmp_path / "full", seed=1, cuda_graph="on", log=None)
    assert train_lm("ran", cfg, corpus, tmp_path / "cut", seed=1, cuda_graph="on", log=None,
                    max_steps=7) is None
    assert load_checkpoint(tmp_path / "cut")["step"] == 7
    resumed = train_lm("ran", cfg, corpus, tmp_path / "cut", seed=1, cuda_graph="on", log=None,
                       resume=True)
    assert _same_params(load_checkpoint(tmp_path / "full")["model"],
                        load_checkpoint(tmp_path / "cut")["model"])
    assert resumed["test_ppl"] == full["test_ppl"] and resumed["train_ppl"] == full["train_ppl"]


def test_static_step_update_is_sgd_with_clipping():
    """One static step against a hand-written one: loss, global-norm clip, p -= lr * g."""
    torch.manual_seed(0)
    model = LanguageModel("lstm_minus_srnn", 30, 16, 2, dropout=0.0, init_scale=0.5)
    ref = LanguageModel("lstm_minus_srnn", 30, 16, 2, dropout=0.0, init_scale=0.5)
    ref.load_state_dict(model.state_dict())
    x = torch.randint(0, 30, (6, 4))
    y = torch.randint(0, 30, (6, 4))
    st = StaticTrainStep(model, 6, 4, max_grad_norm=0.25, gen=None)
    st.begin(None, torch.zeros(2, dtype=torch.float64), 0.7)
    loss = st.step(x, y)
    logits, _ = ref(x)
    l_ref = torch.nn.functional.cross_entropy(logits.reshape(-1, 30), y.reshape(-1),
                                              reduction="none").view(6, 4).mean(1).sum()
    grads = torch.autograd.grad(l_ref, list(ref.parameters()))
    norm = torch.sqrt(sum((g.double() ** 2).sum() for g in grads))
    assert norm > 0.25   # the clip is active
    for p, p_ref, g in zip(model.parameters(), ref.parameters(), grads):
        expected = p_ref.detach().double() - 0.7 * g.double() * (0.25 / float(norm))
        torch.testing.assert_close(p.detach().double(), expected, rtol=1e-5, atol=1e-6)
    assert float(loss.detach()) == pytest.approx(float(l_ref.detach()) / 6, rel=1e-6)
    assert float(st.partial()[1]) == 24.0


def test_replay_check_compares_the_replayed_values_not_the_restored_ones():
    """The check that a captured step equals the eager one (run on CUDA before a graph is used)
    with a stand-in graph whose replay is the eager step: it must pass, and a replay that does
    nothing must be refused.  (The first version compared the live tensors after restoring the
    snapshot into them, so on the H200 every capture was refused as "graph moved 0".)"""
    from rnn_ablations.lm.graph_step import _Snapshot

    torch.manual_seed(0)
    model = LanguageModel("ran", 30, 16, 2, dropout=0.3, init_scale=0.5)
    gen = torch.Generator().manual_seed(3)
    st = StaticTrainStep(model, 6, 4, max_grad_norm=5.0, gen=gen, rows=(0, 4, 4))
    st.begin(None, torch.zeros(2, dtype=torch.float64), 0.5)
    with torch.no_grad():
        st.x.copy_(torch.randint(0, 30, (6, 4)))
        st.y.copy_(torch.randint(0, 30, (6, 4)))
    model.train()
    before = [p.detach().clone() for p in model.parameters()]

    class EagerReplay:
        def replay(self):
            st._step()

    class NoOp:
        def replay(self):
            pass

    snap = _Snapshot(st)
    st._check(EagerReplay(), snap)   # same dropout masks (generator restored): agrees
    for p, b in zip(model.parameters(), before):
        assert torch.equal(p.detach(), b)   # and everything is restored afterwards
    with pytest.raises(RuntimeError, match="disagrees with the eager step"):
        st._check(NoOp(), _Snapshot(st))


def test_static_evaluator_equals_evaluate(corpus):
    torch.manual_seed(0)
    model = LanguageModel("lstm", len(corpus.vocab), 24, 2, dropout=0.3)
    ref = evaluate(model, corpus.valid, 4, 10)
    got = StaticEvaluator(model, 10, 4).evaluate(corpus.valid)
    assert got == ref
    assert model.training   # restored


def test_deadline_stops_training_like_max_steps(corpus, tmp_path):
    cfg = _cfg(epochs=3)
    assert train_lm("srnn", cfg, corpus, tmp_path / "r", seed=0, log=None,
                    deadline=time.time() - 1) is None
    ck = load_checkpoint(tmp_path / "r")
    assert (ck["epoch"], ck["step"], ck["done"]) == (0, 0, False)   # nothing trained after it


def test_cuda_graph_mode_is_checked(corpus, tmp_path):
    with pytest.raises(ValueError, match="--cuda-graph must be one of"):
        train_lm("lstm", _cfg(), corpus, tmp_path / "x", cuda_graph="maybe", log=None)


# ------------------------------------------------------------------ the tables
def _row(variant, status, epochs, valid, test, **kw):
    return dict({"variant": variant, "seed": 0, "paper_name": variant, "epochs": epochs,
                 "epochs_planned": 39, "valid_ppl": valid, "test_ppl": test, "seconds": 12.0,
                 "status": status, "learning_rate": 1.0, "step_mode": "graph"}, **kw)


def test_tables_mark_diverged_and_incomplete_runs_beside_the_papers(tmp_path):
    results = {"device": "test device", "config": "medium", "epochs_planned": 39, "data": "d",
               "max_parallel": 3, "runs": 3, "time_budget_s": 100.0, "wall_seconds": 99.0,
               "cuda_graph": "auto",
               "rows": [_row("lstm", "complete", 39, 86.5, 83.0),
                        _row("srnn", "diverged", 39, None, None, valid_ppl_raw=3.2e7),
                        _row("ran", "incomplete", 12.5, 120.25, 117.5)]}
    write_results(results, tmp_path)
    md = (tmp_path / "results.md").read_text()
    assert "| srnn |" in md and "| diverged | diverged |" in md and "3.2e" not in md
    assert "12.50 of 39" in md and "incomplete" in md and "cut by the time budget" in md
    assert "83.9 ± 0.3" in md and "82.7" in md and "140.9" in md and "81.6" in md and "81.9" in md
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["device"] == "test device"
    assert [set(r) >= {"variant", "epochs", "valid_ppl", "test_ppl", "seconds"}
            for r in data["rows"]] == [True] * 3
    assert (tmp_path / "results.png").stat().st_size > 1000
    assert "acl_test_ppl" in (tmp_path / "results.csv").read_text().splitlines()[0]
    assert "diverged" in format_results(results)
    # the papers' numbers (Levy et al. 2018 and the RAN paper, PTB large)
    assert PAPER_TEST_PPL["large"]["lstm_minus_srnn"]["acl"] == 76.0
    assert PAPER_TEST_PPL["large"]["identity_ran"]["ran"] == 83.2


def test_reproduce_rejects_bad_input(tmp_path):
    d = write_ptb(tmp_path / "ptb", 400, 100)
    with pytest.raises(ValueError, match="--config must be one of"):
        reproduce_ptb("synthetic", d, tmp_path / "o")
    with pytest.raises(ValueError, match="needs --data"):
        reproduce_ptb("tiny", None, tmp_path / "o")
    with pytest.raises(ValueError, match="--seeds has repeats"):
        reproduce_ptb("tiny", d, tmp_path / "o", seeds=[1, 1])
    with pytest.raises(ValueError, match="unknown variant|Unknown variant|variant"):
        reproduce_ptb("tiny", d, tmp_path / "o", variants=["gru"])
    (d / "ptb.test.txt").unlink()
    with pytest.raises(ValueError, match="has no test file"):
        reproduce_ptb("tiny", d, tmp_path / "o")


# ------------------------------------------------------------------ the command, killed
def _reference(data: Path, variant: str, out: Path, epochs: int = 2):
    """What a run of the command computes, trained here without interruption."""
    from rnn_ablations.lm import load_corpus
    cfg = get_config("tiny", epochs=epochs).for_variant(variant)
    r = train_lm(variant, cfg, load_corpus(data), out, seed=0, log=None)
    return r, load_checkpoint(out)["model"]


@pytest.mark.slow  # trains end to end
def test_reproduce_killed_mid_run_resumes_to_the_uninterrupted_result(tmp_path):
    """Two variants in two processes; the training processes are killed (SIGKILL) once one has
    checkpointed (the table then says failed); --resume (the two runs in threads of one process)
    ends with exactly the uninterrupted result."""
    import threading
    data = write_ptb(tmp_path / "ptb", 2400, 300)
    out = tmp_path / "cut"
    kw = dict(variants=["lstm", "ran"], device="cpu", max_parallel=2, threads=1, epochs=2,
              checkpoint_every=5)
    pids, first = {}, []

    def log(line):
        m = re.match(r"started (\S+) \(pid (\d+)\)", line)
        if m:
            pids[m.group(1)] = int(m.group(2))

    th = threading.Thread(target=lambda: first.append(reproduce_ptb("tiny", data, out, log=log,
                                                                    **kw)))
    th.start()
    ckpts = [out / r / "checkpoint.pt" for r in ("lstm_s0", "ran_s0")]
    t0 = time.time()
    while not any(p.exists() for p in ckpts):
        assert th.is_alive(), "the command ended before any checkpoint"
        assert time.time() - t0 < 300, "no checkpoint within 300 s"
        time.sleep(0.01)
    for pid in list(pids.values()):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    th.join(timeout=300)
    assert first and any(r["status"] == "failed" for r in first[0]["rows"])
    assert "failed" in (out / "results.md").read_text()
    states = [load_checkpoint(p) for p in ckpts if p.exists()]
    assert not all(s["done"] for s in states)
    # the same --out without --resume is refused, with the fix in the message
    from rnn_ablations.cli import main
    args = ["reproduce", "ptb", "--config", "tiny", "--data", str(data), "--out", str(out),
            "--variants", "lstm", "ran", "--epochs", "2", "--device", "cpu"]
    assert main(args) == 2
    # resumed with both runs in threads of one process (one interpreter start less)
    res = reproduce_ptb("tiny", data, out, resume=True, log=None, runs_per_process=2, **kw)
    assert res["processes"] == 1
    logs = "".join((out / r / "run.log").read_text() for r in ("lstm_s0", "ran_s0"))
    assert "resuming" in logs
    for row in res["rows"]:
        ref, ref_model = _reference(data, row["variant"], tmp_path / ("ref_" + row["variant"]))
        assert (row["status"], row["epochs"]) == ("complete", 2)
        assert row["valid_ppl"] == ref["valid_ppl"] and row["test_ppl"] == ref["test_ppl"]
        assert math.isfinite(row["test_ppl"])
        assert _same_params(load_checkpoint(out / f"{row['variant']}_s0")["model"], ref_model)
    assert json.loads((out / "results.json").read_text())["rows"] == res["rows"]
    for f in ("results.md", "results.csv", "results.png"):
        assert (out / f).exists()


def test_a_run_cut_short_is_reported_incomplete_with_its_test_ppl(tmp_path):
    """The process body of a run (in this process), stopped by max_steps as by a deadline."""
    data = write_ptb(tmp_path / "ptb", 2000, 300)
    spec = {"run": "identity_ran_s0", "variant": "identity_ran", "seed": 0, "config": "tiny",
            "epochs": None, "data": str(data), "out": str(tmp_path / "identity_ran_s0"),
            "device": "cpu", "resume": False, "overwrite": False, "deadline": None,
            "cuda_graph": "auto", "checkpoint_every": 0, "max_steps": 4, "threads": 1}
    assert child_train(spec) == 0
    row = row_of(tmp_path, spec, 0)
    assert row["status"] == "incomplete" and row["epochs"] == pytest.approx(4 / 24, abs=1e-3)
    assert math.isfinite(row["test_ppl"]) and row["test_ppl"] < 100 and row["steps"] == 4
    res = {"device": row["device"], "config": "tiny", "epochs_planned": 2, "data": str(data),
           "max_parallel": 1, "runs": 1, "time_budget_s": None, "wall_seconds": 1.0,
           "cuda_graph": "auto", "rows": [row]}
    write_results(res, tmp_path)
    assert "0.17 of 2" in (tmp_path / "results.md").read_text()


def test_timing_mode_projects_the_full_run(tmp_path):
    data = write_ptb(tmp_path / "ptb", 2000, 300)
    t = run_timing("tiny", data, tmp_path / "t", variants=["srnn"], lrs=["srnn=0.1"],
                   device="cpu", steps=5, threads=1, log=None)
    (r,) = t["rows"]
    assert r["run"] == "srnn_lr0.1_s0" and r["steps"] == 5 and r["step_mode"] == "eager"
    assert r["steps_per_s"] > 0 and r["epoch_size"] == 24 and r["total_steps"] == 48
    assert r["projected_s"] > r["total_steps"] / r["steps_per_s"]
    assert t["projected_wall_s"] == r["projected_s"]
    assert "projected wall time" in (tmp_path / "t" / "timing.md").read_text()


# ------------------------------------------------------------------ CUDA
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@cuda
def test_cuda_graph_step_matches_the_eager_step(corpus, tmp_path):
    """Ten steps of the graphed trainer against the trainer's own eager loop on the GPU (the
    same dropout masks: the generator's)."""
    ctx = DistContext(device=torch.device("cuda"))
    cfg = _cfg(epochs=1)
    lines = []
    assert train_lm("lstm", cfg, corpus, tmp_path / "e", seed=2, cuda_graph="off", log=None,
                    ctx=ctx, max_steps=10) is None
    assert train_lm("lstm", cfg, corpus, tmp_path / "g", seed=2, cuda_graph="auto",
                    log=lines.append, ctx=ctx, max_steps=10) is None
    assert not any("not used" in line for line in lines), lines
    a = load_checkpoint(tmp_path / "e")
    b = load_checkpoint(tmp_path / "g")
    for k in a["model"]:
        torch.testing.assert_close(a["model"][k], b["model"][k], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(a["partial"], b["partial"], rtol=1e-6, atol=0)
    assert torch.equal(a["generator"], b["generator"])   # the replays drew as many numbers


@cuda
def test_cuda_graph_resume_is_bit_identical(corpus, tmp_path):
    ctx = DistContext(device=torch.device("cuda"))
    cfg = _cfg(epochs=2)
    full = train_lm("ran", cfg, corpus, tmp_path / "full", seed=5, cuda_graph="on", log=None,
                    ctx=ctx)
    assert train_lm("ran", cfg, corpus, tmp_path / "cut", seed=5, cuda_graph="on", log=None,
                    ctx=ctx, max_steps=9) is None
    resumed = train_lm("ran", cfg, corpus, tmp_path / "cut", seed=5, cuda_graph="on", log=None,
                       ctx=ctx, resume=True)
    assert _same_params(load_checkpoint(tmp_path / "full")["model"],
                        load_checkpoint(tmp_path / "cut")["model"])
    assert resumed["test_ppl"] == full["test_ppl"]


@cuda
def test_cuda_graph_evaluator_matches_evaluate(corpus):
    torch.manual_seed(0)
    model = LanguageModel("lstm", len(corpus.vocab), 24, 2, dropout=0.3).cuda()
    ref = evaluate(model, corpus.valid, 4, 10)
    ev = StaticEvaluator(model, 10, 4, use_graph=True)
    got = ev.evaluate(corpus.valid)
    assert ev.graph is not None, ev.failed
    assert got["ppl"] == pytest.approx(ref["ppl"], rel=1e-6)


# ------------------------------------------------------------------ time budget, --lr, --seeds
@pytest.mark.slow  # trains end to end
def test_time_budget_starts_no_run_it_cannot_fit_and_says_so(tmp_path):
    """One process at a time, three long runs, a 25 s budget: the first run is cut (its epochs
    shown), the other two are not started and are listed as not run; the command keeps the
    budget or states by how much it ran over."""
    data = write_ptb(tmp_path / "ptb", 2400, 300)
    out = tmp_path / "o"
    res = reproduce_ptb("tiny", data, out, variants=["lstm", "ran", "srnn"], device="cpu",
                        max_parallel=1, threads=1, epochs=500, time_budget=25, log=None)
    status = [r["status"] for r in res["rows"]]
    assert status == ["incomplete", "not run", "not run"]
    cut = res["rows"][0]
    assert 0 < cut["epochs"] < 500 and cut["epochs_planned"] == 500
    assert all(r["epochs"] == 0 and r["test_ppl"] is None for r in res["rows"][1:])
    assert not (out / "ran_s0" / "checkpoint.pt").exists()
    md = (out / "results.md").read_text()
    assert "| not run | not run |" in md and " of 500" in md and "not run: they could not start" in md
    # the overrun (start-up and final evaluations on a loaded machine) is stated, never hidden
    assert (res["over_budget_s"] is None) == (res["wall_seconds"] <= 25)
    if res["over_budget_s"]:
        assert "longer than its time budget" in md


@pytest.mark.slow  # trains end to end
def test_lr_and_seeds_give_one_row_per_run_and_a_summary_per_variant(tmp_path):
    """−GATES at three learning rates and the LSTM over two seeds, at tiny scale: every run is a
    row with its variant, seed and lr; the summary picks the S-RNN's lr by validation
    perplexity and gives the LSTM's mean ± std over its two seeds."""
    data = write_ptb(tmp_path / "ptb", 2000, 300)
    out = tmp_path / "o"
    res = reproduce_ptb("tiny", data, out, variants=["lstm", "srnn"], seeds=[0, 1],
                        lrs=["srnn=0.25", "srnn=0.1", "srnn=0.05"], device="cpu", threads=1,
                        epochs=1, runs_per_process=4, log=None)
    rows = res["rows"]
    assert len(rows) == 2 + 3 * 2
    assert {(r["variant"], r["seed"], r["learning_rate"]) for r in rows} == (
        {("lstm", s, 1.0) for s in (0, 1)} | {("srnn", s, lr) for s in (0, 1)
                                               for lr in (0.25, 0.1, 0.05)})
    for r in rows:
        assert r["status"] == "complete" and r["epochs"] == 1 and r["seconds"] > 0
        assert math.isfinite(r["valid_ppl"]) and math.isfinite(r["test_ppl"])
        assert r["paper_learning_rate"] == 1.0
    assert (out / "srnn_lr0.1_s1" / "checkpoint.pt").exists()
    ck = load_checkpoint(out / "srnn_lr0.05_s0")
    assert ck["config"]["learning_rate"] == 0.05
    summary = {s["variant"]: s for s in res["summary"]}
    by_lr = {}
    for r in rows:
        if r["variant"] == "srnn":
            by_lr.setdefault(r["learning_rate"], []).append(r["valid_ppl"])
    best = min(by_lr, key=lambda lr: sum(by_lr[lr]) / 2)
    assert summary["srnn"]["learning_rate"] == best and summary["srnn"]["n"] == 2
    assert "lr lowered for stability" in summary["srnn"]["note"]
    lstm_tests = [r["test_ppl"] for r in rows if r["variant"] == "lstm"]
    assert summary["lstm"]["n"] == 2
    assert summary["lstm"]["test_ppl_mean"] == pytest.approx(sum(lstm_tests) / 2)
    assert summary["lstm"]["test_ppl_std"] == pytest.approx(
        abs(lstm_tests[0] - lstm_tests[1]) / math.sqrt(2))
    # seeds differ: two different models, not one replayed
    assert lstm_tests[0] != lstm_tests[1]
    # --resume of the finished study changes no run
    before = {r["run"]: (out / r["run"] / "outcome.json").read_text() for r in rows}
    again = reproduce_ptb("tiny", data, out, variants=["lstm", "srnn"], seeds=[0, 1],
                          lrs=["srnn=0.25", "srnn=0.1", "srnn=0.05"], device="cpu", threads=1,
                          epochs=1, runs_per_process=8, resume=True, log=None)
    assert [r["test_ppl"] for r in again["rows"]] == [r["test_ppl"] for r in rows]
    assert {k: json.loads(v)["steps"] for k, v in before.items()} == {
        r["run"]: r["steps"] for r in again["rows"]}
