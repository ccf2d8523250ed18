"""OpenNMT-py 3.5.1 encoders for every variant of :mod:`rnn_ablations.variants`.

After :func:`register` (which the start-up hook ``rnn_ablations_hooks`` runs automatically right
after ``onmt`` is imported) the plain OpenNMT-py commands accept these encoder types::

    onmt_train -config my.yaml -encoder_type bran        # or `encoder_type: bran` in the YAML

====================  ===========================  ===================================
encoder type          variant                      direction
====================  ===========================  ===================================
``lstm``              LSTM (our implementation)    unidirectional
``srnn``              LSTM − GATES (S-RNN)         unidirectional
``lstm_minus_srnn``   LSTM − S-RNN                 unidirectional
``ran``               LSTM − S-RNN − OUT (RAN)     unidirectional
``identity_ran``      identity RAN                 unidirectional
``lstm_minus_srnn_    LSTM − S-RNN − HIDDEN        unidirectional
minus_hidden``
``blstm`` ...         the same cells               bidirectional (``b`` + the variant
                                                   name), like OpenNMT's ``brnn``
====================  ===========================  ===================================

(The list is the variant table's: a variant added there gets both encoder types.)

The encoder honours ``-enc_layers``, ``-enc_hid_size`` (``-hidden_size``), ``-dropout`` (between
layers and on the source embeddings, and ``-dropout_steps`` through ``update_dropout``) and
``-bridge``; the ``rnn_type`` option only selects the *decoder* cell (and how many states the
bridge maps).  Bidirectional encoders use ``enc_hid_size / 2`` units per direction and join the
two directions of every layer before handing the state to the decoder, exactly like OpenNMT's
``brnn`` + ``_fix_enc_hidden``.  The final state is always ``(h, c)``, each
``(enc_layers, batch, enc_hid_size)`` (``c`` is a copy of ``h`` for ``srnn``); the GRU decoder
uses ``h``.

Initialisation: OpenNMT re-initialises every parameter after building the model (``-param_init``
uniform, ``U(±0.1)`` by default, or ``-param_init_glorot``).  By default every encoder type keeps
exactly that init, as OpenNMT's own ``brnn``/``rnn`` encoders do, so every variant starts from the
distribution the LSTM starts from.  The option ``-ablated_init`` (added to ``onmt_train``'s model
options, so it is saved in the checkpoint) lets the user ask for something else; it acts on a new
model only (never after ``-train_from``) and only on our encoder types (``brnn`` never gets it):

* ``onmt`` (default): keep OpenNMT's initialisation for everything.
* ``gate_bias``: keep OpenNMT's initialisation, then set the forget-gate bias to 1 in every variant
  that has a forget gate, ``lstm`` included (:meth:`AblatedRNN.set_forget_bias_`: for ``lstm``
  ``bias_ih``'s forget slice 1 and ``bias_hh``'s 0); the other bias entries keep OpenNMT's init;
  ``srnn`` has no forget gate and is unchanged.
* ``variant``: :meth:`AblatedRNN.reset_parameters` for the whole recurrent stack (``nn.LSTM``'s
  rule, every weight and bias ``U(±1/√H)``, for every variant); the embeddings and the bridge
  keep OpenNMT's init.

Without OpenNMT-py this module still imports (AllenNLP's ``--include-package rnn_ablations``
imports every submodule); constructing an encoder, :func:`register` and the option checks then
raise an ``ImportError`` naming the pip command that installs OpenNMT-py (:func:`require_onmt`).
OpenNMT-py's checkpoint loader is made to check the checkpoint's ``-encoder_type`` against the
model, and a ``variant_state`` entry (written by earlier versions) against both, then to drop
that entry (:func:`prepare_checkpoint`).

:func:`register` also makes ``argparse.Namespace`` a torch safe global (OpenNMT-py 3.5.1
checkpoints contain one and torch ≥ 2.6 loads ``weights_only``), and checks the model options
early: an unknown ``-encoder_type`` lists the valid ones, and with our encoders the encoder and
decoder hidden sizes must match and an RNN decoder may not have more layers than the encoder.
With ``-train_from``, a command whose ``-encoder_type`` differs from the checkpoint's is refused
(OpenNMT-py would silently keep the checkpoint's type; see :func:`check_train_from`).
"""
from __future__ import annotations

