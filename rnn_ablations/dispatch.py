"""Dispatch of one layer/direction to the fused C++ CPU kernel or to the generic PyTorch path.

The fast path is used automatically for CPU tensors of dtype float32/float64 when the compiled
extension ``rnn_ablations._C`` is importable, and for CUDA tensors of dtype float32/float64/
bfloat16/float16 (also under ``torch.autocast("cuda")``) when ``rnn_ablations._C_cuda`` is (built
only with a CUDA torch and nvcc; its step loops are replayed as CUDA graphs, see
:mod:`rnn_ablations.cuda_graphs`); everything else (half precision on the CPU, other devices, an
install without the extension, ``RNN_ABLATIONS_DISABLE_KERNEL=1``) takes :func:`generic_layer`,
which computes the same function.  :func:`set_backend` forces one path (the tests use it to compare them).
"""
from __future__ import annotations

import contextlib
import importlib
import os
import sys
import warnings
from typing import Optional

import torch

from . import cuda_graphs
from .cuda_graphs import get_cuda_graphs, set_cuda_graphs, use_cuda_graphs
from . import _kernel_loader
from .functional import generic_layer, projection_bias
from .variants import Variant

__all__ = ["kernel_available", "cuda_kernel_available", "set_backend", "use_backend",
           "set_pipeline", "get_pipeline", "use_pipeline", "run_layer", "input_projection",
           "set_cuda_graphs", "get_cuda_graphs", "use_cuda_graphs",
           "kernel_isa", "supported_kernel_isas", "set_kernel_isa", "use_kernel_isa"]

# The CPU kernel: built at install time, or compiled on first use and cached (_kernel_loader).
_C, _KERNEL_ERROR, _KERNEL_SOURCE = _kernel_loader.load_cpu_kernel()
if _C is not None:
    # RNN_ABLATIONS_ISA names the vector path; a bad value fails here, at import, not mid-run.
    _C.kernel_isa()

try:  # pragma: no cover - built only with a CUDA build of torch and nvcc (see setup.py)
    _C_cuda = importlib.import_module(__package__ + "._C_cuda")
    _CUDA_KERNEL_ERROR: Optional[str] = None
except ImportError as exc:  # pragma: no cover
    _C_cuda = None
    _CUDA_KERNEL_ERROR = (f"{exc}; it is built by `pip install --no-build-isolation -e .` when "
                          "torch is a CUDA build and CUDA's compiler is found")

_BACKENDS = ("auto", "kernel", "generic")
_backend = "generic" if os.environ.get("RNN_ABLATIONS_DISABLE_KERNEL") == "1" else "auto"
# Without a CPU kernel the loader has warned already (or RNN_ABLATIONS_NO_KERNEL asked for that).
_warned = set() if _C is not None else {"CPU"}


def kernel_available() -> bool:
    """True when the compiled CPU kernel could be imported."""
    return _C is not None


def kernel_isa() -> Optional[str]:
    """The vector code the CPU kernel runs: ``"avx2"`` (AVX2 + FMA: the packed step GEMM and the
    element-wise pass in 256-bit registers) or ``"portable"`` (the build's baseline; the step
    GEMM is ATen's); ``None`` without a kernel.  Chosen at run time from the CPU (cpuid), or by
    ``RNN_ABLATIONS_ISA=avx2|portable``; :func:`set_kernel_isa` switches it."""
    return _C.kernel_isa() if _C is not None else None


def supported_kernel_isas() -> list:
    """The vector paths this CPU and build can run, best first (empty without a kernel)."""
    return list(_C.supported_isas()) if _C is not None else []


def set_kernel_isa(name: str) -> None:
    """Use the vector path ``"avx2"``, ``"portable"`` or ``"auto"`` (the best this CPU supports).
    Raises ``ValueError`` for a name this CPU/build cannot run, ``RuntimeError`` without a kernel."""
    if _C is None:
        raise RuntimeError(f"no compiled CPU kernel: {_KERNEL_ERROR}")
    try:
        _C.set_kernel_isa(name)
    except RuntimeError as exc:
        raise ValueError(str(exc).splitlines()[0]) from None


