"""The CUDA driver API through ctypes (``libcuda.so.1``, installed with the NVIDIA driver): load
the compiled programs into the current context, look up their entry points, launch them on
torch's current stream (cooperatively for the persistent kernels), and the few device and
occupancy queries the persistent kernels' plan needs.

torch owns the context (the device's primary context, made current by torch's runtime calls);
a thread that has none current yet (the autograd engine's device threads) gets the primary
context of torch's current device.  Loaded modules are kept per (device, program).
"""
from __future__ import annotations

import ctypes
import threading
from typing import Dict, Optional, Sequence, Tuple

import torch

from . import cache
from .programs import Program

__all__ = ["CudaDriverError", "driver", "driver_error", "Kernel", "kernel", "device_attribute",
           "launch", "arch_of"]


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


def _ensure_context(device: int) -> None:
    """Make the primary context of ``device`` current on this thread (torch's context)."""
    lib = driver()
    ctx = ctypes.c_void_p()
    _check(lib.cuCtxGetCurrent(ctypes.byref(ctx)), "cuCtxGetCurrent")
    if ctx.value:
        cur = ctypes.c_int()
        if lib.cuCtxGetDevice(ctypes.byref(cur)) == 0 and cur.value == device:
            return
    dev = ctypes.c_int()
    _check(lib.cuDeviceGet(ctypes.byref(dev), device), "cuDeviceGet")
    primary = ctypes.c_void_p()
    _check(lib.cuDevicePrimaryCtxRetain(ctypes.byref(primary), dev), "cuDevicePrimaryCtxRetain")
    _check(lib.cuCtxSetCurrent(primary), "cuCtxSetCurrent")


def device_attribute(attr: int, device: int) -> int:
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
