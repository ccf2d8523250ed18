"""Dispatch of one layer/direction (:func:`run_layer`) and of the directions of a bidirectional
layer together (:func:`run_directions`): which implementation runs them and how they are
scheduled.

* :mod:`rnn_ablations.backend`: the compiled kernels and the ``auto`` / ``kernel`` / ``generic``
  switch;
* :mod:`rnn_ablations.projection`: the input projection of all steps (oneDNN or ``F.linear``);
* :mod:`rnn_ablations.kernel_autograd`: the autograd Functions around the kernels;
* here: the CPU kernel's schedule policy (plain or pipelined; directions one after the other or
  concurrently), :func:`run_layer` and :func:`run_directions`.

The public names of those modules are re-exported here (``rnn_ablations.dispatch`` is where
callers have always found them).
"""
from __future__ import annotations

from typing import Optional

import torch

from . import backend, cuda_recurrence
from .backend import (_temporarily, _KERNEL_ERROR, _KERNEL_SOURCE, _CUDA_KERNEL_ERROR, _C, _C_cuda,  # noqa: F401
                      _kernel_applies, autocast_like, _plain_kernel, cuda_kernel_available,
                      get_backend, kernel_available, kernel_isa, set_backend,
                      set_kernel_isa, supported_kernel_isas, use_backend, use_kernel_isa)
from .cuda_graphs import get_cuda_graphs, set_cuda_graphs, use_cuda_graphs
from .functional import projection_bias
from .kernel_autograd import (_DIRECTION_ARGS, _PIPELINED_DIRECTION_ARGS, _KernelDirections,
                              _KernelLayer, _PipelinedDirections, _PipelinedLayer,
                              _generic_from_projection, _needs_grad, _or_empty, _plain_forward)
from .projection import (ONEDNN_MIN_WEIGHT, _OneDnnLinear, _onednn_projection_applies,  # noqa: F401
                         _onednn_usable, input_projection)
from .variants import Variant

__all__ = ["kernel_available", "cuda_kernel_available", "set_backend", "use_backend",
           "set_pipeline", "get_pipeline", "use_pipeline", "run_layer", "input_projection",
           "run_directions", "set_concurrent_directions", "get_concurrent_directions",
           "use_concurrent_directions",
           "set_cuda_graphs", "get_cuda_graphs", "use_cuda_graphs",
           "kernel_isa", "supported_kernel_isas", "set_kernel_isa", "use_kernel_isa"]


#: How the kernel schedules a layer.  The *pipelined* kernel (``_C.fused_forward/backward``) runs
#: the recurrence on one core while the other computes, chunk by chunk, the large GEMMs that do
#: not wait for the next step: the input projection of later steps in the forward pass, the
#: input gradient of finished steps in the backward pass (the weight gradients follow as two
#: GEMMs over all steps).  The *plain* kernel (``_C.forward/backward``) takes the input
#: projection of all steps from :func:`input_projection` and splits each GEMM over the threads.
#:
#: ``"auto"`` takes the pipeline for ``T >= PIPELINE_MIN_STEPS`` except (a) with 2+ threads, when
#: one step's GEMM (batch x R*H x H multiply-adds) reaches ``PIPELINE_MAX_STEP_MACS`` (training)
#: or ``PIPELINE_MAX_STEP_MACS_INFERENCE`` (no gradient); (b) single-threaded inference with a
#: weight large enough for oneDNN's projection.  Why: the pipeline wins when the recurrence leaves
#: a core idle, i.e. when one step's GEMM is too small to be worth splitting over the cores; once
#: it is large enough, splitting every GEMM over the threads (the plain kernel) keeps both cores
#: busy on the critical path instead.  Inference needs less work beside the recurrence (no
#: gradients), so the plain kernel takes over at a smaller step.  The thresholds and the timings
#: they come from are in ``benchmarks/results/schedule_policy.md`` (re-measure with
#: ``benchmarks/schedules.py`` on a new machine).
#: ``"always"`` / ``"never"`` force one schedule (the tests run both; with one thread the
#: pipeline's two roles run one after the other).  The directions of a bidirectional layer that
#: run concurrently (``_concurrent_directions`` below) take neither: each runs the plain kernel
#: on one thread.
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
                                         batch_sizes, rec_mask, PIPELINE_CHUNK)
        out, h_n, c_n = backend._C.fused_forward(
            variant.kernel_spec, highway, x, w_ih, _or_empty(bias, x), w_hh, h0, c0, batch_sizes,
            _or_empty(rec_mask, x), False, PIPELINE_CHUNK)[:3]
        return out, h_n, c_n
    proj = input_projection(x, w_ih, pbias)
    w_hh, h0, c0, rec_mask = autocast_like(proj, w_hh, h0, c0, rec_mask)
    ext = cuda_recurrence.select(_plain_kernel(proj), variant, highway, proj, w_hh)
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


