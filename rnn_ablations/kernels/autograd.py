"""The autograd Functions around the compiled step kernels: the plain kernel (from the input
projections; ``registry.cpu_kernel()`` on CPU, the CUDA step or persistent kernel on CUDA) and the
pipelined CPU kernel (from the layer input), each with its hand-written backward, and the
differentiable recomputation used under ``create_graph=True`` (the hand-written backward is not
differentiable).

Every kernel is an argument (``ext``, a kernel object of ``kernels/interface.py``), called only
through the interface's methods.  Each entry point (:func:`plain_layer`, :func:`pipelined_layer`,
:func:`plain_pair`, :func:`pipelined_pair`) runs its autograd Function where a gradient is
wanted, else the same forward function the Function calls (``_*_forward`` with ``keep=False``:
nothing saved for a backward)."""
from __future__ import annotations

from typing import Optional

import torch

from .interface import PipelinedKernel, StepKernel
from ..functional import generic_from_projection, projection_bias


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


def _plain_forward(ext, variant, highway, proj, w_hh, h0, c0, batch_sizes, rec_mask, keep):
    """``ext.plain_forward`` → ``(out, h_n, c_n, gates, cs, hin)`` (the last three for a backward
    with ``keep``).  ``proj`` is always a scratch tensor here (fresh from the input projection,
    which saves no output for its backward), so a kernel that declares ``in_place_gates`` turns
    its recurrent blocks into the gate activations in place instead of copying them; the
    autograd-free alias is what it writes (``proj`` may be the view a custom Function
    returned)."""
    return ext.plain_forward(variant.kernel_spec, highway, proj.detach(), w_hh, h0, c0,
                             batch_sizes, _or_empty(rec_mask, proj), keep,
                             in_place=ext.in_place_gates)


def _pipelined_forward(ext, variant, highway, x, w_ih, bias, w_hh, h0, c0, batch_sizes,
                       rec_mask, chunk, keep):
    """``ext.pipelined_forward`` → ``(out, h_n, c_n, gates, cs, hin, xo)``."""
    return ext.pipelined_forward(variant.kernel_spec, highway, x, w_ih, _or_empty(bias, x), w_hh,
                                 h0, c0, batch_sizes, _or_empty(rec_mask, x), keep, chunk)


def _plain_pair_forward(ext, variant, highway, batch_sizes, groups, keep):
    """``ext.plain_directions_forward`` of the groups of :data:`_DIRECTION_ARGS` (``proj``:
    scratch tensors the kernel may write) → per direction ``(out, h_n, c_n, gates, cs, hin)``."""
    return ext.plain_directions_forward(
        variant.kernel_spec, highway, [g[0] for g in groups], [g[1] for g in groups],
        [g[2] for g in groups], [g[3] for g in groups], batch_sizes,
        [_or_empty(g[7], g[0]) for g in groups], keep, in_place=ext.in_place_gates)


