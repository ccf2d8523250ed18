"""Marks for ``torch.compile`` that do not import ``torch._dynamo``.

``torch.compiler.assume_constant_result`` imports ``torch._dynamo`` (and with it sympy and the
symbolic-shapes machinery: 1.5-2 s, as long as ``import torch`` itself), which a decorator applied
at import would add to every ``import rnn_ablations``.  What the decorator does is mark the
function; dynamo reads the mark when it traces a call of it, by which time it is imported anyway.
``tests/commands/test_nothing_built_before_use.py`` checks that the mark is the one torch's
decorator sets.
"""
from __future__ import annotations

__all__ = ["assume_constant_result"]

#: the attribute ``torch._dynamo.decorators.assume_constant_result`` sets on the function
MARK = "_dynamo_marked_constant"


def assume_constant_result(fn):
    """``torch.compiler.assume_constant_result(fn)``, without importing ``torch._dynamo``: under
    ``torch.compile`` / ``torch.export`` a call of ``fn`` is run once, when the graph is traced,
    and its result is a constant of the graph."""
    setattr(fn, MARK, True)
    return fn
