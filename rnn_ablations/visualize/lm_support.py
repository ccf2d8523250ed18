"""Language-model checkpoints of ``rnn-ablations lm train`` (format read from rnn_ablations.lm)."""
from __future__ import annotations


def is_lm_checkpoint(obj) -> bool:
    return False


def load(path, obj):
    raise ValueError(f"{path}: language-model checkpoints are not readable yet")
