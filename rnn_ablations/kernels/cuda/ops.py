"""The compiled CUDA kernel's entry points as PyTorch operators (namespace ``rnn_ablations``).

The CUDA kernels implement the same operators as the CPU kernel (:mod:`rnn_ablations.kernels.ops`),
registered for the CUDA dispatch key next to the CPU implementations, so that one operator is
one function of its inputs on either device:

=======================  ==========================================================================
operator                 CUDA implementation (``rnn_ablations/kernels/cuda/host.py``)
=======================  ==========================================================================
``plain_forward``        ``plain_forward``: the step kernel (one launch per step, the recurrent
                         product on cuBLAS)
``plain_backward``       ``plain_backward``: the step kernel's backward
``scan_forward`` /       ``scan_forward`` / ``scan_backward``: the element-wise scan of a cell that
``scan_backward``        reads no h_{t-1}
``persistent_forward``   ``persistent_forward``: the forward of one layer in one cooperative
                         launch (W_hh on chip); arguments of ``plain_forward`` plus ``blocks``,
                         ``batch_tile`` (the grid and rows per tile, 0 = automatic); CUDA only
``persistent_backward``  ``persistent_backward``: arguments of ``plain_backward`` plus
                         ``blocks``, ``batch_tile``; CUDA only
=======================  ==========================================================================

The results are those of the CPU operators: ``out``, ``h_n``, ``c_n`` and every gradient have
the input's dtype; what a forward saves for its backward (``gates``, ``cs``, ``hin``) is in the
accumulation type (float32 for float16 and bfloat16 inputs).  ``cs`` is empty unless ``train``,
as on the CPU.  ``persistent_forward`` returns ``gates`` only with ``train`` (its backward reads
them, its inference never writes them).

:class:`CudaKernel` puts the operators behind the CUDA module's own calling convention (what
:mod:`rnn_ablations.kernels.cuda.recurrence` and :mod:`rnn_ablations.kernels.cuda.graphs` call), and, as
:class:`rnn_ablations.kernels.ops.CpuKernel` does, calls the implementation directly in plain eager mode.
``persistent_plan`` (a question about a shape, not a computation) stays the module's own.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .. import ops, schema

__all__ = ["CudaKernel", "CUDA_OPERATORS", "register_cuda"]

#: The operators with a CUDA implementation (``torch.ops.rnn_ablations.<name>``).
CUDA_OPERATORS = schema.CUDA_OPERATORS

_registered = None  # the raw module the CUDA implementations were registered for
_IMPLEMENTATIONS = {}  # operator name -> its CUDA implementation (a Python function)


def _no_memory_unless(train: bool, cs: Tensor) -> Tensor:
    # the CUDA forwards always fill cs (they read it for c_n); outside training nothing reads
    # it, and the CPU operator returns it empty: so does this one
    return cs if train else cs.new_empty(0)


def register_cuda(raw) -> bool:
    """Register the CUDA implementations of ``raw`` (the module :mod:`rnn_ablations.kernels.cuda`
    loads), defining the operators this process has not defined yet (the CUDA-only ones, and
    the shared ones where the CPU kernel is not loaded: their schemas and fake kernels come from
    the table, :func:`rnn_ablations.kernels.ops.define`); once per process.  True."""
    global _registered
    if _registered is not None:
        return True
    _registered = raw

    def cuda(name):
        """``fn`` as the CUDA implementation of ``name``."""
        def deco(fn):
            _IMPLEMENTATIONS[name] = fn
            ops.define(name, "CUDA", fn)
            return fn
        return deco

    def forward(name):
        train = schema.positions(name)["train"]

        def fn(*args):
            out, h_n, c_n, gates, cs, hin = getattr(raw, name)(*args)
            return out, h_n, c_n, gates, _no_memory_unless(args[train], cs), hin
        return fn

    def forwarded(name):
        def fn(*args):
            return tuple(getattr(raw, name)(*schema.complete(name, args)))
        return fn

    cuda("plain_forward")(forward("plain_forward"))
    cuda("plain_backward")(forwarded("plain_backward"))
    if hasattr(raw, "scan_forward"):
        cuda("scan_forward")(forwarded("scan_forward"))
        cuda("scan_backward")(forwarded("scan_backward"))
    if hasattr(raw, "persistent_forward"):
        cuda("persistent_forward")(forward("persistent_forward"))
        cuda("persistent_backward")(forwarded("persistent_backward"))
    return True


def _call(name: str):
    """A kernel method's implementation: operator ``name`` with the method's arguments (the
    first ``n`` of them: ``plain_forward``'s ``in_place`` stays here); every entry's first
    tensor is its third argument (after spec and highway)."""
    n = len(schema.arguments(name))

    def call(self, args):
        args = args[:n]
        return list(getattr(self._ops(args[2]), name)(*args))
    return call


class CudaKernel:
    """The CUDA module ``raw`` (what :mod:`rnn_ablations.kernels.cuda` loads; ``registry.cuda_kernel()``
    holds this wrapper) with its computing entry points routed through the operators
    (same names, same arguments: :mod:`rnn_ablations.kernels.schema`); everything else
    (``persistent_plan``, …) is the module's own.
    A plain eager call runs the implementation directly (:func:`rnn_ablations.kernels.ops._plain_eager`);
    every other call goes through the operator, so what traces or intercepts operators
    (``torch.compile``, ``torch.export``, a ``TorchDispatchMode``) sees it."""

    #: capabilities (``kernels/interface.py``): ``plain_forward`` returns the gates in a tensor
    #: of its own; ``scan`` / ``persistent`` are set per instance from the compiled entry points
    in_place_gates = False

    def __init__(self, raw):
        self.raw = raw
        self.operators = register_cuda(raw)
        self._dispatched = torch.ops.rnn_ablations
        self._direct = ops._Direct(_IMPLEMENTATIONS)
        self.scan = ops.scan_built(raw)
        self.persistent = hasattr(raw, "persistent_forward")

    def _ops(self, first: Tensor):
        return self._direct if ops._plain_eager(first) else self._dispatched

    def __getattr__(self, name):
        return getattr(self.raw, name)

    # the CUDA module's entry points (the operators' arguments); plain_forward's in_place is
    # ignored (in_place_gates is False: the gates come back in a tensor of their own)
    plain_forward = schema.entry("plain_forward", _call("plain_forward"))
    plain_backward = schema.entry("plain_backward", _call("plain_backward"))
    persistent_forward = schema.entry("persistent_forward", _call("persistent_forward"))
    persistent_backward = schema.entry("persistent_backward", _call("persistent_backward"))
    scan_forward = schema.entry("scan_forward", _call("scan_forward"))
    scan_backward = schema.entry("scan_backward", _call("scan_backward"))
