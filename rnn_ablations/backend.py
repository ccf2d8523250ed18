"""Which implementation runs a layer: the compiled kernels (loaded here), the backend switch
(``auto`` / ``kernel`` / ``generic``) and the CPU kernel's vector path.

The compiled CPU kernel ``rnn_ablations._C`` runs CPU tensors of dtype float32/float64; the CUDA
kernel ``rnn_ablations._C_cuda`` (built only with a CUDA torch and nvcc; its step loops are
replayed as CUDA graphs, see :mod:`rnn_ablations.cuda_graphs`) runs CUDA float32/float64/
bfloat16/float16 (also under ``torch.autocast("cuda")``).  Everything else (half precision on the
CPU, other devices, an install without the extension, ``RNN_ABLATIONS_DISABLE_KERNEL=1``) takes
the generic path, which computes the same function.  :func:`set_backend` forces one path (the
tests use it to compare them).
"""
from __future__ import annotations

import contextlib
import importlib
import os
import warnings
from typing import Optional

import torch

from . import cuda_graphs
from . import _kernel_loader

__all__ = ["kernel_available", "cuda_kernel_available", "set_backend", "get_backend",
           "use_backend", "kernel_isa", "supported_kernel_isas", "set_kernel_isa",
           "use_kernel_isa"]

# The CPU kernel: built at install time, or compiled on first use and cached (_kernel_loader).
_C, _KERNEL_ERROR, _KERNEL_SOURCE = _kernel_loader.load_cpu_kernel()
if _C is not None:
    # RNN_ABLATIONS_ISA names the vector path; a bad value fails here, at import, not mid-run.
    _C.kernel_isa()

try:  # pragma: no cover - built only with a CUDA build of torch and nvcc (see setup.py)
    _C_cuda = importlib.import_module(__package__ + "._C_cuda")
    _CUDA_KERNEL_ERROR: Optional[str] = None
except ImportError as exc:  # pragma: no cover
    _C_cuda = None
    _CUDA_KERNEL_ERROR = (f"{exc}; it is built by `pip install --no-build-isolation -e .` when "
                          "torch is a CUDA build and CUDA's compiler is found")

_BACKENDS = ("auto", "kernel", "generic")
_backend = "generic" if os.environ.get("RNN_ABLATIONS_DISABLE_KERNEL") == "1" else "auto"
# Without a CPU kernel the loader has warned already (or RNN_ABLATIONS_NO_KERNEL asked for that).
_warned = set() if _C is not None else {"CPU"}


def kernel_available() -> bool:
    """True when the compiled CPU kernel could be imported."""
    return _C is not None


def kernel_isa() -> Optional[str]:
    """The vector code the CPU kernel runs: ``"avx512"`` (AVX-512F: the packed step GEMM in
    8 x 32 register tiles and the element-wise pass in 512-bit registers), ``"avx2"`` (AVX2 +
    FMA, 4 x 24 tiles, 256-bit) or ``"portable"`` (the build's baseline; the step GEMM is ATen's);
    ``None`` without a kernel.  Chosen at run time from the CPU (cpuid, and whether the OS saves
    the registers), not from the machine that compiled it, or by
    ``RNN_ABLATIONS_ISA=avx512|avx2|portable``; :func:`set_kernel_isa` switches it.  The test
    path ``"emulated_avx512"`` runs the AVX-512 path's GEMM blocking with AVX2 instructions."""
    return _C.kernel_isa() if _C is not None else None


def supported_kernel_isas() -> list:
    """The vector paths this CPU and build can run, best first (empty without a kernel)."""
    return list(_C.supported_isas()) if _C is not None else []


def set_kernel_isa(name: str) -> None:
    """Use the vector path ``"avx512"``, ``"avx2"``, ``"portable"`` or ``"auto"`` (the best this
    CPU supports), or the test path ``"emulated_avx512"`` (see :func:`kernel_isa`).
    Raises ``ValueError`` for a name this CPU/build cannot run, ``RuntimeError`` without a kernel."""
    if _C is None:
        raise RuntimeError(f"no compiled CPU kernel: {_KERNEL_ERROR}")
    try:
        _C.set_kernel_isa(name)
    except RuntimeError as exc:
        raise ValueError(str(exc).splitlines()[0]) from None