def _pipelined_pair_forward(ext, variant, highway, batch_sizes, chunk, groups, keep):
    """``ext.pipelined_directions_forward`` of the groups of :data:`_PIPELINED_DIRECTION_ARGS`
    → per direction ``(out, h_n, c_n, gates, cs, hin, xo)``."""
    return ext.pipelined_directions_forward(
        variant.kernel_spec, highway, [g[0] for g in groups], [g[1] for g in groups],
        [_or_empty(g[2], g[0]) for g in groups], [g[3] for g in groups],
        [g[4] for g in groups], [g[5] for g in groups], batch_sizes,
        [_or_empty(g[6], g[0]) for g in groups], keep, chunk)


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
        # (a bfloat16 w_hh beside float32 states: the step GEMM in bfloat16, recomputed in
        # float32 through a differentiable cast)
        outs = generic_from_projection(variant, highway, proj, w_hh.to(proj.dtype), h0, c0,
                                       batch_sizes, rec_mask)
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
    """Autograd wrapper: forward and the hand-written backward of a step kernel ``ext`` (the
    ``StepKernel`` of ``kernels/interface.py``: the CPU or a CUDA kernel).

    ``x``, ``w_ih`` and ``pbias`` (the layer input and the projection's parameters, from which
    ``proj = F.linear(x, w_ih, pbias)`` was computed) receive no gradient here (theirs flows
    through ``proj``); they are kept for the ``create_graph=True`` backward, which recomputes
    the layer differentiably (the kernel overwrites ``proj``'s recurrent blocks in place)."""

    @staticmethod
    def forward(ctx, proj, w_hh, h0, c0, x, w_ih, pbias, variant, highway, batch_sizes,
                rec_mask, ext):
        # the kernel may write the gates into proj (a scratch tensor): the autograd-free alias
        # is what it writes and what is saved
        proj = proj.detach()
        mask_ = _or_empty(rec_mask, proj)
        out, h_n, c_n, gates, cs, hin = _plain_forward(ext, variant, highway, proj, w_hh, h0, c0,
                                                       batch_sizes, rec_mask, True)
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
        dproj, dw, dh0, dc0 = ctx.ext.plain_backward(
            ctx.variant.kernel_spec, ctx.highway, g_out, g_hn, g_cn, gates, cs, hin, out, proj,
            w_hh, h0, c0, batch_sizes, mask)
        return (dproj, dw, dh0, dc0) + (None,) * 8


class _PipelinedLayer(torch.autograd.Function):
    """Autograd wrapper of the pipelined kernel: from the layer input to the outputs, with the
    input projection inside (its gradients come back from the kernel's backward).  Under
    ``create_graph=True`` the backward recomputes the layer differentiably (see
    :func:`_graph_grads`)."""

    @staticmethod
    def forward(ctx, x, w_ih, bias, w_hh, h0, c0, variant, highway, batch_sizes, rec_mask, chunk,
                ext):
        mask_ = _or_empty(rec_mask, x)
        out, h_n, c_n, gates, cs, hin, xo = _pipelined_forward(
            ext, variant, highway, x, w_ih, bias, w_hh, h0, c0, batch_sizes, rec_mask, chunk,
            True)
        ctx.save_for_backward(gates, cs, hin, xo, out, x, w_ih, w_hh, h0, c0, batch_sizes, mask_,
                              bias)
        ctx.variant, ctx.highway, ctx.has_bias = variant, highway, bias is not None
        ctx.has_mask = rec_mask is not None
        ctx.chunk, ctx.ext = chunk, ext
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
            return tuple(grads) + (None,) * 6
        g_out, g_hn, g_cn = _incoming_grads(g_out, g_hn, g_cn, out, h0, c0)
        need_dw = need[1] or need[3]
        need_bias = ctx.has_bias and need[2]
        dx, dw_ih, db, dw_hh, dh0, dc0 = ctx.ext.pipelined_backward(
            ctx.variant.kernel_spec, ctx.highway, g_out, g_hn, g_cn, gates, cs, hin, xo, out, x,
            w_ih, w_hh, h0, c0, batch_sizes, mask, need[0], need_dw, need_bias, ctx.chunk)
        return (dx if need[0] else None, dw_ih if need[1] else None, db if need_bias else None,
                dw_hh if need[3] else None, dh0, dc0, None, None, None, None, None, None)


#: Per direction, the tensors :class:`_KernelDirections` takes (in this order).
_DIRECTION_ARGS = ("proj", "w_hh", "h0", "c0", "x", "w_ih", "pbias", "rec_mask")


