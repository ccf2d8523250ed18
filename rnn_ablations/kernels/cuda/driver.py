"""The CUDA driver API through ctypes (``libcuda.so.1``, installed with the NVIDIA driver): load
the compiled programs into the current context, look up their entry points, launch them on
torch's current stream (cooperatively for the persistent kernels), and the few device and
occupancy queries the persistent kernels' plan needs.

Every module is loaded into the device's primary context, the one torch's runtime uses: it is
retained once per device for the life of the process (:func:`primary_context`), and a thread
whose current context is another one (none yet: the autograd engine's device threads; another
device's; a context some other library created on the same device) is switched to it before a
load or launch (:func:`_ensure_context`).  Loaded modules are kept per (device, program).
:func:`driver_version`, :func:`device_count` and :func:`compute_capability` answer
``rnn_ablations.kernels.cuda.unavailable_reason`` without initialising torch's CUDA state.

:func:`set_implementation` routes :func:`kernel`, :func:`launch` and :func:`device_attribute`
to another implementation of the execution model (the CPU emulation of the CUDA kernels in
``tests/cuda_emulation``), so that the host loops run unchanged on CPU tensors.
"""
from __future__ import annotations

import ctypes
import threading
from typing import Dict, Optional, Sequence, Tuple

import torch

from . import cache
from .programs import Program

__all__ = ["CudaDriverError", "driver", "driver_error", "Kernel", "kernel", "device_attribute",
           "launch", "launcher", "arch_of", "set_implementation", "primary_context",
           "driver_version", "device_count", "compute_capability"]


class CudaDriverError(RuntimeError):
    """A CUDA driver call failed (the message names the call and the driver's reason)."""


# CUdevice_attribute values (cuda.h)
ATTR_MULTIPROCESSOR_COUNT = 16
ATTR_COMPUTE_CAPABILITY_MAJOR = 75
ATTR_COMPUTE_CAPABILITY_MINOR = 76
ATTR_COOPERATIVE_LAUNCH = 95
ATTR_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97
# CUfunction_attribute
FUNC_ATTR_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8

_lock = threading.Lock()
_lib: Optional[ctypes.CDLL] = None
_error: Optional[str] = None


def driver() -> ctypes.CDLL:
    """``libcuda.so.1`` (``CudaDriverError`` without an NVIDIA driver)."""
    global _lib, _error
    with _lock:
        if _lib is None:
            if _error is not None:
                raise CudaDriverError(_error)
            try:
                lib = ctypes.CDLL("libcuda.so.1")
            except OSError as exc:
                _error = f"the NVIDIA driver's libcuda.so.1 cannot be loaded ({exc})"
                raise CudaDriverError(_error) from None
            _declare(lib)
            code = lib.cuInit(0)
            if code != 0:
                _error = f"the NVIDIA driver could not be initialised (cuInit: error {code})"
                raise CudaDriverError(_error)
            _lib = lib
        return _lib


def _declare(lib: ctypes.CDLL) -> None:
    """The argument types of the calls made here (pointers and sizes at full width)."""
    P, U, I = ctypes.c_void_p, ctypes.c_uint, ctypes.c_int
    PP = ctypes.POINTER(ctypes.c_void_p)
    lib.cuInit.argtypes = [U]
    lib.cuDriverGetVersion.argtypes = [ctypes.POINTER(I)]
    lib.cuDeviceGetCount.argtypes = [ctypes.POINTER(I)]
    lib.cuGetErrorName.argtypes = [I, ctypes.POINTER(ctypes.c_char_p)]
    lib.cuGetErrorString.argtypes = [I, ctypes.POINTER(ctypes.c_char_p)]
    lib.cuCtxGetCurrent.argtypes = [PP]
    lib.cuCtxGetDevice.argtypes = [ctypes.POINTER(I)]
    lib.cuCtxSetCurrent.argtypes = [P]
    lib.cuDeviceGet.argtypes = [ctypes.POINTER(I), I]
    lib.cuDevicePrimaryCtxRetain.argtypes = [PP, I]
    lib.cuDeviceGetAttribute.argtypes = [ctypes.POINTER(I), I, I]
    lib.cuModuleLoadData.argtypes = [PP, P]
    lib.cuModuleGetFunction.argtypes = [PP, P, ctypes.c_char_p]
    lib.cuFuncSetAttribute.argtypes = [P, I, I]
    lib.cuOccupancyMaxActiveBlocksPerMultiprocessor.argtypes = [ctypes.POINTER(I), P, I,
                                                                 ctypes.c_size_t]
    lib.cuLaunchKernel.argtypes = [P, U, U, U, U, U, U, U, P, PP, PP]
    lib.cuLaunchCooperativeKernel.argtypes = [P, U, U, U, U, U, U, U, P, PP]


