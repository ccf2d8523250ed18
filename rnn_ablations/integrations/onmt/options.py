"""OpenNMT-py's options with the rnn_ablations encoders: the ``-ablated_init`` option, the early
checks of the model options (:func:`check_model_opts`) and of ``-train_from``
(:func:`check_train_from`), ``${NAME}`` in a config's data paths (:func:`expand_data_paths`), and
the patches of OpenNMT-py's parser and model builder that apply them (installed by
:func:`rnn_ablations.integrations.onmt.register`).  OpenNMT-py is imported only inside the
functions that need it."""
from __future__ import annotations

import functools
import os
import re
import sys
from typing import Callable, Optional

from ...variants import VARIANTS
from .encoder_types import (DEFAULT_INIT, ENCODER_TYPES, INIT_CHOICES, OnmtUsageError,
                            encoder_type_for, require_onmt)

__all__ = ["check_model_opts", "check_train_from", "expand_data_paths", "install"]


# ---------------------------------------------------------------------- option checks
def _valid_types_message(str2enc) -> str:
    ours = [t for t in ENCODER_TYPES]
    theirs = sorted(t for t in str2enc if t not in ENCODER_TYPES)
    return (f"valid encoder types are: {', '.join(theirs)} (OpenNMT-py) and {', '.join(ours)} "
            "(rnn_ablations: a variant name for a unidirectional encoder, 'b' + the name for a "
            "bidirectional one)")


def _suggest(name) -> Optional[str]:
    """Our encoder type for a near miss: another case, '-', a variant alias (``tanh_ran``), or
    the closest of our types to a typo (``BRAN_x`` → ``bran``)."""
    if not isinstance(name, str):
        return None
    key = name.strip().lower().replace("-", "_")
    candidates = [(key, False)]
    if key.startswith("bi_"):
        candidates.append((key[3:], True))
    if key.startswith("b"):
        candidates.append((key[1:], True))
    for variant, bidirectional in candidates:
        try:
            return encoder_type_for(variant, bidirectional)
        except (ValueError, TypeError):
            continue
    import difflib  # a typo (``BRAN_x``, ``brann``): the closest of our types

    close = difflib.get_close_matches(key, list(ENCODER_TYPES), n=1, cutoff=0.6)
    return close[0] if close else None


def check_model_opts(opt) -> None:
    """Check the model options that concern the encoder; raise :class:`OnmtUsageError` (a
    ``ValueError``) with a message saying what is wrong and how to fix it.  Expects the options
    after OpenNMT's ``ArgumentParser.update_model_opts`` (as ``validate_model_opts`` gets
    them)."""
    require_onmt()
    from onmt.encoders import str2enc

    if getattr(opt, "model_task", "seq2seq") != "seq2seq" or getattr(opt, "model_type", "text") != "text":
        return  # the language-model task has no encoder
    enc = getattr(opt, "encoder_type", None)
    if enc not in str2enc:
        hint = _suggest(enc)
        hint = f" (did you mean {hint!r}?)" if hint else ""
        raise OnmtUsageError(f"-encoder_type {enc!r} is unknown{hint}; "
                             f"{_valid_types_message(str2enc)}")
    if enc not in ENCODER_TYPES:
        return
    _variant, bidirectional = ENCODER_TYPES[enc]
    enc_h, dec_h = opt.enc_hid_size, opt.dec_hid_size
    if enc_h != dec_h:
        raise OnmtUsageError(
            f"-encoder_type {enc}: the encoder hidden size (-enc_hid_size {enc_h}) must equal the "
            f"decoder hidden size (-dec_hid_size {dec_h}): the decoder starts from the encoder's "
            "final state and attends over its outputs; set both to the same value (or use "
            "-hidden_size)")
    if bidirectional and enc_h % 2:
        raise OnmtUsageError(
            f"-encoder_type {enc} is bidirectional: -enc_hid_size {enc_h} is split between the two "
            "directions and must be even")
    init = getattr(opt, "ablated_init", DEFAULT_INIT)
    if init not in INIT_CHOICES:
        raise OnmtUsageError(f"-ablated_init must be one of {', '.join(INIT_CHOICES)}, got {init!r}")
    if getattr(opt, "decoder_type", "rnn") == "rnn":
        enc_l, dec_l = opt.enc_layers, opt.dec_layers
        if enc_l < dec_l:
            raise OnmtUsageError(
                f"-encoder_type {enc} with an RNN decoder: the encoder has fewer layers "
                f"(-enc_layers {enc_l}) than the decoder (-dec_layers {dec_l}); decoder layer k "
                "starts from encoder layer k's final state, so use -enc_layers >= -dec_layers "
                "(or -layers N for both)")
        if enc_l > dec_l and not getattr(opt, "input_feed", 1):
            raise OnmtUsageError(
                f"-encoder_type {enc} with -input_feed 0: the decoder (torch.nn.{opt.rnn_type}) "
                f"needs an initial state with exactly -dec_layers {dec_l} layers but the encoder "
                f"has -enc_layers {enc_l}; use the same number of layers or -input_feed 1")