class _KernelDirections(torch.autograd.Function):
    """Autograd wrapper of the CPU kernel's directions entry points
    (``plain_directions_forward`` / ``plain_directions_backward`` of ``ext``): the directions of a
    bidirectional layer submitted together, run concurrently (one per thread) in the forward and in the hand-written backward.  Direction
    ``d`` is :class:`_KernelLayer` on the ``d``-th group of :data:`_DIRECTION_ARGS` in ``flat``
    (``rec_mask`` may be ``None``); the outputs are ``(out, h_n, c_n)`` of every direction, in
    order.  ``x``, ``w_ih`` and ``pbias`` receive no gradient here (theirs flows through
    ``proj``); they are kept for the ``create_graph=True`` backward (see :func:`_graph_grads`)."""

    @staticmethod
    def forward(ctx, ext, variant, highway, batch_sizes, *flat):
        k = len(_DIRECTION_ARGS)
        groups = [(g[0].detach(),) + tuple(g[1:])  # proj: as in _KernelLayer.forward
                  for g in (flat[i:i + k] for i in range(0, len(flat), k))]
        masks = [_or_empty(g[7], g[0]) for g in groups]
        results = _plain_pair_forward(ext, variant, highway, batch_sizes, groups, True)
        saved = []
        for g, m, (out, _, _, gates, cs, hin) in zip(groups, masks, results):
            saved += [gates, cs, hin, out, g[0], g[1], g[2], g[3], m, g[4], g[5], g[6]]
        ctx.save_for_backward(batch_sizes, *saved)
        ctx.variant, ctx.highway, ctx.ext = variant, highway, ext
        ctx.has_mask = [g[7] is not None for g in groups]
        return tuple(t for r in results for t in r[:3])

    @staticmethod
    def backward(ctx, *grads):
        batch_sizes, *saved = ctx.saved_tensors
        n = len(ctx.has_mask)
        per = [saved[12 * d:12 * (d + 1)] for d in range(n)]
        incoming = [grads[3 * d:3 * (d + 1)] for d in range(n)]
        need = ctx.needs_input_grad[4:]
        k = len(_DIRECTION_ARGS)
        result = [None] * (4 + k * n)
        if torch.is_grad_enabled():  # create_graph=True: a differentiable backward, per direction
            for d, ((gates, cs, hin, out, proj, w_hh, h0, c0, mask, x, w_ih, pbias),
                    g) in enumerate(zip(per, incoming)):
                nd = need[k * d:k * (d + 1)]
                dproj, dw, dh0, dc0 = _graph_grads(
                    ctx.variant, ctx.highway, x, w_ih, pbias, w_hh, h0, c0, batch_sizes,
                    mask if ctx.has_mask[d] else None, g, True,
                    [w_hh if nd[1] else None, h0 if nd[2] else None, c0 if nd[3] else None])
                result[4 + k * d:4 + k * d + 4] = [dproj if nd[0] else None, dw, dh0, dc0]
            return tuple(result)
        filled = [_incoming_grads(*g, p[3], p[6], p[7]) for g, p in zip(incoming, per)]
        got = ctx.ext.plain_directions_backward(
            ctx.variant.kernel_spec, ctx.highway, *[[f[i] for f in filled] for i in range(3)],
            *[[p[i] for p in per] for i in range(8)], batch_sizes, [p[8] for p in per])
        for d, (dproj, dw, dh0, dc0) in enumerate(got):
            nd = need[k * d:k * (d + 1)]
            result[4 + k * d:4 + k * d + 4] = [dproj if nd[0] else None, dw if nd[1] else None,
                                               dh0 if nd[2] else None, dc0 if nd[3] else None]
        return tuple(result)


#: Per direction, the tensors :class:`_PipelinedDirections` takes (in this order).
_PIPELINED_DIRECTION_ARGS = ("x", "w_ih", "bias", "w_hh", "h0", "c0", "rec_mask")


