"""Running one layer/direction (:func:`run_layer`) and the directions of a bidirectional layer
together (:func:`run_directions`) the way the run plan says.

* :mod:`rnn_ablations.plan`: the settings (:func:`~rnn_ablations.plan.options`: backend,
  kernel ISA, CPU schedule, concurrent directions, CUDA recurrence and graphs, ...) with their
  environment variables, and :func:`~rnn_ablations.plan.plan_layer`, the one function that
  decides, from the settings and the call's shapes, device, dtype, gradient mode and threads,
  which implementation and schedule run a layer;
* :mod:`rnn_ablations.backend`: the compiled kernels and what they can run;
* :mod:`rnn_ablations.projection`: the input projection of all steps (oneDNN or ``F.linear``);
* :mod:`rnn_ablations.kernel_autograd`: the autograd Functions around the kernels;
* here: the measured thresholds of the CPU schedule policy (:class:`rnn_ablations.plan.Policy`),
  the description of a call for the plan, and the calls of the kernels the plan chose.

The public names of those modules are re-exported here; ``set_pipeline`` / ``use_pipeline`` /
``get_pipeline`` and ``set_concurrent_directions`` / ``use_...`` / ``get_...`` are short forms of
:func:`rnn_ablations.set_options` / :func:`rnn_ablations.options` for one setting, in their own
words (``"always"`` / ``"never"``, see ``docs/options.md``).
"""
from __future__ import annotations

import functools
from typing import Optional

import torch

from . import backend, cuda_recurrence, projection
from .backend import (_KERNEL_ERROR, _KERNEL_SOURCE, _CUDA_KERNEL_ERROR, _C, _C_cuda,  # noqa: F401
                      autocast_like, cuda_kernel_available, get_backend, kernel_available,
                      kernel_isa, set_backend, set_kernel_isa, supported_kernel_isas, use_backend,
                      use_kernel_isa)
from .cuda_graphs import get_cuda_graphs, set_cuda_graphs, use_cuda_graphs
from .functional import projection_bias
from .kernel_autograd import (_DIRECTION_ARGS, _PIPELINED_DIRECTION_ARGS, _KernelDirections,
                              _KernelLayer, _PipelinedDirections, _PipelinedLayer,
                              _generic_from_projection, _needs_grad, _or_empty, _plain_forward)
from .plan import LayerCall, Plan, Policy, cached_plan, get_options, options, set_options
from .projection import (ONEDNN_MIN_WEIGHT, _OneDnnLinear, _onednn_projection_applies,  # noqa: F401
                         _onednn_usable, input_projection)
from .variants import Variant

__all__ = ["kernel_available", "cuda_kernel_available", "set_backend", "use_backend",
           "set_pipeline", "get_pipeline", "use_pipeline", "run_layer", "input_projection",
           "run_directions", "set_concurrent_directions", "get_concurrent_directions",
           "use_concurrent_directions", "set_cuda_graphs", "get_cuda_graphs", "use_cuda_graphs",
           "kernel_isa", "supported_kernel_isas", "set_kernel_isa", "use_kernel_isa",
           "layer_plan"]

#: The thresholds of the CPU schedule policy (see :func:`rnn_ablations.plan._cpu_schedule`),
#: measured on the 2-core development machine: ``benchmarks/results/schedule_policy.md``
#: (re-measure with ``benchmarks/schedules.py`` on a new machine).  The pipelined schedule from
#: this many steps ...
PIPELINE_MIN_STEPS = Policy().min_steps
#: ... and, with 2+ threads, the plain schedule from this many multiply-adds per step GEMM
#: (B x R*H x H), training / no gradient.
PIPELINE_MAX_STEP_MACS = Policy().max_step_macs
PIPELINE_MAX_STEP_MACS_INFERENCE = Policy().max_step_macs_inference


def _policy() -> Policy:
    return _policy_of(PIPELINE_MIN_STEPS, PIPELINE_MAX_STEP_MACS,
                      PIPELINE_MAX_STEP_MACS_INFERENCE, projection.ONEDNN_MIN_WEIGHT)


