"""The compiled CPU kernel's entry points as PyTorch operators (namespace ``rnn_ablations``).

Each entry of ``rnn_ablations._C`` that computes is registered with :mod:`torch.library` as an
operator with a schema, a fake (meta) kernel that gives the shapes of its results without
running it, and the CPU implementation.  Through the dispatcher the kernels are then ordinary
operators to PyTorch: ``torch.compile(fullgraph=True)`` and ``torch.export`` trace them (with
their fake kernels), a ``TorchDispatchMode`` or ``FlopCounterMode`` sees them, and
``torch.library.opcheck`` checks them.  Their gradients stay where they were written: the
autograd Functions of :mod:`rnn_ablations.kernels.autograd` call the forward and backward
operators (so saved-tensor hooks see what they save).

The operators' arguments and results are written once, in the schema table
(:mod:`rnn_ablations.kernels.schema`), from which they are defined here.  What the arguments
are (one layer; T steps, B rows, H units, R recurrent and X input-only blocks of H rows of the
variant's kernel spec, ``csrc/common/kernel_spec.h``; every tensor float32 or float64 on the CPU
unless said):

==========================  =====================================================================
argument                    meaning
==========================  =====================================================================
``spec``, ``highway``       the variant's ``Variant.kernel_spec``; the highway connection
``proj``                    (T,B,(R+X)·H) input projections (``plain_forward_``: mutated, the gate
                            activations written into its recurrent blocks); the scan's
                            (T,B,D·G·H), time- or batch-major, its G blocks per direction from
                            ``decode_scan_spec``
``x``, ``w_ih``, ``bias``   the layer input (T,B,D), ((R+X)·H,D), (R·H) or empty (the pipelined
                            kernel projects inside)
``w_hh``                    (R·H,H); bfloat16 beside float32 tensors runs the step GEMM in
                            bfloat16 (d_w_hh then comes back in bfloat16)
``h0``, ``c0``              (B,H) (the scan's: (D,B,H))
``batch_sizes``             (T) int64, non-increasing
``rec_mask``                (B,H) dropout mask on h_{t-1}, or empty
``train``                   keep what the backward reads (``cs``, ``hin``)
``chunk``                   the pipelined kernel's steps per chunk (0 = auto)
``g_out``, ``g_hn``,        the gradients of ``out``, ``h_n``, ``c_n``
``g_cn``
``gates``, ``cs``, ``hin``  what the forward saved: gate activations (T,B,R·H), memories
``xo``, ``out``             (T,B,H), output before the highway mix (T,B,H); input-only
                            projections (T,B,X·H) (empty when X = 0), the output
``need_dx``, ``need_dw``,   which gradients to compute
``need_bias``
``save``, ``bias_grad``     (scan) keep ``cs``; compute the bias gradient
``g``, ``x``                (``weight_grad``) (rows,M), (rows,K) → gᵀx (M,K)
==========================  =====================================================================

The forwards return out (T,B,H), h_n, c_n, gates, cs (empty unless train), hin (empty unless
train and highway), and the pipelined ones xo; ``plain_forward_`` leaves ``gates`` out (it is
``proj[..., :R·H]``).  The backwards return the gradients of their inputs in order (d_proj,
d_w_hh, d_h0, d_c0; pipelined: dx (empty unless need_dx), d_w_ih, d_bias (empty unless
need_bias), d_w_hh (both empty unless need_dw), d_h0, d_c0; scan: d_proj, d_c0, d_bias).  The
``*_directions_*`` operators run the two directions of a bidirectional layer at once (one per
thread), every tensor but ``batch_sizes`` a list of two (``plain_directions_forward_``: proj_0,
proj_1, both mutated), and return every direction's results, flat.

:class:`CpuKernel` puts the operators behind ``_C``'s own calling convention, so the code that
calls the kernel (``registry.cpu_kernel()``) is the same whether an entry is an operator or not.
"""
from __future__ import annotations

from typing import List, Sequence, Tuple

import torch
from torch import Tensor

from . import schema

__all__ = ["CpuKernel", "OPERATORS", "register"]

#: The operators' names (``torch.ops.rnn_ablations.<name>``; their schemas: ``schema.SCHEMAS``).
OPERATORS = schema.CPU_OPERATORS

_registered = None  # the raw module the operators were registered for
_LIBRARY = torch.library.Library("rnn_ablations", "FRAGMENT")  # the operators' definitions
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


class _Named:
    """A call's arguments by name (``a.proj``), for the fake kernels: positions from the
    schema table, defaults filled in."""

    __slots__ = ("_args", "_at")

    def __init__(self, name: str, args, kwargs):
        self._args = schema.complete(name, args, kwargs)
        self._at = schema.positions(name)

    def __getattr__(self, item):
        return self._args[self._at[item]]


