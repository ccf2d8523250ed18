"""The fast path of a cell that never reads h_{t-1} (``Variant.reads_hidden`` False, e.g.
LSTM − S-RNN − HIDDEN): one input projection for all steps, then an element-wise scan.

Its only recurrence is ``c_t = f_t∘c_{t-1} + i_t∘c̃_t`` with gates that read ``x_t`` only, so
there is no per-step matrix product: :func:`rnn_ablations.dispatch.run_scan_layer` computes the projections of every
step with one GEMM per direction and hands them to a fused element-wise kernel, ``scan_forward``
/ ``scan_backward`` (``csrc/cpu/scan.cpp`` with its AVX2 + FMA rows
``csrc/cpu/scan_rows_avx2.cpp`` in the CPU extension ``_C``, ``csrc/cuda/scan_kernel.cuh`` in the
CUDA kernels), with a hand-written backward.  The kernels receive the variant's
kernel spec (``Variant.kernel_spec``) and the highway flag, as the step kernels do, and derive the
output rule and block offsets from them (``csrc/common/kernel_spec.h``, ``decode_scan_spec``);
:func:`scan_applies` says whether they have a rule for a cell.

The whole layer is one autograd node (:class:`_FusedScanLayer`): the kernels add the bias
inside the scan and sum its gradient there, read a ``batch_first`` input (and write their output)
in batch-major order without transposed copies, and inference (no gradient wanted) saves nothing
for a backward.  Under autocast the projection is an autograd op and the scan a node of its own
(:class:`_ScanLayer`).  Everything else (other dtypes or devices, no compiled kernel or one built
with another scan interface than ``registry.SCAN_ABI``, the ``generic`` backend) runs the
reference :func:`rnn_ablations.functional.generic_directions`, which computes the same function.

Padding follows the other variants' layer calls (:mod:`rnn_ablations.functional`): rows sorted by
decreasing length, ``batch_sizes[t]`` rows active at step t; an inactive row keeps its state and
outputs zero.  A bidirectional layer is one call: the kernels run direction 1 backwards within
each row's length (the same function as the other variants' reversed copies, without the copies).
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

import torch

from . import registry as _registry
from .interface import ScanKernel
from .projection import _dnnl_linear
from ..functional import generic_directions
from ..variants import Variant

__all__ = ["scan_applies", "scan_kernel_available", "scan_layer", "fused_scan_layer"]


def scan_applies(variant: Variant) -> bool:
    """True when the scan kernels have a rule for ``variant``: a memory cell whose gates read no
    h_{t-1} and whose content is used as it is.  These are the specs that
    ``csrc/common/kernel_spec.h`` ``decode_scan_spec`` accepts (``tests/test_variant_table.py``
    checks that both agree for every row); any other cell that reads no h_{t-1} runs on the
    generic path.  The block order the kernels read is the table's (``Variant.blocks``), which
    the table checks when a row is built."""
    if not isinstance(variant, Variant):
        raise TypeError(f"scan_applies takes a Variant (rnn_ablations.get_variant(name)), got "
                        f"{type(variant).__name__}")
    return (not variant.reads_hidden and variant.has_memory
            and variant.content_activation == "identity")


def scan_kernel_available(device: str = "cpu") -> bool:
    """True when the compiled scan kernel for ``device`` ("cpu" or "cuda") is loaded (the modules
    the loader accepted, :func:`rnn_ablations.kernels.registry.kernels`)."""
    got = _registry.kernels()
    return got.cpu_scan if device == "cpu" else got.cuda_scan


class _ScanLayer(torch.autograd.Function):
    """Autograd wrapper of the scan kernels: from the projections to the outputs."""

    @staticmethod
    def forward(ctx, proj, h0, c0, batch_sizes, spec, ext, variant, highway):
        out, h_n, c_n, cs = ext.scan_forward(spec, highway, proj, h0, c0, batch_sizes, True)
        ctx.save_for_backward(proj, h0, c0, cs, batch_sizes)
        ctx.spec, ctx.ext, ctx.variant, ctx.highway = spec, ext, variant, highway
        return out, h_n, c_n

    @staticmethod
    def backward(ctx, g_out, g_hn, g_cn):
        proj, h0, c0, cs, batch_sizes = ctx.saved_tensors
        if torch.is_grad_enabled():
            # create_graph=True: the kernel's hand-written backward is not differentiable; the
            # layer is recomputed on the differentiable generic path from the saved inputs and
            # differentiated by autograd, so second derivatives are exact.
            with torch.enable_grad():
                outs = generic_directions(ctx.variant, ctx.highway, proj, h0, c0, batch_sizes)
            wrt = [t for t in (proj, c0) if t.requires_grad]
            got = iter(torch.autograd.grad(outs, wrt, (g_out, g_hn, g_cn), create_graph=True,
                                           allow_unused=True)) if wrt else iter(())
            dproj, dc0 = (next(got) if t.requires_grad else None for t in (proj, c0))
            dproj = dproj if dproj is not None or not proj.requires_grad else torch.zeros_like(proj)
            dc0 = dc0 if dc0 is not None or not c0.requires_grad else torch.zeros_like(c0)
            return dproj, None, dc0, None, None, None, None, None
        dproj, dc0 = ctx.ext.scan_backward(ctx.spec, ctx.highway, g_out.contiguous(),
                                           g_hn.contiguous(), g_cn.contiguous(), proj, c0, cs,
                                           batch_sizes)[:2]
        return dproj, None, dc0, None, None, None, None, None


def _rows(x: torch.Tensor) -> Tuple[torch.Tensor, bool]:
    """``x`` (T, B, d) as a 2-D matrix of rows without a copy where its layout allows: time-major
    (rows t·B + b) when contiguous, batch-major (rows b·T + t) when it is the time-major view of a
    contiguous (B, T, d) tensor (a ``batch_first`` input or a previous scan layer's output)."""
    if not x.is_contiguous() and x.transpose(0, 1).is_contiguous():
        return x.transpose(0, 1).reshape(-1, x.shape[-1]), True
    return x.contiguous().view(-1, x.shape[-1]), False


def _as_time_major(rows: torch.Tensor, seq_len: int, batch: int, batch_major: bool) -> torch.Tensor:
    """The (T, B, W) view of a 2-D matrix of rows ordered as :func:`_rows` returned them."""
    if batch_major:
        return rows.view(batch, seq_len, rows.shape[-1]).transpose(0, 1)
    return rows.view(seq_len, batch, rows.shape[-1])


def _rows_of(t: torch.Tensor, batch_major: bool) -> torch.Tensor:
    """Inverse of :func:`_as_time_major` (a view)."""
    return (t.transpose(0, 1) if batch_major else t).reshape(-1, t.shape[-1])


def _project(x2d: torch.Tensor, weights: Sequence[torch.Tensor], onednn: bool
             ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """x2d · [W_0; W_1]ᵀ (the directions side by side) on the faster GEMM library, no autograd;
    returns it and the concatenated weight where one was made (kept for the backward).  oneDNN
    reads one weight, so the directions' are concatenated for it; ATen's GEMM writes each
    direction's columns in place instead."""
    if onednn:
        weight = weights[0] if len(weights) == 1 else torch.cat(list(weights))
        return _dnnl_linear(x2d, weight, None), (weight if len(weights) > 1 else None)
    if len(weights) == 1:
        return torch.mm(x2d, weights[0].t()), None
    if torch.compiler.is_compiling():  # a traced graph takes no out= views: one GEMM instead
        return torch.mm(x2d, torch.cat(list(weights)).t()), None
    width = weights[0].shape[0]
    proj = x2d.new_empty(x2d.shape[0], width * len(weights))
    for d, w in enumerate(weights):
        torch.mm(x2d, w.t(), out=proj[:, d * width:(d + 1) * width])
    return proj, None


def _project_back(g2d: torch.Tensor, weights: Sequence[torch.Tensor],
                  cat: Optional[torch.Tensor], onednn: bool) -> torch.Tensor:
    """g2d · [W_0; W_1] (the input gradient of :func:`_project`), on the same library."""
    if onednn:
        weight = cat if cat is not None else (weights[0] if len(weights) == 1
                                              else torch.cat(list(weights)))
        return _dnnl_linear(g2d, weight.t(), None)  # oneDNN reads the transposed layout
    width = weights[0].shape[0]
    dx = torch.mm(g2d[:, :width], weights[0])
    for d in range(1, len(weights)):
        dx.addmm_(g2d[:, d * width:(d + 1) * width], weights[d])
    return dx


class _FusedScanLayer(torch.autograd.Function):
    """The whole layer as one autograd node: the input projection of every step and direction
    (GEMMs without bias: the kernel adds it), the scan, and a hand-written backward (the scan
    backward also sums the bias gradient; then the input gradient of both directions and their
    weight gradients).  A ``batch_first`` input and a previous scan layer's output are read in
    their batch-major order, without a transposed copy.  ``ext`` is the CPU or CUDA extension."""

    @staticmethod
    def forward(ctx, x, c0, h0, batch_sizes, onednn, ext, variant, highway, bias, *weights):
        out, h_n, c_n, proj, cs, cat, batch_major = _FusedScanLayer.compute(
            x, c0, h0, batch_sizes, onednn, ext, variant, highway, bias, weights, True)
        ctx.save_for_backward(x, c0, h0, bias, proj, cs, batch_sizes, cat, *weights)
        ctx.spec, ctx.ext, ctx.variant, ctx.highway = variant.kernel_spec, ext, variant, highway
        ctx.batch_major, ctx.onednn = batch_major, onednn
        return out, h_n, c_n

    @staticmethod
    def compute(x, c0, h0, batch_sizes, onednn, ext, variant, highway, bias, weights, save):
        """The forward: the projection of every step and direction, then the scan (``save``:
        keep what the backward reads)."""
        seq_len, batch = x.shape[0], x.shape[1]
        x2d, batch_major = _rows(x)
        proj2d, cat = _project(x2d, weights, onednn)
        proj = _as_time_major(proj2d, seq_len, batch, batch_major)
        out, h_n, c_n, cs = ext.scan_forward(variant.kernel_spec, highway, proj, h0, c0,
                                             batch_sizes, save, bias)
        return out, h_n, c_n, proj, cs, cat, batch_major

    @staticmethod
    def backward(ctx, g_out, g_hn, g_cn):
        x, c0, h0, bias, proj, cs, batch_sizes, cat, *weights = ctx.saved_tensors
        # inputs: x, c0, h0, batch_sizes, onednn, ext, variant, highway, bias, *weights
        need = ctx.needs_input_grad
        wants = (need[0], need[1], need[8]) + tuple(need[9:])
        if torch.is_grad_enabled():
            # create_graph=True: recompute the layer with differentiable ops and let autograd
            # differentiate it, so that second derivatives are exact.
            inputs = [x, c0, bias] + weights
            with torch.enable_grad():
                outs = _reference_layer(ctx.variant, ctx.highway, x, weights, bias, h0, c0,
                                        batch_sizes)
                got = iter(torch.autograd.grad(outs, [t for t, w in zip(inputs, wants) if w],
                                               (g_out, g_hn, g_cn), create_graph=True,
                                               allow_unused=True))
            grads = [next(got) if w else None for w in wants]
            grads = [torch.zeros_like(t) if g is None and w else g
                     for t, g, w in zip(inputs, grads, wants)]
            dx, dc0, db, *dws = grads
            return (dx, dc0, None, None, None, None, None, None, db, *dws)
        g_out = torch.zeros_like(cs, dtype=proj.dtype) if g_out is None else g_out
        if g_out.stride(-1) != 1:  # e.g. the expanded gradient of .sum()
            g_out = g_out.contiguous()
        g_hn = torch.zeros_like(c0) if g_hn is None else g_hn.contiguous()
        g_cn = torch.zeros_like(c0) if g_cn is None else g_cn.contiguous()
        dproj, dc0, db = ctx.ext.scan_backward(ctx.spec, ctx.highway, g_out, g_hn, g_cn, proj, c0,
                                               cs, batch_sizes, bias, bool(need[8]))
        g2d = _rows_of(dproj, ctx.batch_major)
        dx = dws = None
        if need[0]:
            dx = _as_time_major(_project_back(g2d, weights, cat, ctx.onednn), x.shape[0],
                                x.shape[1], ctx.batch_major)
        if any(need[9:]):
            x2d, _ = _rows(x)
            kernel = _registry.cpu_kernel() if x2d.device.type == "cpu" else None
            if kernel is not None:
                dw = kernel.weight_grad(g2d, x2d)
            else:
                dw = g2d.t().mm(x2d)
            dws = dw.split(weights[0].shape[0])
        return (dx, dc0 if need[1] else None, None, None, None, None, None, None,
                db if need[8] else None, *(dws if dws is not None else [None] * len(weights)))


def _reference_layer(variant, highway, x, weights, bias, h0, c0, batch_sizes):
    """The layer with differentiable torch ops (the generic path) from the fused layer's inputs."""
    weight = weights[0] if len(weights) == 1 else torch.cat(weights)
    proj = torch.nn.functional.linear(x, weight, bias)
    return generic_directions(variant, highway, proj, h0, c0, batch_sizes)


def scan_layer(ext: ScanKernel, variant: Variant, highway: bool, proj: torch.Tensor, h0: torch.Tensor,
               c0: torch.Tensor, batch_sizes: torch.Tensor):
    """The scan kernel of ``ext`` from the projections ``proj`` (T, B, D·G·H): the autograd
    Function where a gradient is wanted, else the forward alone (nothing saved)."""
    proj, h0, c0 = proj.contiguous(), h0.contiguous(), c0.contiguous()
    if torch.is_grad_enabled() and (proj.requires_grad or c0.requires_grad):
        return _ScanLayer.apply(proj, h0, c0, batch_sizes, variant.kernel_spec, ext, variant,
                                highway)
    out, h_n, c_n, _ = ext.scan_forward(variant.kernel_spec, highway, proj, h0, c0, batch_sizes,
                                        False)
    return out, h_n, c_n


def fused_scan_layer(ext: ScanKernel, variant: Variant, highway: bool, x: torch.Tensor,
                     weights: Sequence[torch.Tensor], bias: Optional[torch.Tensor],
                     h0: torch.Tensor, c0: torch.Tensor, batch_sizes: torch.Tensor,
                     onednn: bool):
    """The whole layer in one node (:class:`_FusedScanLayer`: the projection on oneDNN where
    ``onednn``, the scan with the bias inside, the backward) where a gradient is wanted, else
    its forward alone (nothing saved)."""
    h0, c0 = h0.contiguous(), c0.contiguous()
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad
                                       for t in (x, c0, bias, *weights)):
        return _FusedScanLayer.apply(x, c0, h0, batch_sizes, onednn, ext, variant, highway, bias,
                                     *weights)
    with torch.no_grad():
        return _FusedScanLayer.compute(x, c0, h0, batch_sizes, onednn, ext, variant, highway,
                                       bias, weights, False)[:3]

