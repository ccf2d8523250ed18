"""OpenNMT-py integration, in process: registration, the encoder contract for every encoder type
under the option matrix (LSTM/GRU decoder, input feeding on/off, -bridge on/off), padding,
dropout, initialisation after OpenNMT's param_init, option checks and the configs.

The real commands (onmt_build_vocab, onmt_train, onmt_translate, -train_from, python -S) are
exercised in tests/integrations/test_onmt_cli.py."""
import argparse
import difflib
import math
import os
from pathlib import Path

import pytest
import torch

onmt = pytest.importorskip("onmt", reason="OpenNMT-py is not installed (bash scripts/setup.sh)")

import onmt.encoders  # noqa: E402
import onmt.opts  # noqa: E402
from onmt.bin.train import _get_parser  # noqa: E402
from onmt.inputters.inputter import dict_to_vocabs  # noqa: E402
from onmt.utils.parse import ArgumentParser  # noqa: E402

from rnn_ablations import VARIANTS  # noqa: E402
from rnn_ablations.integrations import onmt as ours  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "onmt_configs"
SHARED_DATA = Path(os.environ.get("RNN_ABLATIONS_SHARED_DATA",
                                  Path(__file__).resolve().parents[2].parent / "shared" / "data"))
ALL_TYPES = list(ours.ENCODER_TYPES)

SRC_TOKENS = ["<unk>", "<blank>", "<s>", "</s>"] + [f"s{i}" for i in range(12)]
TGT_TOKENS = ["<unk>", "<blank>", "<s>", "</s>"] + [f"t{i}" for i in range(14)]
PAD = 1


def _vocabs():
    return dict_to_vocabs({"src": SRC_TOKENS, "tgt": TGT_TOKENS, "data_task": "seq2seq"})


def _opts(*args, validate=True):
    """onmt_train's options (as the command parses them) for a tiny model."""
    base = ["-data", "{}", "-src_vocab", "unused", "-layers", "2", "-hidden_size", "12",
            "-word_vec_size", "6", "-dropout", "0.0"]
    opt, unknown = _get_parser().parse_known_args(base + [str(a) for a in args])
    assert not unknown, unknown
    ArgumentParser.update_model_opts(opt)
    if validate:
        ArgumentParser.validate_model_opts(opt)
    return opt


def _model(opt):
    """What onmt_train builds: build_base_model, OpenNMT's param_init (build_base_model leaves
    the embeddings and the generator uninitialised: skip_init), then our -ablated_init."""
    import onmt.model_builder as mb
    torch.manual_seed(0)
    return mb.build_model(opt, opt, _vocabs(), None, -1)


def _batch(lengths, vocab_size, seed=0):
    g = torch.Generator().manual_seed(seed)
    T = max(lengths)
    x = torch.randint(4, vocab_size, (len(lengths), T, 1), generator=g)
    for b, n in enumerate(lengths):
        x[b, n:, 0] = PAD
    return x, torch.tensor(lengths)


# ----------------------------------------------------------------------------- registration
def test_every_type_registered_by_the_import_hook_and_register_is_idempotent():
    for name, cls in ours.ENCODER_CLASSES.items():
        assert onmt.encoders.str2enc[name] is cls
        assert issubclass(cls, onmt.encoders.EncoderBase)
    assert set(ALL_TYPES) == set(VARIANTS) | {"b" + v for v in VARIANTS}
    before = dict(onmt.encoders.str2enc)
    validate, model_opts = ArgumentParser.validate_model_opts, onmt.opts.model_opts
    ours.register()
    ours.register()
    assert onmt.encoders.str2enc == before
    assert ArgumentParser.validate_model_opts.__func__ is validate.__func__
    assert onmt.opts.model_opts is model_opts
    assert ours.is_registered()
    assert argparse.Namespace in torch.serialization.get_safe_globals()
    # onmt's own register_encoder refuses duplicates, so registration must not go through it
    with pytest.raises(ValueError, match="duplicate"):
        onmt.encoders.register_encoder("bran")(ours.ENCODER_CLASSES["bran"])


