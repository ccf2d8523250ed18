"""Language-model checkpoints and runs: checksum verified on resume / evaluate / visualize, atomic
writes, Ctrl-C during `lm train` and `ablate`, --resume of a missing directory, the files that
--max-steps writes, the progress bar's ETA, a non-UTF-8 corpus."""
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from rnn_ablations.cli import main
from rnn_ablations.lm import LanguageModel, SyntheticSpec, get_config, load_checkpoint, synthetic_corpus, train_lm
from rnn_ablations.lm.interrupt import TrainingInterrupted

REPO = Path(__file__).resolve().parents[2]
SPEC = SyntheticSpec(train_sentences=120, valid_sentences=15, test_sentences=15)
TINY = ["--config", "tiny", "--corpus-sentences", "120", "--no-progress"]

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def corpus():
    return synthetic_corpus(SPEC)


def _flip_middle(path: Path, n: int = 8) -> None:
    data = bytearray(path.read_bytes())
    mid = len(data) // 2
    for k in range(mid, mid + n):
        data[k] ^= 0xFF
    path.write_bytes(bytes(data))


# ------------------------------------------------------------------------------------ checksum
def test_flipped_bytes_are_refused_by_resume_evaluate_and_visualize(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["lm", "train", "--variant", "ran", "--out", str(run), "--max-steps", "3"]
                + TINY) == 0
    ck = load_checkpoint(run)             # a good checkpoint loads (and carries its checksum)
    assert len(ck["sha256"]) == 64
    capsys.readouterr()
    _flip_middle(run / "checkpoint.pt")
    with pytest.raises(ValueError, match="damaged"):
        load_checkpoint(run)

    assert main(["lm", "evaluate", str(run)]) == 2
    err = capsys.readouterr().err
    assert "checkpoint.pt" in err and "damaged" in err
    assert main(["lm", "train", "--variant", "ran", "--out", str(run), "--resume"] + TINY) == 2
    err = capsys.readouterr().err
    assert "checkpoint.pt" in err and "damaged" in err
    assert main(["visualize", "--model", str(run), "--text", "the cat", "--json",
                 str(tmp_path / "v.json")]) == 2
    err = capsys.readouterr().err
    assert "checkpoint.pt" in err and "damaged" in err
    assert not (tmp_path / "v.json").exists()


def test_the_checksum_sees_a_changed_tensor_value(tmp_path, corpus):
    """Flipping the payload of a weight (the zip structure intact) is caught by the checksum."""
    train_lm("ran", get_config("tiny", epochs=1), corpus, tmp_path / "r", log=None, max_steps=2)
    path = tmp_path / "r" / "checkpoint.pt"
    ck = torch.load(path, weights_only=True)
    ck["model"]["embedding.weight"][3, 4] += 1e-6     # one value, a tiny change
    torch.save(ck, path)
    with pytest.raises(ValueError, match="do not match the SHA-256 checksum"):
        load_checkpoint(path)
    # a truncated file: a clear message too, not an unpickling traceback
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(ValueError, match="damaged, truncated"):
        load_checkpoint(path)


def test_checkpoint_without_checksum_is_read_with_a_warning(tmp_path, corpus, caplog):
    train_lm("ran", get_config("tiny", epochs=1), corpus, tmp_path / "r", log=None, max_steps=2)
    path = tmp_path / "r" / "checkpoint.pt"
    ck = torch.load(path, weights_only=True)
    del ck["sha256"]
    torch.save(ck, path)
    with caplog.at_level("WARNING", logger="rnn_ablations.lm.checkpoints"):
        assert load_checkpoint(path)["variant"] == "ran"
    assert "no checksum" in caplog.text


