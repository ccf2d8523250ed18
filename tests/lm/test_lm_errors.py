"""Clear errors from the language-model commands: a full disk while a checkpoint is written (one
line naming the file, no partial checkpoint), seeds outside torch's range, RNN_ABLATIONS_PTB
naming a missing folder."""
import os
import resource
import shutil
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from rnn_ablations.cli import main

REPO = Path(__file__).resolve().parents[2]
TRAIN = [sys.executable, "-m", "rnn_ablations.cli", "lm", "train", "--variant", "ran", "--config",
         "tiny", "--corpus-sentences", "120", "--no-progress", "--max-steps", "3"]


def _limit_file_size():
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # the write fails (EFBIG) instead
    resource.setrlimit(resource.RLIMIT_FSIZE, (20000, 20000))


@pytest.fixture
def small_filesystem(tmp_path):
    """A 40 kB tmpfs (needs root; skipped elsewhere): the disk really fills up."""
    mnt = tmp_path / f"small-{uuid.uuid4().hex[:6]}"
    mnt.mkdir()
    if shutil.which("mount") is None or os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root and mount(8)")
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=40k", "tmpfs", str(mnt)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)


def _check_full(proc, run, reason):
    err = proc.stderr
    assert proc.returncode == 2, err[-3000:]
    assert "Traceback" not in err and "enforce fail" not in err, err[-3000:]
    lines = [l for l in err.strip().splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("rnn-ablations lm: error: could not read or write")
    assert f"{str(run / 'checkpoint.pt')!r}: {reason}" in lines[0], lines[0]
    assert sorted(p.name for p in run.iterdir()) == ["train.log"]   # no partial checkpoint


def test_full_disk_during_train_is_one_line_without_a_partial_checkpoint(small_filesystem):
    run = small_filesystem / "run"
    proc = subprocess.run(TRAIN + ["--out", str(run)], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1"),
                          timeout=300)
    _check_full(proc, run, "No space left on device")


def test_file_size_limit_during_train_is_one_line_naming_the_file(tmp_path):
    run = tmp_path / "run"
    proc = subprocess.run(TRAIN + ["--out", str(run)], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1"),
                          preexec_fn=_limit_file_size, timeout=300)
    _check_full(proc, run, "File too large")


@pytest.mark.parametrize("argv,message", [
    (["reproduce", "ptb", "--config", "tiny", "--seeds", "99999999999999999999"],
     "argument --seeds: must be an integer from 0 to 18446744073709551614"),
    (["reproduce", "ptb", "--config", "tiny", "--seeds", "-1"],
     "argument --seeds: must be an integer from 0 to"),
    (["lm", "train", "--seed", "99999999999999999999"],
     "argument --seed: must be an integer from -9223372036854775808 to 18446744073709551614"),
])
def test_seeds_outside_torch_s_range_are_refused_up_front(tmp_path, capsys, argv, message):
    with pytest.raises(SystemExit) as info:
        main(argv + ["--out", str(tmp_path / "out")])
    assert info.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_ptb_variable_naming_a_missing_folder(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("RNN_ABLATIONS_PTB", str(tmp_path / "no" / "ptb"))
    assert main(["reproduce", "ptb", "--config", "tiny", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"RNN_ABLATIONS_PTB={str(tmp_path / 'no' / 'ptb')!r}" in err and "does not exist" in err
    assert "or pass --data DIR" in err and "unset it" not in err and "Traceback" not in err
    (tmp_path / "file").write_text("x")
    monkeypatch.setenv("RNN_ABLATIONS_PTB", str(tmp_path / "file"))
    assert main(["reproduce", "ptb", "--config", "tiny", "--out", str(tmp_path / "out")]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err


def test_ptb_variable_is_read_by_lm_train(tmp_path, capsys, monkeypatch):
    """docs/options.md: RNN_ABLATIONS_PTB is the default --data of `lm train` too; a bad value
    is refused there with the way out that exists for it (unset: the synthetic corpus), and
    `reproduce ptb`, which needs the data, does not offer that way out."""
    from rnn_ablations.lm import load_checkpoint
    from _lm_corpus import write_ptb
    monkeypatch.setenv("RNN_ABLATIONS_PTB", str(tmp_path / "missing"))
    assert main(["lm", "train", "--variant", "ran", "--out", str(tmp_path / "a"),
                 "--config", "tiny", "--no-progress", "--max-steps", "1"]) == 2
    err = capsys.readouterr().err
    assert "RNN_ABLATIONS_PTB=" in err and "unset it to train on the embedded synthetic" in err
    assert main(["reproduce", "ptb", "--config", "tiny", "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert "pass --data DIR" in err and "unset it" not in err, err
    data = write_ptb(tmp_path / "ptb", 2400, 300)
    monkeypatch.setenv("RNN_ABLATIONS_PTB", str(data))
    run = tmp_path / "run"
    assert main(["lm", "train", "--variant", "ran", "--out", str(run), "--config", "tiny",
                 "--no-progress", "--max-steps", "1"]) == 0
    spec = load_checkpoint(run)["corpus"]["spec"]
    assert spec == {"kind": "dir", "path": str(data.resolve())}, spec
