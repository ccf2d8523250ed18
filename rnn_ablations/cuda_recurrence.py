"""Deprecated: ``rnn_ablations.cuda_recurrence`` is :mod:`rnn_ablations.kernels.cuda_recurrence` (see :mod:`rnn_ablations._moved`)."""
from ._moved import alias

alias(__name__)