#: How the CPU kernel runs the directions of a bidirectional layer (:func:`run_directions`).
#: *Concurrently*: both directions' input projections first (large GEMMs on all threads), then
#: both recurrences at once, one direction per thread, in one call of the kernel
#: (``_C.forward_directions``; the hand-written backward likewise, ``_C.backward_directions``,
#: each direction with its w_hh gradient), i.e. one fork/join per layer and pass instead of one
#: per step.  Each direction then runs the plain kernel single-threaded: its step GEMMs and
#: element-wise passes are not split (no synchronisation per step), and no core waits for the
#: other's recurrence.  *Sequentially*: each direction by itself through :func:`run_layer`
#: (pipelined or plain, both threads on one direction).
#:
#: Concurrently, each direction runs on one thread the schedule the policy above picks for one
#: thread: the pipelined kernel (``_C.fused_forward_directions`` / ``fused_backward_directions``:
#: its two roles one after the other, i.e. each chunk of steps projected just before the
#: recurrence reaches it, while it is in cache) from ``PIPELINE_MIN_STEPS`` steps, except for
#: inference with a weight large enough for oneDNN's projection; else the plain kernel from the
#: input projections of all steps (``_C.forward_directions`` / ``backward_directions``), computed
#: before on all threads.  ``set_pipeline("always" / "never")`` forces one of the two here too.
#:
#: ``"auto"`` runs them concurrently with 2 torch threads (both ways keep both cores busy; the
#: concurrent one without a synchronisation per step).  With more threads, concurrently only
#: while one step's GEMM is below the size from which the schedule policy above splits it over
#: the threads (``PIPELINE_MAX_STEP_MACS``, ``..._INFERENCE`` without gradient): below it a
#: direction's recurrence runs on one core either way; above it, one direction at a time on all
#: threads may be faster (not measured: the development machines have 2 cores).  With one
#: thread there is nothing to gain: the directions run one after the other, as ``"never"``.  ``"always"`` / ``"never"``
#: force one way (the tests compare them; ``"always"`` with one thread runs the concurrent entry
#: point, which then runs the directions one after the other).  The same outputs and gradients
#: either way, up to the summation order of the GEMMs.
_DIRECTION_MODES = ("auto", "always", "never")
_concurrent_directions = "auto"


def set_concurrent_directions(mode: str) -> None:
    """``"auto"``, ``"always"`` or ``"never"`` (see ``_concurrent_directions`` above)."""
    global _concurrent_directions
    if mode not in _DIRECTION_MODES:
        raise ValueError(f"unknown concurrent-directions mode {mode!r}; choose one of "
                         f"{', '.join(_DIRECTION_MODES)}")
    _concurrent_directions = mode


def get_concurrent_directions() -> str:
    return _concurrent_directions


def use_concurrent_directions(mode: str):
    """Context manager: :func:`set_concurrent_directions` inside the ``with`` block, restored
    after it."""
    return _temporarily(set_concurrent_directions, get_concurrent_directions, mode)


def _directions_concurrent(xs, params) -> bool:
    if len(xs) < 2 or _concurrent_directions == "never":
        return False
    x = xs[0]
    if x.shape[0] == 0 or x.shape[1] == 0 or any(p[1] is None for p in params):
        return False
    if any(t.shape != x.shape for t in xs) or not _kernel_applies(x):
        return False
    if any(t.device.type != "cpu" or t.dtype != x.dtype
           for p in params for t in p if t is not None):
        return False  # run_layer reports what is wrong
    if _cpu_autocast():
        return False  # the projections would be in the autocast dtype: run_layer's way
    threads = torch.get_num_threads()
    if _concurrent_directions == "always" or threads == 2:
        return True
    if threads < 2:
        return False
    w_hh = params[0][1]
    needs_grad = any(_needs_grad(t, *p) for t, p in zip(xs, params))
    limit = PIPELINE_MAX_STEP_MACS if needs_grad else PIPELINE_MAX_STEP_MACS_INFERENCE
    return x.shape[1] * w_hh.shape[0] * w_hh.shape[1] < limit


