"""The compiled kernels (loaded here, by the first call that needs them: not by the import) and
what they can run: :func:`kernels` describes to the run plan what this process has
(:class:`Kernels`).

The compiled CPU kernel ``rnn_ablations._C`` runs CPU tensors of dtype float32/float64; the CUDA
kernels (compiled at first use by NVRTC, :mod:`rnn_ablations.kernels.cuda`; their step loops replayed as CUDA graphs, see
:mod:`rnn_ablations.kernels.cuda.graphs`) run CUDA float32/float64/bfloat16/float16 (also under
``torch.autocast("cuda")``).  Everything else (half precision on the CPU, other devices, an
install without the extension, ``RNN_ABLATIONS_NO_KERNEL=1``) takes the generic path, which
computes the same function.  Which path a call takes is decided by
:func:`rnn_ablations.plan.plan_layer`.  The process-wide effects of the settings that concern
the kernels (the CPU kernel's vector path, freeing the recorded CUDA graphs) and the check that
``backend="kernel"`` has a kernel are registered here with :mod:`rnn_ablations.settings`.
"""
from __future__ import annotations

import dataclasses
import functools
import threading
import warnings
from typing import Optional

import torch

from .. import settings
from ..settings import process_options
from . import cuda as _cuda_kernels
from . import loader, ops
from .cuda import graphs as cuda_graphs, ops as ops_cuda
from .autocast import autocast_dtype, autocast_like  # noqa: F401  (read here by the run layer)

__all__ = ["kernel_available", "cuda_kernel_available", "kernel_isa", "supported_kernel_isas",
           "kernels", "Kernels", "onednn_usable", "cpu_kernel", "cpu_kernel_error",
           "cpu_kernel_source", "cuda_kernel", "cuda_kernel_error", "graphed_cuda_kernel"]

# The kernels are loaded by the first call that asks for them (a layer call's plan, an accessor
# below, ``rnn-ablations kernels build``), not by the import: ``import rnn_ablations`` and the
# commands that run no layer never load or compile them.  Until then the globals ``_C``,
# ``_KERNEL_ERROR``, ``_KERNEL_SOURCE`` (the CPU kernel: built at install time, or compiled on
# first use and cached, kernels/loader.py) and ``_C_cuda``, ``_CUDA_KERNEL_ERROR`` (the CUDA
# kernels' entry points, compiled at first use by NVRTC, rnn_ablations.kernels.cuda) are absent;
# reading one from outside (``registry._C``, ``monkeypatch.setattr(registry, "_C", ...)``) loads
# that kernel first (the module ``__getattr__`` below).  Inside this module they are read through
# ``_cpu()`` / ``_cuda()``.
_load_lock = threading.RLock()
#: which kernels this process has loaded (set after their globals, under ``_load_lock``)
_loaded = {"cpu": False, "cuda": False}
_CPU_GLOBALS = ("_C", "_KERNEL_ERROR", "_KERNEL_SOURCE")
_CUDA_GLOBALS = ("_C_cuda", "_CUDA_KERNEL_ERROR")


def load_cpu_kernel(report: bool = True, retry_failed: bool = False) -> None:
    """Load the CPU kernel once per process (thread-safe; a concurrent caller waits): the module
    installed with the package, the cached one, or a first-use build (kernels/loader.py: with
    its messages and its lock between processes).  Called by every reader of the kernel;
    ``report`` and ``retry_failed`` are the loader's (``rnn-ablations kernels build`` says a
    failure itself, and tries again where a build failed before)."""
    global _C, _KERNEL_ERROR, _KERNEL_SOURCE
    if _loaded["cpu"]:
        return
    with _load_lock:
        if _loaded["cpu"]:
            return
        module, error, source = loader.load_cpu_kernel(report=report, retry_failed=retry_failed)
        kernel = None
        if module is not None:
            # its computing entry points as registered operators, with the module's calling
            # convention
            kernel = ops.CpuKernel(module)
        else:
            # the loader has warned (or RNN_ABLATIONS_NO_KERNEL / RNN_ABLATIONS_DISABLE_KERNEL
            # asked for that): the plan's fallback warning is not repeated
            with _warn_lock:
                _warned.update(("CPU", "CPU scan"))
        _C, _KERNEL_ERROR, _KERNEL_SOURCE = kernel, error, source
        _loaded["cpu"] = True
        if kernel is not None:
            # the kernel_isa default (RNN_ABLATIONS_ISA): a path this CPU lacks fails here,
            # at the kernel's first use
            apply_kernel_isa(process_options().kernel_isa)


