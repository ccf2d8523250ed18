"""The input projection of all time steps at once (``F.linear`` over T·B rows), on the faster
GEMM library: oneDNN for large float32 CPU weights, where it beat MKL on AMD CPUs (see
``benchmarks/results/schedule_policy.md``), else ``F.linear``.  Which one is the run plan's
decision (:func:`rnn_ablations.plan.onednn_applies`, ``Plan.onednn``), given to
:func:`input_projection`.  The weight gradient stays on MKL (no faster on oneDNN, which would
need two transposed copies)."""
from __future__ import annotations

from typing import Optional

import torch

from . import backend

__all__ = ["input_projection"]


@torch.library.custom_op("rnn_ablations::onednn_linear", mutates_args=(), device_types="cpu")
def onednn_linear(x: torch.Tensor, weight: torch.Tensor,
                  bias: Optional[torch.Tensor]) -> torch.Tensor:
    """``x · weightᵀ + bias`` on oneDNN (x (..., K), weight (M, K) in any layout, bias (M) or
    None → (..., M)): an operator of its own, so that a compiled graph calls it as it is
    (inductor's lowering of the oneDNN op expects a weight it packed itself)."""
    y = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, x.shape[-1]).contiguous(), weight,
                                           bias, "none", [], "")
    return y.view(*x.shape[:-1], weight.shape[0])


@onednn_linear.register_fake
def _(x, weight, bias):
    return x.new_empty(*x.shape[:-1], weight.shape[0])


def _dnnl_linear(x2d: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    if torch.compiler.is_compiling():
        return onednn_linear(x2d, weight, bias)
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
        b = bias.contiguous() if bias is not None else None
        if torch.compiler.is_compiling():
            # no view of a tensor made here: the kernel then writes into the projections in
            # place, which autograd forbids on a custom Function's view output
            return onednn_linear(x, w, b)
        y = _dnnl_linear(x2d, w, b)
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
            kernel = backend.cpu_kernel()
            dw = kernel.weight_grad(g2d, x2d) if kernel is not None else g2d.t().mm(x2d)
        if ctx.has_bias and need[2]:
            db = g2d.sum(0)
        return dx, dw, db


def input_projection(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                     onednn: bool) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for all time steps at once, on oneDNN where ``onednn``
    (``Plan.onednn``), else ``F.linear``."""
    if onednn:
        return _OneDnnLinear.apply(x, weight, bias)
    return torch.nn.functional.linear(x, weight, bias)
