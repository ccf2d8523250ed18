"""The host side of the CUDA kernels: the entry points that the operators' CUDA implementations
call (``plain_forward`` / ``plain_backward``: the step kernel, :mod:`.step`; ``scan_forward`` /
``scan_backward``: the element-wise scan, :mod:`.scan`; ``persistent_forward`` /
``persistent_backward`` / ``persistent_plan``: the persistent kernels, :mod:`.persistent`), with
the arguments and results of the CPU kernel's entry points (``csrc/cpu/layer_plain.cpp``,
``csrc/cpu/scan.cpp``; read their headers for the arguments).  This is the module
:func:`rnn_ablations.kernels.cuda.load` hands to the backend; the input checks and the argument
packing the families share are in :mod:`.common`.

The step loop runs in Python: per step one GEMM through torch (the active rows' h_{t-1} into the
step's preallocated fp32 / float64 pre-activations, fp32 accumulation for the half types,
torch's math-mode flags) and one launch of the NVRTC-compiled element-wise kernel
(:mod:`.driver`, on torch's current stream); the backward is its mirror (one element-wise
launch, then the GEMM for dL/dh_{t-1}), the weight gradient one GEMM after the loop.  No host
synchronisation, no allocation outside torch's caching allocator and no host-to-device copy but
an asynchronous one from pinned memory, so a call can be captured in a CUDA graph
(:mod:`rnn_ablations.kernels.cuda.graphs` replays the whole loop so).  The scan and the
persistent kernels are one launch per call (per 1024 steps for the persistent ones).

Dtypes: float64, float32, bfloat16 and float16; the saved tensors (gates, cs, hin) and the
carried gradients are in the accumulation type (float32 for the half types).

The device type the entry points take is ``common.DEVICE_TYPE``: ``"cuda"``; the tests that run
the host loops on CPU tensors (with a stand-in for :mod:`.driver`) set ``"cpu"``.
"""
from __future__ import annotations

from .common import STRUCTS as _STRUCTS, pack  # noqa: F401  (tests/kernels/test_nvrtc_kernels.py)
from .persistent import persistent_backward, persistent_forward, persistent_plan
from .scan import scan_backward, scan_forward
from .step import plain_backward, plain_forward

__all__ = ["plain_forward", "plain_backward", "scan_forward", "scan_backward", "persistent_forward",
           "persistent_backward", "persistent_plan", "scan_abi", "pack"]

#: the scan entry points' calling convention, under the name the backend reads from every
#: kernel module (rnn_ablations.kernels.ops.scan_built; the CPU kernel's module has it too):
#: it must equal rnn_ablations.kernels.registry.SCAN_ABI
scan_abi = 3