def test_register_refuses_to_shadow_a_foreign_encoder_type():
    from onmt.encoders import RNNEncoder
    onmt.encoders.str2enc["ran"] = RNNEncoder
    try:
        with pytest.raises(ValueError, match="already has an encoder type 'ran'"):
            ours.register()
    finally:
        onmt.encoders.str2enc["ran"] = ours.ENCODER_CLASSES["ran"]
    ours.register()
    assert ours.is_registered()


def test_encoder_type_names():
    assert ours.encoder_type_for("ran") == "bran"
    assert ours.encoder_type_for("tanh_ran", bidirectional=False) == "ran"
    assert ours.encoder_type_for("lstm_minus_gates") == "bsrnn"
    with pytest.raises(ValueError, match="valid variants"):
        ours.encoder_type_for("gru")


def test_option_added_to_onmt_parser_and_defaults():
    opt = _opts("-encoder_type", "bran")
    assert opt.ablated_init == "onmt"
    assert opt.brnn is False  # onmt's own _fix_enc_hidden must not run on our joined states
    help_text = _get_parser().format_help()
    assert "-ablated_init" in help_text and "bidentity_ran" in help_text
    # checkpoints of older runs lack the option: ckpt_model_opts fills the default in
    old = argparse.Namespace(**{k: v for k, v in vars(opt).items() if k != "ablated_init"})
    assert ArgumentParser.ckpt_model_opts(old).ablated_init == "onmt"


# ----------------------------------------------------------------------------- the encoder
@pytest.mark.parametrize("enc_type", ALL_TYPES)
def test_model_matrix_lstm_gru_decoder_input_feed_bridge(enc_type):
    """Every decoder setting the encoder must serve: forward + backward of the whole NMTModel."""
    torch.manual_seed(0)
    src, src_len = _batch([5, 3, 4], len(SRC_TOKENS))
    tgt, _ = _batch([4, 4, 4], len(TGT_TOKENS), seed=1)
    for rnn_type in ("LSTM", "GRU"):
        for input_feed in (1, 0):
            for bridge in (False, True):
                args = ["-encoder_type", enc_type, "-rnn_type", rnn_type, "-input_feed", input_feed]
                opt = _opts(*(args + (["-bridge"] if bridge else [])))
                model = _model(opt)
                enc_out, (h, c), lens = model.encoder(src, src_len)
                assert enc_out.shape == (3, 5, 12)
                assert h.shape == c.shape == (2, 3, 12)
                assert lens is src_len
                assert (enc_out[1, 3:] == 0).all() and (enc_out[2, 4:] == 0).all()
                assert hasattr(model.encoder, "bridge") == bridge
                if bridge:
                    assert len(model.encoder.bridge) == (2 if rnn_type == "LSTM" else 1)
                    assert (h >= 0).all()  # ReLU bridge
                dec_out, attns = model(src, tgt, src_len)
                assert dec_out.shape == (3, 3, 12) and attns["std"].shape == (3, 3, 5)
                loss = model.generator(dec_out).logsumexp(-1).sum()
                loss.backward()
                for name, p in model.encoder.rnn.named_parameters():
                    assert p.grad is not None and torch.isfinite(p.grad).all(), name
                    assert p.grad.abs().sum() > 0, (enc_type, rnn_type, input_feed, bridge, name)


@pytest.mark.parametrize("enc_type", ["ran", "bran", "bsrnn", "blstm"])
def test_padding_is_exact_and_directions_are_joined(enc_type):
    torch.manual_seed(0)
    opt = _opts("-encoder_type", enc_type)
    model = _model(opt).eval()
    enc = model.encoder
    lengths = [6, 2, 4]
    src, src_len = _batch(lengths, len(SRC_TOKENS))
    out, (h, c), _ = enc(src, src_len)
    for b, n in enumerate(lengths):
        out_b, (h_b, c_b), _ = enc(src[b:b + 1, :n], torch.tensor([n]))
        torch.testing.assert_close(out[b:b + 1, :n], out_b)
        torch.testing.assert_close(h[:, b:b + 1], h_b)
        torch.testing.assert_close(c[:, b:b + 1], c_b)
        assert (out[b, n:] == 0).all()
    # the joined state is [forward | backward] per layer, as onmt's _fix_enc_hidden makes it
    _, (raw_h, _) = enc.rnn(enc.embeddings(src), lengths=src_len)
    if enc.bidirectional:
        assert raw_h.shape == (4, 3, 6)
        torch.testing.assert_close(h, torch.cat([raw_h[0::2], raw_h[1::2]], dim=2))
        # the top layer's forward half ends at the last real token; its backward half at token 0
        torch.testing.assert_close(h[1, 0, :6], out[0, 5, :6])
        torch.testing.assert_close(h[1, 0, 6:], out[0, 0, 6:])
    else:
        torch.testing.assert_close(h, raw_h)