def load_cuda_kernel() -> None:
    """Find the CUDA kernels once per process (thread-safe): their entry points, or why they are
    not in use (no CUDA in torch, no device, no NVRTC or driver, the switch).  Nothing is
    compiled here (each NVRTC program is compiled by the first call that needs it)."""
    global _C_cuda, _CUDA_KERNEL_ERROR
    if _loaded["cuda"]:
        return
    with _load_lock:
        if _loaded["cuda"]:
            return
        raw, error = _cuda_kernels.load()
        # their computing entry points as operators (CUDA implementations of the CPU kernel's)
        _C_cuda = ops_cuda.CudaKernel(raw) if raw is not None else None
        _CUDA_KERNEL_ERROR = error
        _loaded["cuda"] = True


def _cpu():
    """The CPU kernel (loaded on the first call), or ``None``."""
    if not _loaded["cpu"]:
        load_cpu_kernel()
    return _C


def _cuda():
    """The CUDA kernel (found on the first call), or ``None``."""
    if not _loaded["cuda"]:
        load_cuda_kernel()
    return _C_cuda


def __getattr__(name: str):
    """``registry._C`` and the other kernel globals, read (or monkeypatched) from outside before
    the first use: load that kernel, then answer."""
    if name in _CPU_GLOBALS:
        load_cpu_kernel()
    elif name in _CUDA_GLOBALS:
        load_cuda_kernel()
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return globals()[name]


def cpu_kernel_loaded() -> bool:
    """Whether this process has loaded (or tried to load) the CPU kernel: false until a layer
    call, an accessor or ``rnn-ablations kernels build`` asks for it."""
    return _loaded["cpu"]


# Warned once per kind (``Plan.warning``); without a CPU kernel the loader has warned already.
_warned = set()
_warn_lock = threading.Lock()


def apply_kernel_isa(name: str) -> None:
    """Switch the CPU kernel's vector path (the ``kernel_isa`` setting; called by
    :func:`rnn_ablations.set_options`).  ``ValueError`` for a path this CPU/build cannot run,
    ``RuntimeError`` for a named path without a kernel."""
    kernel = _cpu()
    if kernel is None:
        if name == "auto":
            return
        raise RuntimeError(f"kernel_isa={name!r}: there is no compiled CPU kernel ({_KERNEL_ERROR})")
    try:
        kernel.set_kernel_isa(name)
    except RuntimeError as exc:
        raise ValueError(str(exc).splitlines()[0]) from None


def require_a_kernel() -> None:
    """``RuntimeError`` when no compiled kernel is available (``backend="kernel"`` needs one)."""
    if _cpu() is None and _cuda() is None:
        raise RuntimeError("backend='kernel': no compiled kernel is available (CPU: "
                           f"{_KERNEL_ERROR}; CUDA: {_CUDA_KERNEL_ERROR})")


def _check_settings(given) -> None:
    if given.get("backend") == "kernel":
        require_a_kernel()


def _process_change(old, new) -> None:
    if new.kernel_isa != old.kernel_isa:
        apply_kernel_isa(new.kernel_isa)
    if not new.cuda_graphs and old.cuda_graphs:
        cuda_graphs.clear_graphs()  # off for the process: free the recorded graphs


settings.on_check(_check_settings)
settings.on_process_change(_process_change)


#: the scan entry points' calling convention this package speaks (``ops.SCAN_ABI``)
SCAN_ABI = ops.SCAN_ABI


def _can(kernel, capability: str) -> bool:
    """What the kernel object declares (``kernels/interface.py``: ``scan``, ``persistent``)."""
    return kernel is not None and bool(getattr(kernel, capability, False))


def cpu_kernel():
    """The CPU kernel (``ops.CpuKernel``), or ``None`` (why: :func:`cpu_kernel_error`); the
    first call loads it (:func:`load_cpu_kernel`)."""
    return _cpu()


