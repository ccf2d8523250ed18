"""Argument checks shared by the public classes (:class:`~rnn_ablations.AblatedRNN`, the
OpenNMT-py and AllenNLP adapters): each says what was wrong and what is expected, and raises the
error type its caller's framework reports (``ValueError`` by default)."""
from __future__ import annotations

import numbers

__all__ = ["check_prob", "check_positive_int"]


def check_prob(name: str, value, error: type = ValueError) -> float:
    """``value`` as a float in [0, 1) (a dropout probability); ``error`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= value < 1:
        raise error(f"{name} must be a number in [0, 1), got {value!r}")
    return float(value)


def check_positive_int(name: str, value, error: type = ValueError) -> int:
    """``value`` as a positive int (not a bool); ``error`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
        raise error(f"{name} must be a positive integer, got {value!r}")
    return int(value)
