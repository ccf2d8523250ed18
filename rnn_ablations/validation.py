"""Argument checks shared by the public classes (:class:`~rnn_ablations.AblatedRNN`, the
OpenNMT-py and AllenNLP adapters) and the command lines: each says what was wrong and what is
expected, and raises the error type its caller's framework reports (``ValueError`` by default;
:func:`cli_type` makes a check an ``argparse`` type, whose errors argparse reports with the
option's name)."""
from __future__ import annotations

import argparse
import numbers
from typing import Callable, Optional

__all__ = ["check_prob", "Probability", "check_positive_int", "check_nonnegative_int", "check_int_range",
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


class Probability:
    """A module's dropout probability ``name``: assigning it checks the value (:func:`check_prob`)
    and keeps, beside the float, a boolean ``_<name>_on`` and the probability as an exact ratio
    of two integers ``_<name>_ratio`` (``p == num / den``), which is what a forward reads.

    torch.compile with ``dynamic=True`` makes a float attribute of a module a symbolic input: a
    ``p > 0`` test on it puts a float symbol and its guards into the trace (of a model without
    dropout too), and the first compile then traces the model a second time to specialize it.
    Booleans and a module's integers are constants to dynamo (guarded).  Assigning a new
    probability later (OpenNMT-py's ``update_dropout`` does) updates all three; a compiled model
    recompiles once on the new value."""

    def __init__(self, doc: str):
        self.__doc__ = doc

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    def __get__(self, obj, owner=None):
        if obj is None:
            return self
        return obj.__dict__["_" + self.name]

    def __set__(self, obj, value) -> None:
        p = check_prob(self.name, value)
        obj.__dict__.update({"_" + self.name: p, f"_{self.name}_on": p > 0,
                             f"_{self.name}_ratio": p.as_integer_ratio()})


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
