"""SIGTERM (batch schedulers, `kill`, `docker stop`) stops `lm train` as Ctrl-C does: the window
in progress is finished, a checkpoint written, the resume command printed; the resumed run ends
at the same checkpoint as a run never stopped.  `--resume` of a folder without a checkpoint says
so instead of starting over."""
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
from rnn_ablations.lm.interrupt import TrainingInterrupted, exit_on_sigterm

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.usefixtures("one_thread")

#: far more epochs than run: --max-steps ends it (70 windows per epoch), so that the signal,
#: sent after the first epoch, cannot come after the end
ARGS = ["lm", "train", "--variant", "ran", "--config", "tiny", "--epochs", "5000", "--max-steps",
        "700", "--set", "hidden_size=16", "--corpus-sentences", "300", "--no-progress",
        "--log-losses"]


@pytest.mark.slow  # trains end to end
def test_sigterm_to_a_training_process_checkpoints_and_resumes_to_the_same_end(tmp_path, capsys):
    run = tmp_path / "cut"
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "rnn_ablations.cli"] + ARGS + ["--out", str(run)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            cwd=REPO)
    try:
        deadline = time.time() + 150
        while time.time() < deadline and proc.poll() is None:
            log = run / "train.log"
            if log.exists() and "epoch 1/5000" in log.read_text():
                break
            time.sleep(0.05)
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err[-2000:]
    assert "Traceback" not in err and "Continue the run with:" in err
    assert "interrupted (SIGTERM)" in (run / "train.log").read_text()
    cut = load_checkpoint(run)
    assert 70 <= cut["global_step"] < 700 and not cut["done"]
    line = err.strip().splitlines()[-1].strip()
    assert line.startswith("rnn-ablations lm train ") and line.endswith("--resume")

    assert main(shlex.split(line)[1:]) == 0                       # resumed to the end
    assert main(ARGS + ["--out", str(tmp_path / "full")]) == 0   # never stopped
    a, b = load_checkpoint(tmp_path / "full"), load_checkpoint(run)
    assert a["global_step"] == b["global_step"] == 700
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    assert a["losses"] == b["losses"]


def test_sigterm_replaces_the_exit_handler_while_training(tmp_path, monkeypatch):
    """`reproduce ptb`'s children exit on SIGTERM (exit_on_sigterm) until they train; while a
    run trains, SIGTERM checkpoints it like Ctrl-C, and the handler is put back after."""
    previous = signal.signal(signal.SIGTERM, exit_on_sigterm)
    try:
        calls = {"n": 0}
        real = LanguageModel.forward

        def forward(self, *a, **kw):
            if self.training:
                calls["n"] += 1
                if calls["n"] == 5:
                    os.kill(os.getpid(), signal.SIGTERM)
            return real(self, *a, **kw)

        monkeypatch.setattr(LanguageModel, "forward", forward)
        corpus = synthetic_corpus(SyntheticSpec(train_sentences=120, valid_sentences=15,
                                                test_sentences=15))
        with pytest.raises(TrainingInterrupted) as info:
            train_lm("ran", get_config("tiny", epochs=2), corpus, tmp_path / "run", log=None)
        assert info.value.signal_name == "SIGTERM"
        assert signal.getsignal(signal.SIGTERM) is exit_on_sigterm
        assert load_checkpoint(tmp_path / "run")["global_step"] == 5
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_resume_of_a_folder_without_a_checkpoint_says_so(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "train.log").write_text("ran: stopped before its first checkpoint\n")
    assert main(["lm", "train", "--variant", "ran", "--config", "tiny", "--corpus-sentences", "120",
                 "--no-progress", "--out", str(run), "--resume"]) == 2
    err = capsys.readouterr().err
    assert "holds no checkpoint (checkpoint.pt), so there is nothing to continue" in err
    assert "drop --resume" in err and not (run / "checkpoint.pt").exists()


_VALIDATION_CHILD = r"""
import os, signal, sys
from rnn_ablations.cli import main
from rnn_ablations.lm import trainer
real = trainer._Training.stopped_result
def stopped_result(self, why):   # SIGTERM while the run validates after --max-steps
    os.kill(os.getpid(), signal.SIGTERM)
    return real(self, why)
trainer._Training.stopped_result = stopped_result
sys.exit(main(sys.argv[1:]))
"""


def test_sigterm_during_the_validation_after_max_steps_prints_the_resume_command(tmp_path):
    """After --max-steps the run validates outside the training loop; SIGTERM there ends as
    Ctrl-C does (the resume command, exit status 143), not silently (-15); --resume finishes."""
    run = tmp_path / "run"
    args = ["lm", "train", "--variant", "ran", "--config", "tiny", "--max-steps", "3",
            "--corpus-sentences", "120", "--no-progress", "--out", str(run)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(REPO)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    proc = subprocess.run([sys.executable, "-c", _VALIDATION_CHILD] + args, env=env,
                          capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert proc.returncode == 143, (proc.returncode, proc.stderr[-2000:])
    assert "Continue the run with:" in proc.stderr and "--resume" in proc.stderr, proc.stderr
    assert load_checkpoint(run)["global_step"] == 3
    assert main(args + ["--resume"]) == 0
    assert (run / "result.json").exists()