_ENCODER_TYPE_DEFAULT = "rnn"   # OpenNMT-py's default -encoder_type


def _encoder_type_given(opt) -> bool:
    """Whether this command chose -encoder_type (not OpenNMT's default, or named on the command
    line); OpenNMT's parsed options do not say whether a default value was typed."""
    if getattr(opt, "encoder_type", _ENCODER_TYPE_DEFAULT) != _ENCODER_TYPE_DEFAULT:
        return True
    return any(a in ("-encoder_type", "--encoder_type") or a.startswith("--encoder_type=")
               for a in sys.argv[1:])


def check_train_from(model_opt, opt, checkpoint) -> None:
    """``-train_from``: OpenNMT-py rebuilds the model from the checkpoint's options (unless
    ``-override_opts``), so a different ``-encoder_type`` on the command line would be silently
    ignored.  Raise :class:`OnmtUsageError` when the command asks for another encoder type
    than the checkpoint's, and log a warning when it only has OpenNMT's default ``rnn``."""
    if checkpoint is None or opt is None or model_opt is opt or getattr(opt, "override_opts", False):
        return
    ckpt_opt = checkpoint.get("opt") if isinstance(checkpoint, dict) else None
    ckpt_enc = getattr(ckpt_opt, "encoder_type", None) or getattr(model_opt, "encoder_type", None)
    asked = getattr(opt, "encoder_type", None)
    if ckpt_enc is None or asked is None or asked == ckpt_enc:
        return
    where = getattr(opt, "train_from", "") or "the checkpoint"
    if _encoder_type_given(opt):
        raise OnmtUsageError(
            f"-train_from {where}: the checkpoint's encoder is -encoder_type {ckpt_enc}, but this "
            f"command asks for -encoder_type {asked}. OpenNMT-py would continue the checkpoint's "
            f"{ckpt_enc} encoder and ignore the option; set -encoder_type {ckpt_enc} (or leave it "
            f"out) to continue training, or start a new model without -train_from to train a "
            f"{asked} encoder")
    from onmt.utils.logging import logger
    logger.warning("-train_from %s: continuing with the checkpoint's -encoder_type %s (this "
                   "command has OpenNMT-py's default -encoder_type %s, which is ignored)",
                   where, ckpt_enc, asked)


_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def expand_data_paths(data):
    """The ``data:`` option (YAML text, or the dict OpenNMT-py makes of it) with every
    ``${NAME}`` replaced by the environment variable ``NAME``; :class:`OnmtUsageError` naming
    the variables that are not set (a path would otherwise point nowhere)."""
    text = data if isinstance(data, str) else None
    if text is None:
        return data
    missing = sorted({m.group(1) for m in _VARIABLE.finditer(text)} - set(os.environ))
    if missing:
        raise OnmtUsageError(
            f"the config's data paths use the environment variable(s) {', '.join(missing)}, "
            f"which {'is' if len(missing) == 1 else 'are'} not set: set "
            f"{' and '.join(missing)} to the data folder (the config's header says what each "
            f"holds), e.g. export {missing[0]}=/path/to/data")
    return _VARIABLE.sub(lambda m: os.environ[m.group(1)], text)


# ---------------------------------------------------------------------- patches
_INIT_HELP = (
    "How the rnn_ablations encoders (-encoder_type " + ", ".join(VARIANTS) + " "
    "and their bidirectional b* forms) are initialised after -param_init/-param_init_glorot, for a "
    "new model: 'onmt' (default) keeps OpenNMT's init, as for its own brnn encoder; 'gate_bias' "
    "keeps it and sets the forget-gate bias to 1 in every variant with a forget gate (lstm "
    "included); 'variant' re-applies AblatedRNN's own init (nn.LSTM's rule: every weight and "
    "bias U(+-1/sqrt(H))) to the recurrent layers.")

