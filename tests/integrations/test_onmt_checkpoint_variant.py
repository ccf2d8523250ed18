"""OpenNMT-py loads checkpoints with its own loader (``BaseModel.load_state_dict``), not torch's:
the encoder's ``variant_state`` (not saved: the checkpoint's ``-encoder_type`` names the variant)
is filled from the checkpoint's options, and a ``variant_state`` entry that a checkpoint of an
earlier version holds is checked, for ``onmt_translate`` and ``-train_from`` alike.

One real tiny model is trained on tests/fixtures/onmt; it, a copy with the entry of earlier
versions and a copy with an altered entry are then translated and trained from, in one fresh
interpreter running OpenNMT-py's own entry points (what the console scripts call)."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

onmt = pytest.importorskip("onmt", reason="OpenNMT-py is not installed")

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "onmt"

DRIVER = textwrap.dedent('''
    import json, sys
    from pathlib import Path
    import torch
    from onmt.bin.build_vocab import main as build_vocab_main
    from onmt.bin.train import main as train_main
    from onmt.bin.translate import main as translate_main
    from rnn_ablations.variants import get_variant

    work, fixtures = Path(sys.argv[1]), Path(sys.argv[2])
    cfg = work / "config.yaml"
    cfg.write_text("\\n".join([
        f"save_data: {work}/ex", f"src_vocab: {work}/vocab.src", f"tgt_vocab: {work}/vocab.tgt",
        "train_steps: 2", "save_checkpoint_steps: 2", "valid_steps: 2", "report_every: 1",
        "batch_size: 8", "valid_batch_size: 8", "bucket_size: 32", "num_workers: 0",
        "world_size: 1", "layers: 1", "hidden_size: 8", "word_vec_size: 4", "seed: 1",
        "encoder_type: bran", "data:", "  toy:", f"    path_src: {fixtures}/src-train.txt",
        f"    path_tgt: {fixtures}/tgt-train.txt", "  valid:",
        f"    path_src: {fixtures}/src-val.txt", f"    path_tgt: {fixtures}/tgt-val.txt"]) + "\\n")

    def run(main, prog, *args):
        sys.argv = [prog] + [str(a) for a in args]
        try:
            main()
            return None
        except Exception as exc:  # the message is what the test checks
            return f"{type(exc).__name__}: {exc}"

    out = {}
    assert run(build_vocab_main, "onmt_build_vocab", "-config", cfg, "-n_sample", "-1") is None
    assert run(train_main, "onmt_train", "-config", cfg, "-save_model", work / "orig/model") is None
    original = torch.load(work / "orig/model_step_2.pt")
    out["saved_keys"] = [k for k in original["model"] if "variant_state" in k]
    torch.save(original, work / "without.pt")
    old = torch.load(work / "orig/model_step_2.pt")
    old["model"]["encoder.rnn.variant_state"] = torch.tensor(
        [get_variant("ran").code, 0])                # as earlier versions wrote it
    torch.save(old, work / "old.pt")
    wrong = torch.load(work / "orig/model_step_2.pt")
    wrong["model"]["encoder.rnn.variant_state"] = torch.tensor(
        [get_variant("identity_ran").code, 0])       # same shapes as ran, other equations
    torch.save(wrong, work / "wrong.pt")

    src = fixtures / "src-val.txt"
    for name in ("without", "old", "wrong"):
        out[f"translate_{name}"] = run(
            translate_main, "onmt_translate", "-model", work / f"{name}.pt", "-src", src,
            "-output", work / f"{name}.pred", "-beam_size", "2", "-max_length", "8")
        out[f"train_from_{name}"] = run(
            train_main, "onmt_train", "-config", cfg, "-save_model", work / f"{name}/model",
            "-train_from", work / f"{name}.pt", "-train_steps", "3")
    out["translations"] = [len((work / f"{n}.pred").read_text().splitlines())
                           for n in ("without", "old")]
    out["resumed_keys"] = [k for k in torch.load(work / "old/model_step_3.pt")["model"]
                           if "variant_state" in k]
    print("RESULT " + json.dumps(out))
''')


@pytest.fixture(scope="module")
def outcome(tmp_path_factory):
    work = tmp_path_factory.mktemp("onmt_variant_state")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    env.pop("RNN_ABLATIONS_NO_HOOKS", None)
    proc = subprocess.run([sys.executable, "-c", DRIVER, str(work), str(FIXTURES)], cwd=work,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


@pytest.mark.slow  # trains with onmt_train
def test_checkpoints_with_and_without_variant_state_translate_and_train_on(outcome):
    assert outcome["saved_keys"] == []          # the -encoder_type names the variant
    lines = len((FIXTURES / "src-val.txt").read_text().splitlines())
    for name in ("without", "old"):
        assert outcome[f"translate_{name}"] is None, outcome[f"translate_{name}"]
        assert outcome[f"train_from_{name}"] is None, outcome[f"train_from_{name}"]
    assert outcome["translations"] == [lines, lines]
    assert outcome["resumed_keys"] == []        # the old entry is not carried on


def test_checkpoint_with_a_wrong_variant_state_is_refused(outcome):
    for key in ("translate_wrong", "train_from_wrong"):
        message = outcome[key]
        assert message is not None and message.startswith("OnmtUsageError"), message
        assert "-encoder_type bran" in message and "'identity_ran'" in message, message


def test_prepare_checkpoint_in_process():
    """The same check on a model built in this process (no files)."""
    import argparse

    import torch

    from rnn_ablations import AblatedRNN
    from rnn_ablations.integrations.onmt import prepare_checkpoint
    from rnn_ablations.variants import get_variant

    model = torch.nn.Module()
    model.rnn = AblatedRNN("ran", 3, 4)
    ckpt = {"opt": argparse.Namespace(encoder_type="ran"), "model": {}}
    prepare_checkpoint(model, ckpt)
    assert ckpt["model"] == {}              # nothing to add: the module has no such buffer
    ckpt = {"opt": argparse.Namespace(encoder_type="ran"),
            "model": {"rnn.variant_state": torch.tensor([get_variant("ran").code, 0])}}
    prepare_checkpoint(model, ckpt)
    assert ckpt["model"] == {}              # the entry of earlier versions: checked, dropped
    # options of another of our types than the module: refused even without the entry
    ckpt = {"opt": argparse.Namespace(encoder_type="identity_ran"), "model": {}}
    with pytest.raises(ValueError, match="'identity_ran'.*into rnn, an encoder of variant 'ran'"):
        prepare_checkpoint(model, ckpt)
    ckpt = {"opt": argparse.Namespace(encoder_type="ran"),
            "model": {"rnn.variant_state": torch.tensor([0.5, 0.0])}}
    with pytest.raises(ValueError, match="must be an integer tensor"):
        prepare_checkpoint(model, ckpt)
