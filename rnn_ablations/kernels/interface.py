"""The interface every kernel class implements, declared once.

A *step kernel* runs one direction of a layer whose cell reads h_{t-1} from the input
projections; a *scan kernel* runs a layer whose cell reads none.  The run layer calls a kernel
only through these methods (``kernel_autograd.plain_layer``, ``scan.scan_layer`` /
``scan.fused_scan_layer``), so any class with them can take a kernel's place: the CPU kernel
(``ops.CpuKernel``), the CUDA kernel (``ops_cuda.CudaKernel``), its CUDA-graph replay
(``cuda_graphs.GraphedKernel``) and the persistent CUDA kernel
(``cuda_recurrence.PersistentKernel``).  The arguments and results are those of the operators
documented in ``rnn_ablations/kernels/ops.py``.
"""
from __future__ import annotations

from typing import List, Optional, Protocol, runtime_checkable

from torch import Tensor

__all__ = ["StepKernel", "ScanKernel", "PipelinedKernel"]


@runtime_checkable
class StepKernel(Protocol):
    """``plain_forward`` / ``plain_backward`` of ``ops.py``."""

    def plain_forward(self, spec: int, highway: bool, proj: Tensor, w_hh: Tensor, h0: Tensor,
                c0: Tensor, batch_sizes: Tensor, rec_mask: Tensor,
                keep_hin: bool) -> List[Tensor]:
        """→ out, h_n, c_n, gates, cs, hin."""

    def plain_backward(self, spec: int, highway: bool, g_out: Tensor, g_hn: Tensor, g_cn: Tensor,
                 gates: Tensor, cs: Tensor, hin: Tensor, out: Tensor, proj: Tensor, w_hh: Tensor,
                 h0: Tensor, c0: Tensor, batch_sizes: Tensor,
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
    ``plain_directions_backward`` of ``ops.py``."""

    def pipelined_forward(self, *args) -> List[Tensor]: ...

    def pipelined_backward(self, *args) -> List[Tensor]: ...

    def plain_directions_forward(self, *args, **kwargs) -> List[List[Tensor]]: ...

    def plain_directions_backward(self, *args) -> List[List[Tensor]]: ...

    def pipelined_directions_forward(self, *args) -> List[List[Tensor]]: ...

    def pipelined_directions_backward(self, *args) -> List[List[Tensor]]: ...
