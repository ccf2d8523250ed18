"""The one execution of a layer call: :func:`run_layer_call` asks the run plan
(:func:`rnn_ablations.plan.decide`) once and calls the runner it names from :data:`RUNNERS`,
a table from runner name to function.  Nothing else here decides how a layer runs: each runner
does one thing, with the parameters the plan gives it (schedule chunk, oneDNN projection, CUDA
recurrence and graphs).

A layer call (:func:`run_layer_call`): ``x`` (T, B, D_in) the layer input in time order,
``params[d] = (w_ih, w_hh, bias)`` per direction (``w_hh`` is ``None`` for a cell that reads no
h_{t-1}), ``h0`` / ``c0`` (directions, B, H), ``batch_sizes`` (a CPU int64 tensor of length T:
rows sorted by decreasing length, ``batch_sizes[t]`` active at step t), ``rec_masks`` one
recurrent-dropout mask (or ``None``) per direction, ``reverse`` the function that reverses a
time-major tensor within each row's length (direction 1 of a cell that reads h_{t-1} runs on the
reversed input, and its output is reversed back; a :class:`rnn_ablations.functional.Reversal`,
as the module passes, also lets a large no-gradient call stream the reversal).  It returns
``(output (T, B, D·H), [h_n per direction], [c_n per direction])``.

:func:`run_layer` (one direction of a step cell) and :func:`run_scan_layer` (a cell that reads no
h_{t-1}) are the same call for those who hold the pieces of one.
"""
from __future__ import annotations

from typing import Callable, Dict, Optional, Sequence

import torch

from .kernels import autograd, registry, scan
from .kernels.cuda import recurrence as cuda_recurrence
from .functional import Reversal, projection_bias
from . import plan as _plan
from .plan import Plan, decide
from .kernels.projection import (bf16_gemm_applies, bf16_projection, input_projection,
                                 stream_steps, streamed_forward)
from .kernels.cuda import selfcheck as cuda_selfcheck
from .variants import Variant

__all__ = ["RUNNERS", "run_layer_call", "run_layer", "run_scan_layer", "layer_plan"]


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
    return input_projection(x, w_ih, pbias, onednn=plan.onednn), pbias


def _run_generic(plan, variant, highway, x, params, h0, c0, batch_sizes, rec_masks, reverse):
    """The generic path (torch ops, differentiated by autograd), one direction after the other."""
    results = []
    for d, (xd, (w_ih, w_hh, bias)) in enumerate(zip(_direction_inputs(x, reverse, len(params)),
                                                     params)):
        proj, _ = _projection(plan, xd, w_ih, bias)
        w_hh, hd, cd, mask = registry.autocast_like(proj, w_hh, h0[d], c0[d], rec_masks[d])
        results.append(autograd._generic_from_projection(variant, highway, proj, w_hh, hd,
                                                                cd, batch_sizes, mask))
    return _assemble(results, reverse)


def _plain_runner(kernel: Callable[[Plan], object]):
    """A runner of the step kernel that ``kernel(plan)`` gives (the CPU kernel, or the CUDA step
    kernel or the persistent one, graphed where the plan says), from the input projections, one
    direction after the other."""

    def run(plan, variant, highway, x, params, h0, c0, batch_sizes, rec_masks, reverse):
        results = []
        for d, (xd, (w_ih, w_hh, bias)) in enumerate(
                zip(_direction_inputs(x, reverse, len(params)), params)):
            proj, pbias = _projection(plan, xd, w_ih, bias)
            w_hh, hd, cd, mask = registry.autocast_like(proj, w_hh, h0[d], c0[d], rec_masks[d])
            ext = kernel(plan)
            results.append(autograd.plain_layer(ext, variant, highway, proj, w_hh, hd, cd,
                                                       xd, w_ih, pbias, batch_sizes, mask))
        return _assemble(results, reverse)
    return run


def _cpu_kernel(plan):
    return registry.cpu_kernel()