@functools.lru_cache(maxsize=8)
def _policy_of(*values) -> Policy:
    return Policy(*values)


# the short forms' words for the schedule settings
_PIPELINE_WORDS = {"auto": "auto", "always": "pipelined", "never": "plain"}
_DIRECTION_WORDS = {"auto": "auto", "always": "on", "never": "off"}


def _word(table, setting: str, value: str, what: str) -> str:
    if value not in table:
        raise ValueError(f"unknown {what} mode {value!r}; choose one of {', '.join(table)} "
                         f"(or rnn_ablations.options({setting}=...))")
    return table[value]


def _back(table, value: str) -> str:
    return next(k for k, v in table.items() if v == value)


def set_pipeline(mode: str) -> None:
    """``set_options(cpu_schedule=...)`` in the short form's words: ``"auto"``, ``"always"``
    (pipelined) or ``"never"`` (plain)."""
    set_options(cpu_schedule=_word(_PIPELINE_WORDS, "cpu_schedule", mode, "pipeline"))


def get_pipeline() -> str:
    """The ``cpu_schedule`` setting of this thread in the short form's words."""
    return _back(_PIPELINE_WORDS, get_options().cpu_schedule)


def use_pipeline(mode: str):
    """``options(cpu_schedule=...)`` in the short form's words (``"auto"``, ``"always"``,
    ``"never"``): for this thread inside the ``with`` block."""
    return options(cpu_schedule=_word(_PIPELINE_WORDS, "cpu_schedule", mode, "pipeline"))


def set_concurrent_directions(mode: str) -> None:
    """``set_options(concurrent_directions=...)`` in the short form's words: ``"auto"``,
    ``"always"`` (on) or ``"never"`` (off)."""
    set_options(concurrent_directions=_word(_DIRECTION_WORDS, "concurrent_directions", mode,
                                            "concurrent-directions"))


def get_concurrent_directions() -> str:
    """The ``concurrent_directions`` setting of this thread in the short form's words."""
    return _back(_DIRECTION_WORDS, get_options().concurrent_directions)


def use_concurrent_directions(mode: str):
    """``options(concurrent_directions=...)`` in the short form's words, for this thread inside the
    ``with`` block."""
    return options(concurrent_directions=_word(_DIRECTION_WORDS, "concurrent_directions", mode,
                                               "concurrent-directions"))


def __getattr__(name: str):
    if name == "PIPELINE_CHUNK":  # read as the pipeline_chunk setting
        return get_options().pipeline_chunk
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def plan_sizes(steps, batch, rec_blocks: int, hidden: int, needs_grad: bool):
    """``(steps, batch)`` for a :class:`~rnn_ablations.plan.LayerCall`.  In eager mode T and B.
    Under ``torch.compile`` / ``torch.export`` the plan is made when the graph is traced, and a
    size may be symbolic (dynamic shapes: one graph for every sequence length, which a plan
    keyed on the exact size would not allow).  The plan reads the sizes only through its
    thresholds (zero, ``Policy.min_steps``, the step GEMM's ``max_step_macs`` /
    ``max_step_macs_inference``), so each is replaced by a size on the same side of every
    threshold: the graph then guards on those sides, not on the size."""
    if not torch.compiler.is_compiling():
        return steps, batch
    return threshold_sizes(steps, batch, rec_blocks, hidden, needs_grad)


