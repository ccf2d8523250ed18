"""Deprecated: ``rnn_ablations.kernel_autograd`` is :mod:`rnn_ablations.kernels.autograd` (see :mod:`rnn_ablations._moved`)."""
from ._moved import alias

alias(__name__)