def _run_cpu_pipelined(plan, variant, highway, x, params, h0, c0, batch_sizes, rec_masks,
                       reverse):
    """The pipelined CPU kernel (the projection inside), one direction after the other."""
    results = [autograd.pipelined_layer(registry.cpu_kernel(), variant, highway, xd, w_ih, bias,
                                        w_hh, h0[d], c0[d], batch_sizes, rec_masks[d], plan.chunk)
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
    return _assemble(autograd.plain_pair(registry.cpu_kernel(), variant, highway, batch_sizes,
                                         flat), reverse)


def _run_cpu_pipelined_pair(plan, variant, highway, x, params, h0, c0, batch_sizes, rec_masks,
                            reverse):
    """The two directions at once, one per thread, on the pipelined CPU kernel."""
    flat = []
    for d, (xd, (w_ih, w_hh, bias)) in enumerate(zip(_direction_inputs(x, reverse, len(params)),
                                                     params)):
        flat += [xd.contiguous(), w_ih.contiguous(), _contiguous(bias), w_hh.contiguous(),
                 h0[d].contiguous(), c0[d].contiguous(), _contiguous(rec_masks[d])]
    return _assemble(autograd.pipelined_pair(registry.cpu_kernel(), variant, highway,
                                             batch_sizes, plan.chunk, flat), reverse)


def _stream_chunk(x, params, h0, c0, rec_masks) -> int:
    """Steps per chunk when a plain CPU call streams its input projections
    (:func:`rnn_ablations.kernels.projection.streamed_forward`), else 0: a no-gradient call in
    eager mode, outside autocast, whose projections of all steps reach
    ``plan.POLICY.stream_min_bytes`` per direction."""
    if torch.compiler.is_compiling():
        return 0  # a traced graph (torch.compile / torch.export): no guard on the sizes
    w_ih = params[0][0]
    policy = _plan.POLICY
    if x.shape[0] * x.shape[1] * w_ih.shape[0] * x.element_size() < policy.stream_min_bytes:
        return 0  # the common case, decided by the size alone
    if (torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in
                                        [x, h0, c0, *[w for p in params for w in p]])):
        return 0
    if (registry.autocast_dtype("cpu") is not None
            or x.dtype not in (torch.float32, torch.float64) or type(x) is not torch.Tensor):
        return 0
    return stream_steps(x.shape[0], x.shape[1], w_ih.shape[0], x.element_size(),
                        policy.stream_min_bytes, policy.stream_chunk_bytes)


def _streaming(runner):
    """A CPU step-kernel runner that streams the input projections of a large no-gradient call
    on the plain kernel (:func:`_stream_chunk`) and otherwise runs ``runner`` (the pipelined
    schedule's forward, too, holds per-step tensors of all steps)."""

    def run(plan, variant, highway, x, params, h0, c0, batch_sizes, rec_masks, reverse):
        chunk = _stream_chunk(x, params, h0, c0, rec_masks)
        if (not chunk or len(params) > 2
                or (len(params) == 2 and not isinstance(reverse, Reversal))):
            # (a reverse function of a caller's own cannot reverse a few steps at a time: the
            # module passes a functional.Reversal)
            return runner(plan, variant, highway, x, params, h0, c0, batch_sizes, rec_masks,
                          reverse)
        n, H = len(params), params[0][1].shape[1]
        out = x.new_empty(x.shape[0], x.shape[1], n * H)
        # the directions together (one per thread) where the plan runs them so
        groups = [list(range(n))] if plan.concurrent else [[d] for d in range(n)]
        h_n, c_n = [None] * n, [None] * n
        for g in groups:
            done = streamed_forward(
                registry.cpu_kernel(), variant.kernel_spec, highway, x, reverse, g,
                [params[d][0] for d in g],
                [projection_bias(params[d][2], params[d][0].shape[0]) for d in g],
                [params[d][1] for d in g], [h0[d] for d in g], [c0[d] for d in g],
                batch_sizes, [rec_masks[d] for d in g], plan.onednn, out, chunk)
            for d, (h, c) in zip(g, done):
                h_n[d], c_n[d] = h, c
        return out, h_n, c_n
    run.__doc__ = (runner.__doc__ or "") + " Streams the projections of a large no-gradient call."
    return run


_step_gemm_set = [None]  # the (policy, isa) whose library thresholds the kernel holds


def _sync_step_gemm(isa) -> None:
    """Give the CPU kernel the step-GEMM library thresholds of ``plan.POLICY`` for the vector
    path ``isa`` (:func:`rnn_ablations.plan.library_step_thresholds`), when they changed."""
    if torch.compiler.is_compiling():
        # no call into the extension while a graph is traced (fullgraph would fail on it): a
        # compiled graph's calls run with the thresholds of the last eager call (at first the
        # kernel's own, never, as the default POLICY lists no path)
        return
    key, cpu = _step_gemm_set[0], registry.cpu_kernel()
    if (key is not None and key[0] is _plan.POLICY and key[1] == isa
            and key[2] is cpu) or cpu is None:
        return
    key = (_plan.POLICY, isa, cpu)
    setter = getattr(cpu, "set_library_step_gemm", None)
    if setter is not None:
        setter(*_plan.library_step_thresholds(_plan.POLICY, isa))
    _step_gemm_set[0] = key


