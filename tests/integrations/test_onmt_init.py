"""OpenNMT-py: every encoder type built from ``onmt_configs/multi30k_<type>.yaml`` starts where
OpenNMT-py's own ``brnn`` starts (``param_init`` U(±0.1)), role by role (see
``_init_roles.py``)."""
import pytest
import torch

from rnn_ablations import VARIANTS

from _init_roles import ablated_roles, assert_same_distribution, nn_lstm_roles
from conftest import REPO, requires_onmt

pytestmark = requires_onmt


def _onmt_model(enc_type, seed=3):
    import onmt
    import onmt.model_builder as mb
    from onmt.bin.train import _get_parser
    from onmt.inputters.inputter import dict_to_vocabs
    from onmt.utils.parse import ArgumentParser
    from rnn_ablations.integrations import onmt as ours
    ours.register()  # what the start-up hook does when onmt is imported (idempotent)
    assert ours.is_registered() and onmt.encoders.str2enc
    config = REPO / "onmt_configs" / f"multi30k_{enc_type}.yaml"
    opt, unknown = _get_parser().parse_known_args(
        ["-config", str(config), "-hidden_size", "16", "-word_vec_size", "8"])
    assert not unknown
    ArgumentParser.update_model_opts(opt)
    ArgumentParser.validate_model_opts(opt)
    specials = ["<unk>", "<blank>", "<s>", "</s>"]
    vocabs = dict_to_vocabs({"src": specials + [f"s{i}" for i in range(10)],
                             "tgt": specials + [f"t{i}" for i in range(10)],
                             "data_task": "seq2seq"})
    torch.manual_seed(seed)
    return mb.build_model(opt, opt, vocabs, None, -1), opt

@pytest.mark.parametrize("variant", VARIANTS)
def test_multi30k_every_encoder_type_starts_like_brnn(variant):
    model, opt = _onmt_model("b" + variant)
    assert opt.ablated_init == "onmt"
    reference, ref_opt = _onmt_model("brnn")
    assert isinstance(reference.encoder.rnn, torch.nn.LSTM)
    bound = ref_opt.param_init
    assert bound == 0.1
    assert_same_distribution(ablated_roles(model.encoder.rnn), nn_lstm_roles(reference.encoder.rnn),
                             f"onmt b{variant}", bound)
