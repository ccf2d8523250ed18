"""The input projection of all time steps at once (``F.linear`` over T·B rows), on the faster
GEMM library: oneDNN for large float32 CPU weights, where it beat MKL on AMD CPUs (see
``benchmarks/results/schedule_policy.md``), else ``F.linear``.  Which one is the run plan's
decision (:func:`rnn_ablations.plan.onednn_applies`, ``Plan.onednn``), given to
:func:`input_projection`.  The weight gradient stays on MKL (no faster on oneDNN, which would
need two transposed copies)."""
from __future__ import annotations

from typing import List, Optional

import torch

from . import registry

__all__ = ["input_projection", "streamed_forward", "streamed_scan_forward"]


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
            kernel = registry.cpu_kernel()
            dw = kernel.weight_grad(g2d, x2d) if kernel is not None else g2d.t().mm(x2d)
        if ctx.has_bias and need[2]:
            db = g2d.sum(0)
        return dx, dw, db


def input_projection(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                     onednn: bool, bf16_gemm: bool = False) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for all time steps at once, on oneDNN where ``onednn``
    (``Plan.onednn``), else ``F.linear``.  With ``bf16_gemm`` (``Plan.bf16_gemm``: a bfloat16
    CPU call on the float32 kernels) the GEMM runs in bfloat16 (operands rounded to bfloat16,
    accumulation in float32 inside the GEMM library) and the result comes back in float32.

    The steps and rows are one dimension of the GEMM: ``x`` (T, B, K) is usually a view of a
    batch-first input, and ``F.linear`` on such a view, with a weight that needs no gradient (a
    bfloat16 or float32 copy, frozen parameters), runs as a batched product of T small GEMMs
    against the expanded weight (``torch.matmul`` folds only contiguous batch dimensions or a
    weight that requires a gradient); one (T·B, K) GEMM instead was 8-36 % faster in float32
    (AMD EPYC, AVX2, 2 threads)."""
    if onednn and not bf16_gemm:
        return _OneDnnLinear.apply(x, weight, bias)  # (flattens x itself)
    x2d = x.reshape(-1, x.shape[-1])
    if bf16_gemm:
        bf = torch.bfloat16
        y = torch.nn.functional.linear(
            x2d.to(bf), weight.to(bf), bias.to(bf) if bias is not None else None).float()
    else:
        y = torch.nn.functional.linear(x2d, weight, bias)
    return y.view(*x.shape[:-1], y.shape[-1])


# --------------------------------------------------------------------------- streamed inference
def _operands(dtype: torch.dtype, bf16_gemm: bool, w_ihs, pbiases):
    """The projection's weights and biases in the dtype its GEMM runs in (once per call)."""
    gemm = torch.bfloat16 if bf16_gemm else dtype
    return ([w.to(gemm) for w in w_ihs],
            [b.to(gemm) if b is not None else None for b in pbiases], gemm)


def _chunk_projection(xs: torch.Tensor, w: torch.Tensor, b: Optional[torch.Tensor],
                      onednn: bool, gemm: torch.dtype, dtype: torch.dtype) -> torch.Tensor:
    """One chunk's input projection: the chunk in the GEMM's dtype, the result in the kernel's
    (a bfloat16 chunk is widened here, a chunk at a time)."""
    proj = input_projection(xs.to(gemm), w, b, onednn and gemm == torch.float32)
    return proj.to(dtype).contiguous()