import argparse
import functools
import os
import re
import threading
from typing import Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

# Defined before OpenNMT-py is imported below: when this module is imported before `onmt`, the
# import of `onmt` fires the start-up hook, which imports `register` from this (still partially
# initialised) module and calls it; the registration then happens at the end of this module.
_READY = False
_REGISTER_WHEN_READY = False


def register() -> None:
    """Register every encoder type into OpenNMT-py (idempotent, safe to call again).

    * ``onmt.encoders.str2enc[type] = class`` for every type of :data:`ENCODER_TYPES`
      (``register_encoder`` refuses duplicates, so the dict is filled directly);
    * ``-ablated_init`` is added to ``onmt.opts.model_opts`` (shown by ``onmt_train -h`` and
      saved with the model options in the checkpoint) and the ``-encoder_type`` help lists ours;
    * ``ArgumentParser.validate_model_opts`` first runs :func:`check_model_opts`;
    * ``ArgumentParser._validate_data`` first replaces ``${NAME}`` in the corpora's paths (the
      config's ``data:`` section) by environment variable ``NAME`` (:func:`expand_data_paths`),
      so that a shipped config names its data through variables;
    * ``onmt.model_builder.build_model`` applies ``-ablated_init`` after OpenNMT's init;
    * OpenNMT's checkpoint loader (``BaseModel.load_state_dict``) first runs
      :func:`prepare_checkpoint` (refuses a checkpoint of another variant; drops the
      ``variant_state`` entry of earlier versions after checking it);
    * ``torch.serialization.add_safe_globals([argparse.Namespace])``.
    """
    global _REGISTER_WHEN_READY
    if not _READY:
        _REGISTER_WHEN_READY = True
        return
    _register()


try:
    from onmt.encoders.encoder import EncoderBase
    ONMT_IMPORT_ERROR: Optional[ImportError] = None
except ImportError as _exc:
    # This module must import without OpenNMT-py: AllenNLP's --include-package imports every
    # submodule of rnn_ablations.  The classes below are then built on nn.Module and every entry
    # point (constructing an encoder, register, the option checks) raises require_onmt()'s error.
    EncoderBase = nn.Module
    ONMT_IMPORT_ERROR = _exc


def require_onmt() -> None:
    """Raise ``ImportError`` saying how to install OpenNMT-py when it cannot be imported."""
    if ONMT_IMPORT_ERROR is not None:
        raise ImportError(
            f"the OpenNMT-py encoders of rnn_ablations need OpenNMT-py 3.5.1, which cannot be "
            f"imported here ({ONMT_IMPORT_ERROR}); install it with: {INSTALL_HINT}"
        ) from ONMT_IMPORT_ERROR

from . import ONMT_INSTALL_HINT as INSTALL_HINT
from ..rnn import AblatedRNN
from ..validation import check_positive_int, check_prob
from ..variants import VARIANTS, get_variant

__all__ = [
    "AblatedRNNEncoder", "ENCODER_TYPES", "ENCODER_CLASSES", "INIT_CHOICES", "DEFAULT_INIT",
    "register", "is_registered", "check_model_opts", "check_train_from", "encoder_type_for",
    "require_onmt", "INSTALL_HINT", "ONMT_IMPORT_ERROR", "prepare_checkpoint",
]

#: ``-ablated_init`` choices (see the module docstring).
INIT_CHOICES = ("gate_bias", "onmt", "variant")
DEFAULT_INIT = "onmt"

#: encoder type -> (variant, bidirectional)
ENCODER_TYPES: Dict[str, Tuple[str, bool]] = {}
for _v in VARIANTS:
    ENCODER_TYPES[_v] = (_v, False)
for _v in VARIANTS:
    ENCODER_TYPES["b" + _v] = (_v, True)


