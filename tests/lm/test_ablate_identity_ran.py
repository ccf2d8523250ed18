"""`rnn-ablations ablate` reports a run whose validation perplexity ended worse than a uniform guess
as diverged, with the epoch, instead of printing the perplexity as a result.

The identity RAN's state h = c has no bound: on the embedded corpus, one valid row that the
stream cut starts inside a nested clause can send |c| up by ~1 per token (to ~300 over the row's
350 tokens), and with it the logits; the mean loss of the split is then dominated by that row.
The histories below are the identity_ran runs of `.venv/bin/rnn-ablations ablate --variants
identity_ran --seed S` (config synthetic) on the AMD EPYC VM: seed 0 diverged (valid perplexity
6126 at epoch 4, above the vocabulary size again from epoch 8 on, 1.29e7 at the end), seed 1 was
over the limit at epoch 3 only.  No training here: the results are given to the reporting code.
"""
import csv
import json

import pytest

from rnn_ablations.lm import ablate
from rnn_ablations.lm.ablate import diverged, format_table, run_ablation
from rnn_ablations.lm.configs import get_config
from rnn_ablations.lm.synthetic import SyntheticSpec, synthetic_corpus

SEED0_VALID = [5.18, 4.11, 5.90, 6126.43, 3.61, 3.58, 3.73, 2299009.08, 5560534.24, 12853195.34]
SEED1_VALID = [5.43, 4.20, 6.73e17, 3.66, 3.73, 3.45, 3.45, 3.29, 3.27, 3.26]
LSTM_VALID = [5.12, 4.54, 4.38, 4.12, 3.52, 3.32, 3.28, 3.25, 3.24, 3.24]


def _result(variant, valid_history, test, acc):
    return {"variant": variant, "paper_name": variant, "config": "synthetic",
            "recurrent_params": 82176, "hyper_parameters": {"learning_rate": 0.5},
            "valid_ppl": valid_history[-1], "test_ppl": test, "valid_long_range_acc": acc,
            "test_long_range_acc": acc, "train_words_per_sec": 90000.0, "train_time_s": 13.0,
            "epochs": len(valid_history), "seed": 0, "corpus": "embedded", "vocab_size": 53,
            "history": [{"epoch": e + 1, "valid_ppl": p} for e, p in enumerate(valid_history)]}


def _results():
    return [_result("lstm", LSTM_VALID, 3.21, 0.914),
            _result("identity_ran", SEED0_VALID, 3.21, 0.883)]


def test_the_epochs_of_a_divergence():
    lstm, ident = _results()
    spiked = _result("identity_ran", SEED1_VALID, 3.22, 0.892)
    assert diverged(ident) and not diverged(lstm) and not diverged(spiked)
    assert ablate.diverged_epochs(ident) == [4, 8, 9, 10] and ablate.diverged_since(ident) == 8
    assert ablate.diverged_epochs(spiked) == [3] and ablate.diverged_since(spiked) is None
    assert ablate.diverged_epochs(lstm) == [] and ablate.diverged_since(lstm) is None
    # over the limit only at the final evaluation: diverged, with no epoch to name
    last = dict(lstm, valid_ppl=float("nan"))
    assert diverged(last) and ablate.diverged_since(last) is None
    assert "diverged" in format_table([last]) and "(epoch" not in format_table([last])


@pytest.mark.parametrize("markdown", [False, True])
def test_the_table_names_the_divergence_instead_of_printing_its_perplexity(markdown):
    text = format_table(_results(), markdown=markdown)
    ident = next(line for line in text.splitlines() if "identity_ran" in line)
    assert "diverged (epoch 8)" in ident
    assert "1.29e+07" not in text and "12853195" not in text
    assert "3.21" in ident and "88.3%" in ident          # the other columns as measured
    lstm = next(line for line in text.splitlines() if line.lstrip("| ").startswith("lstm"))
    assert "3.24" in lstm and "diverged" not in lstm


def test_the_note_gives_the_value_and_the_epochs():
    note = ablate.divergence_note(_results())
    assert ("identity_ran diverged: its validation perplexity was above the vocabulary size "
            "(53, a uniform guess) from epoch 8 to the end (1.29e+07 after training; also at "
            "epoch 4)") in note
    assert "none was retuned" in note and "lstm" not in note
    spiked = ablate.divergence_note([_result("identity_ran", SEED1_VALID, 3.22, 0.892)])
    assert spiked == ("identity_ran: validation perplexity above the vocabulary size (53, a "
                      "uniform guess) at epoch 3, not at the end; the row is the final model's.")
    assert ablate.divergence_note(_results()[:1]) == ""


def test_run_ablation_prints_and_writes_the_divergence(tmp_path, monkeypatch):
    """The main job's path: what it prints and the four files, with the training replaced by the
    recorded results."""
    recorded = {r["variant"]: r for r in _results()}
    monkeypatch.setattr(ablate, "train_lm",
                        lambda name, cfg, corpus, run_dir, **kw: dict(recorded[name]))
    corpus = synthetic_corpus(SyntheticSpec(train_sentences=40, valid_sentences=10,
                                            test_sentences=10))
    lines = []
    results = run_ablation(get_config("synthetic"), corpus, tmp_path / "ab",
                           variants=["lstm", "identity_ran"], log=lines.append)
    printed = "\n".join(lines)
    assert "diverged (epoch 8)" in printed and "1.29e+07 after training" in printed
    table = printed.split("diverged:")[0]
    assert "1.29e+07" not in table
    assert [r["diverged"] for r in results] == [False, True]
    assert results[1]["diverged_from_epoch"] == 8 and results[1]["diverged_epochs"] == [4, 8, 9, 10]

    out = tmp_path / "ab"
    md = (out / "results.md").read_text()
    assert "| diverged (epoch 8) |" in md and "from epoch 8 to the end" in md
    rows = list(csv.DictReader(open(out / "results.csv")))
    assert [(r["variant"], r["diverged"], r["diverged_from_epoch"]) for r in rows] == \
        [("lstm", "False", ""), ("identity_ran", "True", "8")]
    assert float(rows[1]["valid_ppl"]) == pytest.approx(12853195.34)   # the raw value is kept
    data = json.loads((out / "results.json").read_text())
    assert "from epoch 8 to the end" in data["note"]
    assert data["results"][1]["diverged"] is True