# -- the fake kernels: fake(a), a the call's arguments by name --------------------------------
def _in_place_fake(a):
    out, h_n, c_n, _, cs, hin = _forward_shapes(a.proj, a.w_hh, a.h0, a.highway, a.train)
    return out, h_n, c_n, cs, hin


def _pipelined_fake(x, w_ih, w_hh, h0, highway, train):
    T, B, H, R = _sizes(x, w_hh)
    X = w_ih.shape[0] // H - R
    return _forward_shapes(x, w_hh, h0, highway, train) + (
        h0.new_empty(T, B, X * H) if X > 0 else _empty(h0),)


def _pipelined_grads_fake(x, w_ih, w_hh, h0, c0, need_dx, need_dw, need_bias):
    H = w_hh.shape[1]
    R = w_hh.shape[0] // H
    return (x.new_empty(x.shape) if need_dx else _empty(x),
            w_ih.new_empty(w_ih.shape) if need_dw else _empty(x),
            x.new_empty(R * H) if need_bias else _empty(x),
            w_hh.new_empty(w_hh.shape) if need_dw else _empty(x),
            h0.new_empty(h0.shape), c0.new_empty(c0.shape))


def _directions_forward_fake(a):
    flat = []
    for p, w, h in zip((a.proj_0, a.proj_1), a.w_hh, a.h0):
        out, h_n, c_n, _, cs, hin = _forward_shapes(p, w, h, a.highway, a.train)
        flat += [out, h_n, c_n, cs, hin]
    return tuple(flat)


def _like_layout(proj: Tensor, width: int, dtype=None) -> Tensor:
    T, B = proj.shape[0], proj.shape[1]
    dtype = proj.dtype if dtype is None else dtype
    if not proj.is_contiguous() and proj.transpose(0, 1).is_contiguous():
        return proj.new_empty(B, T, width, dtype=dtype).transpose(0, 1)
    return proj.new_empty(T, B, width, dtype=dtype)


def _scan_fake(a):
    D, _, H = a.c0.shape
    acc = accumulation_dtype(a.proj.dtype)  # the memories cs, as a forward saves them
    return (_like_layout(a.proj, D * H), a.c0.new_empty(a.c0.shape), a.c0.new_empty(a.c0.shape),
            _like_layout(a.proj, D * H, acc) if a.save else a.proj.new_empty(0, dtype=acc))


def _persistent_fake(a):
    """``plain_forward``'s fake results, but ``gates`` empty unless ``train``."""
    out, h_n, c_n, gates, cs, hin = _forward_shapes(a.proj, a.w_hh, a.h0, a.highway, a.train)
    return out, h_n, c_n, gates if a.train else gates.new_empty(0), cs, hin


def _grads_like(a):
    return tuple(t.new_empty(t.shape) for t in (a.proj, a.w_hh, a.h0, a.c0))


#: operator -> its fake kernel (the shapes and dtypes of its results), for every operator of the
#: schema table
_FAKES = {
    "plain_forward": lambda a: _forward_shapes(a.proj, a.w_hh, a.h0, a.highway, a.train),
    "plain_forward_": _in_place_fake,
    "plain_backward": _grads_like,
    "pipelined_forward": lambda a: _pipelined_fake(a.x, a.w_ih, a.w_hh, a.h0, a.highway,
                                                   a.train),
    "pipelined_backward": lambda a: _pipelined_grads_fake(a.x, a.w_ih, a.w_hh, a.h0, a.c0,
                                                          a.need_dx, a.need_dw, a.need_bias),
    "plain_directions_forward_": _directions_forward_fake,
    "plain_directions_backward": lambda a: [t.new_empty(t.shape) for p, w, h, c in zip(
        a.proj, a.w_hh, a.h0, a.c0) for t in (p, w, h, c)],
    "pipelined_directions_forward": lambda a: [
        t for x, wi, w, h in zip(a.x, a.w_ih, a.w_hh, a.h0)
        for t in _pipelined_fake(x, wi, w, h, a.highway, a.train)],
    "pipelined_directions_backward": lambda a: [
        t for x, wi, w, h, c in zip(a.x, a.w_ih, a.w_hh, a.h0, a.c0)
        for t in _pipelined_grads_fake(x, wi, w, h, c, a.need_dx, a.need_dw, a.need_bias)],
    "scan_forward": _scan_fake,
    "scan_backward": lambda a: (
        _like_layout(a.proj, a.proj.shape[2]), a.g_cn.new_empty(a.g_cn.shape),
        a.proj.new_empty(a.proj.shape[2]) if a.bias_grad else _empty(a.proj)),
    "weight_grad": lambda a: a.g.new_empty(a.g.shape[1], a.x.shape[1]),
    "persistent_forward": _persistent_fake,
    "persistent_backward": _grads_like,
}
_DEFINED = set()  # the operators defined in this process