def driver_error() -> Optional[str]:
    try:
        driver()
    except CudaDriverError as exc:
        return str(exc)
    return None


def _check(code: int, what: str) -> None:
    if code != 0:
        lib = driver()
        name, text = ctypes.c_char_p(), ctypes.c_char_p()
        lib.cuGetErrorName(code, ctypes.byref(name))
        lib.cuGetErrorString(code, ctypes.byref(text))
        raise CudaDriverError(f"rnn_ablations CUDA kernel: {what} failed: "
                              f"{(name.value or b'').decode()} ({code}): "
                              f"{(text.value or b'').decode()}")


#: device ordinal -> its primary context (CUcontext), retained once for the process
_primary: Dict[int, int] = {}
_primary_lock = threading.Lock()


def primary_context(device: int) -> int:
    """The primary context of ``device`` (torch's), retained on first use and kept: one
    ``cuDevicePrimaryCtxRetain`` per device and process, whatever the number of threads."""
    got = _primary.get(device)
    if got is None:
        lib = driver()
        with _primary_lock:
            got = _primary.get(device)
            if got is None:
                dev = ctypes.c_int()
                _check(lib.cuDeviceGet(ctypes.byref(dev), device), f"cuDeviceGet({device})")
                ctx = ctypes.c_void_p()
                _check(lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev),
                       f"cuDevicePrimaryCtxRetain(device {device})")
                got = _primary[device] = ctx.value
    return got


def _ensure_context(device: int) -> None:
    """Make the primary context of ``device`` current on this thread, unless it is already:
    a thread with no context, another device's, or another context of the same device (where
    the modules loaded in the primary context do not exist) is switched."""
    want = primary_context(device)
    lib = driver()
    ctx = ctypes.c_void_p()
    _check(lib.cuCtxGetCurrent(ctypes.byref(ctx)), "cuCtxGetCurrent")
    if ctx.value != want:
        _check(lib.cuCtxSetCurrent(ctypes.c_void_p(want)),
               f"cuCtxSetCurrent(primary context of device {device})")


def driver_version() -> int:
    """The CUDA version the installed driver supports, as ``cuDriverGetVersion`` gives it
    (1000 x major + 10 x minor: 12040 is CUDA 12.4)."""
    lib = driver()
    out = ctypes.c_int()
    _check(lib.cuDriverGetVersion(ctypes.byref(out)), "cuDriverGetVersion")
    return out.value


def device_count() -> int:
    """The CUDA devices this process sees (``CUDA_VISIBLE_DEVICES`` applied)."""
    lib = driver()
    out = ctypes.c_int()
    _check(lib.cuDeviceGetCount(ctypes.byref(out)), "cuDeviceGetCount")
    return out.value


