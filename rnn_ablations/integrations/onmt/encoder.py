"""The OpenNMT-py encoder of every variant (:class:`AblatedRNNEncoder` and its per-type classes
:data:`ENCODER_CLASSES`), and the registration of the integration into OpenNMT-py
(:func:`register_now`, which :func:`rnn_ablations.integrations.onmt.register` calls).

This is the one module of the package that imports OpenNMT-py when it is imported (its classes
subclass OpenNMT-py's ``EncoderBase``).  Without OpenNMT-py it still imports (AllenNLP's
``--include-package rnn_ablations`` imports every submodule): the classes are then built on
``nn.Module`` and constructing an encoder or registering raises an ``ImportError`` naming the pip
command that installs OpenNMT-py.
"""
from __future__ import annotations

import argparse
import sys
from typing import Dict, Optional

import torch
import torch.nn.functional as F
from torch import nn

# Set before OpenNMT-py is imported below: when this module is imported before `onmt`, the
# import of `onmt` fires the start-up hook, which calls the package's register() while this
# module is still being imported; register() then sets _REGISTER_WHEN_READY, and the
# registration happens at the end of this module.
_READY = False
_REGISTER_WHEN_READY = False

try:
    from onmt.encoders.encoder import EncoderBase
    ONMT_IMPORT_ERROR: Optional[ImportError] = None
except ImportError as _exc:
    # The classes below are then built on nn.Module and every entry point (constructing an
    # encoder, registering, the option checks) raises require_onmt()'s error.
    EncoderBase = nn.Module
    ONMT_IMPORT_ERROR = _exc

from ...rnn import AblatedRNN
from ...validation import check_positive_int, check_prob
from ...variants import get_variant
from . import checkpoints, options, translate
from .encoder_types import (CLASS_NAMES, DEFAULT_INIT, ENCODER_TYPES, INIT_CHOICES,
                            OnmtUsageError, require_onmt)

__all__ = ["AblatedRNNEncoder", "ENCODER_CLASSES", "ONMT_IMPORT_ERROR", "register_now",
           "is_registered"]

#: the public module of the encoder classes (the package re-exports them): the name that
#: pickles and OpenNMT-py's model printout show
PUBLIC_MODULE = __name__.rsplit(".", 1)[0]


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


#: encoder type -> encoder class (module-level classes, so they can be pickled)
ENCODER_CLASSES: Dict[str, type] = {}
for _name in ENCODER_TYPES:
    _cls_name = CLASS_NAMES[_name]
    _cls = type(_cls_name, (AblatedRNNEncoder,), {
        "encoder_type": _name,
        "__module__": PUBLIC_MODULE,
        "__qualname__": _cls_name,
        "__doc__": (f"OpenNMT-py encoder type ``{_name}``: {ENCODER_TYPES[_name][0]}, "
                    f"{'bidirectional' if ENCODER_TYPES[_name][1] else 'unidirectional'} "
                    "(see :class:`AblatedRNNEncoder`)."),
    })
    globals()[_cls_name] = _cls
    ENCODER_CLASSES[_name] = _cls
    __all__.append(_cls_name)


# ---------------------------------------------------------------------- registration
def _reinit_encoders(model, checkpoint) -> None:
    if checkpoint is not None:
        return  # -train_from (also with -update_vocab): the weights come from the checkpoint
    for module in model.modules():
        if isinstance(module, AblatedRNNEncoder):
            module.apply_ablated_init()


def _one_line_errors(hook):
    """``sys.excepthook`` that prints an uncaught :class:`OnmtUsageError` as one line
    (``onmt_train: error: ...``; its message says what to change) and hands every other
    exception to ``hook``."""
    def excepthook(kind, value, tb):
        if isinstance(value, OnmtUsageError):
            prog = sys.argv[0].rsplit("/", 1)[-1] if sys.argv and sys.argv[0] else ""
            prefix = f"{prog}: " if prog and not prog.startswith("-") else ""
            sys.stderr.write(f"{prefix}error: {value}\n")
            return
        hook(kind, value, tb)

    excepthook.__rnn_ablations_wrapped__ = True
    return excepthook


def is_registered() -> bool:
    """True when every encoder type is in ``onmt.encoders.str2enc``."""
    encoders = sys.modules.get("onmt.encoders")
    if encoders is None:
        return False
    return all(encoders.str2enc.get(t) is c for t, c in ENCODER_CLASSES.items())


def register_now() -> None:
    """What :func:`rnn_ablations.integrations.onmt.register` does (its docstring lists it)."""
    require_onmt()

    import onmt.encoders

    str2enc = onmt.encoders.str2enc
    for name, cls in ENCODER_CLASSES.items():
        existing = str2enc.get(name)
        if existing is not None and existing is not cls and not getattr(
                existing, "__rnn_ablations_encoder__", False):
            raise ValueError(f"OpenNMT-py already has an encoder type {name!r} "
                             f"({existing.__module__}.{existing.__qualname__}); rnn_ablations "
                             "cannot register its own under that name")
        str2enc[name] = cls
    options.install(_reinit_encoders)
    checkpoints.install()
    translate.install()
    if not options.wrapped(sys.excepthook):
        sys.excepthook = _one_line_errors(sys.excepthook)
    if hasattr(torch.serialization, "add_safe_globals"):
        torch.serialization.add_safe_globals([argparse.Namespace])


_READY = True
if _REGISTER_WHEN_READY:
    register_now()
