"""The language model (rnn_ablations.lm): configs, data, training, state carry-over, checkpoints,
resume, multi-process training and the `lm` / `params` commands."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rnn_ablations.cli import main
from rnn_ablations.lm import (CONFIGS, LanguageModel, SyntheticSpec, get_config, load_checkpoint,
                              load_corpus, synthetic_corpus, train_lm)
from rnn_ablations.lm.configs import PAPER_LR_OVERRIDES
from rnn_ablations.lm.synthetic import agreement_positions, generate_lines

REPO = Path(__file__).resolve().parents[2]
SHARED = Path(os.environ.get("RNN_ABLATIONS_SHARED_DATA",
                             Path(__file__).resolve().parents[2].parent / "shared" / "data"))
PTB = SHARED / "ptb"

SMALL_SPEC = SyntheticSpec(train_sentences=120, valid_sentences=15, test_sentences=15)


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: see conftest.one_thread


@pytest.fixture(scope="module")
def small_corpus():
    return synthetic_corpus(SMALL_SPEC)


def _write_ptb(d: Path, train: str, valid: str = None, test: str = None) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "ptb.train.txt").write_text(train)
    if valid is not None:
        (d / "ptb.valid.txt").write_text(valid)
    if test is not None:
        (d / "ptb.test.txt").write_text(test)
    return d


# ------------------------------------------------------------------------------------- configs
def test_configs_equal_the_design_table():
    # Zaremba et al. (2014) via the TF PTB tutorial: layers × H | BPTT | init | lr | clip | epochs | decay after | decay | dropout
    table = {
        "small": (2, 200, 20, 0.1, 1.0, 5, 13, 4, 0.5, 0.0),
        "medium": (2, 650, 35, 0.05, 1.0, 5, 39, 6, 0.8, 0.5),
        "large": (2, 1500, 35, 0.04, 1.0, 10, 55, 14, 1 / 1.15, 0.65),
    }
    for name, row in table.items():
        c = CONFIGS[name]
        got = (c.num_layers, c.hidden_size, c.num_steps, c.init_scale, c.learning_rate,
               c.max_grad_norm, c.epochs, c.decay_after, c.lr_decay, c.dropout)
        assert got == pytest.approx(row), name
        assert c.batch_size == 20 and c.forget_bias == 0.0
    # the RAN code's lowered learning rates
    assert PAPER_LR_OVERRIDES == {"medium": {"ran": 1.0, "identity_ran": 0.8},
                                  "large": {"ran": 0.8, "identity_ran": 0.5}}
    assert CONFIGS["large"].for_variant("identity_ran").learning_rate == 0.5
    assert CONFIGS["large"].for_variant("tanh_ran").learning_rate == 0.8
    assert CONFIGS["large"].for_variant("lstm").learning_rate == 1.0
    assert CONFIGS["large"].for_variant("ran", paper_lr=False).learning_rate == 1.0
    assert CONFIGS["medium"].for_variant("identity_ran").learning_rate == 0.8
    # schedule: lr constant up to "decay after", then × decay per epoch
    small = CONFIGS["small"]
    assert [small.lr_at_epoch(e) for e in (1, 4, 5, 6, 13)] == [1.0, 1.0, 0.5, 0.25, 0.5 ** 9]


def test_config_errors():
    with pytest.raises(ValueError, match="unknown config 'huge'.*tiny.*small"):
        get_config("huge")
    with pytest.raises(ValueError, match="unknown config field"):
        get_config("small", hiden_size=3)
    with pytest.raises(ValueError, match="dropout"):
        get_config("small", dropout=1.5)
    assert get_config("small", epochs=2).epochs == 2


# ------------------------------------------------------------------------------------- data
def test_ptb_reader(tmp_path):
    d = _write_ptb(tmp_path / "d", "a b <unk>\nb c\n\nb\n", valid="a zz b\n")
    c = load_corpus(d)
    # <eos> after every line (the empty one too); most frequent first, ties alphabetical
    assert c.vocab.words == ["<eos>", "b", "<unk>", "a", "c"]
    assert c.vocab.decode(c.train) == "a b <unk> <eos> b c <eos> <eos> b <eos>".split()
    assert c.vocab.decode(c.valid) == "a <unk> b <eos>".split()   # zz is out of vocabulary
    assert c.oov["valid"] == 1
    assert c.test is None and "no test file" in c.summary()
    # plain train.txt / valid.txt names work too
    d2 = tmp_path / "d2"
    d2.mkdir()
    (d2 / "train.txt").write_text("x y\n")
    (d2 / "valid.txt").write_text("y x\n")
    (d2 / "test.txt").write_text("x\n")
    assert load_corpus(d2).test is not None


@pytest.mark.skipif(not PTB.exists(), reason=f"PTB data not found at {PTB} "
                                              "(set RNN_ABLATIONS_SHARED_DATA)")
def test_real_ptb_counts():
    c = load_corpus(PTB)
    assert len(c.vocab) == 10000
    assert len(c.train) == 929589 and len(c.valid) == 73760  # one <eos> per line
    assert c.test is not None and len(c.test) == 82430  # the test split is there now


def test_synthetic_corpus_is_deterministic_and_agrees():
    a, b = synthetic_corpus(SMALL_SPEC), synthetic_corpus(SMALL_SPEC)
    assert torch.equal(a.train, b.train) and a.vocab.words == b.vocab.words
    other = synthetic_corpus(SyntheticSpec(seed=7, train_sentences=120, valid_sentences=15,
                                           test_sentences=15))
    assert not torch.equal(a.train[:200], other.train[:200])
    for line in generate_lines(SMALL_SPEC, "valid"):
        stack, depth = [], 0
        for w in line.split():
            if w.startswith("n"):
                stack.append(w[1:])
                depth = max(depth, len(stack))
            elif w.startswith("v"):
                assert stack.pop() == w[1:]          # every verb agrees with its noun
        assert not stack and depth <= SMALL_SPEC.max_depth
    verbs = agreement_positions(a, "valid")
    assert verbs.sum() == sum(l.count(" v") for l in generate_lines(SMALL_SPEC, "valid"))


# ------------------------------------------------------------------------------------- model
def test_state_carry_over_is_exact():
    """Running 2T tokens at once equals two windows of T with the state carried."""
    torch.manual_seed(0)
    for variant in ("lstm", "srnn", "ran"):
        m = LanguageModel(variant, 20, 16, 2, dropout=0.0, init_scale=0.3).eval()
        x = torch.randint(0, 20, (12, 3))
        full, (h, c) = m(x)
        a, st = m(x[:5])
        b, (h2, c2) = m(x[5:], st)
        torch.testing.assert_close(torch.cat([a, b]), full, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(h2, h)
        torch.testing.assert_close(c2, c)


def test_init_uniform_and_forget_bias():
    m = LanguageModel("lstm", 30, 8, 2, init_scale=0.05, forget_bias=1.0)
    for name, p in m.named_parameters():
        if "bias" in name and "layers" in name:
            if name.endswith("bias_ih_l0"):
                assert torch.all(p[8:16] == 1.0) and torch.all(p[:8] == 0) and torch.all(p[16:] == 0)
            else:
                assert torch.all(p == 0)
        else:
            assert p.abs().max() <= 0.05 and p.abs().max() > 0.03
    r = LanguageModel("ran", 30, 8, 1, forget_bias=0.5)
    assert r.layers[0].bias_l0.tolist() == [0.0] * 8 + [0.5] * 8   # gates i, f


# ------------------------------------------------------------------------------------- training
def test_loss_falls_on_a_tiny_corpus(tmp_path):
    text = "".join("the cat sat on the mat <unk> and the dog ran\n" for _ in range(60))
    d = _write_ptb(tmp_path / "d", text, valid=text[:200])
    cfg = get_config("tiny", epochs=3, batch_size=4)
    r = train_lm("ran", cfg, load_corpus(d), tmp_path / "run", seed=0, log=None)
    h = r["history"]
    assert h[-1]["train_ppl"] < 0.5 * h[0]["train_ppl"]
    assert r["valid_ppl"] < 3.0 and r["test_ppl"] is None
    assert r["train_words_per_sec"] > 0


def test_training_carries_detached_state(small_corpus, monkeypatch):
    calls = []
    orig = LanguageModel.forward

    def spy(self, tokens, state=None, **kw):
        logits, new = orig(self, tokens, state, **kw)
        if self.training:
            calls.append((state, new))
        return logits, new

    monkeypatch.setattr(LanguageModel, "forward", spy)
    cfg = get_config("tiny", epochs=2)
    train_lm("lstm", cfg, small_corpus, None, seed=0, log=None)
    n = (small_corpus.train.numel() // cfg.batch_size - 1) // cfg.num_steps
    assert len(calls) == 2 * n
    for k, (state_in, _) in enumerate(calls):
        assert state_in[0].grad_fn is None and not state_in[0].requires_grad
        if k % n == 0:       # every epoch starts from zeros
            assert torch.all(state_in[0] == 0) and torch.all(state_in[1] == 0)
        else:                # ... then continues from the previous window's final state
            prev_out = calls[k - 1][1]
            assert prev_out[0].grad_fn is not None    # the model's output was part of the graph
            assert torch.equal(state_in[0], prev_out[0].detach())
            assert torch.equal(state_in[1], prev_out[1].detach())


def test_resume_continues_bit_identically(small_corpus, tmp_path):
    cfg = get_config("tiny", epochs=3, dropout=0.3)
    full = train_lm("lstm_minus_srnn", cfg, small_corpus, tmp_path / "a", seed=5, log=None,
                    record_losses=True)
    part = tmp_path / "b"
    assert train_lm("lstm_minus_srnn", cfg, small_corpus, part, seed=5, log=None,
                    record_losses=True, max_steps=13) is None        # stopped mid-epoch
    ck = load_checkpoint(part)
    assert ck["step"] > 0 and ck["state"] is not None and not ck["done"]
    assert train_lm("lstm_minus_srnn", cfg, small_corpus, part, seed=5, log=None, resume=True,
                    record_losses=True, max_steps=ck["global_step"] + 20) is None
    res = train_lm("lstm_minus_srnn", cfg, small_corpus, part, seed=5, log=None, resume=True,
                   record_losses=True)
    a, b = load_checkpoint(tmp_path / "a"), load_checkpoint(part)
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    assert a["losses"] == b["losses"]
    assert res["valid_ppl"] == full["valid_ppl"] and res["test_ppl"] == full["test_ppl"]
    # a finished run resumed again is not retrained
    again = train_lm("lstm_minus_srnn", cfg, small_corpus, part, seed=5, log=None, resume=True)
    assert again["valid_ppl"] == full["valid_ppl"]


def test_a_diverged_run_stops_at_the_epoch_end_and_is_not_retrained(small_corpus, tmp_path):
    cfg = get_config("tiny", epochs=3)
    lines = []
    # any real perplexity is above 1.5: the run counts as diverged after its first epoch
    assert train_lm("ran", cfg, small_corpus, tmp_path / "d", seed=0, log=lines.append,
                    stop_above_ppl=1.5) is None
    ck = load_checkpoint(tmp_path / "d")
    assert ck["epoch"] == 1 and ck["step"] == 0 and len(ck["history"]) == 1
    assert any("diverged, training stopped" in line for line in lines)
    res = json.loads((tmp_path / "d" / "result.json").read_text())
    assert res["stopped_by"] == "diverged" and res["epochs_completed"] == 1
    # resumed, it does not train again; without the threshold it goes on to the end
    assert train_lm("ran", cfg, small_corpus, tmp_path / "d", seed=0, log=None, resume=True,
                    stop_above_ppl=1.5) is None
    assert load_checkpoint(tmp_path / "d")["global_step"] == ck["global_step"]
    done = train_lm("ran", cfg, small_corpus, tmp_path / "d", seed=0, log=None, resume=True)
    assert done is not None and load_checkpoint(tmp_path / "d")["epoch"] == 3
    # a normal run never trips a threshold it stays under
    ok = train_lm("ran", cfg.replace(epochs=1), small_corpus, tmp_path / "n", seed=0, log=None,
                  stop_above_ppl=1e9)
    assert ok is not None and ok["complete"] is not False
    with pytest.raises(ValueError, match="stop_above_ppl must be a perplexity > 1"):
        train_lm("ran", cfg, small_corpus, tmp_path / "x", log=None, stop_above_ppl=0.5)


def test_resume_refuses_another_variant_config_or_seed(small_corpus, tmp_path):
    cfg = get_config("tiny", epochs=1)
    train_lm("ran", cfg, small_corpus, tmp_path / "r", seed=0, log=None, max_steps=3)
    with pytest.raises(ValueError, match="from variant 'ran', not 'lstm'"):
        train_lm("lstm", cfg, small_corpus, tmp_path / "r", seed=0, log=None, resume=True)
    with pytest.raises(ValueError, match="different values of hidden_size"):
        train_lm("ran", cfg.replace(hidden_size=16), small_corpus, tmp_path / "r", log=None,
                 resume=True)
    with pytest.raises(ValueError, match="--seed 0, not 1"):
        train_lm("ran", cfg, small_corpus, tmp_path / "r", seed=1, log=None, resume=True)
    with pytest.raises(FileExistsError, match="--resume.*--overwrite"):
        train_lm("ran", cfg, small_corpus, tmp_path / "r", seed=0, log=None)


@pytest.mark.slow  # trains end to end
def test_torchrun_two_processes_match_single_process(tmp_path):
    """2 processes (gloo, CPU), each with half of the batch rows, dropout on: the per-window
    training loss follows the single-process run."""
    args = ["lm", "train", "--variant", "ran", "--config", "tiny", "--set", "dropout=0.2",
            "--epochs", "1", "--corpus-sentences", "150", "--log-losses", "--no-progress"]
    assert main(args + ["--out", str(tmp_path / "one"), "--threads", "1"]) == 0
    torchrun = Path(sys.executable).with_name("torchrun")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [str(torchrun), "--standalone", "--nproc-per-node", "2", "-m", "rnn_ablations.cli"]
        + args + ["--out", str(tmp_path / "two")],
        capture_output=True, text=True, timeout=170, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "2 processes" in proc.stdout
    one = json.loads((tmp_path / "one" / "losses.json").read_text())
    two = json.loads((tmp_path / "two" / "losses.json").read_text())
    assert len(one) == len(two) > 10
    assert two == pytest.approx(one, rel=1e-4, abs=1e-5)
    r1 = json.loads((tmp_path / "one" / "result.json").read_text())
    r2 = json.loads((tmp_path / "two" / "result.json").read_text())
    assert r2["processes"] == 2
    assert r2["valid_ppl"] == pytest.approx(r1["valid_ppl"], rel=1e-4)


# ------------------------------------------------------------------------------------- commands
def test_lm_train_and_evaluate_commands(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["lm", "train", "--variant", "identity_ran", "--config", "tiny", "--epochs", "1",
                 "--corpus-sentences", "100", "--out", str(run), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "epoch 1/1" in out and "valid ppl" in out and "training words/s" in out
    result = json.loads((run / "result.json").read_text())
    assert main(["lm", "evaluate", str(run), "--json", str(tmp_path / "e.json")]) == 0
    ev = json.loads((tmp_path / "e.json").read_text())
    assert ev["valid"]["ppl"] == pytest.approx(result["valid_ppl"], rel=1e-9)
    assert ev["test"]["ppl"] == pytest.approx(result["test_ppl"], rel=1e-9)
    # a checkpoint of another variant
    assert main(["lm", "evaluate", str(run), "--variant", "lstm"]) == 2
    assert "holds a 'identity_ran' model, not 'lstm'" in capsys.readouterr().err
    # existing run: no silent overwrite
    args = ["lm", "train", "--variant", "lstm", "--config", "tiny", "--epochs", "1",
            "--corpus-sentences", "100", "--out", str(run), "--no-progress"]
    assert main(args) == 2
    assert "already holds a run" in capsys.readouterr().err
    assert main(args + ["--resume"]) == 2
    assert "from variant 'identity_ran', not 'lstm'" in capsys.readouterr().err
    assert main(args + ["--overwrite"]) == 0
    assert json.loads((run / "result.json").read_text())["variant"] == "lstm"


def test_bad_data_directories(tmp_path, capsys):
    base = ["lm", "train", "--variant", "ran", "--config", "tiny", "--no-progress", "--out"]

    def err(data, out="o"):
        assert main(base + [str(tmp_path / out), "--data", str(data)]) == 2
        return capsys.readouterr().err

    assert "does not exist" in err(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    msg = err(tmp_path / "empty")
    assert "has no ptb.train.txt (or train.txt) and ptb.valid.txt" in msg and "contains nothing" in msg
    _write_ptb(tmp_path / "onlytrain", "a b\n")
    msg = err(tmp_path / "onlytrain")
    assert "has no ptb.valid.txt" in msg and "ptb.train.txt" in msg.split("contains")[1]
    _write_ptb(tmp_path / "blank", "\n\n", valid="a\n")
    assert "contains no words" in err(tmp_path / "blank")
    assert not (tmp_path / "o").exists()   # nothing was created on a failure
    # unknown config / variant
    assert main(["lm", "train", "--variant", "gru", "--out", str(tmp_path / "x")]) == 2
    assert "unknown variant 'gru'; valid variants are lstm, srnn" in capsys.readouterr().err
    assert main(["lm", "train", "--variant", "ran", "--config", "xl", "--out", str(tmp_path / "x")]) == 2
    assert "unknown config 'xl'" in capsys.readouterr().err
    assert main(["lm", "evaluate", str(tmp_path / "nothing")]) == 2
    assert "no checkpoint" in capsys.readouterr().err


def test_params_command_prints_the_papers_numbers(capsys):
    assert main(["params"]) == 0
    out = capsys.readouterr().out
    got = {}
    for line in out.splitlines():
        parts = line.split()
        m = re.search(r" (\d+\.\d\d)M \([\d,]+\)", line)
        if m and parts[0] in ("medium", "large") and parts[4] in ("lstm", "ran"):
            got[(parts[0], parts[4])] = float(m.group(1))
    paper = {("medium", "lstm"): 6.77, ("medium", "ran"): 4.23,
             ("large", "lstm"): 36.02, ("large", "ran"): 22.52}
    for key, want in paper.items():
        assert got[key] == pytest.approx(want, rel=0.005), key
    assert "6.77M" in out and "4.23M" in out and "36.02M" in out
    assert main(["params", "--sizes", "2x650", "--variants", "lstm", "ran"]) == 0
    out = capsys.readouterr().out
    assert "6,770,400" in out and "4,227,600" in out
    assert main(["params", "--sizes", "650"]) == 2
    assert "LAYERSxHIDDEN" in capsys.readouterr().err
