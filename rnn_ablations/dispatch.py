"""The one execution of a layer call: :func:`run_layer_call` describes the call, asks the run
plan once (:func:`rnn_ablations.plan.decide`) and calls the runner the plan names from
:data:`RUNNERS`, a table from runner name to function.  Nothing here decides how a layer runs:
each runner does one thing, with the parameters the plan gives it (schedule and chunk, input
projection library, bfloat16 path, streaming chunk, step-GEMM library thresholds, CUDA
recurrence and graphs).

A layer call (:func:`run_layer_call`): ``x`` (T, B, D_in) the layer input in time order,
``params[d] = (w_ih, w_hh, bias)`` per direction (``w_hh`` is ``None`` for a cell that reads no
h_{t-1}; with ``proj_size`` a fourth entry, ``w_hr``), ``h0`` / ``c0`` (directions, B, H; ``h0``
(directions, B, P) with ``proj_size``), ``batch_sizes`` (a CPU int64 tensor of length T: rows
sorted by decreasing length, ``batch_sizes[t]`` active at step t), ``rec_masks`` one
recurrent-dropout mask (or ``None``) per direction, ``reverse`` the function that reverses a
time-major tensor within each row's length (direction 1 of a cell that reads h_{t-1} runs on the
reversed input, and its output is reversed back; a :class:`rnn_ablations.functional.Reversal`,
as the module passes, also lets a large no-gradient call stream the reversal).  It returns
``(output (T, B, D·H), [h_n per direction], [c_n per direction])``.

:func:`run_layer` (one direction of a step cell) and :func:`run_scan_layer` (a cell that reads no
h_{t-1}) are the same call for those who hold the pieces of one.
"""
from __future__ import annotations

import threading
from typing import Callable, Dict, Optional, Sequence

import torch

from .kernels import autograd, registry, scan
from .kernels.cuda import recurrence as cuda_recurrence
from .kernels.projection import input_projection, streamed_forward, streamed_scan_forward
from .functional import (Reversal, generic_directions, generic_from_projection,
                         projection_bias)
from .plan import Plan, decide
from .variants import Variant

__all__ = ["RUNNERS", "run_layer_call", "run_layer", "run_scan_layer", "layer_plan",
           "observe"]


# --------------------------------------------------------------------------- step cells
def _direction_inputs(x, reverse, n):
    return [x if d == 0 else reverse(x) for d in range(n)]


def _assemble(results, reverse):
    """``(output, [h_n], [c_n])`` of the directions' ``(out, h_n, c_n)``: direction 1's output
    reversed back, the outputs side by side."""
    outs = [out if d == 0 else reverse(out) for d, (out, _, _) in enumerate(results)]
    return (outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1),
            [h for _, h, _ in results], [c for _, _, c in results])


def _projection(plan: Plan, x, w_ih, bias):
    pbias = projection_bias(bias, w_ih.shape[0])
    return input_projection(x, w_ih, pbias, onednn=plan.onednn, bf16_gemm=plan.bf16_gemm), pbias


def _run_generic(plan, variant, highway, x, params, h0, c0, batch_sizes, rec_masks, reverse):
    """The generic path (torch ops, differentiated by autograd), one direction after the other
    (:func:`rnn_ablations.functional.generic_from_projection`; with ``proj_size`` its ``w_hr``,
    the runner ``generic_projected``)."""
    results = []
    for d, (xd, p) in enumerate(zip(_direction_inputs(x, reverse, len(params)), params)):
        w_ih, w_hh, bias = p[:3]
        proj, _ = _projection(plan, xd, w_ih, bias)
        w_hr = p[3] if len(p) > 3 else None
        if w_hr is None:
            w_hh, hd, cd, mask = registry.autocast_like(proj, w_hh, h0[d], c0[d], rec_masks[d])
        else:  # proj_size: the whole recurrence in the projection's dtype (autocast)
            w_hh, hd, cd, mask, w_hr = (None if t is None else t.to(proj.dtype) for t in
                                        (w_hh, h0[d], c0[d], rec_masks[d], w_hr))
        results.append(generic_from_projection(variant, highway, proj, w_hh, hd, cd,
                                               batch_sizes, mask, w_hr))
    return _assemble(results, reverse)