class _PipelinedDirections(torch.autograd.Function):
    """Autograd wrapper of ``pipelined_directions_forward`` / ``pipelined_directions_backward``
    of ``ext`` (the CPU kernel):
    the directions of a bidirectional layer at once, one per thread, each as
    :class:`_PipelinedLayer` on the ``d``-th group of :data:`_PIPELINED_DIRECTION_ARGS` in
    ``flat`` (``bias`` and ``rec_mask`` may be ``None``); the outputs are ``(out, h_n, c_n)`` of
    every direction, in order."""

    @staticmethod
    def forward(ctx, ext, variant, highway, batch_sizes, chunk, *flat):
        k = len(_PIPELINED_DIRECTION_ARGS)
        groups = [flat[i:i + k] for i in range(0, len(flat), k)]
        masks = [_or_empty(g[6], g[0]) for g in groups]
        results = _pipelined_pair_forward(ext, variant, highway, batch_sizes, chunk, groups, True)
        saved = []
        for g, m, (out, _, _, gates, cs, hin, xo) in zip(groups, masks, results):
            saved += [gates, cs, hin, xo, out, g[0], g[1], g[3], g[4], g[5], m, g[2]]
        ctx.save_for_backward(batch_sizes, *saved)
        ctx.variant, ctx.highway, ctx.chunk, ctx.ext = variant, highway, chunk, ext
        ctx.has_mask = [g[6] is not None for g in groups]
        ctx.has_bias = groups[0][2] is not None
        return tuple(t for r in results for t in r[:3])

    @staticmethod
    def backward(ctx, *grads):
        batch_sizes, *saved = ctx.saved_tensors
        n = len(ctx.has_mask)
        per = [saved[12 * d:12 * (d + 1)] for d in range(n)]
        incoming = [grads[3 * d:3 * (d + 1)] for d in range(n)]
        k = len(_PIPELINED_DIRECTION_ARGS)
        need = ctx.needs_input_grad[5:]
        result = [None] * (5 + k * n)
        if torch.is_grad_enabled():  # create_graph=True: a differentiable backward, per direction
            for d, ((gates, cs, hin, xo, out, x, w_ih, w_hh, h0, c0, mask, bias),
                    g) in enumerate(zip(per, incoming)):
                nd = need[k * d:k * (d + 1)]
                pbias = projection_bias(bias, w_ih.shape[0]) if ctx.has_bias else None
                got = _graph_grads(
                    ctx.variant, ctx.highway, x, w_ih, pbias, w_hh, h0, c0, batch_sizes,
                    mask if ctx.has_mask[d] else None, g, False,
                    [t if nd_i else None for t, nd_i in zip(
                        (x, w_ih, bias if ctx.has_bias else None, w_hh, h0, c0), nd)])
                result[5 + k * d:5 + k * d + 6] = got
            return tuple(result)
        filled = [_incoming_grads(*g, p[4], p[8], p[9]) for g, p in zip(incoming, per)]
        need_dx = any(need[k * d] for d in range(n))
        need_dw = any(need[k * d + 1] or need[k * d + 3] for d in range(n))
        need_bias = ctx.has_bias and any(need[k * d + 2] for d in range(n))
        got = ctx.ext.pipelined_directions_backward(
            ctx.variant.kernel_spec, ctx.highway, *[[f[i] for f in filled] for i in range(3)],
            *[[p[i] for p in per] for i in range(10)], batch_sizes, [p[10] for p in per],
            need_dx, need_dw, need_bias, ctx.chunk)
        for d, (dx, dw_ih, db, dw_hh, dh0, dc0) in enumerate(got):
            nd = need[k * d:k * (d + 1)]
            result[5 + k * d:5 + k * d + 6] = [dx if nd[0] else None, dw_ih if nd[1] else None,
                                               db if nd[2] and need_bias else None,
                                               dw_hh if nd[3] else None, dh0 if nd[4] else None,
                                               dc0 if nd[5] else None]
        return tuple(result)


# --------------------------------------------------------------------------- the entry points
# One function per kernel entry: the autograd Function where a gradient is wanted, else the
# forward function the Function calls, with nothing kept for a backward.