def encoder_type_for(variant: str, bidirectional: bool = True) -> str:
    """The encoder type name of a variant (aliases accepted): ``("ran", True)`` -> ``"bran"``."""
    name = get_variant(variant).name
    return ("b" if bidirectional else "") + name


class AblatedRNNEncoder(EncoderBase):
    """OpenNMT-py encoder around :class:`rnn_ablations.AblatedRNN`.

    Args:
        variant: a variant name of the table (``lstm``, ``srnn``, ``lstm_minus_srnn``, ``ran``,
            ``identity_ran``, ``lstm_minus_srnn_minus_hidden``; aliases accepted).
        bidirectional: two directions of ``hidden_size // 2`` units each, joined per layer.
        num_layers, hidden_size: ``-enc_layers``, ``-enc_hid_size`` (the *total* size: the
            decoder's hidden size).
        dropout: ``-dropout``: between layers, and (via ``update_dropout``) on the embeddings.
        embeddings: the :class:`onmt.modules.Embeddings` of the source side.
        use_bridge: ``-bridge``: a ReLU layer from the encoder's final state (all layers
            concatenated) to the decoder's initial state, one per state (``bridge_states``).
        bridge_states: 2 for an LSTM decoder (``h`` and ``c``), 1 for a GRU decoder (``h``; ``c``
            is then passed on unchanged and unused).
        init: ``-ablated_init``; applied by :meth:`apply_ablated_init` after OpenNMT's init.

    ``forward(src, src_len)`` -> ``(enc_out (B, T, hidden_size), (h, c), src_len)`` with
    ``h``, ``c`` each ``(num_layers, B, hidden_size)``; outputs at padded positions are 0 and the
    final states are taken at each row's last real token.
    """

    #: set on the per-type subclasses made by this module
    encoder_type: Optional[str] = None
    __rnn_ablations_encoder__ = True

    def __init__(self, variant, bidirectional: bool, num_layers: int, hidden_size: int,
                 dropout: float = 0.0, embeddings=None, use_bridge: bool = False,
                 bridge_states: int = 2, init: str = DEFAULT_INIT) -> None:
        require_onmt()
        super().__init__()
        self.variant = get_variant(variant)
        if not isinstance(bidirectional, bool):
            raise ValueError(f"bidirectional must be True or False, got {bidirectional!r}")
        num_layers = check_positive_int("enc_layers", num_layers)
        hidden_size = check_positive_int("enc_hid_size", hidden_size)
        dropout = check_prob("dropout", dropout)
        if embeddings is None or not hasattr(embeddings, "embedding_size"):
            raise ValueError("embeddings must be the onmt.modules.Embeddings of the source side "
                             f"(with an embedding_size), got {type(embeddings).__name__}")
        if bidirectional and hidden_size % 2:
            raise ValueError(f"a bidirectional encoder splits enc_hid_size between its two "
                             f"directions: it must be even, got {hidden_size}")
        if bridge_states not in (1, 2):
            raise ValueError(f"bridge_states must be 1 (GRU decoder) or 2 (LSTM decoder), got "
                             f"{bridge_states!r}")
        if init not in INIT_CHOICES:
            raise ValueError(f"ablated_init must be one of {', '.join(INIT_CHOICES)}, got {init!r}")
        self.bidirectional = bidirectional
        self.num_layers = num_layers
        self.hidden_size = hidden_size
        self.ablated_init = init
        self.embeddings = embeddings
        num_directions = 2 if bidirectional else 1
        self.rnn = AblatedRNN(self.variant.name, embeddings.embedding_size,
                              hidden_size // num_directions, num_layers=num_layers,
                              batch_first=True, dropout=dropout, bidirectional=bidirectional)
        self.use_bridge = bool(use_bridge)
        if self.use_bridge:
            total = hidden_size * num_layers
            self.bridge = nn.ModuleList([nn.Linear(total, total) for _ in range(bridge_states)])

    @classmethod
    def from_opt(cls, opt, embeddings):
        """Build from OpenNMT's model options (``cls`` must be a per-type subclass)."""
        if cls.encoder_type is None:
            raise ValueError("use one of the registered encoder classes (ENCODER_CLASSES), not "
                             "the base class, with from_opt")
        variant, bidirectional = ENCODER_TYPES[cls.encoder_type]
        dropout = opt.dropout[0] if isinstance(opt.dropout, (list, tuple)) else opt.dropout
        return cls(variant, bidirectional, opt.enc_layers, opt.enc_hid_size, dropout, embeddings,
                   use_bridge=bool(getattr(opt, "bridge", False)),
                   bridge_states=2 if getattr(opt, "rnn_type", "LSTM") == "LSTM" else 1,
                   init=getattr(opt, "ablated_init", DEFAULT_INIT))

    # ------------------------------------------------------------------ init
    def apply_ablated_init(self, mode: Optional[str] = None) -> None:
        """Re-apply the variant's own initialisation after OpenNMT's ``param_init`` (see the
        module docstring for the modes); ``mode`` defaults to the ``-ablated_init`` it was built
        with."""
        mode = self.ablated_init if mode is None else mode
        if mode not in INIT_CHOICES:
            raise ValueError(f"ablated_init must be one of {', '.join(INIT_CHOICES)}, got {mode!r}")
        if mode == "onmt":
            return
        if mode == "variant":
            self.rnn.reset_parameters()
            return
        self.rnn.set_forget_bias_(1.0)  # gate_bias; a no-op for srnn (no forget gate)

    # ------------------------------------------------------------------ forward
    def _join_directions(self, state: torch.Tensor) -> torch.Tensor:
        # (layers * 2, B, H/2), directions interleaved per layer -> (layers, B, H)
        return torch.cat([state[0::2], state[1::2]], dim=2)

    def _bridge(self, state: torch.Tensor, linear: nn.Linear) -> torch.Tensor:
        layers, batch, hidden = state.shape
        flat = state.permute(1, 0, 2).reshape(batch, layers * hidden)
        out = F.relu(linear(flat)).view(batch, layers, hidden)
        return out.permute(1, 0, 2).contiguous()

    def forward(self, src, src_len=None):
        """See :meth:`onmt.encoders.encoder.EncoderBase.forward`."""
        emb = self.embeddings(src)
        enc_out, (h, c) = self.rnn(emb, lengths=src_len)
        if self.bidirectional:
            h, c = self._join_directions(h), self._join_directions(c)
        if self.use_bridge:
            h = self._bridge(h, self.bridge[0])
            c = self._bridge(c, self.bridge[1]) if len(self.bridge) == 2 else c
        return enc_out, (h, c), src_len

    def update_dropout(self, dropout, attention_dropout=None):
        """Called by OpenNMT for ``-dropout_steps``."""
        self.rnn.dropout = check_prob("dropout", dropout)
        self.embeddings.update_dropout(dropout)

    def extra_repr(self) -> str:
        return (f"encoder_type={self.encoder_type!r}, hidden_size={self.hidden_size}, "
                f"bridge={self.use_bridge}, ablated_init={self.ablated_init!r}")


