"""The interface every kernel class implements, declared once.

A *step kernel* runs one direction of a layer whose cell reads h_{t-1} from the input
projections; a *scan kernel* runs a layer whose cell reads none.  The run layer calls a kernel
only through these methods (``kernels/autograd.py``: ``plain_layer``, ``pipelined_layer``,
``plain_pair``, ``pipelined_pair``; ``kernels/scan.py``: ``scan_layer`` / ``fused_scan_layer``),
so any class with them can take a kernel's place: the CPU kernel (``ops.CpuKernel``), the CUDA
kernel (``cuda/ops.py``: ``CudaKernel``), its CUDA-graph replay (``cuda/graphs.py``:
``GraphedKernel``) and the persistent CUDA kernel (``cuda/recurrence.py``: ``PersistentKernel``).
The methods' parameters are taken from the schema table (``kernels/schema.py``: ``ENTRIES``,
the operators' arguments, documented in ``kernels/ops.py``), as are the kernel classes', which
forward them by position.

What a kernel can do is declared by the kernel (class attributes), never found by asking which
object it is: ``in_place_gates`` (``plain_forward(..., in_place=True)`` writes the gate
activations into ``proj``, a scratch tensor the caller hands over, instead of a copy),
``scan`` (the scan entry points of this package's calling convention are there) and
``persistent`` (the persistent CUDA kernel is there).
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable

from .schema import entry

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

    plain_forward = entry("plain_forward", doc="→ out, h_n, c_n, gates, cs, hin (``in_place`` "
                                               "only where ``in_place_gates``).")
    plain_backward = entry("plain_backward", doc="→ d_proj, d_w_hh, d_h0, d_c0.")


@runtime_checkable
class ScanKernel(Protocol):
    """``scan_forward`` / ``scan_backward`` of ``ops.py``."""

    scan_forward = entry("scan_forward", doc="→ out, h_n, c_n, cs.")
    scan_backward = entry("scan_backward", doc="→ d_proj, d_c0, d_bias.")


@runtime_checkable
class PipelinedKernel(Protocol):
    """The CPU kernel's entries that take the layer input (the projection inside) and the
    directions of a bidirectional layer at once: ``pipelined_*``, ``plain_directions_forward_`` /
    ``plain_directions_backward`` of ``ops.py`` (lists hold one tensor per direction)."""

    pipelined_forward = entry("pipelined_forward", doc="→ out, h_n, c_n, gates, cs, hin, xo.")
    pipelined_backward = entry("pipelined_backward", doc="→ dx, dw_ih, d_bias, dw_hh, dh0, dc0.")
    plain_directions_forward = entry("plain_directions_forward",
                                     doc="→ per direction: out, h_n, c_n, gates, cs, hin.")
    plain_directions_backward = entry("plain_directions_backward",
                                      doc="→ per direction: d_proj, d_w_hh, d_h0, d_c0.")
    pipelined_directions_forward = entry(
        "pipelined_directions_forward", doc="→ per direction: out, h_n, c_n, gates, cs, hin, xo.")
    pipelined_directions_backward = entry(
        "pipelined_directions_backward", doc="→ per direction: dx, dw_ih, d_bias, dw_hh, dh0, dc0.")


@runtime_checkable
class PersistentEntries(Protocol):
    """The persistent CUDA kernel's entries (``persistent_forward`` / ``persistent_backward``):
    the step kernel's arguments, then the grid (``blocks``, ``batch_tile``; 0 = automatic)."""

    persistent_forward = entry("persistent_forward", doc="→ out, h_n, c_n, gates, cs, hin.")
    persistent_backward = entry("persistent_backward", doc="→ d_proj, d_w_hh, d_h0, d_c0.")


@runtime_checkable
class WeightGrad(Protocol):
    """The CPU kernel's weight-gradient GEMM (``ops.py``: ``weight_grad``)."""

    weight_grad = entry("weight_grad", doc="→ ``g`` (N, out)ᵀ · ``x`` (N, in): the (out, in) "
                                           "weight gradient.")


#: every protocol, for the interface test (``tests/kernels/test_kernel_interface.py``)
PROTOCOLS = (StepKernel, ScanKernel, PipelinedKernel, PersistentEntries, WeightGrad)
