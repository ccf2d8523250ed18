"""Deprecated: ``rnn_ablations.projection`` is :mod:`rnn_ablations.kernels.projection` (see :mod:`rnn_ablations._moved`)."""
from ._moved import alias

alias(__name__)