def _class_name(encoder_type: str) -> str:
    variant, bidirectional = ENCODER_TYPES[encoder_type]
    camel = "".join(part.capitalize() for part in variant.split("_"))
    return f"Ablated{'Bi' if bidirectional else ''}{camel}Encoder"


#: encoder type -> encoder class (module-level classes, so they can be pickled)
ENCODER_CLASSES: Dict[str, type] = {}
for _name in ENCODER_TYPES:
    _cls_name = _class_name(_name)
    _cls = type(_cls_name, (AblatedRNNEncoder,), {
        "encoder_type": _name,
        "__module__": __name__,
        "__qualname__": _cls_name,
        "__doc__": (f"OpenNMT-py encoder type ``{_name}``: {ENCODER_TYPES[_name][0]}, "
                    f"{'bidirectional' if ENCODER_TYPES[_name][1] else 'unidirectional'} "
                    "(see :class:`AblatedRNNEncoder`)."),
    })
    globals()[_cls_name] = _cls
    ENCODER_CLASSES[_name] = _cls
    __all__.append(_cls_name)


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
    """Check the model options that concern the encoder; raise ``ValueError`` with a message
    saying what is wrong and how to fix it.  Expects the options after OpenNMT's
    ``ArgumentParser.update_model_opts`` (as ``validate_model_opts`` gets them)."""
    require_onmt()
    from onmt.encoders import str2enc

    if getattr(opt, "model_task", "seq2seq") != "seq2seq" or getattr(opt, "model_type", "text") != "text":
        return  # the language-model task has no encoder
    enc = getattr(opt, "encoder_type", None)
    if enc not in str2enc:
        hint = _suggest(enc)
        hint = f" (did you mean {hint!r}?)" if hint else ""
        raise ValueError(f"-encoder_type {enc!r} is unknown{hint}; {_valid_types_message(str2enc)}")
    if enc not in ENCODER_TYPES:
        return
    _variant, bidirectional = ENCODER_TYPES[enc]
    enc_h, dec_h = opt.enc_hid_size, opt.dec_hid_size
    if enc_h != dec_h:
        raise ValueError(
            f"-encoder_type {enc}: the encoder hidden size (-enc_hid_size {enc_h}) must equal the "
            f"decoder hidden size (-dec_hid_size {dec_h}): the decoder starts from the encoder's "
            "final state and attends over its outputs; set both to the same value (or use "
            "-hidden_size)")
    if bidirectional and enc_h % 2:
        raise ValueError(
            f"-encoder_type {enc} is bidirectional: -enc_hid_size {enc_h} is split between the two "
            "directions and must be even")
    init = getattr(opt, "ablated_init", DEFAULT_INIT)
    if init not in INIT_CHOICES:
        raise ValueError(f"-ablated_init must be one of {', '.join(INIT_CHOICES)}, got {init!r}")
    if getattr(opt, "decoder_type", "rnn") == "rnn":
        enc_l, dec_l = opt.enc_layers, opt.dec_layers
        if enc_l < dec_l:
            raise ValueError(
                f"-encoder_type {enc} with an RNN decoder: the encoder has fewer layers "
                f"(-enc_layers {enc_l}) than the decoder (-dec_layers {dec_l}); decoder layer k "
                "starts from encoder layer k's final state, so use -enc_layers >= -dec_layers "
                "(or -layers N for both)")
        if enc_l > dec_l and not getattr(opt, "input_feed", 1):
            raise ValueError(
                f"-encoder_type {enc} with -input_feed 0: the decoder (torch.nn.{opt.rnn_type}) "
                f"needs an initial state with exactly -dec_layers {dec_l} layers but the encoder "
                f"has -enc_layers {enc_l}; use the same number of layers or -input_feed 1")


