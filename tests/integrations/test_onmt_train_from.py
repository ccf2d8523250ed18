"""`onmt_train -train_from` with an -encoder_type other than the checkpoint's: OpenNMT-py keeps
the checkpoint's type and would silently ignore the option; we refuse it (or warn when the
command only has OpenNMT's default)."""
import argparse
import logging

import pytest

onmt = pytest.importorskip("onmt", reason="OpenNMT-py is not installed (bash scripts/setup.sh)")

import onmt.model_builder  # noqa: E402

from rnn_ablations.integrations.onmt import check_train_from, is_registered  # noqa: E402


def _opts(encoder_type, **kw):
    return argparse.Namespace(encoder_type=encoder_type, **kw)


def _checkpoint(encoder_type="bran"):
    return {"opt": _opts(encoder_type), "model": {}}


def test_another_encoder_type_is_refused_through_build_model(monkeypatch):
    """The check runs inside OpenNMT-py's build_model (as patched by the registration)."""
    assert is_registered()
    monkeypatch.setattr("sys.argv", ["onmt_train", "-config", "c.yaml", "-encoder_type", "blstm"])
    opt = _opts("blstm", train_from="run/model_step_4.pt", override_opts=False)
    with pytest.raises(ValueError) as info:
        onmt.model_builder.build_model(_opts("bran"), opt, None, _checkpoint("bran"))
    msg = str(info.value)
    assert "-train_from run/model_step_4.pt" in msg
    assert "-encoder_type bran" in msg and "-encoder_type blstm" in msg
    assert "without -train_from" in msg


def test_openNMT_default_type_is_refused_when_typed(monkeypatch):
    monkeypatch.setattr("sys.argv", ["onmt_train", "-encoder_type", "rnn", "-train_from", "m.pt"])
    with pytest.raises(ValueError, match="asks for -encoder_type rnn"):
        check_train_from(_opts("bran"), _opts("rnn", train_from="m.pt"), _checkpoint("bran"))
    monkeypatch.setattr("sys.argv", ["onmt_train", "--encoder_type=rnn"])
    with pytest.raises(ValueError):
        check_train_from(_opts("bran"), _opts("rnn", train_from="m.pt"), _checkpoint("bran"))


def test_openNMT_default_type_not_typed_gives_a_warning(monkeypatch, caplog):
    monkeypatch.setattr("sys.argv", ["onmt_train", "-config", "c.yaml", "-train_from", "m.pt"])
    with caplog.at_level(logging.WARNING, logger="onmt"):
        check_train_from(_opts("bran"), _opts("rnn", train_from="m.pt"), _checkpoint("bran"))
    assert "continuing with the checkpoint's -encoder_type bran" in caplog.text


def test_matching_type_override_and_new_models_pass(monkeypatch, caplog):
    monkeypatch.setattr("sys.argv", ["onmt_train", "-encoder_type", "bran"])
    with caplog.at_level(logging.WARNING, logger="onmt"):
        check_train_from(_opts("bran"), _opts("bran", train_from="m.pt"), _checkpoint("bran"))
        # -override_opts: OpenNMT builds the command's model (torch then checks the weights)
        opt = _opts("blstm", train_from="m.pt", override_opts=True)
        check_train_from(opt, opt, _checkpoint("bran"))
        # a new model (no checkpoint)
        check_train_from(_opts("blstm"), _opts("blstm"), None)
    assert caplog.text == ""