def streamed_forward(kernel, spec: int, highway: bool, x: torch.Tensor, reversal, directions,
                     w_ihs, pbiases, w_hhs, h0s, c0s, batch_sizes: torch.Tensor, masks,
                     onednn: bool, out: torch.Tensor, chunk: int,
                     dtype: Optional[torch.dtype] = None, bf16_gemm: bool = False,
                     w_hh_dtype: Optional[torch.dtype] = None):
    """A no-gradient forward of one layer's ``directions`` on the CPU step kernel (``kernel``:
    ``registry.cpu_kernel()``), with the input projections computed ``chunk`` steps at a time
    instead of all at once.  ``x`` (T, B, D) is the layer's input; direction 0 reads it as it is,
    direction 1 reversed within each row's length (``reversal``, a
    :class:`rnn_ablations.functional.Reversal`).  Per chunk of steps: each direction's input
    steps (for direction 1 gathered from ``x``: no reversed copy of the whole input), its
    projection (``w_ihs[k]``, ``pbiases[k]``), then the kernel from the states the previous chunk
    ended in; direction ``d``'s output goes to ``out[..., d·H:(d+1)·H]`` (``out`` (T, B, D·H), the
    layer's output), direction 1's back in the original order.  The projections of all steps
    (T·B·(R+X)·H per direction), a reversed input and per-direction outputs are never held: peak
    memory is the input, the output and one chunk.  One direction runs ``plain_forward``, two
    run ``plain_directions_forward`` (one per thread).  Returns ``[(h_n, c_n)]`` per direction,
    equal to the unstreamed forward's (each row's final state is the state of its last active
    step: a chunk where a row is inactive passes its state through).

    ``dtype``: the dtype the kernel runs (default ``x``'s); a bfloat16 call on the float32
    kernels (``Plan.bf16_on_f32``) passes float32: each chunk is widened on its own and its
    output narrowed into ``out`` (bfloat16), the states stay in float32 (returned so); with
    ``bf16_gemm`` the chunks' projections run in bfloat16 (``Plan.bf16_gemm``); ``w_hh_dtype``:
    the dtype ``w_hhs`` go to the kernel in (default ``dtype``; bfloat16 with float32 runs the
    step GEMM in bfloat16, ``Plan.bf16_step_gemm``)."""
    T = x.shape[0]
    H = w_hhs[0].shape[1]
    dtype = x.dtype if dtype is None else dtype
    w_ihs, pbiases, gemm = _operands(dtype, bf16_gemm, w_ihs, pbiases)
    dsts = [out[..., d * H:(d + 1) * H] for d in directions]
    hs = [h.to(dtype).contiguous() for h in h0s]
    cs = [c.to(dtype).contiguous() for c in c0s]
    masks = [m.to(dtype).contiguous() if m is not None else x.new_empty(0, dtype=dtype)
             for m in masks]
    w_hhs = [w.to(w_hh_dtype or dtype).contiguous() for w in w_hhs]
    for t0 in range(0, T, chunk):
        t1 = min(T, t0 + chunk)
        bs = batch_sizes[t0:t1]
        if int(bs[0]) == 0:  # no row has a step left: the rest is padding in either order
            for dst in dsts:
                dst[t0:].zero_()
            break
        projs = [_chunk_projection(x[t0:t1] if d == 0 else reversal.steps(x, t0, t1), w, b,
                                   onednn, gemm, dtype)
                 for d, w, b in zip(directions, w_ihs, pbiases)]
        if len(directions) == 1:
            results = [kernel.plain_forward(spec, highway, projs[0], w_hhs[0], hs[0], cs[0], bs,
                                            masks[0], False, True)]
        else:
            results = kernel.plain_directions_forward(spec, highway, projs, w_hhs, hs, cs, bs,
                                                      masks, False, True)
        for k, (d, r) in enumerate(zip(directions, results)):
            if d == 0:
                dsts[k][t0:t1].copy_(r[0])
            else:
                reversal.place(dsts[k], r[0].to(out.dtype), t0)
            hs[k], cs[k] = r[1], r[2]
        del projs, results
    return list(zip(hs, cs))


def streamed_scan_forward(kernel, spec: int, highway: bool, x: torch.Tensor, reversal,
                          weights, pbiases, h0: torch.Tensor, c0: torch.Tensor,
                          batch_sizes: torch.Tensor, onednn: bool, out: torch.Tensor, chunk: int,
                          dtype: Optional[torch.dtype] = None,
                          bf16_gemm: bool = False) -> List[torch.Tensor]:
    """A no-gradient forward of a cell that reads no h_{t-1} (the scan kernel ``kernel``), its
    input projections computed ``chunk`` steps at a time: per chunk and direction the input
    steps (direction 1's gathered reversed within each row's length through ``reversal``, a
    :class:`rnn_ablations.functional.Reversal`), their projection with the bias
    (``weights[d]`` (G·H, D), ``pbiases[d]``), then ``scan_forward`` of that one direction from
    the states the previous chunk ended in; direction ``d``'s output goes to
    ``out[..., d·H:(d+1)·H]`` in the original order.  Peak memory: the input, the output and
    one chunk (no projection of all steps, no reversed copy).  ``h0`` / ``c0`` (D, B, H);
    ``dtype`` / ``bf16_gemm`` as in :func:`streamed_forward`.  Returns ``[h_n, c_n]``, each
    (D, B, H), equal to the unstreamed scan's."""
    T, D, H = x.shape[0], h0.shape[0], h0.shape[-1]
    dtype = x.dtype if dtype is None else dtype
    weights, pbiases, gemm = _operands(dtype, bf16_gemm, weights, pbiases)
    hs = [h0[d:d + 1].to(dtype).contiguous() for d in range(D)]
    cs = [c0[d:d + 1].to(dtype).contiguous() for d in range(D)]
    dsts = [out[..., d * H:(d + 1) * H] for d in range(D)]
    for t0 in range(0, T, chunk):
        t1 = min(T, t0 + chunk)
        bs = batch_sizes[t0:t1]
        if int(bs[0]) == 0:
            for dst in dsts:
                dst[t0:].zero_()
            break
        for d in range(D):
            xs = x[t0:t1] if d == 0 else reversal.steps(x, t0, t1)
            proj = _chunk_projection(xs, weights[d], pbiases[d], onednn, gemm, dtype)
            o, hs[d], cs[d], _ = kernel.scan_forward(spec, highway, proj, hs[d], cs[d], bs,
                                                     False)
            del proj
            if d == 0:
                dsts[d][t0:t1].copy_(o)
            else:
                reversal.place(dsts[d], o.to(out.dtype), t0)
    return [torch.cat(hs), torch.cat(cs)]