_ENCODER_TYPE_DEFAULT = "rnn"   # OpenNMT-py's default -encoder_type


def _encoder_type_given(opt) -> bool:
    """Whether this command chose -encoder_type (not OpenNMT's default, or named on the command
    line); OpenNMT's parsed options do not say whether a default value was typed."""
    import sys
    if getattr(opt, "encoder_type", _ENCODER_TYPE_DEFAULT) != _ENCODER_TYPE_DEFAULT:
        return True
    return any(a in ("-encoder_type", "--encoder_type") or a.startswith("--encoder_type=")
               for a in sys.argv[1:])


def check_train_from(model_opt, opt, checkpoint) -> None:
    """``-train_from``: OpenNMT-py rebuilds the model from the checkpoint's options (unless
    ``-override_opts``), so a different ``-encoder_type`` on the command line would be silently
    ignored.  Raise ``ValueError`` when the command asks for another encoder type than the
    checkpoint's, and log a warning when it only has OpenNMT's default ``rnn``."""
    if checkpoint is None or opt is None or model_opt is opt or getattr(opt, "override_opts", False):
        return
    ckpt_opt = checkpoint.get("opt") if isinstance(checkpoint, dict) else None
    ckpt_enc = getattr(ckpt_opt, "encoder_type", None) or getattr(model_opt, "encoder_type", None)
    asked = getattr(opt, "encoder_type", None)
    if ckpt_enc is None or asked is None or asked == ckpt_enc:
        return
    where = getattr(opt, "train_from", "") or "the checkpoint"
    if _encoder_type_given(opt):
        raise ValueError(
            f"-train_from {where}: the checkpoint's encoder is -encoder_type {ckpt_enc}, but this "
            f"command asks for -encoder_type {asked}. OpenNMT-py would continue the checkpoint's "
            f"{ckpt_enc} encoder and ignore the option; set -encoder_type {ckpt_enc} (or leave it "
            f"out) to continue training, or start a new model without -train_from to train a "
            f"{asked} encoder")
    from onmt.utils.logging import logger
    logger.warning("-train_from %s: continuing with the checkpoint's -encoder_type %s (this "
                   "command has OpenNMT-py's default -encoder_type %s, which is ignored)",
                   where, ckpt_enc, asked)