@contextlib.contextmanager
def use_kernel_isa(name: str):
    """Context manager form of :func:`set_kernel_isa` (restores the previous path)."""
    old = kernel_isa()
    set_kernel_isa(name)
    try:
        yield
    finally:
        set_kernel_isa(old)


def cuda_kernel_available() -> bool:
    """True when the compiled CUDA kernel could be imported."""
    return _C_cuda is not None


def set_backend(name: str) -> None:
    """``"auto"`` (a compiled kernel where one applies), ``"kernel"`` (required: an error for
    tensors no kernel handles) or ``"generic"``."""
    global _backend
    if name not in _BACKENDS:
        raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(_BACKENDS)}")
    if name == "kernel" and _C is None and _C_cuda is None:
        raise RuntimeError(
            "no compiled kernel is available (CPU: "
            f"{_KERNEL_ERROR}; CUDA: {_CUDA_KERNEL_ERROR})"
        )
    _backend = name


def get_backend() -> str:
    return _backend


@contextlib.contextmanager
def _temporarily(setter, getter, value: str):
    old = getter()
    setter(value)
    try:
        yield
    finally:
        setter(old)


def use_backend(name: str):
    """Context manager: :func:`set_backend` inside the ``with`` block, restored after it."""
    return _temporarily(set_backend, get_backend, name)


def _unavailable(device: str, error: Optional[str]) -> None:
    if _backend == "kernel":
        raise RuntimeError(f"the rnn_ablations {device} kernel is not available: {error}")
    if device not in _warned:
        warnings.warn(f"rnn_ablations: compiled {device} kernel unavailable ({error}); using the "
                      "slower generic path")
        _warned.add(device)


def _plain_kernel(t: torch.Tensor):
    """The compiled module (``_C`` on CPU, ``_C_cuda`` on CUDA) whose ``forward``/``backward``
    run a layer from its input projections, or ``None`` for the generic path."""
    if _backend == "generic":
        return None
    if t.device.type == "cpu" and t.dtype in (torch.float32, torch.float64):
        if _C is None:
            _unavailable("CPU", _KERNEL_ERROR)
        return _C
    if t.device.type == "cuda" and t.dtype in _CUDA_DTYPES:
        if _C_cuda is None:
            _unavailable("CUDA", _CUDA_KERNEL_ERROR)
            return None
        return _graphed_cuda if cuda_graphs.get_cuda_graphs() else _C_cuda
    if _backend == "kernel":
        raise RuntimeError(f"the rnn_ablations kernels handle CPU float32/float64 and CUDA "
                           f"float32/float64/bfloat16/float16, got {t.device} {t.dtype}; use the "
                           "generic backend")
    return None


_CUDA_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
#: ``_C_cuda`` behind CUDA-graph replay (same entry points)
_graphed_cuda = cuda_graphs.GraphedKernel(_C_cuda) if _C_cuda is not None else None


def _cuda_autocast_dtype(t: torch.Tensor) -> Optional[torch.dtype]:
    """The autocast dtype when ``t`` is a CUDA tensor inside ``torch.autocast("cuda")``."""
    if t.device.type != "cuda":
        return None
    try:
        on = torch.is_autocast_enabled("cuda")
        dtype = torch.get_autocast_dtype("cuda") if on else None
    except TypeError:  # pragma: no cover - torch < 2.4
        on = torch.is_autocast_enabled()
        dtype = torch.get_autocast_gpu_dtype() if on else None
    return dtype


def autocast_like(proj: torch.Tensor, *tensors: Optional[torch.Tensor]):
    """Under ``torch.autocast("cuda")`` the input projection comes out in the autocast dtype
    (F.linear is on its lower-precision list); the recurrence then runs in that dtype too, as
    cuDNN's LSTM does under autocast: ``tensors`` (recurrent weight, states, mask; ``None``
    passes through) are cast to it, differentiably, so their gradients flow back to the float32
    parameters.  Outside CUDA autocast they are returned as they are."""
    if _cuda_autocast_dtype(proj) is None:
        return tensors
    return tuple(None if t is None else t.to(proj.dtype) for t in tensors)


def _kernel_applies(t: torch.Tensor) -> bool:
    """True when the CPU kernel (and so also its pipelined schedule) runs ``t``."""
    return t.device.type == "cpu" and _plain_kernel(t) is not None
