"""How a forward runs, in words: :func:`explain` gives, for every layer call of a forward of a
module (an :class:`~rnn_ablations.AblatedRNN`, or a model holding some), the run plan that
call gets (:func:`rnn_ablations.plan.decide`), without computing the layers.

It runs the module's forward with every layer call answered by a stand-in: the call is
described and planned as it would be (the same settings, grad mode, autocast, threads and
compiled kernels; the CUDA kernels' first-use check runs where a family has not been checked
yet, as the first real call would), then the stand-in returns zero tensors of the shapes and
dtype the runner would return, so the next layer is planned on what it would see.  What the
plan says is what the runner named by ``Plan.runner`` does (``tests/test_plan_truth.py``
compares them)::

    >>> import torch, rnn_ablations as ra
    >>> m = ra.AblatedRNN("lstm", 64, 64)
    >>> with torch.no_grad():
    ...     print(ra.explain(m, torch.randn(1000, 1000, 64)))
    layer call 1: lstm, 1 direction, T=1000 B=1000 d_in=64 H=64, float32 on cpu, no gradient, ...
      path: cpu (the compiled CPU kernel); runner cpu_streamed
      ...
      streaming: 16 steps per chunk (input projections a chunk at a time)

``rnn-ablations explain`` prints the same for a shape (:mod:`rnn_ablations.commands.explain`).
"""
from __future__ import annotations

import dataclasses
from typing import List, Optional

import torch

from . import dispatch
from .plan import LayerCall, Plan, describe

__all__ = ["explain", "Explanation", "LayerCallPlan", "plan_in_words"]


@dataclasses.dataclass(frozen=True)
class LayerCallPlan:
    """One layer call of a forward: its variant, what was described (``call``) and the plan it
    got (``plan``)."""

    index: int
    variant: str
    highway: bool
    call: LayerCall
    input_size: int
    plan: Plan

    def lines(self) -> List[str]:
        return plan_in_words(self.plan, self.call, self.variant, self.highway, self.index,
                             self.input_size)

    def __str__(self) -> str:
        return "\n".join(self.lines())


class Explanation(list):
    """The :class:`LayerCallPlan` of every layer call of one forward, in call order; ``str()``
    gives them in words."""

    def __str__(self) -> str:
        if not self:
            return "no layer call (the forward ran no rnn_ablations layer)"
        return "\n".join(str(p) for p in self)

    @property
    def plans(self) -> List[Plan]:
        return [p.plan for p in self]


def _dtype_name(dtype: Optional[torch.dtype]) -> str:
    return str(dtype).replace("torch.", "") if dtype is not None else "none"