@contextlib.contextmanager
def use_kernel_isa(name: str):
    """Context manager form of :func:`set_kernel_isa` (restores the previous path)."""
    old = kernel_isa()
    set_kernel_isa(name)
    try:
        yield
    finally:
        set_kernel_isa(old)


def cuda_kernel_available() -> bool:
    """True when the compiled CUDA kernel could be imported."""
    return _C_cuda is not None


def set_backend(name: str) -> None:
    """``"auto"`` (a compiled kernel where one applies), ``"kernel"`` (required: an error for
    tensors no kernel handles) or ``"generic"``."""
    global _backend
    if name not in _BACKENDS:
        raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(_BACKENDS)}")
    if name == "kernel" and _C is None and _C_cuda is None:
        raise RuntimeError(
            "no compiled kernel is available (CPU: "
            f"{_KERNEL_ERROR}; CUDA: {_CUDA_KERNEL_ERROR})"
        )
    _backend = name


def get_backend() -> str:
    return _backend


@contextlib.contextmanager
def _temporarily(setter, getter, value: str):
    old = getter()
    setter(value)
    try:
        yield
    finally:
        setter(old)


def use_backend(name: str):
    """Context manager: :func:`set_backend` inside the ``with`` block, restored after it."""
    return _temporarily(set_backend, get_backend, name)


def _unavailable(device: str, error: Optional[str]) -> None:
    if _backend == "kernel":
        raise RuntimeError(f"the rnn_ablations {device} kernel is not available: {error}")
    if device not in _warned:
        warnings.warn(f"rnn_ablations: compiled {device} kernel unavailable ({error}); using the "
                      "slower generic path")
        _warned.add(device)


def _plain_kernel(t: torch.Tensor):
    """The compiled module (``_C`` on CPU, ``_C_cuda`` on CUDA) whose ``forward``/``backward``
    run a layer from its input projections, or ``None`` for the generic path."""
    if _backend == "generic":
        return None
    if t.device.type == "cpu" and t.dtype in (torch.float32, torch.float64):
        if _C is None:
            _unavailable("CPU", _KERNEL_ERROR)
        return _C
    if t.device.type == "cuda" and t.dtype in _CUDA_DTYPES:
        if _C_cuda is None:
            _unavailable("CUDA", _CUDA_KERNEL_ERROR)
            return None
        return _graphed_cuda if cuda_graphs.get_cuda_graphs() else _C_cuda
    if _backend == "kernel":
        raise RuntimeError(f"the rnn_ablations kernels handle CPU float32/float64 and CUDA "
                           f"float32/float64/bfloat16/float16, got {t.device} {t.dtype}; use the "
                           "generic backend")
    return None


_CUDA_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
#: ``_C_cuda`` behind CUDA-graph replay (same entry points)
_graphed_cuda = cuda_graphs.GraphedKernel(_C_cuda) if _C_cuda is not None else None


def _cuda_autocast_dtype(t: torch.Tensor) -> Optional[torch.dtype]:
    """The autocast dtype when ``t`` is a CUDA tensor inside ``torch.autocast("cuda")``."""
    if t.device.type != "cuda":
        return None
    try:
        on = torch.is_autocast_enabled("cuda")
        dtype = torch.get_autocast_dtype("cuda") if on else None
    except TypeError:  # pragma: no cover - torch < 2.4
        on = torch.is_autocast_enabled()
        dtype = torch.get_autocast_gpu_dtype() if on else None
    return dtype


def _kernel_applies(t: torch.Tensor) -> bool:
    """True when the CPU kernel (and so also its pipelined schedule) runs ``t``."""
    return t.device.type == "cpu" and _plain_kernel(t) is not None


