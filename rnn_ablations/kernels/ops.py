"""The compiled CPU kernel's entry points as PyTorch operators (namespace ``rnn_ablations``).

Each entry of ``rnn_ablations._C`` that computes is registered with :mod:`torch.library` as an
operator with a schema, a fake (meta) kernel that gives the shapes of its results without
running it, and the CPU implementation.  Through the dispatcher the kernels are then ordinary
operators to PyTorch: ``torch.compile(fullgraph=True)`` and ``torch.export`` trace them (with
their fake kernels), a ``TorchDispatchMode`` or ``FlopCounterMode`` sees them, and
``torch.library.opcheck`` checks them.  Their gradients stay where they were written: the
autograd Functions of :mod:`rnn_ablations.kernels.autograd` call the forward and backward
operators (so saved-tensor hooks see what they save).

The interface, once (one layer; T steps, B rows, H units, R recurrent and X input-only blocks of
H rows of the variant's kernel spec, ``csrc/common/kernel_spec.h``; every tensor float32 or
float64 on the CPU unless said):

=======================  ==========================================================================
operator                 arguments → results
=======================  ==========================================================================
``plain_forward``        spec, highway, proj (T,B,(R+X)·H) input projections, w_hh (R·H,H),
                         h0 (B,H), c0 (B,H), batch_sizes (T) int64 non-increasing, rec_mask (B,H)
                         or empty, train → out (T,B,H), h_n (B,H), c_n (B,H), gates (T,B,R·H)
                         activations, cs (T,B,H) memories (empty unless train), hin (T,B,H)
                         output before the highway mix (empty unless train and highway)
``plain_forward_``       the same, writing the gate activations into proj's recurrent blocks
                         (proj is mutated; ``gates`` is not returned: it is
                         ``proj[..., :R·H]``) → out, h_n, c_n, cs, hin
``plain_backward``       spec, highway, g_out, g_hn, g_cn, gates, cs, hin, out, proj, w_hh, h0, c0,
                         batch_sizes, rec_mask → d_proj (T,B,(R+X)·H), d_w_hh, d_h0, d_c0
``pipelined_forward``    spec, highway, x (T,B,D), w_ih ((R+X)·H,D), bias (R·H) or empty, w_hh,
                         h0, c0, batch_sizes, rec_mask, train, chunk (steps per chunk, 0 = auto)
                         → out, h_n, c_n, gates, cs, hin, xo (T,B,X·H) input-only projections
                         (empty when X = 0)
``pipelined_backward``   spec, highway, g_out, g_hn, g_cn, gates, cs, hin, xo, out, x, w_ih, w_hh,
                         h0, c0, batch_sizes, rec_mask, need_dx, need_dw, need_bias, chunk →
                         dx (empty unless need_dx), d_w_ih, d_bias (empty unless need_bias),
                         d_w_hh (both empty unless need_dw), d_h0, d_c0
``plain_directions_forward_``
                         ``plain_forward_`` of the two directions of a bidirectional layer at
                         once (one per thread): proj_0 and proj_1 (both mutated), the other
                         tensors as lists of two → the five results of each direction, flat
``plain_directions_backward``
                         ``plain_backward`` of the directions at once, on the d-th entry of each
                         list → the four results of every direction, flat
``pipelined_directions_forward`` / ``pipelined_directions_backward``
                         ``pipelined_forward`` / ``pipelined_backward`` likewise (seven / six
                         results per direction, flat)
``scan_forward``         spec, highway of a cell that reads no h_{t-1} (its G blocks per direction
                         from ``decode_scan_spec``), proj (T,B,D·G·H), h0 (D,B,H), c0 (D,B,H),
                         batch_sizes, save, bias (D·G·H) or None → out (T,B,D·H), h_n (D,B,H),
                         c_n (D,B,H), cs (T,B,D·H) (empty unless save); time- or batch-major
                         like proj
``scan_backward``        spec, highway, g_out, g_hn, g_cn, proj, c0, cs, batch_sizes, bias,
                         bias_grad → d_proj, d_c0, d_bias (empty unless bias_grad)
``weight_grad``          g (rows,M), x (rows,K) → gᵀx (M,K)
=======================  ==========================================================================

:class:`CpuKernel` puts the operators behind ``_C``'s own calling convention, so the code that
calls the kernel (``registry.cpu_kernel()``) is the same whether an entry is an operator or not.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch
from torch import Tensor

__all__ = ["CpuKernel", "OPERATORS", "register"]

#: The operators' names (``torch.ops.rnn_ablations.<name>``).
OPERATORS = ("plain_forward", "plain_forward_", "plain_backward", "pipelined_forward",
             "pipelined_backward", "plain_directions_forward_", "plain_directions_backward",
             "pipelined_directions_forward", "pipelined_directions_backward", "scan_forward",
             "scan_backward", "weight_grad")

_registered = None  # the raw module the operators were registered for
_LIBRARY = torch.library.Library("rnn_ablations", "FRAGMENT")  # the operators' definitions


class _Operator:
    """What ``register``'s decorator returns for an operator: its fake kernel is registered
    with ``@op.register_fake`` (as on a ``torch.library.custom_op``)."""

    def __init__(self, qualname: str):
        self.qualname = qualname

    def register_fake(self, fn):
        return torch.library.register_fake(self.qualname, lib=_LIBRARY)(fn)
_IMPLEMENTATIONS = {}  # operator name -> its CPU implementation (a Python function)


def _empty(like: Tensor) -> Tensor:
    return like.new_empty(0)


def _sizes(proj_or_x: Tensor, w_hh: Tensor) -> Tuple[int, int, int, int]:
    """T, B, H and R of a step-kernel call."""
    T, B = proj_or_x.shape[0], proj_or_x.shape[1]
    H = w_hh.shape[1]
    return T, B, H, w_hh.shape[0] // H


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of what a forward saves for its backward: float32 for the half types (which
    only the CUDA kernel takes), the input's dtype otherwise (``at::opmath_type``)."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _forward_shapes(proj_or_x, w_hh, h0, highway, train):
    """The fake results (out, h_n, c_n, gates, cs, hin) of a forward: what it saves for the
    backward (gates, cs, hin) in the accumulation type (float32 for the half types, which only
    the CUDA kernel takes)."""
    T, B, H, R = _sizes(proj_or_x, w_hh)
    like = h0
    acc = accumulation_dtype(h0.dtype)
    return (like.new_empty(T, B, H), like.new_empty(B, H), like.new_empty(B, H),
            like.new_empty(T, B, R * H, dtype=acc),
            like.new_empty(T, B, H, dtype=acc) if train else like.new_empty(0, dtype=acc),
            like.new_empty(T, B, H, dtype=acc) if train and highway
            else like.new_empty(0, dtype=acc))


def _fill_padding(batch_sizes: Tensor, *tensors: Tensor) -> None:
    """Zero the rows of each (T, B, ·) tensor that no step reaches (row b at step t with
    b >= batch_sizes[t]), which the kernels do not write: what a forward saves for its backward
    is then a function of the inputs at every position (the backward never reads those rows)."""
    live = [t for t in tensors if t.dim() == 3 and t.numel()]
    if not live or batch_sizes.numel() == 0 or int(batch_sizes[-1]) >= live[0].shape[1]:
        return
    padded = (torch.arange(live[0].shape[1]) >= batch_sizes.unsqueeze(1)).unsqueeze(-1)
    for t in live:
        t.masked_fill_(padded.to(t.device), 0)


def register(raw) -> None:
    """Register the operators for the compiled module ``raw`` (``rnn_ablations._C``); once per
    process (the operators stay bound to the first module)."""
    global _registered
    if _registered is not None:
        return
    _registered = raw

    def _op(name, mutates_args):
        """Define ``rnn_ablations::<name>`` (its schema from ``fn``'s annotations) with ``fn``
        as its CPU kernel, and keep ``fn`` for the direct eager calls of :class:`CpuKernel`.

        Defined on a ``torch.library.Library`` rather than with ``torch.library.custom_op``: the
        dispatcher then calls ``fn`` directly, where a ``custom_op`` adds a Python autograd
        layer and an argument-filling wrapper to every call (tens of microseconds a call, which
        a compiled graph pays per operator).  The operators need no autograd kernel of their
        own: the layers call them inside their ``torch.autograd.Function``s (grad mode off) or
        inside compiled graphs, whose backward calls the backward operators."""
        def deco(fn):
            _IMPLEMENTATIONS[name] = fn
            schema = torch.library.infer_schema(fn, mutates_args=mutates_args)
            _LIBRARY.define(name + schema)
            _LIBRARY.impl(name, fn, "CPU")
            return _Operator("rnn_ablations::" + name)
        return deco

    # -- the plain kernel ------------------------------------------------------------------
    @_op("plain_forward", ())
    def plain_forward(spec: int, highway: bool, proj: Tensor, w_hh: Tensor, h0: Tensor,
                      c0: Tensor, batch_sizes: Tensor, rec_mask: Tensor,
                      train: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
        out, h_n, c_n, gates, cs, hin = raw.plain_forward(spec, highway, proj, w_hh, h0, c0,
                                                    batch_sizes, rec_mask, train, False)
        _fill_padding(batch_sizes, gates, cs, hin)
        return out, h_n, c_n, gates, cs, hin

    @plain_forward.register_fake
    def _(spec, highway, proj, w_hh, h0, c0, batch_sizes, rec_mask, train):
        return _forward_shapes(proj, w_hh, h0, highway, train)

    @_op("plain_forward_", ("proj",))
    def plain_forward_(spec: int, highway: bool, proj: Tensor, w_hh: Tensor, h0: Tensor,
                       c0: Tensor, batch_sizes: Tensor, rec_mask: Tensor,
                       train: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        out, h_n, c_n, _, cs, hin = raw.plain_forward(spec, highway, proj, w_hh, h0, c0, batch_sizes,
                                                rec_mask, train, True)
        _fill_padding(batch_sizes, cs, hin)
        return out, h_n, c_n, cs, hin

    @plain_forward_.register_fake
    def _(spec, highway, proj, w_hh, h0, c0, batch_sizes, rec_mask, train):
        out, h_n, c_n, _, cs, hin = _forward_shapes(proj, w_hh, h0, highway, train)
        return out, h_n, c_n, cs, hin

    @_op("plain_backward", ())
    def plain_backward(spec: int, highway: bool, g_out: Tensor, g_hn: Tensor, g_cn: Tensor,
                       gates: Tensor, cs: Tensor, hin: Tensor, out: Tensor, proj: Tensor,
                       w_hh: Tensor, h0: Tensor, c0: Tensor, batch_sizes: Tensor,
                       rec_mask: Tensor) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
        return tuple(raw.plain_backward(spec, highway, g_out, g_hn, g_cn, gates, cs, hin, out, proj,
                                  w_hh, h0, c0, batch_sizes, rec_mask))

    @plain_backward.register_fake
    def _(spec, highway, g_out, g_hn, g_cn, gates, cs, hin, out, proj, w_hh, h0, c0,
          batch_sizes, rec_mask):
        return (proj.new_empty(proj.shape), w_hh.new_empty(w_hh.shape), h0.new_empty(h0.shape),
                c0.new_empty(c0.shape))

    # -- the pipelined kernel --------------------------------------------------------------
    def _pipelined_fake(x, w_ih, w_hh, h0, highway, train):
        T, B, H, R = _sizes(x, w_hh)
        X = w_ih.shape[0] // H - R
        return _forward_shapes(x, w_hh, h0, highway, train) + (
            h0.new_empty(T, B, X * H) if X > 0 else _empty(h0),)

    @_op("pipelined_forward", ())
    def pipelined_forward(spec: int, highway: bool, x: Tensor, w_ih: Tensor, bias: Tensor,
                          w_hh: Tensor, h0: Tensor, c0: Tensor, batch_sizes: Tensor,
                          rec_mask: Tensor, train: bool, chunk: int
                          ) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
        r = raw.pipelined_forward(spec, highway, x, w_ih, bias, w_hh, h0, c0, batch_sizes, rec_mask,
                              train, chunk)
        _fill_padding(batch_sizes, *r[3:])
        return tuple(r)

    @pipelined_forward.register_fake
    def _(spec, highway, x, w_ih, bias, w_hh, h0, c0, batch_sizes, rec_mask, train, chunk):
        return _pipelined_fake(x, w_ih, w_hh, h0, highway, train)

    def _pipelined_grads_fake(x, w_ih, w_hh, h0, c0, need_dx, need_dw, need_bias):
        H = w_hh.shape[1]
        R = w_hh.shape[0] // H
        return (x.new_empty(x.shape) if need_dx else _empty(x),
                w_ih.new_empty(w_ih.shape) if need_dw else _empty(x),
                x.new_empty(R * H) if need_bias else _empty(x),
                w_hh.new_empty(w_hh.shape) if need_dw else _empty(x),
                h0.new_empty(h0.shape), c0.new_empty(c0.shape))

    @_op("pipelined_backward", ())
    def pipelined_backward(spec: int, highway: bool, g_out: Tensor, g_hn: Tensor, g_cn: Tensor,
                           gates: Tensor, cs: Tensor, hin: Tensor, xo: Tensor, out: Tensor,
                           x: Tensor, w_ih: Tensor, w_hh: Tensor, h0: Tensor, c0: Tensor,
                           batch_sizes: Tensor, rec_mask: Tensor, need_dx: bool, need_dw: bool,
                           need_bias: bool, chunk: int
                           ) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
        return tuple(raw.pipelined_backward(spec, highway, g_out, g_hn, g_cn, gates, cs, hin, xo,
                                        out, x, w_ih, w_hh, h0, c0, batch_sizes, rec_mask,
                                        need_dx, need_dw, need_bias, chunk))

    @pipelined_backward.register_fake
    def _(spec, highway, g_out, g_hn, g_cn, gates, cs, hin, xo, out, x, w_ih, w_hh, h0, c0,
          batch_sizes, rec_mask, need_dx, need_dw, need_bias, chunk):
        return _pipelined_grads_fake(x, w_ih, w_hh, h0, c0, need_dx, need_dw, need_bias)

    # -- the directions of a bidirectional layer at once ------------------------------------
    @_op("plain_directions_forward_", ("proj_0", "proj_1"))
    def plain_directions_forward_(spec: int, highway: bool, proj_0: Tensor, proj_1: Tensor,
                      w_hh: List[Tensor], h0: List[Tensor], c0: List[Tensor],
                      batch_sizes: Tensor, rec_mask: List[Tensor], train: bool
                      ) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor,
                                 Tensor, Tensor, Tensor, Tensor, Tensor]:
        # (a fixed tuple: functionalization does not take a list result from a mutating operator)
        results = raw.plain_directions_forward(spec, highway, [proj_0, proj_1], w_hh, h0, c0,
                                         batch_sizes, rec_mask, train, True)
        for r in results:
            _fill_padding(batch_sizes, r[4], r[5])
        return tuple(t for out, h_n, c_n, _, cs, hin in results
                     for t in (out, h_n, c_n, cs, hin))

    @plain_directions_forward_.register_fake
    def _(spec, highway, proj_0, proj_1, w_hh, h0, c0, batch_sizes, rec_mask, train):
        flat = []
        for p, w, h in zip((proj_0, proj_1), w_hh, h0):
            out, h_n, c_n, _, cs, hin = _forward_shapes(p, w, h, highway, train)
            flat += [out, h_n, c_n, cs, hin]
        return tuple(flat)

    @_op("plain_directions_backward", ())
    def plain_directions_backward(spec: int, highway: bool, g_out: List[Tensor], g_hn: List[Tensor],
                            g_cn: List[Tensor], gates: List[Tensor], cs: List[Tensor],
                            hin: List[Tensor], out: List[Tensor], proj: List[Tensor],
                            w_hh: List[Tensor], h0: List[Tensor], c0: List[Tensor],
                            batch_sizes: Tensor, rec_mask: List[Tensor]) -> List[Tensor]:
        results = raw.plain_directions_backward(spec, highway, g_out, g_hn, g_cn, gates, cs, hin, out,
                                          proj, w_hh, h0, c0, batch_sizes, rec_mask)
        return [t for r in results for t in r]

    @plain_directions_backward.register_fake
    def _(spec, highway, g_out, g_hn, g_cn, gates, cs, hin, out, proj, w_hh, h0, c0,
          batch_sizes, rec_mask):
        return [t.new_empty(t.shape) for p, w, h, c in zip(proj, w_hh, h0, c0)
                for t in (p, w, h, c)]

    @_op("pipelined_directions_forward", ())
    def pipelined_directions_forward(spec: int, highway: bool, x: List[Tensor],
                                     w_ih: List[Tensor], bias: List[Tensor], w_hh: List[Tensor],
                                     h0: List[Tensor], c0: List[Tensor], batch_sizes: Tensor,
                                     rec_mask: List[Tensor], train: bool,
                                     chunk: int) -> List[Tensor]:
        results = raw.pipelined_directions_forward(spec, highway, x, w_ih, bias, w_hh, h0, c0,
                                               batch_sizes, rec_mask, train, chunk)
        for r in results:
            _fill_padding(batch_sizes, *r[3:])
        return [t for r in results for t in r]

    @pipelined_directions_forward.register_fake
    def _(spec, highway, x, w_ih, bias, w_hh, h0, c0, batch_sizes, rec_mask, train, chunk):
        return [t for a, wi, w, h in zip(x, w_ih, w_hh, h0)
                for t in _pipelined_fake(a, wi, w, h, highway, train)]

    @_op("pipelined_directions_backward", ())
    def pipelined_directions_backward(
            spec: int, highway: bool, g_out: List[Tensor], g_hn: List[Tensor],
            g_cn: List[Tensor], gates: List[Tensor], cs: List[Tensor], hin: List[Tensor],
            xo: List[Tensor], out: List[Tensor], x: List[Tensor], w_ih: List[Tensor],
            w_hh: List[Tensor], h0: List[Tensor], c0: List[Tensor], batch_sizes: Tensor,
            rec_mask: List[Tensor], need_dx: bool, need_dw: bool, need_bias: bool,
            chunk: int) -> List[Tensor]:
        results = raw.pipelined_directions_backward(spec, highway, g_out, g_hn, g_cn, gates, cs, hin,
                                                xo, out, x, w_ih, w_hh, h0, c0, batch_sizes,
                                                rec_mask, need_dx, need_dw, need_bias, chunk)
        return [t for r in results for t in r]

    @pipelined_directions_backward.register_fake
    def _(spec, highway, g_out, g_hn, g_cn, gates, cs, hin, xo, out, x, w_ih, w_hh, h0, c0,
          batch_sizes, rec_mask, need_dx, need_dw, need_bias, chunk):
        return [t for a, wi, w, h, c in zip(x, w_ih, w_hh, h0, c0)
                for t in _pipelined_grads_fake(a, wi, w, h, c, need_dx, need_dw, need_bias)]

    # -- the element-wise scan -------------------------------------------------------------
    def _like_layout(proj: Tensor, width: int, dtype=None) -> Tensor:
        T, B = proj.shape[0], proj.shape[1]
        dtype = proj.dtype if dtype is None else dtype
        if not proj.is_contiguous() and proj.transpose(0, 1).is_contiguous():
            return proj.new_empty(B, T, width, dtype=dtype).transpose(0, 1)
        return proj.new_empty(T, B, width, dtype=dtype)

    @_op("scan_forward", ())
    def scan_forward(spec: int, highway: bool, proj: Tensor, h0: Tensor, c0: Tensor,
                     batch_sizes: Tensor, save: bool,
                     bias: Optional[Tensor] = None) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
        out, h_n, c_n, cs = raw.scan_forward(spec, highway, proj, h0, c0, batch_sizes, save, bias)
        _fill_padding(batch_sizes, out, cs)
        return out, h_n, c_n, cs

    @scan_forward.register_fake
    def _(spec, highway, proj, h0, c0, batch_sizes, save, bias=None):
        D, _, H = c0.shape
        acc = accumulation_dtype(proj.dtype)  # the memories cs, as a forward saves them
        return (_like_layout(proj, D * H), c0.new_empty(c0.shape), c0.new_empty(c0.shape),
                _like_layout(proj, D * H, acc) if save else proj.new_empty(0, dtype=acc))

    @_op("scan_backward", ())
    def scan_backward(spec: int, highway: bool, g_out: Tensor, g_hn: Tensor, g_cn: Tensor,
                      proj: Tensor, c0: Tensor, cs: Tensor, batch_sizes: Tensor,
                      bias: Optional[Tensor] = None,
                      bias_grad: bool = False) -> Tuple[Tensor, Tensor, Tensor]:
        return tuple(raw.scan_backward(spec, highway, g_out, g_hn, g_cn, proj, c0, cs,
                                       batch_sizes, bias, bias_grad))

    @scan_backward.register_fake
    def _(spec, highway, g_out, g_hn, g_cn, proj, c0, cs, batch_sizes, bias=None,
          bias_grad=False):
        return (_like_layout(proj, proj.shape[2]), g_cn.new_empty(g_cn.shape),
                proj.new_empty(proj.shape[2]) if bias_grad else _empty(proj))

    # -- the weight gradient ---------------------------------------------------------------
    @_op("weight_grad", ())
    def weight_grad(g: Tensor, x: Tensor) -> Tensor:
        return raw.weight_grad(g, x)

    @weight_grad.register_fake
    def _(g, x):
        return g.new_empty(g.shape[1], x.shape[1])


def _plain_eager(first: Tensor) -> bool:
    """True when nothing could see or needs the dispatcher's view of a call: no tracing
    (``torch.compile`` / ``torch.export`` / ``torch.jit.trace``), no dispatch or torch-function
    mode, no profiler (``torch.profiler`` records the operators it sees), and a plain tensor
    (not a subclass such as a fake or functional tensor)."""
    # is_compiling first: under torch.compile it is the constant True and nothing else is traced
    return (not torch.compiler.is_compiling() and type(first) is Tensor
            and not torch._C._len_torch_dispatch_stack()
            and not torch._C._is_torch_function_mode_enabled()
            and not torch._C._get_tracing_state()
            and not torch._C._autograd._profiler_enabled())


class _Direct:
    """The operators' implementations called without the dispatcher (same functions, same
    results), for the plain eager calls of :class:`CpuKernel` (and of
    :class:`rnn_ablations.kernels.cuda.ops.CudaKernel`, with its own table)."""

    def __init__(self, implementations):
        self._implementations = implementations

    def __getattr__(self, name):
        return self._implementations[name]


#: the scan entry points' calling convention this package speaks (``scan_abi`` of the compiled
#: module: 3 = the variant's kernel spec and the highway flag first, the bias and its gradient
#: inside the scan)
SCAN_ABI = 3


def scan_built(raw) -> bool:
    """Whether the compiled module ``raw`` has scan kernels with this package's calling
    convention (an older build is not called with arguments it would misread: the layer then
    runs on the generic path, and the plan's reason says to rebuild)."""
    return hasattr(raw, "scan_forward") and getattr(raw, "scan_abi", 1) == SCAN_ABI


class CpuKernel:
    """``rnn_ablations._C`` with its computing entry points routed through the operators
    (same names, same arguments, same results); everything else (``kernel_isa``,
    ``set_kernel_isa``, …) is the module's own.

    A call made in plain eager mode (:func:`_plain_eager`: nothing traces it, no mode is
    active, plain tensors) runs the operator's implementation directly, which saves the
    dispatcher's round trip from Python to C++ and back (tens of microseconds a call, a few
    percent of a small layer); every other call goes through the operator, so what traces or
    intercepts operators sees this one."""

    #: capabilities (``kernels/interface.py``): the gates written into the caller's scratch
    #: ``proj``; no persistent kernel; ``scan`` is set per instance (the build may lack it)
    in_place_gates = True
    persistent = False

    def __init__(self, raw):
        register(raw)
        self.raw = raw
        self.scan = scan_built(raw)
        self._dispatched = torch.ops.rnn_ablations
        self._direct = _Direct(_IMPLEMENTATIONS)

    def _ops(self, first: Tensor):
        """Where a call whose first tensor is ``first`` goes (see the class docstring)."""
        return self._direct if _plain_eager(first) else self._dispatched

    def __getattr__(self, name):
        return getattr(self.raw, name)

    def plain_forward(self, spec, highway, proj, w_hh, h0, c0, batch_sizes, rec_mask, keep_hin,
                      in_place=False):
        if in_place:
            # proj is a scratch tensor the caller hands over (it may be the view an autograd
            # Function returned, which autograd would not let a declared mutation touch)
            proj = proj.detach()
            out, h_n, c_n, cs, hin = self._ops(proj).plain_forward_(
                spec, highway, proj, w_hh, h0, c0, batch_sizes, rec_mask, keep_hin)
            return [out, h_n, c_n, proj.narrow(2, 0, w_hh.shape[0]), cs, hin]
        return list(self._ops(proj).plain_forward(spec, highway, proj, w_hh, h0, c0,
                                                  batch_sizes, rec_mask, keep_hin))

    def plain_backward(self, spec, highway, g_out, g_hn, g_cn, gates, cs, hin, out, proj, w_hh,
                       h0, c0, batch_sizes, rec_mask):
        return list(self._ops(g_out).plain_backward(spec, highway, g_out, g_hn, g_cn, gates, cs,
                                                    hin, out, proj, w_hh, h0, c0, batch_sizes,
                                                    rec_mask))

    def pipelined_forward(self, spec, highway, x, w_ih, bias, w_hh, h0, c0, batch_sizes,
                          rec_mask, keep_hin, chunk):
        return list(self._ops(x).pipelined_forward(spec, highway, x, w_ih, bias, w_hh, h0, c0,
                                                   batch_sizes, rec_mask, keep_hin, chunk))

    def pipelined_backward(self, spec, highway, g_out, g_hn, g_cn, gates, cs, hin, xo, out, x,
                           w_ih, w_hh, h0, c0, batch_sizes, rec_mask, need_dx, need_dw,
                           need_bias, chunk):
        return list(self._ops(g_out).pipelined_backward(
            spec, highway, g_out, g_hn, g_cn, gates, cs, hin, xo, out, x, w_ih, w_hh, h0, c0,
            batch_sizes, rec_mask, need_dx, need_dw, need_bias, chunk))

    def plain_directions_forward(self, spec, highway, proj, w_hh, h0, c0, batch_sizes, rec_mask,
                                 keep_hin, in_place=False):
        if len(proj) != 2:
            raise ValueError(f"plain_directions_forward runs the two directions of a bidirectional "
                             f"layer; got {len(proj)} (run forward once per direction instead)")
        # the operator writes the gates into proj: copies, or the caller's scratch tensors
        proj = [p.clone() if not in_place else p.detach() for p in proj]
        flat = self._ops(proj[0]).plain_directions_forward_(spec, highway, proj[0], proj[1], list(w_hh),
                                                list(h0), list(c0), batch_sizes, list(rec_mask),
                                                keep_hin)
        return [[flat[5 * d], flat[5 * d + 1], flat[5 * d + 2],
                 p.narrow(2, 0, w.shape[0]), flat[5 * d + 3], flat[5 * d + 4]]
                for d, (p, w) in enumerate(zip(proj, w_hh))]

    def plain_directions_backward(self, spec, highway, g_out, g_hn, g_cn, gates, cs, hin, out,
                                  proj, w_hh, h0, c0, batch_sizes, rec_mask):
        tensor_lists = (g_out, g_hn, g_cn, gates, cs, hin, out, proj, w_hh, h0, c0)
        flat = self._ops(g_out[0]).plain_directions_backward(
            spec, highway, *[list(t) for t in tensor_lists], batch_sizes, list(rec_mask))
        return _per_direction(flat, 4)

    def pipelined_directions_forward(self, spec, highway, x, w_ih, bias, w_hh, h0, c0,
                                     batch_sizes, rec_mask, keep_hin, chunk):
        flat = self._ops(x[0]).pipelined_directions_forward(
            spec, highway, list(x), list(w_ih), list(bias), list(w_hh), list(h0), list(c0),
            batch_sizes, list(rec_mask), keep_hin, chunk)
        return _per_direction(flat, 7)

    def pipelined_directions_backward(self, spec, highway, g_out, g_hn, g_cn, gates, cs, hin,
                                      xo, out, x, w_ih, w_hh, h0, c0, batch_sizes, rec_mask,
                                      need_dx, need_dw, need_bias, chunk):
        lists = (g_out, g_hn, g_cn, gates, cs, hin, xo, out, x, w_ih, w_hh, h0, c0)
        flat = self._ops(g_out[0]).pipelined_directions_backward(
            spec, highway, *[list(t) for t in lists], batch_sizes, list(rec_mask), need_dx,
            need_dw, need_bias, chunk)
        return _per_direction(flat, 6)

    def scan_forward(self, spec, highway, proj, h0, c0, batch_sizes, save, bias=None):
        return list(self._ops(proj).scan_forward(spec, highway, proj, h0, c0, batch_sizes, save,
                                                 bias))

    def scan_backward(self, spec, highway, g_out, g_hn, g_cn, proj, c0, cs, batch_sizes,
                      bias=None, bias_grad=False):
        return list(self._ops(g_out).scan_backward(spec, highway, g_out, g_hn, g_cn, proj, c0, cs,
                                                   batch_sizes, bias, bias_grad))

    def weight_grad(self, g, x):
        return self._ops(g).weight_grad(g, x)


def _per_direction(flat: Sequence[Tensor], k: int) -> List[List[Tensor]]:
    return [list(flat[i:i + k]) for i in range(0, len(flat), k)]
