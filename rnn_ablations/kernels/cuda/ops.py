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

from typing import Tuple

import torch
from torch import Tensor

from .. import ops

__all__ = ["CudaKernel", "CUDA_OPERATORS", "register_cuda"]

#: The operators with a CUDA implementation (``torch.ops.rnn_ablations.<name>``).
CUDA_OPERATORS = ("plain_forward", "plain_backward", "scan_forward", "scan_backward",
                  "persistent_forward", "persistent_backward")

_registered = None  # the raw module the CUDA implementations were registered for
_IMPLEMENTATIONS = {}  # operator name -> its CUDA implementation (a Python function)


def _no_memory_unless(train: bool, cs: Tensor) -> Tensor:
    # the CUDA forwards always fill cs (they read it for c_n); outside training nothing reads
    # it, and the CPU operator returns it empty: so does this one
    return cs if train else cs.new_empty(0)


def _persistent_fake(proj, w_hh, h0, highway, train):
    """``plain_forward``'s fake results, but ``gates`` empty unless ``train``."""
    out, h_n, c_n, gates, cs, hin = ops._forward_shapes(proj, w_hh, h0, highway, train)
    return out, h_n, c_n, gates if train else gates.new_empty(0), cs, hin


def register_cuda(raw) -> bool:
    """Register the CUDA implementations of ``raw`` (the module :mod:`rnn_ablations.kernels.cuda`
    loads) and define the
    CUDA-only operators; once per process.  False when the CPU operators are not registered
    (no CPU kernel in this process): the shared schemas are defined with them, so the CUDA
    kernel is then called as a module (:class:`CudaKernel` falls back to it)."""
    global _registered
    if _registered is not None:
        return True
    if ops._registered is None:
        return False
    _registered = raw

    def _kernel(name):
        def deco(fn):
            _IMPLEMENTATIONS[name] = fn
            torch.library.register_kernel("rnn_ablations::" + name, "cuda", fn)
            return fn
        return deco

    @_kernel("plain_forward")
    def plain_forward(spec, highway, proj, w_hh, h0, c0, batch_sizes, rec_mask, train):
        out, h_n, c_n, gates, cs, hin = raw.plain_forward(spec, highway, proj, w_hh, h0, c0,
                                                    batch_sizes, rec_mask, train)
        return out, h_n, c_n, gates, _no_memory_unless(train, cs), hin

    @_kernel("plain_backward")
    def plain_backward(*args):
        return tuple(raw.plain_backward(*args))

    if hasattr(raw, "scan_forward"):
        @_kernel("scan_forward")
        def scan_forward(*args):
            return tuple(raw.scan_forward(*args))

        @_kernel("scan_backward")
        def scan_backward(*args):
            return tuple(raw.scan_backward(*args))

    if hasattr(raw, "persistent_forward"):
        def _cuda_op(name):
            def deco(fn):
                _IMPLEMENTATIONS[name] = fn
                return torch.library.custom_op("rnn_ablations::" + name, mutates_args=(),
                                               device_types="cuda")(fn)
            return deco

        @_cuda_op("persistent_forward")
        def persistent_forward(spec: int, highway: bool, proj: Tensor, w_hh: Tensor, h0: Tensor,
                               c0: Tensor, batch_sizes: Tensor, rec_mask: Tensor, train: bool,
                               blocks: int, batch_tile: int
                               ) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
            out, h_n, c_n, gates, cs, hin = raw.persistent_forward(
                spec, highway, proj, w_hh, h0, c0, batch_sizes, rec_mask, train, blocks,
                batch_tile)
            return out, h_n, c_n, gates, _no_memory_unless(train, cs), hin

        @persistent_forward.register_fake
        def _(spec, highway, proj, w_hh, h0, c0, batch_sizes, rec_mask, train, blocks,
              batch_tile):
            return _persistent_fake(proj, w_hh, h0, highway, train)

        @_cuda_op("persistent_backward")
        def persistent_backward(spec: int, highway: bool, g_out: Tensor, g_hn: Tensor,
                                g_cn: Tensor, gates: Tensor, cs: Tensor, hin: Tensor,
                                out: Tensor, proj: Tensor, w_hh: Tensor, h0: Tensor, c0: Tensor,
                                batch_sizes: Tensor, rec_mask: Tensor, blocks: int,
                                batch_tile: int) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
            return tuple(raw.persistent_backward(spec, highway, g_out, g_hn, g_cn, gates, cs,
                                                 hin, out, proj, w_hh, h0, c0, batch_sizes,
                                                 rec_mask, blocks, batch_tile))

        @persistent_backward.register_fake
        def _(spec, highway, g_out, g_hn, g_cn, gates, cs, hin, out, proj, w_hh, h0, c0,
              batch_sizes, rec_mask, blocks, batch_tile):
            return (proj.new_empty(proj.shape), w_hh.new_empty(w_hh.shape),
                    h0.new_empty(h0.shape), c0.new_empty(c0.shape))
    return True