def define(name: str, device: str, implementation) -> None:
    """Register ``implementation`` as ``rnn_ablations::<name>``'s kernel for ``device``
    (``"CPU"`` / ``"CUDA"``), defining the operator first where this process has not: its
    schema from :data:`schema.SCHEMAS`, its fake kernel from ``_FAKES``.  So either device's
    kernel, loaded first, defines the operators it implements.

    Defined on a ``torch.library.Library`` rather than with ``torch.library.custom_op``: the
    dispatcher then calls the implementation directly, where a ``custom_op`` adds a Python
    autograd layer and an argument-filling wrapper to every call (tens of microseconds a call,
    which a compiled graph pays per operator).  The operators need no autograd kernel of their
    own: the layers call them inside their ``torch.autograd.Function``s (grad mode off) or
    inside compiled graphs, whose backward calls the backward operators."""
    if name not in _DEFINED:
        fake = _FAKES[name]
        _LIBRARY.define(name + schema.SCHEMAS[name])
        torch.library.register_fake("rnn_ablations::" + name, lib=_LIBRARY)(
            lambda *args, **kwargs: fake(_Named(name, args, kwargs)))
        _DEFINED.add(name)
    _LIBRARY.impl(name, implementation, device)


def register(raw) -> None:
    """Register the CPU implementations for the compiled module ``raw`` (``rnn_ablations._C``);
    once per process (the operators stay bound to the first module).  Each implementation
    forwards its arguments as they come (``raw``'s entry points take the operator's arguments,
    in the schema's order) and reads by position only what it uses."""
    global _registered
    if _registered is not None:
        return
    _registered = raw
    at = {name: schema.positions(name) for name in OPERATORS}

    def cpu(name):
        def deco(fn):
            _IMPLEMENTATIONS[name] = fn
            define(name, "CPU", fn)
            return fn
        return deco

    # -- the plain kernel ------------------------------------------------------------------
    BS = at["plain_forward"]["batch_sizes"]

    @cpu("plain_forward")
    def plain_forward(*args):
        out, h_n, c_n, gates, cs, hin = raw.plain_forward(*args, False)
        _fill_padding(args[BS], gates, cs, hin)
        return out, h_n, c_n, gates, cs, hin

    @cpu("plain_forward_")
    def plain_forward_(*args):
        out, h_n, c_n, _, cs, hin = raw.plain_forward(*args, True)
        _fill_padding(args[BS], cs, hin)
        return out, h_n, c_n, cs, hin

    @cpu("plain_backward")
    def plain_backward(*args):
        return tuple(raw.plain_backward(*args))

    # -- the pipelined kernel --------------------------------------------------------------
    BS_P = at["pipelined_forward"]["batch_sizes"]

    @cpu("pipelined_forward")
    def pipelined_forward(*args):
        r = raw.pipelined_forward(*args)
        _fill_padding(args[BS_P], *r[3:])
        return tuple(r)

    @cpu("pipelined_backward")
    def pipelined_backward(*args):
        return tuple(raw.pipelined_backward(*args))

    # -- the directions of a bidirectional layer at once ------------------------------------
    P0 = at["plain_directions_forward_"]["proj_0"]
    BS_D = at["plain_directions_forward_"]["batch_sizes"]

    @cpu("plain_directions_forward_")
    def plain_directions_forward_(*args):
        # the raw entry takes the directions' projections as one list
        results = raw.plain_directions_forward(*args[:P0], [args[P0], args[P0 + 1]],
                                               *args[P0 + 2:], True)
        for r in results:
            _fill_padding(args[BS_D], r[4], r[5])
        return tuple(t for out, h_n, c_n, _, cs, hin in results
                     for t in (out, h_n, c_n, cs, hin))

    @cpu("plain_directions_backward")
    def plain_directions_backward(*args):
        return [t for r in raw.plain_directions_backward(*args) for t in r]

    BS_PD = at["pipelined_directions_forward"]["batch_sizes"]

    @cpu("pipelined_directions_forward")
    def pipelined_directions_forward(*args):
        results = raw.pipelined_directions_forward(*args)
        for r in results:
            _fill_padding(args[BS_PD], *r[3:])
        return [t for r in results for t in r]

    @cpu("pipelined_directions_backward")
    def pipelined_directions_backward(*args):
        return [t for r in raw.pipelined_directions_backward(*args) for t in r]

    # -- the element-wise scan -------------------------------------------------------------
    BS_S = at["scan_forward"]["batch_sizes"]

    @cpu("scan_forward")
    def scan_forward(*args):
        args = schema.complete("scan_forward", args)
        out, h_n, c_n, cs = raw.scan_forward(*args)
        _fill_padding(args[BS_S], out, cs)
        return out, h_n, c_n, cs

    @cpu("scan_backward")
    def scan_backward(*args):
        return tuple(raw.scan_backward(*schema.complete("scan_backward", args)))

    # -- the weight gradient ---------------------------------------------------------------
    @cpu("weight_grad")
    def weight_grad(*args):
        return raw.weight_grad(*args)


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