def plain_layer(ext: StepKernel, variant, highway: bool, proj, w_hh, h0, c0, x, w_ih, pbias, batch_sizes,
                rec_mask):
    """One direction on the step kernel ``ext`` (``StepKernel``: the CPU kernel, the CUDA step
    kernel, its graphed or persistent form) from the input projections ``proj`` (a scratch
    tensor the kernel may overwrite); ``x``, ``w_ih``, ``pbias`` are what ``proj`` was computed
    from (kept for a ``create_graph=True`` backward)."""
    proj, w_hh, h0, c0 = proj.contiguous(), w_hh.contiguous(), h0.contiguous(), c0.contiguous()
    rec_mask = rec_mask.contiguous() if rec_mask is not None else None
    if _needs_grad(proj, w_hh, h0, c0):
        return _KernelLayer.apply(proj, w_hh, h0, c0, x, w_ih, pbias, variant, highway,
                                  batch_sizes, rec_mask, ext)
    return tuple(_plain_forward(ext, variant, highway, proj, w_hh, h0, c0, batch_sizes,
                                rec_mask, False)[:3])


def pipelined_layer(ext: PipelinedKernel, variant, highway: bool, x, w_ih, bias, w_hh, h0, c0, batch_sizes,
                    rec_mask, chunk: int):
    """One direction on the pipelined CPU kernel ``ext`` (``PipelinedKernel``), from the layer
    input (the projection inside); ``chunk``: steps per chunk (0 = automatic)."""
    x, w_ih, w_hh = x.contiguous(), w_ih.contiguous(), w_hh.contiguous()
    h0, c0 = h0.contiguous(), c0.contiguous()
    bias = bias.contiguous() if bias is not None else None
    rec_mask = rec_mask.contiguous() if rec_mask is not None else None
    if _needs_grad(x, w_ih, bias, w_hh, h0, c0):
        return _PipelinedLayer.apply(x, w_ih, bias, w_hh, h0, c0, variant, highway, batch_sizes,
                                     rec_mask, chunk, ext)
    return tuple(_pipelined_forward(ext, variant, highway, x, w_ih, bias, w_hh, h0, c0,
                                    batch_sizes, rec_mask, chunk, False)[:3])


def plain_pair(ext: PipelinedKernel, variant, highway: bool, batch_sizes, flat):
    """The directions of a bidirectional layer at once (one per thread) on the CPU step kernel
    ``ext``; ``flat``: per direction the tensors of :data:`_DIRECTION_ARGS`.  Returns ``[(out,
    h_n, c_n), ...]``."""
    n = len(flat) // len(_DIRECTION_ARGS)
    if _needs_grad(*flat):
        outs = _KernelDirections.apply(ext, variant, highway, batch_sizes, *flat)
        return [tuple(outs[3 * d:3 * d + 3]) for d in range(n)]
    k = len(_DIRECTION_ARGS)
    groups = [flat[i:i + k] for i in range(0, len(flat), k)]
    return [tuple(r[:3]) for r in _plain_pair_forward(ext, variant, highway, batch_sizes, groups,
                                                      False)]


def pipelined_pair(ext: PipelinedKernel, variant, highway: bool, batch_sizes, chunk: int, flat):
    """The directions of a bidirectional layer at once (one per thread) on the pipelined CPU
    kernel ``ext``; ``flat``: per direction the tensors of :data:`_PIPELINED_DIRECTION_ARGS`."""
    n = len(flat) // len(_PIPELINED_DIRECTION_ARGS)
    if _needs_grad(*flat):
        outs = _PipelinedDirections.apply(ext, variant, highway, batch_sizes, chunk, *flat)
        return [tuple(outs[3 * d:3 * d + 3]) for d in range(n)]
    k = len(_PIPELINED_DIRECTION_ARGS)
    groups = [flat[i:i + k] for i in range(0, len(flat), k)]
    return [tuple(r[:3]) for r in _pipelined_pair_forward(ext, variant, highway, batch_sizes,
                                                          chunk, groups, False)]