def compute_capability(device: int) -> int:
    """Compute capability of ``device`` as an integer (9.0 -> 90), from the driver (no torch
    CUDA initialisation)."""
    lib = driver()
    major, minor = ctypes.c_int(), ctypes.c_int()
    _check(lib.cuDeviceGetAttribute(ctypes.byref(major), ATTR_COMPUTE_CAPABILITY_MAJOR, device),
           "cuDeviceGetAttribute(compute capability)")
    _check(lib.cuDeviceGetAttribute(ctypes.byref(minor), ATTR_COMPUTE_CAPABILITY_MINOR, device),
           "cuDeviceGetAttribute(compute capability)")
    return major.value * 10 + minor.value


#: an alternative implementation of kernel(), launch() and device_attribute(), or None (libcuda)
_implementation = None


def set_implementation(impl):
    """Route :func:`kernel`, :func:`launch` and :func:`device_attribute` to ``impl`` (an object
    with methods of those names and arguments; its kernels answer ``allow_shared_memory`` and
    ``resident_blocks_per_sm`` as :class:`Kernel` does), or back to the CUDA driver with
    ``None``.  Returns the implementation installed before, to restore it."""
    global _implementation
    if impl is not None:
        missing = [n for n in ("kernel", "launch", "device_attribute") if not hasattr(impl, n)]
        if missing:
            raise TypeError(f"set_implementation: {type(impl).__name__} lacks {missing}; an "
                            "implementation provides kernel(prog, device), launch(k, args, grid, "
                            "block, smem, cooperative) and device_attribute(attr, device)")
    previous, _implementation = _implementation, impl
    return previous


def device_attribute(attr: int, device: int) -> int:
    if _implementation is not None:
        return _implementation.device_attribute(attr, device)
    lib = driver()
    out = ctypes.c_int()
    _check(lib.cuDeviceGetAttribute(ctypes.byref(out), attr, device), "cuDeviceGetAttribute")
    return out.value


_arch: Dict[int, int] = {}


def arch_of(device: int) -> int:
    """Compute capability of ``device`` as an integer (9.0 -> 90)."""
    got = _arch.get(device)
    if got is None:
        major, minor = torch.cuda.get_device_capability(device)
        got = _arch[device] = major * 10 + minor
    return got


class Kernel:
    """One loaded entry point (``CUfunction``) of a program on one device."""

    def __init__(self, prog: Program, device: int):
        self.prog, self.device = prog, device
        binary = cache.binary(prog, arch_of(device))
        _ensure_context(device)
        lib = driver()
        self._module = ctypes.c_void_p()
        self._image = ctypes.create_string_buffer(binary.data + (b"\0" if binary.kind == "ptx"
                                                                 else b""))
        _check(lib.cuModuleLoadData(ctypes.byref(self._module), self._image),
               f"cuModuleLoadData({prog.name})")
        self.function = ctypes.c_void_p()
        _check(lib.cuModuleGetFunction(ctypes.byref(self.function), self._module,
                                       binary.lowered.encode()),
               f"cuModuleGetFunction({prog.name})")
        self._smem_limit = 0
        self._occupancy: Dict[Tuple[int, int], int] = {}

    def allow_shared_memory(self, nbytes: int) -> None:
        """Let a launch use ``nbytes`` of dynamic shared memory (above the default 48 KiB)."""
        if nbytes > self._smem_limit:
            _ensure_context(self.device)
            _check(driver().cuFuncSetAttribute(self.function,
                                               FUNC_ATTR_MAX_DYNAMIC_SHARED_SIZE_BYTES, nbytes),
                   f"cuFuncSetAttribute({self.prog.name}, {nbytes} bytes of shared memory)")
            self._smem_limit = nbytes

    def resident_blocks_per_sm(self, threads: int, smem: int) -> int:
        """Blocks of ``threads`` threads with ``smem`` bytes of dynamic shared memory that fit on
        one SM at once (cached per shape: a recorded call makes no driver query)."""
        key = (threads, smem)
        got = self._occupancy.get(key)
        if got is None:
            _ensure_context(self.device)
            n = ctypes.c_int()
            _check(driver().cuOccupancyMaxActiveBlocksPerMultiprocessor(
                ctypes.byref(n), self.function, threads, smem),
                "cuOccupancyMaxActiveBlocksPerMultiprocessor")
            got = self._occupancy[key] = n.value
        return got