# ---------------------------------------------------------------------- registration
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


def _wrapped(func, marker="__rnn_ablations_wrapped__"):
    return getattr(func, marker, False)


def _patch_model_opts(onmt_opts) -> None:
    original = onmt_opts.model_opts
    if _wrapped(original):
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
    if original is None or _wrapped(original):
        return

    @functools.wraps(original)
    def validate_model_opts(cls, model_opt):
        check_model_opts(model_opt)
        return original(cls, model_opt)

    validate_model_opts.__rnn_ablations_wrapped__ = True
    parser_cls.validate_model_opts = classmethod(validate_model_opts)


_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def expand_data_paths(data):
    """The ``data:`` option (YAML text, or the dict OpenNMT-py makes of it) with every
    ``${NAME}`` replaced by the environment variable ``NAME``; ``ValueError`` naming the
    variables that are not set (a path would otherwise point nowhere)."""
    text = data if isinstance(data, str) else None
    if text is None:
        return data
    missing = sorted({m.group(1) for m in _VARIABLE.finditer(text)} - set(os.environ))
    if missing:
        raise ValueError(
            f"the config's data paths use the environment variable(s) {', '.join(missing)}, "
            f"which {'is' if len(missing) == 1 else 'are'} not set: set "
            f"{' and '.join(missing)} to the data folder (the config's header says what each "
            f"holds), e.g. export {missing[0]}=/path/to/data")
    return _VARIABLE.sub(lambda m: os.environ[m.group(1)], text)


def _patch_validate_data(parser_cls) -> None:
    # defined on a mixin of ArgumentParser: wrap it on ArgumentParser itself
    original = getattr(getattr(parser_cls, "_validate_data", None), "__func__", None)
    if original is None or _wrapped(original):
        return

    @functools.wraps(original)
    def _validate_data(cls, opt):
        if isinstance(getattr(opt, "data", None), str):
            opt.data = expand_data_paths(opt.data)
        return original(cls, opt)

    _validate_data.__rnn_ablations_wrapped__ = True
    parser_cls._validate_data = classmethod(_validate_data)


def _reinit_encoders(model, checkpoint) -> None:
    if checkpoint is not None:
        return  # -train_from (also with -update_vocab): the weights come from the checkpoint
    for module in model.modules():
        if isinstance(module, AblatedRNNEncoder):
            module.apply_ablated_init()


def _patch_build_model(modules) -> None:
    import onmt.model_builder as mb

    original = mb.build_model
    if not _wrapped(original):
        @functools.wraps(original)
        def build_model(model_opt, opt, vocabs, checkpoint, *args, **kwargs):
            check_train_from(model_opt, opt, checkpoint)
            model = original(model_opt, opt, vocabs, checkpoint, *args, **kwargs)
            _reinit_encoders(model, checkpoint)
            return model

        build_model.__rnn_ablations_wrapped__ = True
        mb.build_model = build_model
    # modules that did `from onmt.model_builder import build_model` before we ran
    for module in modules:
        if module is not None and getattr(module, "build_model", None) is original:
            module.build_model = mb.build_model


