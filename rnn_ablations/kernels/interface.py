"""The interface every kernel class implements, declared once.

A *step kernel* runs one direction of a layer whose cell reads h_{t-1} from the input
projections; a *scan kernel* runs a layer whose cell reads none.  The run layer calls a kernel
only through these methods (``kernels/autograd.py``: ``plain_layer``, ``pipelined_layer``,
``plain_pair``, ``pipelined_pair``; ``kernels/scan.py``: ``scan_layer`` / ``fused_scan_layer``),
so any class with them can take a kernel's place: the CPU kernel (``ops.CpuKernel``), the CUDA
kernel (``ops_cuda.CudaKernel``), its CUDA-graph replay (``cuda_graphs.GraphedKernel``) and the
persistent CUDA kernel (``cuda_recurrence.PersistentKernel``).  The arguments and results are
those of the operators documented in ``rnn_ablations/kernels/ops.py``.

What a kernel can do is declared by the kernel (class attributes), never found by asking which
object it is: ``in_place_gates`` (``plain_forward(..., in_place=True)`` writes the gate
activations into ``proj``, a scratch tensor the caller hands over, instead of a copy),
``scan`` (the scan entry points of this package's calling convention are there) and
``persistent`` (the persistent CUDA kernel is there).
"""
from __future__ import annotations

from typing import List, Optional, Protocol, Sequence, runtime_checkable

from torch import Tensor

__all__ = ["StepKernel", "ScanKernel", "PipelinedKernel", "PersistentEntries", "WeightGrad",
           "Capabilities", "PROTOCOLS"]


@runtime_checkable
class Capabilities(Protocol):
    """What a kernel object declares it can do (see the module docstring)."""

    in_place_gates: bool
    scan: bool
    persistent: bool


@runtime_checkable
class StepKernel(Protocol):
    """``plain_forward`` / ``plain_backward`` of ``ops.py``."""

    in_place_gates: bool

    def plain_forward(self, spec: int, highway: bool, proj: Tensor, w_hh: Tensor, h0: Tensor,
                      c0: Tensor, batch_sizes: Tensor, rec_mask: Tensor, keep_hin: bool,
                      in_place: bool = False) -> List[Tensor]:
        """→ out, h_n, c_n, gates, cs, hin (``in_place`` only where ``in_place_gates``)."""

    def plain_backward(self, spec: int, highway: bool, g_out: Tensor, g_hn: Tensor,
                       g_cn: Tensor, gates: Tensor, cs: Tensor, hin: Tensor, out: Tensor,
                       proj: Tensor, w_hh: Tensor, h0: Tensor, c0: Tensor, batch_sizes: Tensor,
                       rec_mask: Tensor) -> List[Tensor]:
        """→ d_proj, d_w_hh, d_h0, d_c0."""


@runtime_checkable
class ScanKernel(Protocol):
    """``scan_forward`` / ``scan_backward`` of ``ops.py``."""

    def scan_forward(self, spec: int, highway: bool, proj: Tensor, h0: Tensor, c0: Tensor,
                     batch_sizes: Tensor, save: bool,
                     bias: Optional[Tensor] = None) -> List[Tensor]:
        """→ out, h_n, c_n, cs."""

    def scan_backward(self, spec: int, highway: bool, g_out: Tensor, g_hn: Tensor,
                      g_cn: Tensor, proj: Tensor, c0: Tensor, cs: Tensor, batch_sizes: Tensor,
                      bias: Optional[Tensor] = None, bias_grad: bool = False) -> List[Tensor]:
        """→ d_proj, d_c0, d_bias."""