def test_src_len_none_means_full_length():
    opt = _opts("-encoder_type", "bidentity_ran")
    enc = _model(opt).eval().encoder
    src, _ = _batch([4, 4], len(SRC_TOKENS))
    a = enc(src, None)
    b = enc(src, torch.tensor([4, 4]))
    torch.testing.assert_close(a[0], b[0])
    assert a[2] is None


def test_gru_bridge_maps_h_and_passes_c():
    torch.manual_seed(0)
    opt = _opts("-encoder_type", "bran", "-rnn_type", "GRU", "-bridge")
    enc = _model(opt).eval().encoder
    src, src_len = _batch([3, 2], len(SRC_TOKENS))
    _, (h, c), _ = enc(src, src_len)
    _, (raw_h, raw_c) = enc.rnn(enc.embeddings(src), lengths=src_len)
    joined_c = torch.cat([raw_c[0::2], raw_c[1::2]], dim=2)
    torch.testing.assert_close(c, joined_c)
    flat = torch.cat([raw_h[0::2], raw_h[1::2]], dim=2).permute(1, 0, 2).reshape(2, 24)
    expected = torch.relu(enc.bridge[0](flat)).view(2, 2, 12).permute(1, 0, 2)
    torch.testing.assert_close(h, expected)


def test_dropout_and_update_dropout():
    opt = _opts("-encoder_type", "bran", "-dropout", "0.3")
    model = _model(opt)
    enc = model.encoder
    assert enc.rnn.dropout == 0.3 and enc.embeddings.dropout.p == 0.3
    model.update_dropout(0.1, 0.1)  # what -dropout_steps calls
    assert enc.rnn.dropout == 0.1 and enc.embeddings.dropout.p == 0.1
    # dropout between layers acts in training mode and not in eval mode
    src, src_len = _batch([5, 5], len(SRC_TOKENS))
    enc.update_dropout(0.5)
    enc.eval()
    a, b = enc(src, src_len)[0], enc(src, src_len)[0]
    torch.testing.assert_close(a, b)
    enc.train()
    torch.manual_seed(1)
    c = enc(src, src_len)[0]
    assert not torch.allclose(a, c)
    with pytest.raises(ValueError, match=r"dropout must be a number in \[0, 1\)"):
        enc.update_dropout(1.5)


def test_more_encoder_than_decoder_layers_with_input_feed():
    opt = _opts("-encoder_type", "bran", "-enc_layers", "3", "-dec_layers", "2")
    model = _model(opt)
    src, src_len = _batch([4, 3], len(SRC_TOKENS))
    tgt, _ = _batch([3, 3], len(TGT_TOKENS))
    dec_out, _ = model(src, tgt, src_len)
    assert dec_out.shape == (2, 2, 12)


def test_transformer_decoder_reads_the_encoder_outputs():
    # no RNN decoder: the layer checks do not apply (here 2 encoder layers, 1 decoder layer)
    opt = _opts("-encoder_type", "bran", "-decoder_type", "transformer", "-heads", "2",
                "-transformer_ff", "16", "-position_encoding", "-word_vec_size", "12",
                "-layers", "-1", "-enc_layers", "2", "-dec_layers", "1")
    model = _model(opt)
    src, src_len = _batch([5, 3, 4], len(SRC_TOKENS))
    tgt, _ = _batch([4, 4, 4], len(TGT_TOKENS), seed=1)
    dec_out, _ = model(src, tgt, src_len)
    assert dec_out.shape == (3, 3, 12) and torch.isfinite(dec_out).all()