# --------------------------------------------------------------------------- pipeline
#: How the kernel schedules a layer.  The *pipelined* kernel (``_C.fused_forward/backward``) runs
#: the recurrence on one core while the other computes, chunk by chunk, the large GEMMs that do
#: not wait for the next step: the input projection of later steps in the forward pass, the
#: input gradient of finished steps in the backward pass (the weight gradients follow as two
#: GEMMs over all steps).  The *plain* kernel (``_C.forward/backward``) takes the input
#: projection of all steps from :func:`input_projection` and splits each GEMM over the threads.
#:
#: ``"auto"`` takes the pipeline for ``T >= PIPELINE_MIN_STEPS`` except (a) with 2+ threads, when
#: one step's GEMM (batch x R*H x H multiply-adds) reaches ``PIPELINE_MAX_STEP_MACS`` (training)
#: or ``PIPELINE_MAX_STEP_MACS_INFERENCE`` (no gradient): it is then worth splitting over the
#: cores, and the plain kernel does that; (b) single-threaded inference with a weight large
#: enough for oneDNN's projection.  Measured on the 2-core AMD EPYC development machine (B = 32,
#: T = 64, 9-11 interleaved rounds of ``benchmarks/schedules.py``, wall clock, a machine whose
#: timings move by 10-20 % between runs), pipelined vs plain, as ratios to nn.LSTM, train /
#: inference, with the step's multiply-adds:
#:   H = 256: lstm (8.4 M) 0.94 / 0.96 vs 0.93 / 0.96, lstm_minus_srnn (6.3 M) 1.14 / 1.25 vs
#:            1.01 / 1.17, ran (4.2 M) 1.62 / 1.64 vs 1.56 / 1.64;
#:   H = 384: lstm (18.9 M) 1.12 / 0.93 vs 1.08 / 0.96, ran (9.4 M) 1.93 / 1.51 vs 1.80 / 1.51;
#:   H = 512: lstm (33.5 M) 0.95 / 0.95 vs 1.06 / 1.04, ran (16.8 M) 1.61 / 1.45 vs 1.60 / 1.61;
#:   H = 650: lstm (54 M) 0.87 / 0.94 vs 1.02 / 1.14, lstm_minus_srnn (40.6 M) 1.02 / 0.93 vs
#:            1.15 / 1.28, ran (27 M) 1.44 / 1.42 vs 1.57 / 1.81.
#: With 1 thread the pipeline trained 1.0-1.1x faster, but inference at H = 650 was 1.1x slower
#: than the plain kernel's oneDNN projection.
#: ``"always"`` / ``"never"`` force one schedule (the tests run both; with one thread the
#: pipeline's two roles run one after the other).
_PIPELINES = ("auto", "always", "never")
_pipeline = "auto"
PIPELINE_MIN_STEPS = 4
#: With 2+ threads, the plain kernel from this many multiply-adds per step GEMM (see above).
PIPELINE_MAX_STEP_MACS = 24_000_000
PIPELINE_MAX_STEP_MACS_INFERENCE = 12_000_000
#: Steps per chunk; 0 = about 256 rows per chunk GEMM and at least four chunks.
PIPELINE_CHUNK = 0


def set_pipeline(mode: str) -> None:
    """``"auto"``, ``"always"`` or ``"never"`` (see ``_pipeline`` above)."""
    global _pipeline
    if mode not in _PIPELINES:
        raise ValueError(f"unknown pipeline mode {mode!r}; choose one of {', '.join(_PIPELINES)}")
    _pipeline = mode


def get_pipeline() -> str:
    return _pipeline


def use_pipeline(mode: str):
    """Context manager: :func:`set_pipeline` inside the ``with`` block, restored after it."""
    return _temporarily(set_pipeline, get_pipeline, mode)


def _pipeline_applies(x: torch.Tensor, w_ih: torch.Tensor, w_hh: torch.Tensor,
                      needs_grad: bool) -> bool:
    if _pipeline != "auto":
        return _pipeline == "always"
    if x.shape[0] < PIPELINE_MIN_STEPS:
        return False
    if torch.get_num_threads() >= 2:
        limit = PIPELINE_MAX_STEP_MACS if needs_grad else PIPELINE_MAX_STEP_MACS_INFERENCE
        return x.shape[1] * w_hh.shape[0] * w_hh.shape[1] < limit
    return needs_grad or not _onednn_projection_applies(x, w_ih)


