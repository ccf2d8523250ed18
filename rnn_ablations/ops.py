"""Deprecated: ``rnn_ablations.ops`` is :mod:`rnn_ablations.kernels.ops` (see :mod:`rnn_ablations._moved`)."""
from ._moved import alias

alias(__name__)