def cpu_kernel_error() -> Optional[str]:
    """Why there is no CPU kernel (``None`` when there is one)."""
    return _KERNEL_ERROR if _cpu() is None else None


def cpu_kernel_source() -> Optional[str]:
    """Where the CPU kernel was loaded from (``"installed"``, ``"cache"``, ``"compiled"``), or
    ``None`` without one."""
    return _KERNEL_SOURCE if _cpu() is not None else None


def cuda_kernel():
    """The CUDA kernel (``ops_cuda.CudaKernel``), or ``None`` (why: :func:`cuda_kernel_error`)."""
    return _cuda()


def cuda_kernel_error() -> Optional[str]:
    """Why the CUDA kernels are not in use (``None`` when they are)."""
    return _CUDA_KERNEL_ERROR if _cuda() is None else None


def graphed_cuda_kernel():
    """The CUDA kernel behind CUDA-graph replay (``cuda_graphs.GraphedKernel``, same entry
    points; one per process, so its recorded graphs are reused), or ``None``."""
    global _graphed_cuda
    cuda = _cuda()
    if cuda is None:
        return None
    if _graphed_cuda is None or _graphed_cuda.ext is not cuda:
        _graphed_cuda = cuda_graphs.GraphedKernel(cuda)
    return _graphed_cuda


@dataclasses.dataclass(frozen=True)
class Kernels:
    """What this process has compiled (``registry.kernels()`` fills it in; tests make their own).

    cpu / cuda: the step kernels; cpu_scan / cuda_scan: the scan kernels (the bias inside, so
    that the projection, the scan and the backward are one node); persistent:
    the persistent CUDA kernel is in the build; onednn: torch's oneDNN linear works here;
    isa: the CPU kernel's vector path in use; cpu_error / cuda_error: why a kernel is missing;
    cpu_vendor: the CPU's maker, ``"intel"``, ``"amd"`` or ``None`` (:func:`cpu_vendor`: the
    GEMM libraries' speeds differ by vendor, which the plan's oneDNN threshold reads);
    bf16_gemm: the CPU has bfloat16 GEMM instructions (AVX512-BF16 or AMX:
    :func:`cpu_has_bf16_gemm`), which ``Policy.bf16_gemm`` / ``bf16_step_gemm`` ``"auto"`` read.
    Everything the plan knows of the machine is here, so that a plan is a function of its
    arguments."""

    cpu: bool = False
    cuda: bool = False
    cpu_scan: bool = False
    cuda_scan: bool = False
    persistent: bool = False
    onednn: bool = False
    isa: Optional[str] = None
    cpu_error: str = "not built"
    cuda_error: str = "not built"
    cpu_vendor: Optional[str] = None
    bf16_gemm: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash(dataclasses.astuple(self)))

    def __hash__(self) -> int:  # hashed once: part of the plan cache's key on every call
        return self._hash



def onednn_usable() -> bool:
    """Whether oneDNN's linear runs here (probed once, on tiny real tensors; the probe is never
    recorded by ``torch.jit.trace`` and runs outside the fake-tensor and tracing modes of
    ``torch.export``, either of which may be what makes the first layer call)."""
    if _onednn_state["ok"] is None:
        from torch.utils._python_dispatch import _disable_current_modes

        ok = False
        tracing = torch._C._get_tracing_state()
        torch._C._set_tracing_state(None)
        try:
            with _disable_current_modes():
                if (torch.backends.mkldnn.is_available()
                        and hasattr(torch.ops.mkldnn, "_linear_pointwise")):
                    a = torch.ones(2, 3)
                    y = torch.ops.mkldnn._linear_pointwise(a, torch.ones(4, 3), torch.zeros(4),
                                                           "none", [], "")
                    ok = bool(torch.allclose(y, torch.full((2, 4), 3.0)))
        except Exception:  # pragma: no cover - builds without oneDNN
            ok = False
        finally:
            torch._C._set_tracing_state(tracing)
        _onednn_state["ok"] = ok
    return _onednn_state["ok"]


_onednn_state = {"ok": None}