# --------------------------------------------------------------------------- input projection
#: oneDNN is used for the all-steps input projection when the weight has at least this many
#: entries.  Measured on the AMD EPYC (AVX2) development machine, one thread, float32, 2048 rows:
#: d_in = H = 650, 3H outputs: forward 68 ms oneDNN vs 85 ms MKL, input gradient 68 vs 82 ms;
#: at H = 256 MKL was faster (9.7 vs 10.5 ms, 9.8 vs 11.9 ms).  The weight gradient stays on MKL
#: (83 vs 86 ms, and oneDNN would need two transposed copies).
ONEDNN_MIN_WEIGHT = 500_000
_onednn_state = {"ok": None}


def _onednn_usable() -> bool:
    if _onednn_state["ok"] is None:
        ok = False
        try:
            if torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise"):
                a = torch.ones(2, 3)
                y = torch.ops.mkldnn._linear_pointwise(a, torch.ones(4, 3), torch.zeros(4), "none", [], "")
                ok = bool(torch.allclose(y, torch.full((2, 4), 3.0)))
        except Exception:  # pragma: no cover - builds without oneDNN
            ok = False
        _onednn_state["ok"] = ok
    return _onednn_state["ok"]


def _dnnl_linear(x2d: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x2d, weight, bias, "none", [], "")


class _OneDnnLinear(torch.autograd.Function):
    """``F.linear`` with the forward and the input gradient on oneDNN (CPU float32).

    Under ``create_graph=True`` (the backward then runs with grad mode on) the gradients are
    computed with differentiable torch ops instead, so that second derivatives are exact."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        x2d = x.reshape(-1, x.shape[-1]).contiguous()
        w = weight.contiguous()
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        y = _dnnl_linear(x2d, w, bias.contiguous() if bias is not None else None)
        return y.view(*x.shape[:-1], w.shape[0])

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        need = ctx.needs_input_grad
        dx = dw = db = None
        if torch.is_grad_enabled():  # create_graph: differentiable ops (double backward)
            g2d = grad.reshape(-1, weight.shape[0])
            if need[0]:
                dx = g2d.mm(weight).view(x.shape)
            if need[1]:
                dw = g2d.t().mm(x.reshape(-1, x.shape[-1]))
            if ctx.has_bias and need[2]:
                db = g2d.sum(0)
            return dx, dw, db
        x2d = x.reshape(-1, x.shape[-1]).contiguous()
        w = weight.contiguous()
        g2d = grad.reshape(-1, w.shape[0]).contiguous()
        if need[0]:
            dx = _dnnl_linear(g2d, w.t(), None).view(x.shape)  # oneDNN reads the transposed layout
        if need[1]:
            dw = _C.weight_grad(g2d, x2d) if _C is not None else g2d.t().mm(x2d)
        if ctx.has_bias and need[2]:
            db = g2d.sum(0)
        return dx, dw, db


def _onednn_projection_applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return (_backend != "generic" and x.device.type == "cpu" and x.dtype == torch.float32
            and weight.dtype == torch.float32 and weight.numel() >= ONEDNN_MIN_WEIGHT
            and _onednn_usable())


def input_projection(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for all time steps at once, on the faster GEMM library."""
    if _onednn_projection_applies(x, weight):
        return _OneDnnLinear.apply(x, weight, bias)
    return torch.nn.functional.linear(x, weight, bias)


# --------------------------------------------------------------------------- recurrence
def _or_empty(t: Optional[torch.Tensor], ref: torch.Tensor) -> torch.Tensor:
    """The kernels take an empty tensor for an absent optional one."""
    return t if t is not None else ref.new_empty(0)


