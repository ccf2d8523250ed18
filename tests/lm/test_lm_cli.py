"""The `lm`, `ablate` and `reproduce` commands refuse what would give a wrong number or a
traceback: changed data behind `lm evaluate RUN`, non-finite config values, an --out under a
file, a failed write."""
import errno
import json
from pathlib import Path

import pytest
import torch

from rnn_ablations.cli import main
from rnn_ablations.lm import get_config, load_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = ["--config", "tiny", "--no-progress"]


def _write_ptb(d: Path, words: int = 30, n_train: int = 2500, n_eval: int = 300) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    vocab = [f"w{i}" for i in range(words)]

    def text(n, shift):
        toks = [vocab[(3 * k + shift + k // 7) % words] for k in range(n)]
        return "\n".join(" ".join(toks[i:i + 10]) for i in range(0, n, 10)) + "\n"
    (d / "ptb.train.txt").write_text(text(n_train, 0))
    (d / "ptb.valid.txt").write_text(text(n_eval, 1))
    (d / "ptb.test.txt").write_text(text(n_eval, 2))
    return d


def _one_line_error(err: str, *words) -> None:
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    for w in words:
        assert w in lines[0], lines[0]


# ------------------------------------------------------------------ evaluate without --data
def test_evaluate_without_data_refuses_changed_training_data(tmp_path, capsys):
    data = _write_ptb(tmp_path / "ptb")
    run = tmp_path / "run"
    assert main(["lm", "train", "--variant", "ran", "--data", str(data), "--out", str(run),
                 "--max-steps", "5"] + TINY) == 0
    capsys.readouterr()
    assert main(["lm", "evaluate", str(run), "--json", str(tmp_path / "a.json")]) == 0
    before = json.loads((tmp_path / "a.json").read_text())["valid"]["ppl"]
    capsys.readouterr()

    # the training file gains words: the vocabulary rebuilt from the folder differs
    with open(data / "ptb.train.txt", "a") as f:
        f.write("brand new words here\n")
    assert main(["lm", "evaluate", str(run)]) == 2
    _one_line_error(capsys.readouterr().err, "different vocabulary", "--data")
    # the --data path refuses the same change (as it did)
    assert main(["lm", "evaluate", str(run), "--data", str(data)]) == 2
    assert "vocabulary" in capsys.readouterr().err

    # same vocabulary, other text in valid: refused too, naming --data as the deliberate way
    _write_ptb(data)   # restore
    lines = (data / "ptb.valid.txt").read_text().splitlines()
    (data / "ptb.valid.txt").write_text("\n".join(lines[::-1]) + "\n")
    assert main(["lm", "evaluate", str(run)]) == 2
    _one_line_error(capsys.readouterr().err, "changed since", "--data")

    _write_ptb(data)   # restored exactly: evaluates again, to the same number
    assert main(["lm", "evaluate", str(run), "--json", str(tmp_path / "b.json")]) == 0
    assert json.loads((tmp_path / "b.json").read_text())["valid"]["ppl"] == before


# ------------------------------------------------------------------ non-finite values
@pytest.mark.parametrize("setting", ["forget_bias=nan", "learning_rate=inf", "init_scale=inf",
                                     "max_grad_norm=nan", "lr_decay=-inf"])
def test_non_finite_config_values_are_refused(tmp_path, capsys, setting):
    assert main(["lm", "train", "--variant", "lstm", "--out", str(tmp_path / "r"),
                 "--set", setting, "--max-steps", "1"] + TINY) == 2
    _one_line_error(capsys.readouterr().err, "finite", setting.split("=")[0])
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("field,value", [("forget_bias", float("nan")),
                                         ("learning_rate", float("inf")),
                                         ("init_scale", float("inf"))])
def test_config_refuses_non_finite_values(field, value):
    with pytest.raises(ValueError, match="finite"):
        get_config("tiny", **{field: value})


# ------------------------------------------------------------------ files
def test_out_under_a_file_is_a_one_line_error(tmp_path, capsys):
    f = tmp_path / "afile"
    f.write_text("keep me")
    for cmd in (["lm", "train", "--variant", "ran", "--out", str(f / "run"), "--max-steps", "1"]
                + TINY,
                ["ablate", "--variants", "ran", "--out", str(f / "sub" / "abl")] + TINY,
                ["lm", "train", "--variant", "ran", "--out", str(f), "--max-steps", "1"] + TINY):
        assert main(cmd) == 2
        _one_line_error(capsys.readouterr().err, str(f))
    assert f.read_text() == "keep me"


def test_a_failed_write_is_a_one_line_error_and_keeps_the_checkpoint(tmp_path, capsys,
                                                                     monkeypatch):
    run = tmp_path / "run"
    args = ["lm", "train", "--variant", "ran", "--out", str(run)] + TINY
    assert main(args + ["--max-steps", "2"]) == 0
    before = (run / "checkpoint.pt").read_bytes()
    capsys.readouterr()

    def disk_full(obj, f, *a, **k):
        raise OSError(errno.ENOSPC, "No space left on device", str(run / "checkpoint.pt"))

    monkeypatch.setattr(torch, "save", disk_full)
    assert main(args + ["--resume", "--max-steps", "4"]) == 2
    _one_line_error(capsys.readouterr().err, "No space left on device", "--resume")
    monkeypatch.undo()
    assert (run / "checkpoint.pt").read_bytes() == before
    assert load_checkpoint(run)["global_step"] == 2
    # the evaluate --json path too
    assert main(["lm", "evaluate", str(run), "--json", str(tmp_path / "no" / "such" / "x.json")]) \
        == 2
    _one_line_error(capsys.readouterr().err, "x.json")
