"""Deprecated: ``rnn_ablations.ops_cuda`` is :mod:`rnn_ablations.kernels.ops_cuda` (see :mod:`rnn_ablations._moved`)."""
from ._moved import alias

alias(__name__)