def _variant_code(encoder_type) -> Optional[int]:
    """The ``Variant.code`` of one of our encoder types, None for any other type."""
    if encoder_type not in ENCODER_TYPES:
        return None
    return get_variant(ENCODER_TYPES[encoder_type][0]).code


def _describe(code: int, highway: bool) -> str:
    names = {get_variant(v).code: v for v in VARIANTS}
    return (repr(names[code]) if code in names else f"<unknown variant code {code}>") + \
        (" with highway" if highway else "")


def prepare_checkpoint(model, checkpoint) -> None:
    """Check ``checkpoint["model"]`` against ``model`` before OpenNMT-py loads it (OpenNMT-py
    copies tensors into the modules itself, so the check that
    :class:`~rnn_ablations.AblatedRNN` does in ``load_state_dict`` does not run there).

    * The checkpoint's ``-encoder_type`` names its variant: one of our types that differs from
      the module's variant is refused (``ValueError`` naming both).
    * A ``variant_state`` entry (earlier versions of the package saved one per encoder) must be
      an integer ``[variant code, highway]`` that agrees with the ``-encoder_type`` and with the
      module; it is then removed (the module has no such buffer, and OpenNMT-py's loader refuses
      keys it cannot place).  Checkpoints without it (this version's) load as they are.
    """
    state = checkpoint.get("model") if isinstance(checkpoint, dict) else None
    if not isinstance(state, dict):
        return
    encoder_type = getattr(checkpoint.get("opt"), "encoder_type", None)
    saved_code = _variant_code(encoder_type)
    for name, module in model.named_modules():
        if not isinstance(module, AblatedRNN):
            continue
        key = f"{name}.variant_state" if name else "variant_state"
        expected = module.variant_state
        if key not in state:
            filled = expected.clone()
            if saved_code is not None:
                filled[0] = saved_code
            value = filled
        else:
            value = state.pop(key)
        if (not isinstance(value, torch.Tensor) or value.numel() != 2 or value.is_floating_point()
                or value.is_complex()):
            raise ValueError(
                f"the checkpoint's {key} must be an integer tensor [variant code, highway] as "
                f"earlier versions of rnn_ablations saved it, got {getattr(value, 'shape', type(value).__name__)}; the "
                "checkpoint is damaged or was edited: train it again or restore the original file")
        code, highway = (int(v) for v in value.reshape(-1).tolist())
        if saved_code is not None and code != saved_code:
            raise ValueError(
                f"the checkpoint is inconsistent: its options say -encoder_type {encoder_type} "
                f"(variant {_describe(saved_code, False)}) but its weights {key} were saved from "
                f"variant {_describe(code, bool(highway))}; the file was edited or mixed from two "
                "checkpoints: use the checkpoint as onmt_train saved it")
        if (code, bool(highway)) != (int(expected[0]), bool(expected[1])):
            raise ValueError(
                f"cannot load the checkpoint's {key}, saved from variant "
                f"{_describe(code, bool(highway))}, into {name or 'the module'}, an encoder of "
                f"variant {_describe(int(expected[0]), bool(expected[1]))} (the shapes may match, "
                "the equations do not); build the model with the checkpoint's -encoder_type")


def _patch_load_state_dict(model_cls) -> None:
    original = model_cls.__dict__.get("load_state_dict")
    if original is None or _wrapped(original):
        return

    @functools.wraps(original)
    def load_state_dict(self, checkpoint, *args, **kwargs):
        prepare_checkpoint(self, checkpoint)
        return original(self, checkpoint, *args, **kwargs)

    load_state_dict.__rnn_ablations_wrapped__ = True
    model_cls.load_state_dict = load_state_dict