def _directions_pipelined(x: torch.Tensor, w_ih: torch.Tensor, needs_grad: bool) -> bool:
    """The schedule of each concurrent direction (one thread each): the policy's one-thread rule."""
    if _pipeline != "auto":
        return _pipeline == "always"
    if x.shape[0] < PIPELINE_MIN_STEPS:
        return False
    return needs_grad or not _onednn_projection_applies(x, w_ih)


def _cpu_autocast() -> bool:
    try:
        return torch.is_autocast_enabled("cpu")
    except TypeError:  # pragma: no cover - torch < 2.4
        return torch.is_autocast_cpu_enabled()


def run_directions(variant: Variant, highway: bool, xs, params, h0s, c0s,
                   batch_sizes: torch.Tensor, rec_masks):
    """The directions of one layer, submitted together.  Returns ``[(output, h_n, c_n), ...]``,
    one per direction, each as :func:`run_layer` returns it.

    Direction ``d`` is ``run_layer(variant, highway, xs[d], *params[d], h0s[d], c0s[d],
    batch_sizes, rec_masks[d])`` with ``params[d] = (w_ih, w_hh, bias)``: the caller gives each
    direction its own input (the reverse direction's ``xs[1]`` reversed within each row's length,
    so that it reads only its real tokens) and reverses that direction's output back.  On the CPU
    kernel with 2+ threads the directions run concurrently (see ``_concurrent_directions``);
    elsewhere one after the other, through :func:`run_layer`."""
    n = len(xs)
    if not (len(params) == len(h0s) == len(c0s) == len(rec_masks) == n):
        raise ValueError("run_directions: xs, params, h0s, c0s and rec_masks need one entry per "
                         "direction")
    if not _directions_concurrent(xs, params):
        return [run_layer(variant, highway, x, w_ih, b, w_hh, h0, c0, batch_sizes, m)
                for x, (w_ih, w_hh, b), h0, c0, m in zip(xs, params, h0s, c0s, rec_masks)]
    needs_grad = any(_needs_grad(x, *p, h0, c0) for x, p, h0, c0 in zip(xs, params, h0s, c0s))
    if _directions_pipelined(xs[0], params[0][0], needs_grad):
        flat = []
        for x, (w_ih, w_hh, b), h0, c0, m in zip(xs, params, h0s, c0s, rec_masks):
            flat += [x.contiguous(), w_ih.contiguous(), b.contiguous() if b is not None else None,
                     w_hh.contiguous(), h0.contiguous(), c0.contiguous(),
                     m.contiguous() if m is not None else None]
        if needs_grad:
            outs = _PipelinedDirections.apply(variant, highway, batch_sizes, PIPELINE_CHUNK, *flat)
            return [tuple(outs[3 * d:3 * d + 3]) for d in range(n)]
        k = len(_PIPELINED_DIRECTION_ARGS)
        groups = [flat[i:i + k] for i in range(0, len(flat), k)]
        results = backend._C.fused_forward_directions(
            variant.kernel_spec, highway, [g[0] for g in groups], [g[1] for g in groups],
            [_or_empty(g[2], g[0]) for g in groups], [g[3] for g in groups],
            [g[4] for g in groups], [g[5] for g in groups], batch_sizes,
            [_or_empty(g[6], g[0]) for g in groups], False, PIPELINE_CHUNK)
        return [tuple(r[:3]) for r in results]
    flat = []
    for x, (w_ih, w_hh, b), h0, c0, m in zip(xs, params, h0s, c0s, rec_masks):
        pbias = projection_bias(b, w_ih.shape[0])
        proj = input_projection(x, w_ih, pbias).contiguous()
        flat += [proj, w_hh.contiguous(), h0.contiguous(), c0.contiguous(), x, w_ih, pbias,
                 m.contiguous() if m is not None else None]
    k = len(_DIRECTION_ARGS)
    if needs_grad:
        outs = _KernelDirections.apply(variant, highway, batch_sizes, *flat)
        return [tuple(outs[3 * d:3 * d + 3]) for d in range(n)]
    groups = [flat[i:i + k] for i in range(0, len(flat), k)]
    results = backend._C.forward_directions(
        variant.kernel_spec, highway, [g[0] for g in groups], [g[1] for g in groups],
        [g[2] for g in groups], [g[3] for g in groups], batch_sizes,
        [_or_empty(g[7], g[0]) for g in groups], False, True)
    return [tuple(r[:3]) for r in results]