@functools.lru_cache(maxsize=1)
def cpu_vendor() -> Optional[str]:
    """The CPU's maker as ``/proc/cpuinfo`` names it: ``"intel"`` (GenuineIntel), ``"amd"``
    (AuthenticAMD), or ``None`` (another maker, or no ``/proc/cpuinfo``); read once."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "vendor_id":
                    return {"GenuineIntel": "intel", "AuthenticAMD": "amd"}.get(value.strip())
    except OSError:
        pass
    return None


def cpu_has_bf16_gemm() -> bool:
    """The CPU has bfloat16 GEMM instructions (AVX512-BF16 or AMX), which oneDNN uses for a
    bfloat16 ``F.linear``; elsewhere a bfloat16 GEMM is emulated and float32 is faster."""
    cpu = torch.cpu
    return bool(getattr(cpu, "_is_amx_tile_supported", lambda: False)()
                or getattr(cpu, "_is_avx512_bf16_supported", lambda: False)())


_kernels_cache = {}


def kernels() -> Kernels:
    """What this process has compiled, for :func:`rnn_ablations.plan.plan_layer`."""
    cpu, cuda = _cpu(), _cuda()
    isa = cpu.kernel_isa() if cpu is not None else None
    key = (id(cpu), id(cuda), isa)
    got = _kernels_cache.get(key)
    if got is None:
        scan_why = ("the compiled extension has no scan kernels of this version (scan_abi "
                    f"{SCAN_ABI}): rebuild it "
                    "(`pip install --no-build-isolation -e .`)")
        got = Kernels(
            cpu=cpu is not None, cuda=cuda is not None,
            cpu_scan=_can(cpu, "scan"), cuda_scan=_can(cuda, "scan"),
            persistent=_can(cuda, "persistent"), onednn=onednn_usable(), isa=isa,
            cpu_error=_KERNEL_ERROR if cpu is None else scan_why,
            cuda_error=_CUDA_KERNEL_ERROR if cuda is None else scan_why,
            cpu_vendor=cpu_vendor(), bf16_gemm=cpu_has_bf16_gemm())
        _kernels_cache.clear()
        _kernels_cache[key] = got
    return got


def warn_once(plan, stacklevel: int = 6) -> None:
    """Show ``plan.warning`` (the auto backend fell back to the generic path), once per kind;
    ``stacklevel`` as ``warnings.warn`` counts it from here (the default: from
    ``plan._plan_of``, to the line of the user's code that called the module)."""
    if plan.warning is None:
        return
    kind, message = plan.warning
    with _warn_lock:
        if kind in _warned:
            return
        _warned.add(kind)
    warnings.warn(message, stacklevel=stacklevel)


def kernel_available() -> bool:
    """True when the compiled CPU kernel could be loaded (the first call loads it, compiling it
    on first use when the install did not: :func:`load_cpu_kernel`)."""
    return _cpu() is not None


def cuda_kernel_available() -> bool:
    """True when the compiled CUDA kernel could be imported."""
    return _cuda() is not None


def kernel_isa() -> Optional[str]:
    """The vector code the CPU kernel runs: ``"avx512"`` (AVX-512F: the packed step GEMM in
    8 x 32 register tiles and the element-wise pass in 512-bit registers), ``"avx2"`` (AVX2 +
    FMA, 4 x 24 tiles, 256-bit) or ``"portable"`` (the build's baseline; the step GEMM is ATen's);
    ``None`` without a kernel.  The ``kernel_isa`` setting chooses it (``"auto"``: the best this
    CPU runs, from cpuid and whether the OS saves the registers, not from the machine that
    compiled it); the test path ``"emulated_avx512"`` runs the AVX-512 path's GEMM blocking with
    AVX2 instructions."""
    cpu = _cpu()
    return cpu.kernel_isa() if cpu is not None else None


def supported_kernel_isas() -> list:
    """The vector paths this CPU and build can run, best first (empty without a kernel)."""
    cpu = _cpu()
    return list(cpu.supported_isas()) if cpu is not None else []


#: ``_C_cuda`` behind CUDA-graph replay (:func:`graphed_cuda_kernel`)
_graphed_cuda = None