@runtime_checkable
class PipelinedKernel(Protocol):
    """The CPU kernel's entries that take the layer input (the projection inside) and the
    directions of a bidirectional layer at once: ``pipelined_*``, ``plain_directions_forward_`` /
    ``plain_directions_backward`` of ``ops.py`` (lists hold one tensor per direction)."""

    def pipelined_forward(self, spec: int, highway: bool, x: Tensor, w_ih: Tensor, bias: Tensor,
                          w_hh: Tensor, h0: Tensor, c0: Tensor, batch_sizes: Tensor,
                          rec_mask: Tensor, keep_hin: bool, chunk: int) -> List[Tensor]:
        """→ out, h_n, c_n, gates, cs, hin, xo."""

    def pipelined_backward(self, spec: int, highway: bool, g_out: Tensor, g_hn: Tensor,
                           g_cn: Tensor, gates: Tensor, cs: Tensor, hin: Tensor, xo: Tensor,
                           out: Tensor, x: Tensor, w_ih: Tensor, w_hh: Tensor, h0: Tensor,
                           c0: Tensor, batch_sizes: Tensor, rec_mask: Tensor, need_dx: bool,
                           need_dw: bool, need_bias: bool, chunk: int) -> List[Tensor]:
        """→ dx, dw_ih, d_bias, dw_hh, dh0, dc0."""

    def plain_directions_forward(self, spec: int, highway: bool, proj: Sequence[Tensor],
                                 w_hh: Sequence[Tensor], h0: Sequence[Tensor],
                                 c0: Sequence[Tensor], batch_sizes: Tensor,
                                 rec_mask: Sequence[Tensor], keep_hin: bool,
                                 in_place: bool = False) -> List[List[Tensor]]:
        """→ per direction: out, h_n, c_n, gates, cs, hin."""

    def plain_directions_backward(self, spec: int, highway: bool, g_out: Sequence[Tensor],
                                  g_hn: Sequence[Tensor], g_cn: Sequence[Tensor],
                                  gates: Sequence[Tensor], cs: Sequence[Tensor],
                                  hin: Sequence[Tensor], out: Sequence[Tensor],
                                  proj: Sequence[Tensor], w_hh: Sequence[Tensor],
                                  h0: Sequence[Tensor], c0: Sequence[Tensor], batch_sizes: Tensor,
                                  rec_mask: Sequence[Tensor]) -> List[List[Tensor]]:
        """→ per direction: d_proj, d_w_hh, d_h0, d_c0."""

    def pipelined_directions_forward(self, spec: int, highway: bool, x: Sequence[Tensor],
                                     w_ih: Sequence[Tensor], bias: Sequence[Tensor],
                                     w_hh: Sequence[Tensor], h0: Sequence[Tensor],
                                     c0: Sequence[Tensor], batch_sizes: Tensor,
                                     rec_mask: Sequence[Tensor], keep_hin: bool,
                                     chunk: int) -> List[List[Tensor]]:
        """→ per direction: out, h_n, c_n, gates, cs, hin, xo."""

    def pipelined_directions_backward(self, spec: int, highway: bool, g_out: Sequence[Tensor],
                                      g_hn: Sequence[Tensor], g_cn: Sequence[Tensor],
                                      gates: Sequence[Tensor], cs: Sequence[Tensor],
                                      hin: Sequence[Tensor], xo: Sequence[Tensor],
                                      out: Sequence[Tensor], x: Sequence[Tensor],
                                      w_ih: Sequence[Tensor], w_hh: Sequence[Tensor],
                                      h0: Sequence[Tensor], c0: Sequence[Tensor],
                                      batch_sizes: Tensor, rec_mask: Sequence[Tensor],
                                      need_dx: bool, need_dw: bool, need_bias: bool,
                                      chunk: int) -> List[List[Tensor]]:
        """→ per direction: dx, dw_ih, d_bias, dw_hh, dh0, dc0."""


@runtime_checkable
class PersistentEntries(Protocol):
    """The persistent CUDA kernel's entries (``persistent_forward`` / ``persistent_backward``):
    the step kernel's arguments, then the grid (``blocks``, ``batch_tile``; 0 = automatic)."""

    def persistent_forward(self, spec: int, highway: bool, proj: Tensor, w_hh: Tensor,
                           h0: Tensor, c0: Tensor, batch_sizes: Tensor, rec_mask: Tensor,
                           keep_hin: bool, blocks: int, batch_tile: int) -> List[Tensor]:
        """→ out, h_n, c_n, gates, cs, hin."""

    def persistent_backward(self, spec: int, highway: bool, g_out: Tensor, g_hn: Tensor,
                            g_cn: Tensor, gates: Tensor, cs: Tensor, hin: Tensor, out: Tensor,
                            proj: Tensor, w_hh: Tensor, h0: Tensor, c0: Tensor,
                            batch_sizes: Tensor, rec_mask: Tensor, blocks: int,
                            batch_tile: int) -> List[Tensor]:
        """→ d_proj, d_w_hh, d_h0, d_c0."""


@runtime_checkable
class WeightGrad(Protocol):
    """The CPU kernel's weight-gradient GEMM (``ops.py``: ``weight_grad``)."""

    def weight_grad(self, g: Tensor, x: Tensor) -> Tensor:
        """→ ``g`` (N, out)ᵀ · ``x`` (N, in): the (out, in) weight gradient."""


#: every protocol, for the interface test (``tests/kernels/test_kernel_interface.py``)
PROTOCOLS = (StepKernel, ScanKernel, PipelinedKernel, PersistentEntries, WeightGrad)