# -------------------------------------------------------------------------------- atomic writes
def test_a_failed_write_leaves_the_previous_checkpoint(tmp_path, corpus, monkeypatch):
    cfg = get_config("tiny", epochs=1)
    run = tmp_path / "r"
    train_lm("ran", cfg, corpus, run, log=None, max_steps=2)
    before = (run / "checkpoint.pt").read_bytes()
    real_save = torch.save

    def failing_save(obj, f, *a, **k):
        real_save(obj, f, *a, **k)
        f.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", failing_save)
    with pytest.raises(OSError, match="disk full"):
        train_lm("ran", cfg, corpus, run, log=None, resume=True, max_steps=4)
    monkeypatch.setattr(torch, "save", real_save)
    assert (run / "checkpoint.pt").read_bytes() == before          # untouched
    assert load_checkpoint(run)["global_step"] == 2
    assert sorted(p.name for p in run.iterdir()) == ["checkpoint.pt", "result.json", "train.log"]
    # the temporary file of a process killed during a write is removed by the next run
    (run / ".checkpoint.pt.x1y2.tmp").write_bytes(b"half a checkpoint")
    train_lm("ran", cfg, corpus, run, log=None, resume=True, max_steps=3)
    assert sorted(p.name for p in run.iterdir()) == ["checkpoint.pt", "result.json", "train.log"]
    assert load_checkpoint(run)["global_step"] == 3


# ------------------------------------------------------------------------- --resume, --max-steps
def test_resume_of_a_missing_directory_is_an_error(tmp_path, corpus, capsys):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        train_lm("ran", get_config("tiny"), corpus, tmp_path / "nope", log=None, resume=True)
    assert main(["lm", "train", "--variant", "ran", "--out", str(tmp_path / "nope"), "--resume"]
                + TINY) == 2
    assert "--resume: the run directory" in capsys.readouterr().err
    assert main(["ablate", "--variants", "ran", "--out", str(tmp_path / "nope2"), "--resume"]
                + TINY) == 2
    assert "does not exist" in capsys.readouterr().err
    assert not (tmp_path / "nope").exists() and not (tmp_path / "nope2").exists()


def test_max_steps_writes_result_and_log(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["lm", "train", "--variant", "lstm", "--out", str(run), "--max-steps", "4",
                 "--epochs", "2"] + TINY) == 0
    assert sorted(p.name for p in run.iterdir()) == ["checkpoint.pt", "result.json", "train.log"]
    res = json.loads((run / "result.json").read_text())
    assert res["complete"] is False and res["global_step"] == 4 and res["window_in_epoch"] == 4
    assert res["valid_ppl"] > 1 and res["test_ppl"] is None
    log = (run / "train.log").read_text()
    assert "config tiny" in log and "stopped after 4 windows" in log and "--resume" in log
    assert main(["lm", "train", "--variant", "lstm", "--out", str(run), "--resume", "--epochs",
                 "2"] + TINY) == 0
    res = json.loads((run / "result.json").read_text())
    assert res["complete"] is True and res["test_ppl"] > 1
    assert "resuming" in (run / "train.log").read_text()


