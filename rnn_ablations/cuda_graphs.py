"""Deprecated: ``rnn_ablations.cuda_graphs`` is :mod:`rnn_ablations.kernels.cuda_graphs` (see :mod:`rnn_ablations._moved`)."""
from ._moved import alias

alias(__name__)