class CudaKernel:
    """The CUDA module ``raw`` (what :mod:`rnn_ablations.kernels.cuda` loads; ``registry.cuda_kernel()``
    holds this wrapper) with its computing entry points routed through the operators
    (same names, same arguments); everything else (``persistent_plan``, …) is the module's own.
    A plain eager call runs the implementation directly (:func:`rnn_ablations.kernels.ops._plain_eager`);
    every other call goes through the operator, so what traces or intercepts operators
    (``torch.compile``, ``torch.export``, a ``TorchDispatchMode``) sees it.  Where the
    operators could not be registered (no CPU kernel in this process) every call goes to the
    module."""

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
        if not self.operators:
            return None
        return self._direct if ops._plain_eager(first) else self._dispatched

    def __getattr__(self, name):
        return getattr(self.raw, name)

    def _call(self, entry: str, *args):
        """``entry`` with ``args``: through the operator of that name where it is registered,
        else the module's own; every entry's first tensor is its third argument (after spec
        and highway)."""
        route = self._ops(args[2])
        if route is None:
            return getattr(self.raw, entry)(*args)
        return list(getattr(route, entry)(*args))

    # the CUDA module's entry points (same arguments as the operators)
    def plain_forward(self, spec, highway, proj, w_hh, h0, c0, batch_sizes, rec_mask, keep_hin,
                      in_place=False):
        # in_place_gates is False: the gates come back in a tensor of their own
        return self._call("plain_forward", spec, highway, proj, w_hh, h0, c0, batch_sizes,
                          rec_mask, keep_hin)

    def plain_backward(self, spec, highway, g_out, g_hn, g_cn, gates, cs, hin, out, proj, w_hh,
                       h0, c0, batch_sizes, rec_mask):
        return self._call("plain_backward", spec, highway, g_out, g_hn, g_cn, gates, cs, hin,
                          out, proj, w_hh, h0, c0, batch_sizes, rec_mask)

    def persistent_forward(self, spec, highway, proj, w_hh, h0, c0, batch_sizes, rec_mask,
                           keep_hin, blocks, batch_tile):
        return self._call("persistent_forward", spec, highway, proj, w_hh, h0, c0, batch_sizes,
                          rec_mask, keep_hin, blocks, batch_tile)

    def persistent_backward(self, spec, highway, g_out, g_hn, g_cn, gates, cs, hin, out, proj,
                            w_hh, h0, c0, batch_sizes, rec_mask, blocks, batch_tile):
        return self._call("persistent_backward", spec, highway, g_out, g_hn, g_cn, gates, cs,
                          hin, out, proj, w_hh, h0, c0, batch_sizes, rec_mask, blocks,
                          batch_tile)

    def scan_forward(self, spec, highway, proj, h0, c0, batch_sizes, save, bias=None):
        return self._call("scan_forward", spec, highway, proj, h0, c0, batch_sizes, save, bias)

    def scan_backward(self, spec, highway, g_out, g_hn, g_cn, proj, c0, cs, batch_sizes,
                      bias=None, bias_grad=False):
        return self._call("scan_backward", spec, highway, g_out, g_hn, g_cn, proj, c0, cs,
                          batch_sizes, bias, bias_grad)