def _incoming_grads(g_out, g_hn, g_cn, out, h0, c0):
    """Autograd passes ``None`` for outputs that received no gradient; the kernels want zeros."""
    return (torch.zeros_like(out) if g_out is None else g_out,
            torch.zeros_like(h0) if g_hn is None else g_hn.contiguous(),
            torch.zeros_like(c0) if g_cn is None else g_cn.contiguous())


def _needs_grad(*tensors) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _plain_forward(ext, spec, highway, proj, w_hh, h0, c0, batch_sizes, mask, keep_hin):
    """``ext.forward``.  ``proj`` is always a scratch tensor here (fresh from
    :func:`input_projection`, which saves no output for its backward), so the CPU kernel may turn
    its recurrent blocks into the gate activations in place instead of copying them."""
    if ext is _C:
        return ext.forward(spec, highway, proj, w_hh, h0, c0, batch_sizes, mask, keep_hin, True)
    return ext.forward(spec, highway, proj, w_hh, h0, c0, batch_sizes, mask, keep_hin)


def _generic_from_projection(variant, highway, proj, w_hh, h0, c0, batch_sizes, rec_mask):
    rh = w_hh.shape[0]
    xo = proj[..., rh:] if proj.shape[-1] > rh else None
    out, h_n, c_n, _ = generic_layer(variant, highway, proj[..., :rh], xo, w_hh, h0, c0,
                                     batch_sizes.tolist(), rec_mask)
    return out, h_n, c_n


def _graph_grads(variant, highway, x, w_ih, pbias, w_hh, h0, c0, batch_sizes, rec_mask,
                 grads, want_proj, wrt):
    """The gradients of one layer *with a graph* (``create_graph=True``: the kernels' hand-written
    backward is not differentiable).  The layer is recomputed on the differentiable generic path
    from its original inputs and differentiated by autograd, so second derivatives are exact.

    ``grads``: the incoming ``(g_out, g_hn, g_cn)`` (``None`` = no gradient); ``wrt``: the
    tensors to differentiate against (``None`` entries are skipped); with ``want_proj`` the
    recomputed input projection (a function of ``x``, ``w_ih``, ``pbias``) comes first."""
    with torch.enable_grad():
        proj = torch.nn.functional.linear(x, w_ih, pbias)
        outs = _generic_from_projection(variant, highway, proj, w_hh, h0, c0, batch_sizes,
                                        rec_mask)
    targets = ([proj] if want_proj else []) + list(wrt)
    live = [i for i, t in enumerate(targets) if t is not None and t.requires_grad]
    pairs = [(o, g) for o, g in zip(outs, grads) if g is not None]
    result = [None] * len(targets)
    if live and pairs:
        got = torch.autograd.grad([o for o, _ in pairs], [targets[i] for i in live],
                                  [g for _, g in pairs], create_graph=True, allow_unused=True)
        for i, g in zip(live, got):
            result[i] = g if g is not None else torch.zeros_like(targets[i])
    return result


