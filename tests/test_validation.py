"""The argument checks of rnn_ablations.validation, and the command-line types made from them:
the value, or the error type asked for with a message that says what was wrong."""
import argparse

import pytest

from rnn_ablations.validation import (check_int_range, check_nonnegative_int,
                                      check_positive_float, check_positive_int, check_prob,
                                      cli_type)


@pytest.mark.parametrize("check,good,bad,message", [
    (check_prob, 0.5, 1.0, "p must be a number in [0, 1), got 1.0"),
    (check_positive_int, 3, 0, "p must be a positive integer, got 0"),
    (check_nonnegative_int, 0, -1, "p must be an integer >= 0, got -1"),
    (check_positive_float, 0.25, float("nan"), "p must be a positive number, got nan"),
])
def test_a_check_returns_the_value_or_names_what_was_wrong(check, good, bad, message):
    assert check("p", good) == good
    with pytest.raises(ValueError) as info:
        check("p", bad)
    assert str(info.value) == message
    with pytest.raises(TypeError):
        check("p", bad, error=TypeError)
    with pytest.raises(ValueError):
        check("p", True)  # a bool is not a number here


def test_an_int_range_includes_both_ends():
    assert check_int_range("seed", 0, 0, 5) == 0 and check_int_range("seed", 5, 0, 5) == 5
    with pytest.raises(ValueError, match="seed must be an integer from 0 to 5, got 6"):
        check_int_range("seed", 6, 0, 5)


def test_a_cli_type_parses_then_checks():
    positive = cli_type(check_positive_int)
    assert positive("7") == 7
    with pytest.raises(argparse.ArgumentTypeError, match="'x' is not an integer"):
        positive("x")
    with pytest.raises(argparse.ArgumentTypeError, match="^must be a positive integer, got 0$"):
        positive("0")
    seconds = cli_type(check_positive_float, parse=float)
    assert seconds("1.5") == 1.5
    with pytest.raises(argparse.ArgumentTypeError, match="'1s' is not a number"):
        seconds("1s")
    seed = cli_type(check_int_range, low=0, high=9, why="the generator's range")
    with pytest.raises(argparse.ArgumentTypeError,
                       match=r"must be an integer from 0 to 9, got 10 \(the generator's range\)"):
        seed("10")


def test_argparse_names_the_option():
    p = argparse.ArgumentParser(exit_on_error=False)
    p.add_argument("--epochs", type=cli_type(check_positive_int))
    with pytest.raises(argparse.ArgumentError, match="argument --epochs: must be a positive "
                                                     "integer, got 0"):
        p.parse_args(["--epochs", "0"])