def _step_kernel(plan: Plan):
    """The CPU step kernel holding the plan's step-GEMM library thresholds (``Plan.step_gemm``:
    the kernel keeps them between calls, so they are given where they differ)."""
    cpu = registry.cpu_kernel()
    if not torch.compiler.is_compiling():
        # (no call into the extension while a graph is traced: fullgraph would fail on it)
        have = getattr(cpu, "library_step_gemm", None)
        if have is not None and tuple(have()) != plan.step_gemm:
            cpu.set_library_step_gemm(*plan.step_gemm)
    return cpu


def _plain_runner(kernel: Callable[[Plan], object]):
    """A runner of the step kernel that ``kernel(plan)`` gives (the CPU kernel, or the CUDA step
    kernel or the persistent one, graphed where the plan says), from the input projections, one
    direction after the other."""

    def run(plan, variant, highway, x, params, h0, c0, batch_sizes, rec_masks, reverse):
        ext = kernel(plan)
        results = []
        for d, (xd, (w_ih, w_hh, bias)) in enumerate(
                zip(_direction_inputs(x, reverse, len(params)), params)):
            proj, pbias = _projection(plan, xd, w_ih, bias)
            w_hh, hd, cd, mask = registry.autocast_like(proj, w_hh, h0[d], c0[d], rec_masks[d])
            results.append(autograd.plain_layer(ext, variant, highway, proj, w_hh, hd, cd,
                                                xd, w_ih, pbias, batch_sizes, mask))
        return _assemble(results, reverse)
    return run


def _run_cpu_pipelined(plan, variant, highway, x, params, h0, c0, batch_sizes, rec_masks,
                       reverse):
    """The pipelined CPU kernel (the projection inside), one direction after the other."""
    ext = _step_kernel(plan)
    results = [autograd.pipelined_layer(ext, variant, highway, xd, w_ih, bias, w_hh, h0[d], c0[d],
                                        batch_sizes, rec_masks[d], plan.chunk)
               for d, (xd, (w_ih, w_hh, bias)) in enumerate(
                   zip(_direction_inputs(x, reverse, len(params)), params))]
    return _assemble(results, reverse)


