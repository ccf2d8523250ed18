"""Deprecated: ``rnn_ablations.backend`` is :mod:`rnn_ablations.kernels.backend` (see :mod:`rnn_ablations._moved`)."""
from ._moved import alias

alias(__name__)