def test_progress_bar_covers_the_whole_run(tmp_path, corpus, monkeypatch):
    tqdm = pytest.importorskip("tqdm")
    seen = []
    real = tqdm.tqdm

    def spy(*a, **k):
        seen.append(k)
        return real(*a, **dict(k, disable=True))

    monkeypatch.setattr(tqdm, "tqdm", spy)
    cfg = get_config("tiny", epochs=3)
    train_lm("ran", cfg, corpus, tmp_path / "a", log=None, progress=True, max_steps=5)
    per_epoch = (corpus.train.numel() // cfg.batch_size - 1) // cfg.num_steps
    assert seen[-1]["total"] == 5 and seen[-1]["initial"] == 0
    train_lm("ran", cfg, corpus, tmp_path / "a", log=None, progress=True, resume=True)
    assert len(seen) == 2        # one bar for the whole run, not one per epoch
    assert seen[-1]["total"] == 3 * per_epoch and seen[-1]["initial"] == 5


# ------------------------------------------------------------------------------------ Ctrl-C
def _sigint_at_window(monkeypatch, k):
    """Send SIGINT to this process during the k-th forward pass (1-based) of training."""
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        pytest.skip("SIGINT does not have Python's default handler in this test process")
    calls = {"n": 0}
    real = LanguageModel.forward

    def forward(self, *a, **kw):
        if self.training:
            calls["n"] += 1
            if calls["n"] == k:
                os.kill(os.getpid(), signal.SIGINT)
        return real(self, *a, **kw)

    monkeypatch.setattr(LanguageModel, "forward", forward)
    return calls


def test_ctrl_c_checkpoints_and_resume_is_bit_identical(tmp_path, corpus, monkeypatch):
    cfg = get_config("tiny", epochs=2, dropout=0.2)
    full = train_lm("lstm_minus_srnn", cfg, corpus, tmp_path / "full", seed=3, log=None,
                    record_losses=True)
    _sigint_at_window(monkeypatch, 7)
    with pytest.raises(TrainingInterrupted) as info:
        train_lm("lstm_minus_srnn", cfg, corpus, tmp_path / "cut", seed=3, log=None,
                 record_losses=True)
    assert isinstance(info.value, KeyboardInterrupt)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler   # restored
    ck = load_checkpoint(tmp_path / "cut")
    assert ck["global_step"] == 7 and not ck["done"]     # the window in progress was finished
    assert "interrupted (Ctrl-C)" in (tmp_path / "cut" / "train.log").read_text()
    monkeypatch.undo()
    res = train_lm("lstm_minus_srnn", cfg, corpus, tmp_path / "cut", seed=3, log=None,
                   record_losses=True, resume=True)
    a, b = load_checkpoint(tmp_path / "full"), load_checkpoint(tmp_path / "cut")
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    assert a["losses"] == b["losses"] and res["valid_ppl"] == full["valid_ppl"]


def test_ctrl_c_in_the_commands_prints_the_resume_command(tmp_path, corpus, monkeypatch, capsys):
    run = tmp_path / "run"
    args = ["lm", "train", "--variant", "ran", "--out", str(run), "--epochs", "2",
            "--set", "hidden_size=16"] + TINY
    _sigint_at_window(monkeypatch, 3)
    assert main(args) == 130
    err = capsys.readouterr().err
    assert "Traceback" not in err and f"checkpoint {run / 'checkpoint.pt'} written" in err
    line = err.strip().splitlines()[-1].strip()
    assert line.startswith("rnn-ablations lm train ") and line.endswith("--resume")
    monkeypatch.undo()
    assert main(shlex.split(line)[1:]) == 0                 # the printed command continues it
    assert json.loads((run / "result.json").read_text())["complete"] is True

    out = tmp_path / "abl"
    args = ["ablate", "--variants", "ran", "lstm", "--out", str(out), "--epochs", "1"] + TINY
    per_epoch = (corpus.train.numel() // 8 - 1) // 10        # the tiny config: batch 8 × 10 steps
    calls = _sigint_at_window(monkeypatch, per_epoch + 3)    # during the second variant (lstm)
    assert main(args) == 130
    assert calls["n"] == per_epoch + 3
    err = capsys.readouterr().err
    line = err.strip().splitlines()[-1].strip()
    assert line.startswith("rnn-ablations ablate ") and line.endswith("--resume")
    assert "--variants ran lstm" in line
    assert json.loads((out / "ran" / "result.json").read_text())["complete"] is True
    assert not load_checkpoint(out / "lstm")["done"]
    monkeypatch.undo()
    assert main(shlex.split(line)[1:]) == 0
    assert [r["variant"] for r in json.loads((out / "results.json").read_text())["results"]] == \
        ["ran", "lstm"]


def test_sigint_to_a_training_process(tmp_path):
    """The real thing: SIGINT to `rnn-ablations lm train` in a child process.  The child gets
    SIGINT's default disposition back: a test run started in the background of a
    non-interactive shell (`bash .ci/run &`) inherits SIGINT ignored, and a Python started so
    ignores Ctrl-C (it then ran all its epochs and exited 0).  Far more epochs than it will
    run, so that the signal cannot come after the end."""
    run = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "rnn_ablations.cli", "lm", "train", "--variant", "ran", "--config",
         "tiny", "--epochs", "5000", "--set", "hidden_size=16", "--corpus-sentences", "300",
         "--no-progress", "--out", str(run)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.time() + 150
        while time.time() < deadline:
            log = run / "train.log"
            if log.exists() and "epoch 1/5000" in log.read_text():
                break
            if proc.poll() is not None:
                break
            time.sleep(0.2)
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err and "Continue the run with:" in err
    assert err.strip().splitlines()[-1].strip().endswith("--resume")
    ck = load_checkpoint(run)
    assert ck["epoch"] >= 1 and not ck["done"]


# ----------------------------------------------------------------------------- corpus encoding
def test_non_utf8_data_file_is_named(tmp_path, capsys):
    d = tmp_path / "data"
    d.mkdir()
    (d / "ptb.train.txt").write_bytes(b"the cat sat\nle caf\xe9 noir\n")
    (d / "ptb.valid.txt").write_text("the cat\n")
    assert main(["lm", "train", "--variant", "ran", "--config", "tiny", "--data", str(d),
                 "--out", str(tmp_path / "o"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "ptb.train.txt" in err and "not UTF-8" in err and "line 2" in err and "0xe9" in err


# ------------------------------------------------------------------ a finished run resumes to itself
def test_resume_of_a_finished_run_changes_nothing(tmp_path, capsys):
    run = tmp_path / "run"
    args = ["lm", "train", "--variant", "lstm", "--out", str(run), "--epochs", "2"] + TINY
    assert main(args + ["--max-steps", "4"]) == 0
    files = {f: (run / f).read_bytes() for f in ("checkpoint.pt", "result.json")}
    for _ in range(2):   # stopped by --max-steps 4: resumed with the same limit, it stays at 4
        assert main(args + ["--max-steps", "4", "--resume"]) == 0
        assert load_checkpoint(run)["global_step"] == 4
        assert {f: (run / f).read_bytes() for f in files} == files
    assert "nothing left to train" in capsys.readouterr().out
    assert main(args + ["--resume"]) == 0          # no limit: trains to the end
    res = json.loads((run / "result.json").read_text())
    assert res["complete"] is True
    files = {f: (run / f).read_bytes() for f in ("checkpoint.pt", "result.json")}
    for extra in ([], ["--max-steps", "2"], ["--max-steps", "1000"]):   # complete: unchanged
        assert main(args + ["--resume"] + extra) == 0
        assert {f: (run / f).read_bytes() for f in files} == files


def test_a_crash_and_resume_chain_ends_at_max_steps(tmp_path, corpus, monkeypatch):
    """A run asked for 12 windows, killed after its checkpoint at window 6 and resumed (three
    times) ends at 12 windows, with the parameters of an uninterrupted 12-window run."""
    cfg = get_config("tiny", epochs=3)
    ref = tmp_path / "ref"
    train_lm("ran", cfg, corpus, ref, log=None, max_steps=12)
    real = LanguageModel.forward
    calls = {"n": 0}

    def forward(self, *a, **kw):
        if self.training:
            calls["n"] += 1
            if calls["n"] == 8:
                raise RuntimeError("killed")
        return real(self, *a, **kw)

    monkeypatch.setattr(LanguageModel, "forward", forward)
    cut = tmp_path / "cut"
    with pytest.raises(RuntimeError, match="killed"):
        train_lm("ran", cfg, corpus, cut, log=None, max_steps=12, checkpoint_every=3)
    monkeypatch.setattr(LanguageModel, "forward", real)
    assert load_checkpoint(cut)["global_step"] == 6
    for _ in range(3):
        assert train_lm("ran", cfg, corpus, cut, log=None, max_steps=12, resume=True,
                        checkpoint_every=3) is None
        assert load_checkpoint(cut)["global_step"] == 12
    assert json.loads((cut / "result.json").read_text())["global_step"] == 12
    a, b = load_checkpoint(ref)["model"], load_checkpoint(cut)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)
