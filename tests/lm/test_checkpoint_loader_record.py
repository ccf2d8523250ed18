"""Loading a language-model checkpoint takes the layers' variant record from the checkpoint's
``variant``: a checkpoint whose state dict lost its metadata (written by the trainer before it
kept it, or cast to float by a user) loads into a ``ran`` / ``identity_ran`` model, and
``visualize`` reads its run directory, without the warning that the shapes fit the other variant
too; a record that names another variant is still refused."""
import warnings

import pytest
import torch

from rnn_ablations.lm import LanguageModel, get_config
from rnn_ablations.lm.checkpoints import FORMAT, model_from_checkpoint, save_checkpoint
from rnn_ablations.rnn import AblatedRNN

VOCAB = ["<unk>", "<eos>"] + [f"w{i}" for i in range(9)]


def _checkpoint(variant, state_of=lambda sd: {k: v.float() for k, v in sd.items()}):
    cfg = get_config("tiny")
    torch.manual_seed(0)
    model = LanguageModel(variant, len(VOCAB), cfg.hidden_size, cfg.num_layers, cfg.dropout,
                          cfg.init_scale, cfg.forget_bias)
    return model, {"format": FORMAT, "variant": variant, "config": cfg.to_dict(),
                   "vocab": VOCAB, "model": state_of(model.state_dict())}


@pytest.mark.parametrize("variant", ["ran", "identity_ran"])
def test_a_state_dict_without_its_record_loads_without_a_warning(variant):
    model, ckpt = _checkpoint(variant)
    assert not hasattr(ckpt["model"], "_metadata")       # a plain dict: the record is gone
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded = model_from_checkpoint(ckpt)
    for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name


def test_a_record_of_another_variant_is_still_refused():
    _, ckpt = _checkpoint("ran", state_of=lambda sd: sd)   # with its metadata: 'ran'
    ckpt["variant"] = "identity_ran"
    with pytest.raises(ValueError, match="saved from an AblatedRNN of variant 'ran'"):
        model_from_checkpoint(ckpt)


def test_visualize_reads_a_run_directory_without_a_warning(tmp_path):
    from rnn_ablations.visualize.loaders import load_model

    _, ckpt = _checkpoint("identity_ran")
    save_checkpoint(ckpt, tmp_path / "checkpoint.pt")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded = load_model(tmp_path)
    assert [m.variant.name for m in loaded.model.modules() if isinstance(m, AblatedRNN)]