_ENC_TYPE_HELP = (
    " rnn_ablations adds the unidirectional " + "|".join(t for t in ENCODER_TYPES if not ENCODER_TYPES[t][1])
    + " and the bidirectional " + "|".join(t for t in ENCODER_TYPES if ENCODER_TYPES[t][1]) + ".")


def _add_model_opts(parser) -> None:
    if "-ablated_init" in getattr(parser, "_option_string_actions", {}):
        return
    group = parser.add_argument_group("Model- rnn_ablations encoders")
    group.add_argument("--ablated_init", "-ablated_init", type=str, default=DEFAULT_INIT,
                       choices=list(INIT_CHOICES), help=_INIT_HELP)
    for action in getattr(parser, "_actions", []):
        if action.dest == "encoder_type" and action.help and _ENC_TYPE_HELP not in action.help:
            action.help += _ENC_TYPE_HELP


def wrapped(func, marker="__rnn_ablations_wrapped__") -> bool:
    """Whether ``func`` is one of the package's wrappers (each patch is installed once)."""
    return getattr(func, marker, False)


def _patch_model_opts(onmt_opts) -> None:
    original = onmt_opts.model_opts
    if wrapped(original):
        return

    @functools.wraps(original)
    def model_opts(parser):
        original(parser)
        _add_model_opts(parser)

    model_opts.__rnn_ablations_wrapped__ = True
    onmt_opts.model_opts = model_opts


def _patch_validate_model_opts(parser_cls) -> None:
    current = parser_cls.__dict__.get("validate_model_opts")
    original = current.__func__ if isinstance(current, classmethod) else None
    if original is None or wrapped(original):
        return

    @functools.wraps(original)
    def validate_model_opts(cls, model_opt):
        check_model_opts(model_opt)
        return original(cls, model_opt)

    validate_model_opts.__rnn_ablations_wrapped__ = True
    parser_cls.validate_model_opts = classmethod(validate_model_opts)


def _patch_validate_data(parser_cls) -> None:
    # defined on a mixin of ArgumentParser: wrap it on ArgumentParser itself
    original = getattr(getattr(parser_cls, "_validate_data", None), "__func__", None)
    if original is None or wrapped(original):
        return

    @functools.wraps(original)
    def _validate_data(cls, opt):
        if isinstance(getattr(opt, "data", None), str):
            opt.data = expand_data_paths(opt.data)
        return original(cls, opt)

    _validate_data.__rnn_ablations_wrapped__ = True
    parser_cls._validate_data = classmethod(_validate_data)


def _patch_build_model(after_build: Callable, modules) -> None:
    import onmt.model_builder as mb

    original = mb.build_model
    if not wrapped(original):
        @functools.wraps(original)
        def build_model(model_opt, opt, vocabs, checkpoint, *args, **kwargs):
            check_train_from(model_opt, opt, checkpoint)
            model = original(model_opt, opt, vocabs, checkpoint, *args, **kwargs)
            after_build(model, checkpoint)
            return model

        build_model.__rnn_ablations_wrapped__ = True
        mb.build_model = build_model
    # modules that did `from onmt.model_builder import build_model` before we ran
    for module in modules:
        if module is not None and getattr(module, "build_model", None) is original:
            module.build_model = mb.build_model


def install(after_build: Callable) -> None:
    """Patch OpenNMT-py (idempotent): ``-ablated_init`` in ``onmt.opts.model_opts`` and our types
    in the ``-encoder_type`` help; :func:`check_model_opts` first in
    ``ArgumentParser.validate_model_opts``; :func:`expand_data_paths` first in
    ``ArgumentParser._validate_data``; ``onmt.model_builder.build_model`` runs
    :func:`check_train_from` before and ``after_build(model, checkpoint)`` after building."""
    import onmt.opts
    import onmt.utils.parse

    _patch_model_opts(onmt.opts)
    _patch_validate_model_opts(onmt.utils.parse.ArgumentParser)
    _patch_validate_data(onmt.utils.parse.ArgumentParser)
    _patch_build_model(after_build, [sys.modules.get("onmt.train_single")])