#: a kernel method that calls its operator with its arguments as they are (the first tensor
#: decides the route): the call written out by schema.entry
_AS_LIST = "list(self._ops({first}).{name}({args}))"


def _directions_call(name: str, per_direction: int):
    """Operator ``name`` of the directions at once (lists as lists, the flat results regrouped
    per direction: ``per_direction`` results each)."""
    lists = [i for i, a in enumerate(schema.arguments(name)) if a.tensors]

    def call(self, args):
        args = list(args)
        for i in lists:
            args[i] = list(args[i])
        flat = getattr(self._ops(args[2][0]), name)(*args)
        return _per_direction(flat, per_direction)
    return call


_PROJ = schema.positions("plain_forward")["proj"]
_W_HH = schema.positions("plain_forward")["w_hh"]
_STEP_ARGS = len(schema.arguments("plain_forward"))


def _plain_forward(self, args):
    proj, in_place = args[_PROJ], args[_STEP_ARGS]
    if in_place:
        # proj is a scratch tensor the caller hands over (it may be the view an autograd
        # Function returned, which autograd would not let a declared mutation touch)
        proj = proj.detach()
        out, h_n, c_n, cs, hin = self._ops(proj).plain_forward_(
            *args[:_PROJ], proj, *args[_PROJ + 1:_STEP_ARGS])
        return [out, h_n, c_n, proj.narrow(2, 0, args[_W_HH].shape[0]), cs, hin]
    return list(self._ops(proj).plain_forward(*args[:_STEP_ARGS]))


def _plain_directions_forward(self, args):
    proj, w_hh, in_place = args[_PROJ], args[_W_HH], args[_STEP_ARGS]
    if len(proj) != 2:
        raise ValueError(f"plain_directions_forward runs the two directions of a bidirectional "
                         f"layer; got {len(proj)} (run forward once per direction instead)")
    # the operator writes the gates into proj: copies, or the caller's scratch tensors
    proj = [p.clone() if not in_place else p.detach() for p in proj]
    rest = [a if isinstance(a, (Tensor, bool, int)) else list(a)
            for a in args[_PROJ + 1:_STEP_ARGS]]
    flat = self._ops(proj[0]).plain_directions_forward_(*args[:_PROJ], proj[0], proj[1], *rest)
    return [[flat[5 * d], flat[5 * d + 1], flat[5 * d + 2],
             p.narrow(2, 0, w.shape[0]), flat[5 * d + 3], flat[5 * d + 4]]
            for d, (p, w) in enumerate(zip(proj, w_hh))]


class CpuKernel:
    """``rnn_ablations._C`` with its computing entry points routed through the operators
    (same names, same arguments, same results); everything else (``kernel_isa``,
    ``set_kernel_isa``, …) is the module's own.  The methods' parameters are those of the
    schema table (:mod:`.schema`): a method forwards them by position.

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

    plain_forward = schema.entry("plain_forward", _plain_forward)
    plain_backward = schema.entry("plain_backward", returns=_AS_LIST)
    pipelined_forward = schema.entry("pipelined_forward", returns=_AS_LIST)
    pipelined_backward = schema.entry("pipelined_backward", returns=_AS_LIST)
    plain_directions_forward = schema.entry("plain_directions_forward",
                                            _plain_directions_forward)
    plain_directions_backward = schema.entry(
        "plain_directions_backward", _directions_call("plain_directions_backward", 4))
    pipelined_directions_forward = schema.entry(
        "pipelined_directions_forward", _directions_call("pipelined_directions_forward", 7))
    pipelined_directions_backward = schema.entry(
        "pipelined_directions_backward", _directions_call("pipelined_directions_backward", 6))
    scan_forward = schema.entry("scan_forward", returns=_AS_LIST)
    scan_backward = schema.entry("scan_backward", returns=_AS_LIST)
    weight_grad = schema.entry("weight_grad", returns="self._ops({first}).{name}({args})")


def _per_direction(flat: Sequence[Tensor], k: int) -> List[List[Tensor]]:
    return [list(flat[i:i + k]) for i in range(0, len(flat), k)]