def test_encoder_constructor_checks():
    emb = _model(_opts("-encoder_type", "ran")).encoder.embeddings
    E = ours.AblatedRNNEncoder
    with pytest.raises(ValueError, match="embeddings must be the onmt.modules.Embeddings"):
        E("ran", False, 1, 8)
    with pytest.raises(ValueError, match="must be even, got 7"):
        E("ran", True, 1, 7, embeddings=emb)
    with pytest.raises(ValueError, match="enc_layers must be a positive integer"):
        E("ran", False, 0, 8, embeddings=emb)
    with pytest.raises(ValueError, match="unknown variant 'gru'"):
        E("gru", False, 1, 8, embeddings=emb)
    with pytest.raises(ValueError, match="ablated_init must be one of gate_bias, onmt, variant"):
        E("ran", False, 1, 8, embeddings=emb, init="zeros")
    with pytest.raises(ValueError, match="per-type subclass|registered encoder classes"):
        E.from_opt(_opts("-encoder_type", "ran"), emb)


# ----------------------------------------------------------------------------- initialisation
def _train_opts(*args):
    return _opts("-param_init", "0.1", *args)


def _build(opt, checkpoint=None):
    import onmt.model_builder as mb
    torch.manual_seed(0)
    return mb.build_model(opt, opt, _vocabs(), checkpoint, -1)


def test_default_init_is_onmt_param_init_for_every_encoder_type():
    """Like brnn: OpenNMT's -param_init 0.1 for every parameter of every encoder type."""
    import onmt.model_builder as mb
    assert getattr(mb.build_model, "__rnn_ablations_wrapped__", False)
    for enc_type in ALL_TYPES + ["brnn"]:
        model = _build(_train_opts("-encoder_type", enc_type))
        for name, p in model.encoder.named_parameters():
            if "embeddings" in name:
                continue
            assert p.abs().max() <= 0.1 and p.std() > 0.02, (enc_type, name)


def test_gate_bias_init_survives_onmt_param_init_for_every_variant_with_a_forget_gate():
    H = 6  # per direction
    model = _build(_train_opts("-encoder_type", "bran", "-ablated_init", "gate_bias"))
    biases = {n: p for n, p in model.encoder.rnn.named_parameters() if n.startswith("bias")}
    assert len(biases) == 4  # 2 layers x 2 directions, one bias each
    for name, b in biases.items():
        torch.testing.assert_close(b[H:2 * H], torch.ones(H))  # i, f
        assert b[:H].abs().max() <= 0.1 and b[:H].std() > 0.02  # OpenNMT's init kept
    for name, w in model.encoder.rnn.named_parameters():
        if name.startswith("weight"):
            assert w.abs().max() <= 0.1  # OpenNMT's -param_init 0.1 kept for the weights
    # the LSTM gets the same forget bias (bias_ih slice 1, bias_hh slice 0: the sum is 1)
    model = _build(_train_opts("-encoder_type", "blstm", "-ablated_init", "gate_bias"))
    rnn = model.encoder.rnn
    for layer in range(2):
        for direction in range(2):
            b = rnn.layer_parameters(layer, direction)[2]
            torch.testing.assert_close(b[H:2 * H], torch.ones(H))
    # LSTM − S-RNN − HIDDEN: its forget gate reads x_t only, its bias (i, f, o) gets the same slice
    model = _build(_train_opts("-encoder_type", "blstm_minus_srnn_minus_hidden",
                               "-ablated_init", "gate_bias"))
    rnn = model.encoder.rnn
    assert not any(n.startswith("weight_hh") for n, _ in rnn.named_parameters())
    for layer in range(2):
        for direction in range(2):
            b = rnn.layer_parameters(layer, direction)[2]
            assert b.shape == (3 * H,)
            torch.testing.assert_close(b[H:2 * H], torch.ones(H))
            assert b[2 * H:].abs().max() <= 0.1 and b[2 * H:].std() > 0.02  # o: OpenNMT's init
    # srnn has no forget gate: OpenNMT's init stays
    model = _build(_train_opts("-encoder_type", "srnn", "-ablated_init", "gate_bias"))
    for name, p in model.encoder.rnn.named_parameters():
        assert p.abs().max() <= 0.1 and p.std() > 0.02, name