# --------------------------------------------------------------------------- bfloat16 on the CPU
def _cpu_bfloat16(x, params) -> bool:
    """A CPU layer call in bfloat16 (bfloat16 input or parameters, or float32 ones under
    ``torch.autocast("cpu", torch.bfloat16)``) that the CPU kernels run
    (:func:`_run_cpu_bfloat16`): not with the generic backend, and where the kernel is built
    (otherwise the plan's fallback or error applies)."""
    if not x.is_cpu or torch.compiler.is_compiling():
        return False  # (a traced graph keeps the plan of its dtype: no context variable there)
    if x.dtype is not torch.bfloat16 and (
            x.dtype is not torch.float32 or (params[0][0].dtype is not torch.bfloat16
                                             and registry.autocast_dtype("cpu") is None)):
        return False  # the common float32 / float64 call, without looking further
    dtypes = {x.dtype} | {t.dtype for p in params for t in p if t is not None}
    auto = registry.autocast_dtype("cpu")
    in_bf16 = (torch.bfloat16 in dtypes and dtypes <= {torch.bfloat16, torch.float32}) or (
        auto == torch.bfloat16 and dtypes == {torch.float32})
    if not in_bf16:
        return False
    from .plan import call_settings
    return call_settings().backend != "generic" and registry.kernels().cpu


def _run_cpu_bfloat16(variant, highway, x, params, h0, c0, batch_sizes, rec_masks, reverse):
    """The bfloat16 CPU path: the layer on the float32 kernels (the plan of the float32 call:
    schedule, streaming, scan), with bfloat16 inputs and parameters widened (exactly) to
    float32, states and the element-wise pass in float32, the input projection in bfloat16
    through the GEMM library where ``plan.POLICY.bf16_gemm`` says
    (:func:`rnn_ablations.kernels.projection.bf16_gemm_applies`), and the results in bfloat16.
    Autograd differentiates the casts, so gradients reach bfloat16 parameters in bfloat16."""
    f = (lambda t: None if t is None else t.float())
    bf = torch.bfloat16
    with torch.autocast("cpu", enabled=False), bf16_projection(
            bf16_gemm_applies(_plan.POLICY.bf16_gemm)):
        out, hs, cs = run_layer_call(
            variant, highway, x.float(), [tuple(f(t) for t in p) for p in params], h0.float(),
            c0.float(), batch_sizes, [f(m) for m in rec_masks], reverse)
    return out.to(bf), [h.to(bf) for h in hs], [c.to(bf) for c in cs]


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
    proj = input_projection(x, weight, bias, onednn=plan.onednn)
    h0, c0 = registry.autocast_like(proj, h0, c0)  # the scan in the autocast dtype
    return proj, h0, c0


def _unbind(out, h_n, c_n):
    return out, list(h_n.unbind(0)), list(c_n.unbind(0))


def _run_generic_scan(plan, variant, highway, x, params, h0, c0, batch_sizes, rec_masks,
                      reverse):
    """The generic path of a cell that reads no h_{t-1}: one projection GEMM, then the torch-ops
    loop of every direction (direction 1 runs each row backwards within its length)."""
    proj, h0, c0 = _scan_projection(plan, x, params, h0, c0)
    return _unbind(*scan._generic_directions(variant, highway, proj, h0, c0, batch_sizes))


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


#: The runners, one per name the plan may give (:data:`rnn_ablations.plan.RUNNERS`).
RUNNERS: Dict[str, Callable] = {
    "generic": _run_generic,
    "generic_scan": _run_generic_scan,
    "cpu_plain": _streaming(_plain_runner(_cpu_kernel)),
    "cpu_pipelined": _streaming(_run_cpu_pipelined),
    "cpu_plain_pair": _streaming(_run_cpu_plain_pair),
    "cpu_pipelined_pair": _streaming(_run_cpu_pipelined_pair),
    "cuda": _plain_runner(cuda_recurrence.step_kernel),
    "scan": _run_scan,
    "fused_scan": _run_fused_scan,
}


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
    if _cpu_bfloat16(x, params):
        return _run_cpu_bfloat16(variant, highway, x, params, h0, c0, batch_sizes, rec_masks,
                                 reverse)
    plan = decide(x, params, h0, c0, scan_layout=scan.scan_applies(variant)
                  if not variant.reads_hidden else False, spec=variant.kernel_spec,
                  highway=highway)
    if plan.path == "cpu":
        _sync_step_gemm(plan.isa)
    elif plan.path == "cuda":
        # the CUDA kernels' first-use check: a family that fails it is replaced by the
        # generic path (kernels/cuda/selfcheck.py)
        plan = cuda_selfcheck.admit(plan, variant, highway, x, registry.cuda_kernel)
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