def threshold_sizes(steps, batch, rec_blocks: int, hidden: int, needs_grad: bool):
    """Sizes on the same side of each of the plan's thresholds as ``steps`` and ``batch``
    (:func:`plan_sizes`); comparisons only, so a symbolic size gives guards, not a value."""
    # the policy's thresholds as _policy() gives them (read here: no cached call in a trace)
    min_steps = PIPELINE_MIN_STEPS
    steps_for_plan = 0 if steps == 0 else (min_steps if steps >= min_steps else 1)
    limit = PIPELINE_MAX_STEP_MACS if needs_grad else PIPELINE_MAX_STEP_MACS_INFERENCE
    per_row = max(1, rec_blocks * hidden * hidden)
    if batch == 0:
        batch_for_plan = 0
    elif batch * per_row < limit:
        batch_for_plan = 1
    else:
        batch_for_plan = -(-limit // per_row)  # the smallest batch at the limit
    return steps_for_plan, batch_for_plan


def _describe(xs, params, needs_grad: bool) -> LayerCall:
    """The plan's view of the directions ``xs`` with ``params[d] = (w_ih, w_hh, bias)``."""
    x = xs[0]
    w_ih, w_hh = params[0][0], params[0][1]
    device = "cpu" if x.is_cpu else x.device.type
    # whether the directions may run together (the concurrent kernel takes CPU tensors of one
    # dtype and shape); one direction runs alone whatever this says
    uniform = len(xs) == 1 or (all(t.shape == x.shape for t in xs[1:])
                               and all(t is None or (t.is_cpu and t.dtype is x.dtype)
                                       for p in params for t in p))
    H = w_hh.shape[1]
    R = w_hh.shape[0] // max(1, H)
    steps, batch = plan_sizes(x.shape[0], x.shape[1], R, H, needs_grad)
    return LayerCall(device, x.dtype, steps, batch, H, R, w_ih.numel(), len(xs), needs_grad,
                     backend.num_threads(), backend.autocast_dtype(device), uniform)


def layer_plan(xs, params, needs_grad: Optional[bool] = None) -> Plan:
    """The plan for the directions ``xs`` (each (T, B, D)) with ``params[d] = (w_ih, w_hh,
    bias)`` under this thread's settings; ``needs_grad`` defaults to grad mode and whether an
    input requires a gradient."""
    if needs_grad is None:
        needs_grad = any(_needs_grad(x, *p) for x, p in zip(xs, params))
    return backend.plan_call(tuple(_describe(xs, params, needs_grad)), _policy)


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
    needs_grad = _needs_grad(x, w_ih, bias, w_hh, h0, c0)
    plan = layer_plan([x], [(w_ih, w_hh, bias)], needs_grad)
    return _run_layer(plan, variant, highway, x, w_ih, bias, w_hh, h0, c0, batch_sizes, rec_mask)


def _run_layer(plan: Plan, variant, highway, x, w_ih, bias, w_hh, h0, c0, batch_sizes,
               rec_mask):
    pbias = projection_bias(bias, w_ih.shape[0])
    if x.shape[0] == 0 or x.shape[1] == 0:
        proj = torch.nn.functional.linear(x, w_ih, pbias)
        return _generic_from_projection(variant, highway, proj, w_hh, h0, c0, batch_sizes,
                                        rec_mask)
    if plan.path == "cpu" and plan.schedule == "pipelined":
        x, w_ih, w_hh = x.contiguous(), w_ih.contiguous(), w_hh.contiguous()
        h0, c0 = h0.contiguous(), c0.contiguous()
        bias = bias.contiguous() if bias is not None else None
        rec_mask = rec_mask.contiguous() if rec_mask is not None else None
        if _needs_grad(x, w_ih, bias, w_hh, h0, c0):
            return _PipelinedLayer.apply(x, w_ih, bias, w_hh, h0, c0, variant, highway,
                                         batch_sizes, rec_mask, plan.chunk)
        out, h_n, c_n = backend._C.fused_forward(
            variant.kernel_spec, highway, x, w_ih, _or_empty(bias, x), w_hh, h0, c0, batch_sizes,
            _or_empty(rec_mask, x), False, plan.chunk)[:3]
        return out, h_n, c_n
    proj = input_projection(x, w_ih, pbias, onednn=plan.onednn)
    w_hh, h0, c0, rec_mask = autocast_like(proj, w_hh, h0, c0, rec_mask)
    if plan.path == "generic":
        return _generic_from_projection(variant, highway, proj, w_hh, h0, c0, batch_sizes,
                                        rec_mask)
    ext = (backend._C if plan.path == "cpu"
           else cuda_recurrence.select(plan, variant, highway, proj, w_hh))
    proj, w_hh, h0, c0 = proj.contiguous(), w_hh.contiguous(), h0.contiguous(), c0.contiguous()
    rec_mask = rec_mask.contiguous() if rec_mask is not None else None
    if _needs_grad(proj, w_hh, h0, c0):
        return _KernelLayer.apply(proj, w_hh, h0, c0, x, w_ih, pbias, variant, highway,
                                  batch_sizes, rec_mask, ext)
    out, h_n, c_n, _, _, _ = _plain_forward(ext, variant.kernel_spec, highway, proj, w_hh, h0, c0,
                                            batch_sizes, _or_empty(rec_mask, proj), False)
    return out, h_n, c_n


def run_directions(variant: Variant, highway: bool, xs, params, h0s, c0s,
                   batch_sizes: torch.Tensor, rec_masks):
    """The directions of one layer, submitted together.  Returns ``[(output, h_n, c_n), ...]``,
    one per direction, each as :func:`run_layer` returns it.

    Direction ``d`` is ``run_layer(variant, highway, xs[d], *params[d], h0s[d], c0s[d],
    batch_sizes, rec_masks[d])`` with ``params[d] = (w_ih, w_hh, bias)``: the caller gives each
    direction its own input (the reverse direction's ``xs[1]`` reversed within each row's length,
    so that it reads only its real tokens) and reverses that direction's output back.  Where the
    plan says ``concurrent`` (the CPU kernel, see :func:`rnn_ablations.plan._cpu_schedule`) the
    directions run at the same time, one per thread, in one kernel call (the hand-written
    backward likewise); elsewhere one after the other.  The same outputs and gradients either
    way, up to the summation order of the GEMMs."""
    n = len(xs)
    if not (len(params) == len(h0s) == len(c0s) == len(rec_masks) == n):
        raise ValueError("run_directions: xs, params, h0s, c0s and rec_masks need one entry per "
                         "direction")
    needs_grad = any(_needs_grad(x, *p, h0, c0) for x, p, h0, c0 in zip(xs, params, h0s, c0s))
    plan = layer_plan(xs, params, needs_grad)
    if not plan.concurrent:
        return [_run_layer(plan, variant, highway, x, w_ih, b, w_hh, h0, c0, batch_sizes, m)
                for x, (w_ih, w_hh, b), h0, c0, m in zip(xs, params, h0s, c0s, rec_masks)]
    if plan.schedule == "pipelined":
        flat = []
        for x, (w_ih, w_hh, b), h0, c0, m in zip(xs, params, h0s, c0s, rec_masks):
            flat += [x.contiguous(), w_ih.contiguous(), b.contiguous() if b is not None else None,
                     w_hh.contiguous(), h0.contiguous(), c0.contiguous(),
                     m.contiguous() if m is not None else None]
        if needs_grad:
            outs = _PipelinedDirections.apply(variant, highway, batch_sizes, plan.chunk, *flat)
            return [tuple(outs[3 * d:3 * d + 3]) for d in range(n)]
        k = len(_PIPELINED_DIRECTION_ARGS)
        groups = [flat[i:i + k] for i in range(0, len(flat), k)]
        results = backend._C.fused_forward_directions(
            variant.kernel_spec, highway, [g[0] for g in groups], [g[1] for g in groups],
            [_or_empty(g[2], g[0]) for g in groups], [g[3] for g in groups],
            [g[4] for g in groups], [g[5] for g in groups], batch_sizes,
            [_or_empty(g[6], g[0]) for g in groups], False, plan.chunk)
        return [tuple(r[:3]) for r in results]
    flat = []
    for x, (w_ih, w_hh, b), h0, c0, m in zip(xs, params, h0s, c0s, rec_masks):
        pbias = projection_bias(b, w_ih.shape[0])
        proj = input_projection(x, w_ih, pbias, onednn=plan.onednn).contiguous()
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