def test_onmt_and_variant_init_modes():
    model = _build(_train_opts("-encoder_type", "lstm_minus_srnn", "-ablated_init", "onmt"))
    for name, p in model.encoder.rnn.named_parameters():
        assert p.abs().max() <= 0.1 and p.std() > 0.02, name
    model = _build(_train_opts("-encoder_type", "lstm_minus_srnn", "-ablated_init", "variant"))
    bound = 1 / math.sqrt(12)
    params = list(model.encoder.rnn.parameters())
    assert all(p.abs().max() <= bound for p in params)  # nn.LSTM's rule, biases included
    assert max(p.abs().max() for p in params) > 0.15  # not OpenNMT's 0.1 any more
    # the bridge and the embeddings keep OpenNMT's init
    model = _build(_train_opts("-encoder_type", "ran", "-ablated_init", "variant", "-bridge"))
    assert model.encoder.bridge[0].weight.abs().max() <= 0.1


def test_init_not_reapplied_when_loading_a_checkpoint():
    opt = _train_opts("-encoder_type", "ran", "-ablated_init", "gate_bias")
    trained = _build(opt)
    with torch.no_grad():
        for p in trained.encoder.rnn.parameters():
            p.add_(0.01)
    state = {k: v.clone() for k, v in trained.state_dict().items() if not k.startswith("generator")}
    checkpoint = {"model": state, "generator": {k: v.clone() for k, v in
                                                trained.generator.state_dict().items()}}
    expected = {k: v.clone() for k, v in trained.encoder.rnn.state_dict().items()}
    resumed = _build(opt, checkpoint)
    for k, v in resumed.encoder.rnn.state_dict().items():
        torch.testing.assert_close(v, expected[k])


# ----------------------------------------------------------------------------- option checks
def _check(*args):
    opt = _opts(*args, validate=False)
    ArgumentParser.validate_model_opts(opt)  # the wrapped classmethod, as onmt calls it


def test_unknown_encoder_type_lists_the_valid_ones():
    with pytest.raises(ValueError) as info:
        _check("-encoder_type", "gru")
    msg = str(info.value)
    assert "-encoder_type 'gru' is unknown" in msg
    for name in ALL_TYPES + ["brnn", "rnn", "transformer", "cnn", "mean"]:
        assert name in msg
    with pytest.raises(ValueError, match=r"unknown \(did you mean 'bran'\?\)"):
        _check("-encoder_type", "BRAN")
    with pytest.raises(ValueError, match=r"did you mean 'ran'\?"):
        _check("-encoder_type", "tanh_ran")
    with pytest.raises(ValueError, match=r"did you mean 'bidentity_ran'\?"):
        _check("-encoder_type", "bi-identity-ran")
    for typo, meant in (("BRAN_x", "bran"), ("brann", "bran"), ("lstm_minus_srnnx", "lstm_minus_srnn")):
        with pytest.raises(ValueError, match=rf"'{typo}' is unknown \(did you mean '{meant}'\?\)"):
            _check("-encoder_type", typo)


