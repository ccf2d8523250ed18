"""`rnn-ablations ablate`: every variant on a very small embedded corpus, the outputs, and the
rules for an existing --out."""
import csv
import json
from pathlib import Path

import pytest
import torch

from rnn_ablations import VARIANTS
from rnn_ablations.cli import main
from rnn_ablations.lm.ablate import format_table, parse_variants

SMALL = ["--config", "tiny", "--epochs", "1", "--corpus-sentences", "80", "--no-progress"]


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: see conftest.one_thread


def test_ablate_writes_csv_json_png_with_one_row_per_variant(tmp_path, capsys):
    out = tmp_path / "ab"
    assert main(["ablate", "--out", str(out)] + SMALL) == 0
    printed = capsys.readouterr().out
    for v in VARIANTS:
        assert v in printed
    assert "valid ppl" in printed and "test ppl" in printed and "train words/s" in printed

    with open(out / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["variant"] for r in rows] == list(VARIANTS)
    for r in rows:
        assert float(r["valid_ppl"]) > 1 and float(r["test_ppl"]) > 1
        assert int(r["recurrent_params"]) > 0 and float(r["train_words_per_sec"]) > 0
        assert r["config"] == "tiny" and r["seed"] == "0"
    data = json.loads((out / "results.json").read_text())
    assert [r["variant"] for r in data["results"]] == list(VARIANTS)
    assert {r["paper_name"] for r in data["results"]} >= {"LSTM", "LSTM − GATES (S-RNN)"}
    png = (out / "results.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    assert (out / "results.md").read_text().count("\n|") >= 6
    for v in VARIANTS:
        assert (out / v / "checkpoint.pt").exists()
    # the parameter column is the variants' recurrent parameter count
    params = {r["variant"]: int(r["recurrent_params"]) for r in rows}
    assert params["lstm"] > params["lstm_minus_srnn"] > params["ran"] == params["identity_ran"] \
        > params["lstm_minus_srnn_minus_hidden"] > params["srnn"]

    # an existing --out is never overwritten silently
    assert main(["ablate", "--out", str(out)] + SMALL) == 2
    err = capsys.readouterr().err
    assert "already holds ablation results" in err and "--resume" in err and "--overwrite" in err
    before = (out / "results.json").read_text()
    # --resume reuses the finished runs: same numbers
    assert main(["ablate", "--out", str(out), "--resume"] + SMALL) == 0
    capsys.readouterr()
    again = json.loads((out / "results.json").read_text())
    assert [r["valid_ppl"] for r in again["results"]] == [r["valid_ppl"] for r in data["results"]]
    # ... but not with other settings
    assert main(["ablate", "--out", str(out), "--resume", "--seed", "3"] + SMALL) == 2
    assert "different seed" in capsys.readouterr().err
    assert (out / "results.json").read_text() == before
    # --overwrite starts again (here with only two variants, aliases accepted)
    assert main(["ablate", "--out", str(out), "--overwrite", "--variants", "tanh_ran,srnn"]
                + SMALL) == 0
    capsys.readouterr()
    rows = list(csv.DictReader(open(out / "results.csv")))
    assert [r["variant"] for r in rows] == ["ran", "srnn"]
    assert not (out / "lstm" / "checkpoint.pt").exists()


def test_ablate_on_ptb_format_dir_without_test(tmp_path, capsys):
    d = tmp_path / "d"
    d.mkdir()
    (d / "train.txt").write_text("a b c d e f g a b c\n" * 40)
    (d / "valid.txt").write_text("a b c d\n" * 10)
    assert main(["ablate", "--data", str(d), "--config", "tiny", "--epochs", "1", "--variants",
                 "lstm", "ran", "--out", str(tmp_path / "o"), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "has no test file: only valid perplexity is reported" in out
    rows = list(csv.DictReader(open(tmp_path / "o" / "results.csv")))
    assert [r["variant"] for r in rows] == ["lstm", "ran"] and rows[0]["test_ppl"] == ""


def test_ablate_bad_input(tmp_path, capsys):
    assert main(["ablate", "--variants", "lstm", "gru", "--out", str(tmp_path / "x")]) == 2
    assert "unknown variant 'gru'" in capsys.readouterr().err
    assert main(["ablate", "--config", "huge", "--out", str(tmp_path / "x")]) == 2
    assert "unknown config 'huge'" in capsys.readouterr().err
    assert main(["ablate", "--data", str(tmp_path / "none"), "--out", str(tmp_path / "x")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["ablate", "--resume", "--overwrite", "--out", str(tmp_path / "x")] + SMALL) == 2
    assert "not both" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
    with pytest.raises(ValueError, match="--variants is empty"):
        parse_variants([","])
    assert parse_variants(["LSTM-minus-gates", "lstm"]) == ["srnn", "lstm"]


def test_format_table_columns():
    r = {"variant": "ran", "paper_name": "P", "recurrent_params": 4227600,
         "hyper_parameters": {"learning_rate": 0.8}, "valid_ppl": 90.123, "test_ppl": None,
         "train_words_per_sec": 12345.6}
    text = format_table([r])
    assert "4.228M" in text and "90.12" in text and "n/a" in text and "12,346" in text
    assert format_table([r], markdown=True).startswith("| variant | paper name |")
