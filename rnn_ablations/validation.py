"""Argument checks shared by the public classes (:class:`~rnn_ablations.AblatedRNN`, the
OpenNMT-py and AllenNLP adapters) and the command lines: each says what was wrong and what is
expected, and raises the error type its caller's framework reports (``ValueError`` by default;
:func:`cli_type` makes a check an ``argparse`` type, whose errors argparse reports with the
option's name)."""
from __future__ import annotations

import argparse
import numbers
from typing import Callable, Optional

__all__ = ["check_prob", "check_positive_int", "check_nonnegative_int", "check_int_range",
           "check_positive_float", "cli_type"]


def _say(name: str, text: str) -> str:
    return f"{name} {text}" if name else text


def _is_int(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, numbers.Integral)


def check_prob(name: str, value, error: type = ValueError) -> float:
    """``value`` as a float in [0, 1) (a dropout probability); ``error`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= value < 1:
        raise error(_say(name, f"must be a number in [0, 1), got {value!r}"))
    return float(value)


def check_positive_int(name: str, value, error: type = ValueError) -> int:
    """``value`` as a positive int (not a bool); ``error`` otherwise."""
    if not _is_int(value) or value <= 0:
        raise error(_say(name, f"must be a positive integer, got {value!r}"))
    return int(value)


def check_nonnegative_int(name: str, value, error: type = ValueError) -> int:
    """``value`` as an int >= 0 (not a bool); ``error`` otherwise."""
    if not _is_int(value) or value < 0:
        raise error(_say(name, f"must be an integer >= 0, got {value!r}"))
    return int(value)


def check_int_range(name: str, value, low: int, high: int, error: type = ValueError) -> int:
    """``value`` as an int from ``low`` to ``high`` (both included); ``error`` otherwise."""
    if not _is_int(value) or not low <= value <= high:
        raise error(_say(name, f"must be an integer from {low} to {high}, got {value!r}"))
    return int(value)


def check_positive_float(name: str, value, error: type = ValueError) -> float:
    """``value`` as a float > 0 (not nan, not a bool); ``error`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not value > 0:
        raise error(_say(name, f"must be a positive number, got {value!r}"))
    return float(value)


def cli_type(check: Callable, parse: Callable = int, why: Optional[str] = None,
             **bounds) -> Callable[[str], object]:
    """An ``argparse`` ``type`` from a check above: the option's text parsed by ``parse``
    (``int`` or ``float``), then checked (``bounds``: the check's other arguments, e.g.
    ``low``/``high`` of :func:`check_int_range`); ``why`` says what the option is, after the
    check's message."""
    what = "an integer" if parse is int else "a number"

    def parse_text(text: str):
        try:
            value = parse(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        try:
            return check("", value, error=argparse.ArgumentTypeError, **bounds)
        except argparse.ArgumentTypeError as exc:
            if why is None:
                raise
            raise argparse.ArgumentTypeError(f"{exc} ({why})") from None

    parse_text.__name__ = check.__name__.replace("check_", "")
    return parse_text