def test_hidden_size_mismatch_and_layers_are_rejected():
    with pytest.raises(ValueError, match=r"-enc_hid_size 16\) must equal the decoder hidden size "
                                         r"\(-dec_hid_size 32\)"):
        _check("-encoder_type", "ran", "-hidden_size", "-1", "-enc_hid_size", "16",
               "-dec_hid_size", "32")
    with pytest.raises(ValueError, match="bidirectional: -enc_hid_size 15 .* must be even"):
        _check("-encoder_type", "bran", "-hidden_size", "15")
    with pytest.raises(ValueError, match=r"fewer layers \(-enc_layers 1\) than the decoder "
                                         r"\(-dec_layers 2\)"):
        _check("-encoder_type", "bsrnn", "-layers", "-1", "-enc_layers", "1", "-dec_layers", "2")
    with pytest.raises(ValueError, match="-input_feed 0: the decoder .* exactly -dec_layers 1"):
        _check("-encoder_type", "ran", "-layers", "-1", "-enc_layers", "2", "-dec_layers", "1",
               "-input_feed", "0")
    _check("-encoder_type", "ran", "-layers", "-1", "-enc_layers", "3", "-dec_layers", "2")
    opt = _opts("-encoder_type", "ran", validate=False)
    opt.ablated_init = "zeros"
    with pytest.raises(ValueError, match="-ablated_init must be one of"):
        ours.check_model_opts(opt)
    # OpenNMT's own encoders keep OpenNMT's checks
    with pytest.raises(AssertionError, match="must be the same size"):
        _check("-encoder_type", "brnn", "-hidden_size", "-1", "-enc_hid_size", "16",
               "-dec_hid_size", "32")


def test_cli_wrapper_reports_bad_options_cleanly(capsys):
    from rnn_ablations import cli
    rc = cli.main(["onmt-train", "-data", "{}", "-src_vocab", "x", "-encoder_type", "bogus"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "rnn-ablations onmt-train: error: -encoder_type 'bogus' is unknown" in err
    assert "bran" in err


# ----------------------------------------------------------------------------- configs
PAPER_CONFIGS = sorted(CONFIGS.glob("multi30k_*.yaml"))


def test_paper_configs_differ_from_the_lstm_one_in_the_encoder_type_and_save_model_only():
    reference = (CONFIGS / "multi30k_blstm.yaml").read_text().splitlines()
    seen = set()
    for path in PAPER_CONFIGS:
        lines = path.read_text().splitlines()
        enc_type = path.stem[len("multi30k_"):]
        seen.add(enc_type)
        if enc_type == "blstm":
            continue
        changed = [d for d in difflib.unified_diff(reference, lines, n=0, lineterm="")
                   if d[:1] in "+-" and not d.startswith(("+++", "---"))]
        assert changed == ["-encoder_type: blstm", f"+encoder_type: {enc_type}",
                           "-save_model: run/multi30k/blstm/model",
                           f"+save_model: run/multi30k/{enc_type}/model"], path.name
        assert len(lines) == len(reference)
    assert seen == {"b" + v for v in VARIANTS} | {"brnn"}


@pytest.mark.parametrize("path", PAPER_CONFIGS + [CONFIGS / "smoke_multi30k.yaml"],
                         ids=lambda p: p.name)
def test_configs_are_valid_onmt_train_configs(path):
    opt, unknown = _get_parser().parse_known_args(["-config", str(path)])
    assert unknown == []
    ArgumentParser.validate_train_opts(opt)
    ArgumentParser.update_model_opts(opt)
    ArgumentParser.validate_model_opts(opt)
    assert opt.encoder_type in onmt.encoders.str2enc
    import yaml
    data = yaml.safe_load(opt.data)
    for corpus in data.values():
        for key in ("path_src", "path_tgt"):
            assert corpus[key].startswith("data/multi30k/"), corpus[key]
    if SHARED_DATA.exists():
        for corpus in data.values():
            for key in ("path_src", "path_tgt"):
                assert (SHARED_DATA / corpus[key][len("data/"):]).is_file(), corpus[key]


def test_a_typo_in_a_config_is_not_silently_accepted(tmp_path):
    cfg = tmp_path / "typo.yaml"
    cfg.write_text((CONFIGS / "multi30k_bran.yaml").read_text() + "encoder_tpye: ran\n")
    opt, unknown = _get_parser().parse_known_args(["-config", str(cfg)])
    assert any("encoder_tpye" in u for u in unknown)  # what the config test above relies on


def test_toy_config_uses_the_documented_default_init():
    """docs/onmt.md calls ablated_init: onmt the unconfounded default; the toy config agrees."""
    import yaml
    from conftest import REPO
    config = yaml.safe_load((REPO / "onmt_configs" / "toy_fixture.yaml").read_text())
    assert config["ablated_init"] == "onmt"
    assert "| `onmt` (default) |" in (REPO / "docs" / "onmt.md").read_text()
