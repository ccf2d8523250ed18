"""Dispatch of one layer/direction (:func:`run_layer`): which implementation runs it and how it
is scheduled.

* :mod:`rnn_ablations.backend`: the compiled kernels and the ``auto`` / ``kernel`` / ``generic``
  switch;
* :mod:`rnn_ablations.projection`: the input projection of all steps (oneDNN or ``F.linear``);
* :mod:`rnn_ablations.kernel_autograd`: the autograd Functions around the kernels;
* here: the CPU kernel's schedule policy (plain or pipelined) and :func:`run_layer`.

The public names of those modules are re-exported here (``rnn_ablations.dispatch`` is where
callers have always found them).
"""
from __future__ import annotations

from typing import Optional

import torch

from . import backend
from .backend import (_temporarily, _KERNEL_ERROR, _KERNEL_SOURCE, _CUDA_KERNEL_ERROR, _C, _C_cuda,  # noqa: F401
                      _cuda_autocast_dtype, _kernel_applies, _plain_kernel, cuda_kernel_available,
                      get_backend, kernel_available, kernel_isa, set_backend,
                      set_kernel_isa, supported_kernel_isas, use_backend, use_kernel_isa)
from .cuda_graphs import get_cuda_graphs, set_cuda_graphs, use_cuda_graphs
from .functional import projection_bias
from .kernel_autograd import (_KernelLayer, _PipelinedLayer, _generic_from_projection,
                              _needs_grad, _or_empty, _plain_forward)
from .projection import (ONEDNN_MIN_WEIGHT, _OneDnnLinear, _onednn_projection_applies,  # noqa: F401
                         _onednn_usable, input_projection)
from .variants import Variant

__all__ = ["kernel_available", "cuda_kernel_available", "set_backend", "use_backend",
           "set_pipeline", "get_pipeline", "use_pipeline", "run_layer", "input_projection",
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