class _KernelLayer(torch.autograd.Function):
    """Autograd wrapper: forward and the hand-written backward of a plain kernel (``ext`` is
    ``_C`` on CPU or ``_C_cuda`` on CUDA; both have the same entry points).

    ``x``, ``w_ih`` and ``pbias`` (the layer input and the projection's parameters, from which
    ``proj = F.linear(x, w_ih, pbias)`` was computed) receive no gradient here (theirs flows
    through ``proj``); they are kept for the ``create_graph=True`` backward, which recomputes
    the layer differentiably (the kernel overwrites ``proj``'s recurrent blocks in place)."""

    @staticmethod
    def forward(ctx, proj, w_hh, h0, c0, x, w_ih, pbias, variant, highway, batch_sizes,
                rec_mask, ext):
        mask_ = _or_empty(rec_mask, proj)
        out, h_n, c_n, gates, cs, hin = _plain_forward(ext, variant.kernel_spec, highway, proj, w_hh,
                                                       h0, c0, batch_sizes, mask_, True)
        ctx.save_for_backward(gates, cs, hin, out, proj, w_hh, h0, c0, batch_sizes, mask_, x,
                              w_ih, pbias)
        ctx.variant, ctx.highway, ctx.ext = variant, highway, ext
        ctx.has_mask = rec_mask is not None
        return out, h_n, c_n

    @staticmethod
    def backward(ctx, g_out, g_hn, g_cn):
        (gates, cs, hin, out, proj, w_hh, h0, c0, batch_sizes, mask, x, w_ih,
         pbias) = ctx.saved_tensors
        need = ctx.needs_input_grad
        if torch.is_grad_enabled():  # create_graph=True: a differentiable backward
            dproj, dw, dh0, dc0 = _graph_grads(
                ctx.variant, ctx.highway, x, w_ih, pbias, w_hh, h0, c0, batch_sizes,
                mask if ctx.has_mask else None, (g_out, g_hn, g_cn), True,
                [w_hh if need[1] else None, h0 if need[2] else None, c0 if need[3] else None])
            return (dproj if need[0] else None, dw, dh0, dc0) + (None,) * 8
        g_out, g_hn, g_cn = _incoming_grads(g_out, g_hn, g_cn, out, h0, c0)
        dproj, dw, dh0, dc0 = ctx.ext.backward(ctx.variant.kernel_spec, ctx.highway, g_out, g_hn, g_cn,
                                               gates, cs, hin, out, proj, w_hh, h0, c0,
                                               batch_sizes, mask)
        return (dproj, dw, dh0, dc0) + (None,) * 8


class _PipelinedLayer(torch.autograd.Function):
    """Autograd wrapper of the pipelined kernel: from the layer input to the outputs, with the
    input projection inside (its gradients come back from the kernel's backward).  Under
    ``create_graph=True`` the backward recomputes the layer differentiably (see
    :func:`_graph_grads`)."""

    @staticmethod
    def forward(ctx, x, w_ih, bias, w_hh, h0, c0, variant, highway, batch_sizes, rec_mask):
        mask_ = _or_empty(rec_mask, x)
        out, h_n, c_n, gates, cs, hin, xo = _C.fused_forward(
            variant.kernel_spec, highway, x, w_ih, _or_empty(bias, x), w_hh, h0, c0, batch_sizes,
            mask_, True, PIPELINE_CHUNK)
        ctx.save_for_backward(gates, cs, hin, xo, out, x, w_ih, w_hh, h0, c0, batch_sizes, mask_,
                              bias)
        ctx.variant, ctx.highway, ctx.has_bias = variant, highway, bias is not None
        ctx.has_mask = rec_mask is not None
        return out, h_n, c_n

    @staticmethod
    def backward(ctx, g_out, g_hn, g_cn):
        (gates, cs, hin, xo, out, x, w_ih, w_hh, h0, c0, batch_sizes, mask,
         bias) = ctx.saved_tensors
        need = ctx.needs_input_grad
        if torch.is_grad_enabled():  # create_graph=True: a differentiable backward
            pbias = projection_bias(bias, w_ih.shape[0]) if ctx.has_bias else None
            grads = _graph_grads(
                ctx.variant, ctx.highway, x, w_ih, pbias, w_hh, h0, c0, batch_sizes,
                mask if ctx.has_mask else None, (g_out, g_hn, g_cn), False,
                [t if n else None for t, n in zip((x, w_ih, bias if ctx.has_bias else None,
                                                   w_hh, h0, c0), need)])
            return tuple(grads) + (None,) * 4
        g_out, g_hn, g_cn = _incoming_grads(g_out, g_hn, g_cn, out, h0, c0)
        need_dw = need[1] or need[3]
        need_bias = ctx.has_bias and need[2]
        dx, dw_ih, db, dw_hh, dh0, dc0 = _C.fused_backward(
            ctx.variant.kernel_spec, ctx.highway, g_out, g_hn, g_cn, gates, cs, hin, xo, out, x, w_ih,
            w_hh, h0, c0, batch_sizes, mask, need[0], need_dw, need_bias, PIPELINE_CHUNK)
        return (dx if need[0] else None, dw_ih if need[1] else None, db if need_bias else None,
                dw_hh if need[3] else None, dh0, dc0, None, None, None, None)