def _contiguous(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    return t.contiguous() if t is not None else None


def _run_cpu_plain_pair(plan, variant, highway, x, params, h0, c0, batch_sizes, rec_masks,
                        reverse):
    """The two directions at once, one per thread, on the CPU step kernel."""
    flat = []
    for d, (xd, (w_ih, w_hh, bias)) in enumerate(zip(_direction_inputs(x, reverse, len(params)),
                                                     params)):
        proj, pbias = _projection(plan, xd, w_ih, bias)
        flat += [proj.contiguous(), w_hh.contiguous(), h0[d].contiguous(), c0[d].contiguous(), xd,
                 w_ih, pbias, _contiguous(rec_masks[d])]
    return _assemble(autograd.plain_pair(_step_kernel(plan), variant, highway, batch_sizes,
                                         flat), reverse)


def _run_cpu_pipelined_pair(plan, variant, highway, x, params, h0, c0, batch_sizes, rec_masks,
                            reverse):
    """The two directions at once, one per thread, on the pipelined CPU kernel."""
    flat = []
    for d, (xd, (w_ih, w_hh, bias)) in enumerate(zip(_direction_inputs(x, reverse, len(params)),
                                                     params)):
        flat += [xd.contiguous(), w_ih.contiguous(), _contiguous(bias), w_hh.contiguous(),
                 h0[d].contiguous(), c0[d].contiguous(), _contiguous(rec_masks[d])]
    return _assemble(autograd.pipelined_pair(_step_kernel(plan), variant, highway,
                                             batch_sizes, plan.chunk, flat), reverse)


def _run_cpu_streamed(plan, variant, highway, x, params, h0, c0, batch_sizes, rec_masks,
                      reverse):
    """A no-gradient forward on the plain CPU step kernel with the input projections computed
    ``plan.stream`` steps at a time (:func:`rnn_ablations.kernels.projection.streamed_forward`;
    the directions together, one per thread, where ``plan.concurrent``); a bfloat16 call
    (``plan.bf16_on_f32``) widened a chunk at a time, its output in bfloat16."""
    n, H = len(params), params[0][1].shape[1]
    out = x.new_empty(x.shape[0], x.shape[1], n * H)
    groups = [list(range(n))] if plan.concurrent else [[d] for d in range(n)]
    h_n, c_n = [None] * n, [None] * n
    ext = _step_kernel(plan)
    dtype = torch.float32 if plan.bf16_on_f32 else x.dtype
    for g in groups:
        done = streamed_forward(
            ext, variant.kernel_spec, highway, x, reverse, g, [params[d][0] for d in g],
            [projection_bias(params[d][2], params[d][0].shape[0]) for d in g],
            [params[d][1] for d in g], [h0[d] for d in g], [c0[d] for d in g], batch_sizes,
            [rec_masks[d] for d in g], plan.onednn, out, plan.stream, dtype=dtype,
            bf16_gemm=plan.bf16_gemm,
            w_hh_dtype=torch.bfloat16 if plan.bf16_step_gemm else None)
        for d, (h, c) in zip(g, done):
            h_n[d], c_n[d] = h.to(x.dtype), c.to(x.dtype)
    return out, h_n, c_n


def _widened(runner):
    """``runner`` on float32 copies of a bfloat16 call's input, parameters and states
    (``plan.bf16_on_f32``; autocast off inside: the float32 kernels), its results narrowed to
    bfloat16 (autograd differentiates the casts, so gradients reach bfloat16 parameters in
    bfloat16); with ``plan.bf16_step_gemm`` the recurrent weight ``w_hh`` goes to the kernel in
    bfloat16 (a bfloat16 parameter as it is), which runs the step GEMM in bfloat16; any other
    call as it is."""

    def run(plan, variant, highway, x, params, h0, c0, batch_sizes, rec_masks, reverse):
        if not plan.bf16_on_f32:
            return runner(plan, variant, highway, x, params, h0, c0, batch_sizes, rec_masks,
                          reverse)
        f = (lambda t: None if t is None else t.float())
        bf = torch.bfloat16
        rec = (lambda t: None if t is None else t.to(bf)) if plan.bf16_step_gemm else f
        with torch.autocast("cpu", enabled=False):
            out, hs, cs = runner(plan, variant, highway, x.float(),
                                 [tuple(rec(t) if i == 1 else f(t) for i, t in enumerate(p))
                                  for p in params], h0.float(),
                                 c0.float(), batch_sizes, [f(m) for m in rec_masks], reverse)
        return out.to(bf), [h.to(bf) for h in hs], [c.to(bf) for c in cs]
    run.__doc__ = runner.__doc__
    return run


# --------------------------------------------------------------------------- scan cells
def _scan_bias(params) -> Optional[torch.Tensor]:
    """The bias of every direction's whole projection, side by side (``None`` without one)."""
    if params[0][2] is None:
        return None
    width = params[0][0].shape[0]
    if len(params) == 1:
        return projection_bias(params[0][2], width)
    return torch.cat([projection_bias(b, width) for _, _, b in params])


def _scan_projection(plan, x, params, h0, c0):
    """The projections of every direction in one GEMM (with the bias), and the states in its
    dtype under autocast."""
    weights = [w for w, _, _ in params]
    bias = _scan_bias(params)
    weight = torch.cat(weights) if len(weights) > 1 else weights[0]
    proj = input_projection(x, weight, bias, onednn=plan.onednn, bf16_gemm=plan.bf16_gemm)
    h0, c0 = registry.autocast_like(proj, h0, c0)  # the scan in the autocast dtype
    return proj, h0, c0


def _unbind(out, h_n, c_n):
    return out, list(h_n.unbind(0)), list(c_n.unbind(0))


def _run_generic_scan(plan, variant, highway, x, params, h0, c0, batch_sizes, rec_masks,
                      reverse):
    """The generic path of a cell that reads no h_{t-1}: one projection GEMM, then the torch-ops
    loop of every direction (:func:`rnn_ablations.functional.generic_directions`)."""
    proj, h0, c0 = _scan_projection(plan, x, params, h0, c0)
    return _unbind(*generic_directions(variant, highway, proj, h0, c0, batch_sizes))


def _scan_kernel(plan: Plan):
    return registry.cpu_kernel() if plan.path == "cpu" else registry.cuda_kernel()


def _run_scan(plan, variant, highway, x, params, h0, c0, batch_sizes, rec_masks, reverse):
    """The scan kernel after the projection (an autograd node of its own: autocast)."""
    proj, h0, c0 = _scan_projection(plan, x, params, h0, c0)
    return _unbind(*scan.scan_layer(_scan_kernel(plan), variant, highway, proj, h0, c0,
                                    batch_sizes))


def _run_fused_scan(plan, variant, highway, x, params, h0, c0, batch_sizes, rec_masks,
                    reverse):
    """The projection, the scan (the bias inside) and the backward in one node."""
    return _unbind(*scan.fused_scan_layer(_scan_kernel(plan), variant, highway, x,
                                          [w for w, _, _ in params], _scan_bias(params), h0, c0,
                                          batch_sizes, plan.onednn))


def _run_scan_streamed(plan, variant, highway, x, params, h0, c0, batch_sizes, rec_masks,
                       reverse):
    """A no-gradient forward of the scan kernel with the input projections computed
    ``plan.stream`` steps at a time, direction by direction
    (:func:`rnn_ablations.kernels.projection.streamed_scan_forward`); a bfloat16 call widened a
    chunk at a time, its output in bfloat16."""
    n, H = len(params), h0.shape[-1]
    if n > 1 and not isinstance(reverse, Reversal):
        lengths = (batch_sizes.unsqueeze(0) > torch.arange(x.shape[1]).unsqueeze(1)).sum(1)
        full = bool((lengths == x.shape[0]).all())
        from .functional import reversal_index
        reverse = Reversal(None if full else reversal_index(lengths, x.shape[0]).to(x.device))
    out = x.new_empty(x.shape[0], x.shape[1], n * H)
    width = params[0][0].shape[0]
    h_n, c_n = streamed_scan_forward(
        _scan_kernel(plan), variant.kernel_spec, highway, x, reverse, [p[0] for p in params],
        [projection_bias(p[2], width) for p in params], h0, c0, batch_sizes, plan.onednn, out,
        plan.stream, dtype=torch.float32 if plan.bf16_on_f32 else x.dtype,
        bf16_gemm=plan.bf16_gemm)
    return _unbind(out, h_n.to(x.dtype), c_n.to(x.dtype))


#: The runners, one per name the plan may give (:data:`rnn_ablations.plan.RUNNERS`).
RUNNERS: Dict[str, Callable] = {
    "generic": _run_generic,
    "generic_scan": _run_generic_scan,
    "generic_projected": _run_generic,
    "cpu_plain": _widened(_plain_runner(_step_kernel)),
    "cpu_pipelined": _widened(_run_cpu_pipelined),
    "cpu_plain_pair": _widened(_run_cpu_plain_pair),
    "cpu_pipelined_pair": _widened(_run_cpu_pipelined_pair),
    "cpu_streamed": _run_cpu_streamed,
    "cuda": _plain_runner(cuda_recurrence.step_kernel),
    "scan": _widened(_run_scan),
    "fused_scan": _widened(_run_fused_scan),
    "scan_streamed": _run_scan_streamed,
}

_observers = threading.local()


class observe:
    """Within the block, every :func:`run_layer_call` of this thread calls ``fn(plan, variant,
    highway, x, params, h0, c0)`` (after the plan is made) and returns what ``fn`` returns
    instead of running the plan's runner: :func:`rnn_ablations.explain` reads the plans of a
    forward this way without computing it."""

    def __init__(self, fn):
        self.fn = fn

    def __enter__(self):
        self.saved = getattr(_observers, "fn", None)
        _observers.fn = self.fn
        return self

    def __exit__(self, *exc):
        _observers.fn = self.saved
        return False


def run_layer_call(variant: Variant, highway: bool, x: torch.Tensor, params, h0: torch.Tensor,
                   c0: torch.Tensor, batch_sizes: torch.Tensor,
                   rec_masks: Optional[Sequence[Optional[torch.Tensor]]] = None,
                   reverse: Optional[Callable[[torch.Tensor], torch.Tensor]] = None):
    """One layer (every direction) as the run plan says; see the module docstring.  Returns
    ``(output (T, B, D·H), [h_n (B, H) per direction], [c_n (B, H) per direction])``."""
    rec_masks = list(rec_masks) if rec_masks is not None else [None] * len(params)
    if reverse is None and variant.reads_hidden and len(params) > 1:
        raise ValueError("run_layer_call: the second direction of a cell that reads h_{t-1} "
                         "runs on the input reversed within each row's length: pass reverse")
    if not variant.has_memory:
        # the cell never reads c_0: no gradient for it (None, as the generic path gives), not
        # the kernels' zeros, which have no graph for a second derivative
        c0 = c0.detach()
    plan = decide(x, params, h0, c0, scan_layout=scan.scan_applies(variant)
                  if not variant.reads_hidden else False, spec=variant.kernel_spec,
                  highway=highway, variant=variant, reverse=reverse)
    watch = getattr(_observers, "fn", None)
    if watch is not None:
        return watch(plan, variant, highway, x, params, h0, c0)
    return RUNNERS[plan.runner](plan, variant, highway, x, params, h0, c0, batch_sizes,
                                rec_masks, reverse)


# --------------------------------------------------------------------------- the pieces of one
def run_layer(variant: Variant, highway: bool, x: torch.Tensor, w_ih: torch.Tensor,
              bias: Optional[torch.Tensor], w_hh: torch.Tensor, h0: torch.Tensor,
              c0: torch.Tensor, batch_sizes: torch.Tensor,
              rec_mask: Optional[torch.Tensor] = None):
    """One direction of a cell that reads h_{t-1}: ``x`` (T, B, D) its input, ``w_ih``
    ((R+X)·H, D), ``bias`` (R·H) or ``None``, ``w_hh`` (R·H, H), ``h0`` / ``c0`` (B, H).
    Returns ``(output (T, B, H), h_n (B, H), c_n (B, H))``."""
    out, h_n, c_n = run_layer_call(variant, highway, x, [(w_ih, w_hh, bias)], h0.unsqueeze(0),
                                   c0.unsqueeze(0), batch_sizes, [rec_mask])
    return out, h_n[0], c_n[0]


def run_scan_layer(variant: Variant, highway: bool, x: torch.Tensor,
                   weights: Sequence[torch.Tensor], biases: Sequence[Optional[torch.Tensor]],
                   h0: torch.Tensor, c0: torch.Tensor, batch_sizes: torch.Tensor):
    """One layer (``len(weights)`` = 1 or 2 directions) of a cell that reads no h_{t-1}:
    ``weights[d]`` (G·H, d_in), ``biases[d]`` the biased blocks' bias or ``None``, ``h0`` /
    ``c0`` (D, B, H).  Returns ``(output (T, B, D·H), h_n (D, B, H), c_n (D, B, H))``."""
    if variant.reads_hidden:
        raise ValueError(f"variant {variant.name!r} reads h_{{t-1}}: it runs through "
                         "rnn_ablations.dispatch.run_layer, not the scan")
    dirs = len(weights)
    if dirs not in (1, 2) or len(biases) != dirs or h0.shape[0] != dirs or c0.shape[0] != dirs:
        raise ValueError(f"run_scan_layer takes 1 or 2 directions, with one weight, bias, h0 and "
                         f"c0 each; got {dirs} weights, {len(biases)} biases, h0 {tuple(h0.shape)}")
    out, h_n, c_n = run_layer_call(variant, highway, x, [(w, None, b) for w, b in
                                                         zip(weights, biases)],
                                   h0, c0, batch_sizes)
    return out, torch.stack(h_n), torch.stack(c_n)


def layer_plan(xs, params, needs_grad: Optional[bool] = None) -> Plan:
    """The plan of a step cell's directions ``xs`` (each (T, B, D)) with ``params[d] = (w_ih,
    w_hh, bias)`` under this thread's settings, from zero states (:func:`rnn_ablations.plan.
    decide`); ``needs_grad`` defaults to grad mode and whether a tensor requires a gradient."""
    x, (_, w_hh, _) = xs[0], params[0]
    states = x.new_zeros(len(params), x.shape[1], w_hh.shape[1])
    return decide(x, params, states, states, needs_grad=needs_grad)