class _WithoutKeys:
    """A ``safetensors.safe_open`` handle whose ``keys()`` leave out ``hidden``."""

    def __init__(self, handle, hidden):
        self._handle, self._hidden = handle, hidden

    def keys(self):
        return [k for k in self._handle.keys() if k not in self._hidden]

    def __getattr__(self, name):
        return getattr(self._handle, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return self._handle.__exit__(*exc) if hasattr(self._handle, "__exit__") else False


_safe_open_lock = threading.Lock()


def _patch_load_safe_state_dict(model_cls) -> None:
    """Safetensors checkpoints (``-save_format safetensors``) under the ``.pt`` rules
    (:func:`prepare_checkpoint`): a ``variant_state`` entry of earlier versions is checked
    against the model and then not loaded (OpenNMT-py's loader would refuse it as an extra key,
    or, had the module such a buffer, copy a wrong one in silently); a file without it loads as
    it is.  The variant itself is the checkpoint's ``-encoder_type``, with which OpenNMT-py built
    the model."""
    original = model_cls.__dict__.get("load_safe_state_dict")
    if original is None or _wrapped(original):
        return

    @functools.wraps(original)
    def load_safe_state_dict(self, model_path, *args, **kwargs):
        from glob import glob

        import safetensors

        saved = {}
        for shard in glob(model_path + ".*.safetensors"):
            with safetensors.safe_open(shard, framework="pt", device="cpu") as f:
                for key in f.keys():
                    if key == "variant_state" or key.endswith(".variant_state"):
                        saved[key] = f.get_tensor(key)
        if not saved:
            return original(self, model_path, *args, **kwargs)
        prepare_checkpoint(self, {"model": dict(saved), "opt": None})  # refuses a wrong one
        unplaced = [k for k in saved if not any(
            isinstance(m, AblatedRNN) and k == (f"{n}.variant_state" if n else "variant_state")
            for n, m in self.named_modules())]
        if unplaced:
            raise ValueError(f"the safetensors checkpoint {model_path} holds {unplaced[0]}, but "
                             "the model has no rnn_ablations encoder there; build the model with "
                             "the checkpoint's -encoder_type")
        real = safetensors.safe_open
        with _safe_open_lock:  # the checked entries are not handed to OpenNMT-py's loader
            safetensors.safe_open = lambda *a, **k: _WithoutKeys(real(*a, **k), set(saved))
            try:
                return original(self, model_path, *args, **kwargs)
            finally:
                safetensors.safe_open = real

    load_safe_state_dict.__rnn_ablations_wrapped__ = True
    model_cls.load_safe_state_dict = load_safe_state_dict


def is_registered() -> bool:
    """True when every encoder type is in ``onmt.encoders.str2enc``."""
    import sys
    encoders = sys.modules.get("onmt.encoders")
    if encoders is None:
        return False
    return all(encoders.str2enc.get(t) is c for t, c in ENCODER_CLASSES.items())


def _register() -> None:
    import sys

    require_onmt()

    import onmt.encoders
    import onmt.model_builder
    import onmt.models.model
    import onmt.opts
    import onmt.utils.parse

    str2enc = onmt.encoders.str2enc
    for name, cls in ENCODER_CLASSES.items():
        existing = str2enc.get(name)
        if existing is not None and existing is not cls and not getattr(
                existing, "__rnn_ablations_encoder__", False):
            raise ValueError(f"OpenNMT-py already has an encoder type {name!r} "
                             f"({existing.__module__}.{existing.__qualname__}); rnn_ablations "
                             "cannot register its own under that name")
        str2enc[name] = cls
    _patch_model_opts(onmt.opts)
    _patch_validate_model_opts(onmt.utils.parse.ArgumentParser)
    _patch_validate_data(onmt.utils.parse.ArgumentParser)
    _patch_build_model([sys.modules.get("onmt.train_single")])
    _patch_load_state_dict(onmt.models.model.BaseModel)
    _patch_load_safe_state_dict(onmt.models.model.BaseModel)
    if hasattr(torch.serialization, "add_safe_globals"):
        torch.serialization.add_safe_globals([argparse.Namespace])


_READY = True
if _REGISTER_WHEN_READY:
    _register()
