"""Deprecated import paths of modules that moved into :mod:`rnn_ablations.kernels`.

``rnn_ablations/backend.py`` and its siblings (``ops``, ``ops_cuda``, ``kernel_autograd``,
``scan``, ``projection``, ``cuda_graphs``, ``cuda_recurrence``) each call :func:`alias`: importing
the old path warns (``DeprecationWarning``, naming the new path) and gives the module itself, so
that an attribute read or set through the old path (``rnn_ablations.backend``) is the new one's
(``rnn_ablations.kernels.backend``): a monkeypatch through either is seen by the package.  The old paths are kept for one release.
"""
from __future__ import annotations

import importlib
import sys
import warnings
from types import ModuleType

#: old import path -> the module it names now
MOVED = {
    "rnn_ablations.backend": "rnn_ablations.kernels.backend",
    "rnn_ablations.ops": "rnn_ablations.kernels.ops",
    "rnn_ablations.ops_cuda": "rnn_ablations.kernels.ops_cuda",
    "rnn_ablations.kernel_autograd": "rnn_ablations.kernels.autograd",
    "rnn_ablations.scan": "rnn_ablations.kernels.scan",
    "rnn_ablations.projection": "rnn_ablations.kernels.projection",
    "rnn_ablations.cuda_graphs": "rnn_ablations.kernels.cuda_graphs",
    "rnn_ablations.cuda_recurrence": "rnn_ablations.kernels.cuda_recurrence",
}


def alias(old: str) -> ModuleType:
    """Warn that ``old`` moved, put the module it names now in its place in ``sys.modules`` and
    return it."""
    new = MOVED[old]
    warnings.warn(f"{old} moved to {new}: import it from there ({old} is a deprecated alias "
                  "that a later release removes)", DeprecationWarning, stacklevel=3)
    module = importlib.import_module(new)
    sys.modules[old] = module
    return module