def plan_in_words(plan: Plan, call: LayerCall, variant: str = "", highway: bool = False,
                  index: int = 1, input_size: Optional[int] = None) -> List[str]:
    """The lines :func:`explain` prints for one layer call."""
    dirs = f"{call.directions} direction" + ("s" if call.directions != 1 else "")
    grad = "gradient wanted" if call.needs_grad else "no gradient"
    extra = []
    if call.autocast_dtype is not None:
        extra.append(f"autocast {_dtype_name(call.autocast_dtype)}")
    if call.compiling:
        extra.append("traced by torch.compile / torch.export")
    d_in = f" d_in={input_size}" if input_size is not None else ""
    head = (f"layer call {index}: {variant}{' + highway' if highway else ''}, {dirs}, "
            f"T={call.steps} B={call.batch}{d_in} H={call.hidden}, {_dtype_name(call.dtype)} on "
            f"{call.device}, {grad}, {call.threads} thread(s)"
            + ("".join(", " + e for e in extra)))
    out = [head, f"  path: {plan.path} ({plan.reason}); runner {plan.runner}"]
    if plan.isa:
        out.append(f"  CPU vector path: {plan.isa}")
    if plan.schedule:
        sched = plan.schedule
        if plan.path == "cpu" and call.rec_blocks:
            sched += (", directions together (one per thread)" if plan.concurrent
                      else ", directions one after the other" if call.directions > 1 else "")
            if plan.schedule == "pipelined":
                sched += f", chunk {plan.chunk or 'automatic'}"
        out.append(f"  schedule: {sched}")
    if plan.bf16_on_f32:
        has = "has" if plan.bf16_instructions else "has no"
        out.append("  dtype path: bfloat16 on the float32 kernels (inputs widened to float32, "
                   f"results in bfloat16); this CPU {has} bfloat16 GEMM instructions")
    else:
        out.append(f"  dtype path: {_dtype_name(call.dtype)}")
    if plan.runner in ("cpu_pipelined", "cpu_pipelined_pair"):
        proj = "inside the pipelined kernel (chunk by chunk, beside the recurrence)"
    elif plan.runner == "fused_scan":
        proj = "inside the scan's one node" + (" (oneDNN)" if plan.onednn else "")
    elif plan.bf16_gemm:
        proj = "bfloat16 GEMM (F.linear in bfloat16, float32 result)"
    elif plan.onednn:
        proj = "oneDNN"
    else:
        proj = "F.linear"
    if plan.onednn_min_weight and call.dtype == torch.float32 and not plan.bf16_on_f32 \
            and call.autocast_dtype is None and "pipelined" not in plan.runner:
        limit = plan.onednn_min_weight
        proj += (f" (weight {call.proj_weight:,} {'>=' if call.proj_weight >= limit else '<'} "
                 f"the oneDNN threshold {limit:,} for this CPU)")
    out.append(f"  input projection: {proj}")
    if plan.path == "cpu" and call.rec_blocks:
        train, inference = plan.step_gemm
        if plan.bf16_step_gemm:
            out.append("  step GEMM: bfloat16 (w_hh and h_{t-1} in bfloat16, float32 "
                       "accumulation into the float32 gates)")
        elif (train, inference) == (-1, -1):
            out.append("  step GEMM: the kernel's own packed GEMM")
        else:
            said = lambda v: "never" if v < 0 else f"from {v:,} multiply-adds per step"
            out.append(f"  step GEMM: MKL's packed GEMM {said(train)} (training), "
                       f"{said(inference)} (no gradient); the kernel's own below")
    out.append("  streaming: " + (f"{plan.stream} steps per chunk (input projections a chunk "
                                  "at a time)" if plan.stream else "off (all steps projected "
                                                                   "at once)"
                                  if plan.path == "cpu" else "off"))
    if plan.path == "cuda":
        cuda = f"  CUDA: recurrence {plan.recurrence or 'scan'}, graphs {'on' if plan.graphs else 'off'}"
        if plan.recurrence == "persistent":
            blocks, tile, backward = plan.persistent
            cuda += (f", persistent blocks {blocks or 'automatic'}, batch tile "
                     f"{tile or 'automatic'}, backward {'persistent' if backward else 'steps'}")
        out.append(cuda)
        if plan.check == "passed":
            out.append("  first-use check: passed: " + "; ".join(plan.cuda_checked))
        elif plan.check == "off":
            out.append("  first-use check: off (switched off, or a graph is traced or captured)")
    elif "failed their check" in plan.reason:
        out.append("  first-use check: failed (see path)")
    if plan.warning is not None:
        out.append(f"  warning: {plan.warning[1]}")
    return out


def _result_dtype(plan: Plan, call: LayerCall) -> torch.dtype:
    """The dtype the runner returns: bfloat16 for the bfloat16 path, the projection's under
    autocast (float32 inputs), else the input's."""
    if plan.bf16_on_f32:
        return torch.bfloat16
    if call.autocast_dtype is not None and call.dtype == torch.float32:
        return call.autocast_dtype
    return call.dtype


def explain(module: torch.nn.Module, *inputs, **kwargs) -> Explanation:
    """The plan of every layer call of ``module(*inputs, **kwargs)`` (see the module
    docstring), under the caller's settings, grad mode and autocast, without computing the
    layers.  Returns an :class:`Explanation`: a list of :class:`LayerCallPlan`; ``str()`` of it
    is the plan in words (path and reason, runner, vector path, schedule, directions, dtype
    path, input projection, step GEMM, streaming, CUDA recurrence / graphs / persistent and
    which CUDA families passed their first-use check)."""
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"explain takes a module (an AblatedRNN or a model holding one) and its "
                        f"inputs, got {type(module).__name__}")
    got = Explanation()

    def stand_in(plan, variant, highway, x, params, h0, c0):
        call = describe(x, params, h0, c0)
        got.append(LayerCallPlan(len(got) + 1, variant.name, bool(highway), call, x.shape[-1],
                                 plan))
        dtype = _result_dtype(plan, call)
        zero = torch.zeros((), dtype=dtype, device=x.device)
        n = len(params)
        out = zero.expand(x.shape[0], x.shape[1], n * h0.shape[-1])
        return (out, [zero.expand(h0.shape[1:]) for _ in range(n)],
                [zero.expand(c0.shape[1:]) for _ in range(n)])

    with dispatch.observe(stand_in):
        module(*inputs, **kwargs)
    return got
