"""Deprecated: ``rnn_ablations.scan`` is :mod:`rnn_ablations.kernels.scan` (see :mod:`rnn_ablations._moved`)."""
from ._moved import alias

alias(__name__)