def run_layer(variant: Variant, highway: bool, x: torch.Tensor, w_ih: torch.Tensor,
              bias: Optional[torch.Tensor], w_hh: torch.Tensor, h0: torch.Tensor,
              c0: torch.Tensor, batch_sizes: torch.Tensor,
              rec_mask: Optional[torch.Tensor] = None):
    """One layer, one direction. Returns ``(output (T,B,H), h_n (B,H), c_n (B,H))``.

    ``x`` (T, B, D) is the layer input, ``w_ih`` ((R+X)·H, D) the input weights (recurrent
    blocks first, then the input-only blocks), ``bias`` (R·H) the recurrent blocks' bias or
    ``None`` (the input-only blocks have none); ``batch_sizes`` is a CPU int64 tensor of length
    T (see :mod:`rnn_ablations.functional`).

    An empty input (B = 0 or T = 0) takes the generic path: there is nothing for a kernel to
    do, and autograd then gives zero gradients of the right shapes, as for ``torch.nn.LSTM``.
    """
    pbias = projection_bias(bias, w_ih.shape[0])
    if x.shape[0] == 0 or x.shape[1] == 0:
        proj = torch.nn.functional.linear(x, w_ih, pbias)
        return _generic_from_projection(variant, highway, proj, w_hh, h0, c0, batch_sizes,
                                        rec_mask)
    needs_grad = _needs_grad(x, w_ih, bias, w_hh, h0, c0)
    if _kernel_applies(x) and _pipeline_applies(x, w_ih, w_hh, needs_grad):
        x, w_ih, w_hh = x.contiguous(), w_ih.contiguous(), w_hh.contiguous()
        h0, c0 = h0.contiguous(), c0.contiguous()
        bias = bias.contiguous() if bias is not None else None
        rec_mask = rec_mask.contiguous() if rec_mask is not None else None
        if needs_grad:
            return _PipelinedLayer.apply(x, w_ih, bias, w_hh, h0, c0, variant, highway,
                                         batch_sizes, rec_mask)
        out, h_n, c_n = _C.fused_forward(
            variant.kernel_spec, highway, x, w_ih, _or_empty(bias, x), w_hh, h0, c0, batch_sizes,
            _or_empty(rec_mask, x), False, PIPELINE_CHUNK)[:3]
        return out, h_n, c_n
    proj = input_projection(x, w_ih, pbias)
    if _cuda_autocast_dtype(proj) is not None:
        # torch.autocast("cuda"): the projection ran in the autocast dtype (F.linear is on its
        # lower-precision list); the recurrence runs in the same dtype, as cuDNN's LSTM does
        # under autocast: the recurrent weight, the states and the mask are cast to it
        # (differentiably: their gradients flow back to the float32 parameters).
        w_hh, h0, c0 = w_hh.to(proj.dtype), h0.to(proj.dtype), c0.to(proj.dtype)
        rec_mask = rec_mask.to(proj.dtype) if rec_mask is not None else None
    ext = _plain_kernel(proj)
    if ext is not None:
        proj, w_hh, h0, c0 = proj.contiguous(), w_hh.contiguous(), h0.contiguous(), c0.contiguous()
        rec_mask = rec_mask.contiguous() if rec_mask is not None else None
        if _needs_grad(proj, w_hh, h0, c0):
            return _KernelLayer.apply(proj, w_hh, h0, c0, x, w_ih, pbias, variant, highway,
                                      batch_sizes, rec_mask, ext)
        out, h_n, c_n, _, _, _ = _plain_forward(ext, variant.kernel_spec, highway, proj, w_hh, h0, c0,
                                                batch_sizes, _or_empty(rec_mask, proj), False)
        return out, h_n, c_n
    return _generic_from_projection(variant, highway, proj, w_hh, h0, c0, batch_sizes, rec_mask)