_kernels: Dict[Tuple[int, Program], Kernel] = {}


def kernel(prog: Program, device: int) -> Kernel:
    """``prog`` loaded on ``device`` (compiled or read from the cache on first use)."""
    if _implementation is not None:
        return _implementation.kernel(prog, device)
    key = (device, prog)
    got = _kernels.get(key)
    if got is None:
        with _lock:
            got = _kernels.get(key)
        if got is None:
            got = Kernel(prog, device)
            with _lock:
                got = _kernels.setdefault(key, got)
    return got


def params_of(args: Sequence[ctypes._SimpleCData]) -> ctypes.Array:
    """The ``kernelParams`` array of a launch: the addresses of ``args`` (which must outlive
    it; a step loop changes their values in place and launches with the same array)."""
    return (ctypes.c_void_p * len(args))(*[ctypes.addressof(a) for a in args])


def launch(k: Kernel, args, grid: int, block: int, smem: int = 0,
           cooperative: bool = False) -> None:
    """Launch ``k`` on torch's current stream of its device with ``args``: the packed
    arguments (ctypes values and Structures, in the kernel's parameter order) or their
    :func:`params_of` array."""
    if _implementation is not None:
        return _implementation.launch(k, args, grid, block, smem, cooperative)
    _ensure_context(k.device)
    params = args if isinstance(args, ctypes.Array) else params_of(args)
    stream = ctypes.c_void_p(torch.cuda.current_stream(k.device).cuda_stream)
    lib = driver()
    if cooperative:
        code = lib.cuLaunchCooperativeKernel(k.function, grid, 1, 1, block, 1, 1, smem, stream,
                                             params)
    else:
        code = lib.cuLaunchKernel(k.function, grid, 1, 1, block, 1, 1, smem, stream, params,
                                  None)
    _check(code, f"{'cuLaunchCooperativeKernel' if cooperative else 'cuLaunchKernel'}"
                 f"({k.prog.name}, grid {grid}, block {block}, shared memory {smem})")


_LAUNCH = launch  # the real launch (a stand-in driver of the tests replaces ``launch``)


def launcher(k: Kernel, cooperative: bool = False):
    """``go(args, grid, block, smem=0)``: :func:`launch` of ``k`` with what does not change
    between the launches of one call resolved once (the context made current, the driver
    library, torch's current stream of ``k``'s device), so that a step loop makes one driver
    call per step.  Resolve it inside the call (the stream is the one current then), not across
    calls.  With an implementation installed (:func:`set_implementation`) or a stand-in for
    :func:`launch` or :func:`kernel` (the CPU tests of the host loops), each call goes through
    :func:`launch`."""
    if _implementation is not None or launch is not _LAUNCH or type(k) is not Kernel:
        stand_in = launch

        def go_through(args, grid: int, block: int, smem: int = 0) -> None:
            stand_in(k, args, grid, block, smem, cooperative)
        return go_through
    _ensure_context(k.device)
    lib = driver()
    stream = ctypes.c_void_p(torch.cuda.current_stream(k.device).cuda_stream)
    function = k.function
    name = "cuLaunchCooperativeKernel" if cooperative else "cuLaunchKernel"
    call = lib.cuLaunchCooperativeKernel if cooperative else lib.cuLaunchKernel

    def go(args, grid: int, block: int, smem: int = 0) -> None:
        params = args if isinstance(args, ctypes.Array) else params_of(args)
        if cooperative:
            code = call(function, grid, 1, 1, block, 1, 1, smem, stream, params)
        else:
            code = call(function, grid, 1, 1, block, 1, 1, smem, stream, params, None)
        if code != 0:
            _check(code, f"{name}({k.prog.name}, grid {grid}, block {block}, shared memory "
                         f"{smem})")
    return go
