"""Named hyper-parameter sets of the language model.

``small``, ``medium`` and ``large`` are the configurations of Zaremba et al. (2014) as ported to
the TensorFlow PTB tutorial, which both papers used:

======  =======  ====  =====  ===  ====  ======  ============  ======  =======
config  layers×H  BPTT  init   lr   clip  epochs  decay after   decay   dropout
======  =======  ====  =====  ===  ====  ======  ============  ======  =======
small   2 × 200   20    0.1    1.0  5     13      4             0.5     0
medium  2 × 650   35    0.05   1.0  5     39      6             0.8     0.5
large   2 × 1500  35    0.04   1.0  10    55      14            1/1.15  0.65
======  =======  ====  =====  ===  ====  ======  ============  ======  =======

All: batch 20, SGD without momentum, uniform init ``±init``, embedding size = hidden size,
dropout on the non-recurrent connections only.  The learning rate of epoch ``e`` (1-based) is
``lr · decay^max(e − decay_after, 0)`` (the tutorial's ``lr_decay ** max(i + 1 - max_epoch, 0)``).

The RAN code lowered the initial learning rate of some RAN runs for stability; those values are
kept in :data:`PAPER_LR_OVERRIDES` and applied per variant by :meth:`LMConfig.for_variant`
(``medium``: ``identity_ran`` 0.8; ``large``: ``ran`` 0.8, ``identity_ran`` 0.5; the tanh RAN's
medium lr was the default 1.0).  The papers give no lowered rate for ``srnn`` or
``lstm_minus_srnn``: they use the table's value.

``tiny`` is for tests and quick looks; ``synthetic`` is the configuration of the embedded default
corpus of ``rnn-ablations ablate`` (see :mod:`rnn_ablations.lm.synthetic`).
"""
from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Dict

from ..variants import get_variant

__all__ = ["LMConfig", "CONFIGS", "PAPER_LR_OVERRIDES", "get_config"]


@dataclasses.dataclass(frozen=True)
class LMConfig:
    name: str
    num_layers: int
    hidden_size: int
    num_steps: int          #: truncated-BPTT length
    init_scale: float       #: every parameter starts U(−init_scale, init_scale)
    learning_rate: float
    max_grad_norm: float    #: clip the global gradient norm to this
    epochs: int
    decay_after: int        #: the lr is multiplied by ``lr_decay`` every epoch after this one
    lr_decay: float
    dropout: float          #: on embedding output, between layers and before the softmax
    batch_size: int = 20
    #: batch size of valid/test evaluation (the state is carried through each row of the stream)
    eval_batch_size: int = 10
    #: added to the forget-gate bias after the uniform init (all other recurrent biases start at
    #: 0, as the TF tutorial's ``BasicLSTMCell(forget_bias=0.0)``); the S-RNN has no forget gate.
    forget_bias: float = 0.0

    def __post_init__(self):
        for f in ("num_layers", "hidden_size", "num_steps", "epochs", "batch_size",
                  "eval_batch_size"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v <= 0:
                raise ValueError(f"config {self.name!r}: {f} must be a positive integer, got {v!r}")
        if isinstance(self.decay_after, bool) or not isinstance(self.decay_after, numbers.Integral) \
                or self.decay_after < 0:
            raise ValueError(f"config {self.name!r}: decay_after must be an integer >= 0, "
                             f"got {self.decay_after!r}")
        for f in ("init_scale", "learning_rate", "max_grad_norm", "lr_decay"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, numbers.Real) or not v > 0 \
                    or not math.isfinite(v):
                raise ValueError(f"config {self.name!r}: {f} must be a finite positive number, "
                                 f"got {v!r}")
        if not isinstance(self.dropout, numbers.Real) or not 0 <= self.dropout < 1:
            raise ValueError(f"config {self.name!r}: dropout must be in [0, 1), got {self.dropout!r}")
        if isinstance(self.forget_bias, bool) or not isinstance(self.forget_bias, numbers.Real) \
                or not math.isfinite(self.forget_bias):
            raise ValueError(f"config {self.name!r}: forget_bias must be a finite number, "
                             f"got {self.forget_bias!r}")

    def lr_at_epoch(self, epoch: int) -> float:
        """Learning rate of the 1-based ``epoch``."""
        return self.learning_rate * self.lr_decay ** max(epoch - self.decay_after, 0)

    def for_variant(self, variant, paper_lr: bool = True) -> "LMConfig":
        """This config with the RAN code's lowered learning rate for ``variant`` (if any)."""
        name = get_variant(variant).name
        if paper_lr:
            lr = PAPER_LR_OVERRIDES.get(self.name, {}).get(name)
            if lr is not None and lr != self.learning_rate:
                return dataclasses.replace(self, learning_rate=lr)
        return self

    def replace(self, **changes) -> "LMConfig":
        """A copy with some fields changed (unknown field names are an error)."""
        fields = {f.name for f in dataclasses.fields(self)}
        bad = sorted(set(changes) - fields)
        if bad:
            raise ValueError(f"unknown config field(s) {', '.join(bad)}; fields are "
                             f"{', '.join(sorted(fields))}")
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> Dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Dict) -> "LMConfig":
        return cls(**d)


CONFIGS: Dict[str, LMConfig] = {
    "tiny": LMConfig("tiny", num_layers=2, hidden_size=32, num_steps=10, init_scale=0.1,
                     learning_rate=1.0, max_grad_norm=5.0, epochs=2, decay_after=1, lr_decay=0.5,
                     dropout=0.0, batch_size=8, eval_batch_size=4),
    # See rnn_ablations/lm/synthetic.py (and docs/lm.md) for why these values.
    "synthetic": LMConfig("synthetic", num_layers=1, hidden_size=128, num_steps=40,
                          init_scale=0.1, learning_rate=0.5, max_grad_norm=5.0, epochs=10,
                          decay_after=7, lr_decay=0.5, dropout=0.0, batch_size=32,
                          eval_batch_size=32, forget_bias=1.0),
    "small": LMConfig("small", num_layers=2, hidden_size=200, num_steps=20, init_scale=0.1,
                      learning_rate=1.0, max_grad_norm=5.0, epochs=13, decay_after=4,
                      lr_decay=0.5, dropout=0.0),
    "medium": LMConfig("medium", num_layers=2, hidden_size=650, num_steps=35, init_scale=0.05,
                       learning_rate=1.0, max_grad_norm=5.0, epochs=39, decay_after=6,
                       lr_decay=0.8, dropout=0.5),
    "large": LMConfig("large", num_layers=2, hidden_size=1500, num_steps=35, init_scale=0.04,
                      learning_rate=1.0, max_grad_norm=10.0, epochs=55, decay_after=14,
                      lr_decay=1 / 1.15, dropout=0.65),
}

#: Initial learning rates of the RAN code (kentonl/ran) where it lowered them.
PAPER_LR_OVERRIDES: Dict[str, Dict[str, float]] = {
    "medium": {"ran": 1.0, "identity_ran": 0.8},
    "large": {"ran": 0.8, "identity_ran": 0.5},
}


def get_config(name: str, **overrides) -> LMConfig:
    """A named config, optionally with fields replaced (``get_config("small", epochs=2)``)."""
    if isinstance(name, LMConfig):
        cfg = name
    else:
        if not isinstance(name, str) or name.strip().lower() not in CONFIGS:
            raise ValueError(f"unknown config {name!r}; choose one of {', '.join(CONFIGS)}")
        cfg = CONFIGS[name.strip().lower()]
    overrides = {k: v for k, v in overrides.items() if v is not None}
    return cfg.replace(**overrides) if overrides else cfg
