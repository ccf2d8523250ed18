"""NVRTC, CUDA's runtime compiler, through ctypes: the device sources (``rnn_ablations/csrc``) to
machine code (CUBIN) for one GPU architecture, with no CUDA toolkit and no nvcc.

The library is the one of torch's CUDA major version (``torch.version.cuda``: a CUDA 12 torch
runs with NVRTC 12, whose CUBIN every driver that runs that torch loads).  ``import torch``
preloads ``libnvrtc.so.<major>`` (and its ``libnvrtc-builtins``) from the ``nvidia`` wheels of a
pip install, so ``ctypes.CDLL("libnvrtc.so.<major>")`` resolves to it; otherwise it is looked
up in the folders of those wheels on ``sys.path`` (:func:`wheel_folders`: ``nvidia/cu13/lib`` for
CUDA 13, ``nvidia/cuda_nvrtc/lib`` or ``nvidia/cu12/lib`` for CUDA 12), torch's major first,
then by its plain name, torch's major first.  A CPU torch (no CUDA major) takes the newest found
(the ``nvidia-cuda-nvrtc`` wheel, which the tests use on a machine without a GPU).  Nothing here
needs a GPU.
"""
from __future__ import annotations

import ctypes
import glob
import os
import sys
import threading
from typing import List, Optional, Sequence, Tuple

__all__ = ["NvrtcError", "library", "version", "supported_archs", "compile_program",
           "library_error", "wheel_folders", "library_names"]


class NvrtcError(RuntimeError):
    """NVRTC could not be loaded, or a program did not compile (the message holds the log)."""


_lock = threading.Lock()
_lib: Optional[ctypes.CDLL] = None
_error: Optional[str] = None


#: CUDA major -> where its NVRTC wheel puts the library (under a site-packages folder)
_WHEEL_FOLDERS = {"13": ("nvidia/cu13/lib",), "12": ("nvidia/cuda_nvrtc/lib", "nvidia/cu12/lib")}


def _majors_first(major: Optional[str]) -> List[str]:
    order = sorted(_WHEEL_FOLDERS, key=int, reverse=True)  # newest first for a CPU torch
    if major is not None:
        order = [major] + [m for m in order if m != major]
    return order


def wheel_folders(major: Optional[str]) -> List[str]:
    """The sub-folders (of a site-packages folder) where the ``nvidia`` wheels put libnvrtc, in
    the order they are tried: those of CUDA ``major`` (torch's, e.g. "12") first."""
    return [sub for m in _majors_first(major)
            for sub in _WHEEL_FOLDERS.get(m, (f"nvidia/cu{m}/lib",))]


def library_names(major: Optional[str]) -> List[str]:
    """The plain names tried last (the system's libnvrtc), CUDA ``major``'s first."""
    return [f"libnvrtc.so.{m}" for m in _majors_first(major)] + ["libnvrtc.so"]


def _candidate_folders(major: Optional[str]) -> List[str]:
    folders = []
    for sub in wheel_folders(major):
        for base in sys.path:
            folder = os.path.join(base, sub)
            if os.path.isdir(folder) and folder not in folders:
                folders.append(folder)
    return folders


def _cuda_major() -> Optional[str]:
    try:
        import torch
    except ImportError:  # pragma: no cover - the package needs torch
        return None
    cuda = torch.version.cuda
    return cuda.split(".")[0] if cuda else None


def _load() -> ctypes.CDLL:
    tried = []
    major = _cuda_major()
    if major is not None:  # torch's own (preloaded from its nvidia wheels, or the system's)
        name = f"libnvrtc.so.{major}"
        try:
            return ctypes.CDLL(name)
        except OSError as exc:
            tried.append(f"{name}: {exc}")
    for folder in _candidate_folders(major):
        libs = sorted(p for p in glob.glob(os.path.join(folder, "libnvrtc.so.*"))
                      if ".alt." not in p)
        if not libs:
            continue
        # the builtins library is dlopen'ed by name from libnvrtc: load it first, globally
        for builtins in sorted(p for p in glob.glob(os.path.join(folder, "libnvrtc-builtins.so.*"))
                               if ".alt." not in p):
            try:
                ctypes.CDLL(builtins, mode=ctypes.RTLD_GLOBAL)
            except OSError as exc:
                tried.append(f"{builtins}: {exc}")
        try:
            return ctypes.CDLL(libs[-1], mode=ctypes.RTLD_GLOBAL)
        except OSError as exc:
            tried.append(f"{libs[-1]}: {exc}")
    for name in library_names(major):
        if major is not None and name == f"libnvrtc.so.{major}":
            continue  # tried first
        try:
            return ctypes.CDLL(name)
        except OSError as exc:
            tried.append(f"{name}: {exc}")
    wheel = "nvidia-cuda-nvrtc-cu12" if major == "12" else "nvidia-cuda-nvrtc"
    for_torch = f" (torch is built for CUDA {major}: NVRTC {major})" if major else ""
    raise NvrtcError(
        "NVRTC (CUDA's runtime compiler, libnvrtc) was not found" + for_torch + ": a CUDA "
        "build of torch installed with pip brings it (the nvidia-cuda-nvrtc wheel); `pip install "
        f"{wheel}` provides it.  Tried: " + "; ".join(tried))


def library() -> ctypes.CDLL:
    """The loaded ``libnvrtc`` (``NvrtcError`` when there is none)."""
    global _lib, _error
    with _lock:
        if _lib is None:
            if _error is not None:
                raise NvrtcError(_error)
            try:
                lib = _load()
            except NvrtcError as exc:
                _error = str(exc)
                raise
            lib.nvrtcGetErrorString.restype = ctypes.c_char_p
            _lib = lib
        return _lib


def library_error() -> Optional[str]:
    """Why NVRTC cannot be loaded, or ``None`` when it can."""
    try:
        library()
    except NvrtcError as exc:
        return str(exc)
    return None


def _check(code: int, what: str) -> None:
    if code != 0:
        msg = library().nvrtcGetErrorString(code)
        raise NvrtcError(f"NVRTC {what}: {msg.decode() if msg else code}")


def version() -> Tuple[int, int]:
    """(major, minor) of the loaded NVRTC."""
    lib = library()
    major, minor = ctypes.c_int(), ctypes.c_int()
    _check(lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
    return major.value, minor.value


def supported_archs() -> List[int]:
    """The ``sm_XY`` architectures this NVRTC compiles for, as integers XY (e.g. 80, 90)."""
    lib = library()
    n = ctypes.c_int()
    _check(lib.nvrtcGetNumSupportedArchs(ctypes.byref(n)), "nvrtcGetNumSupportedArchs")
    arr = (ctypes.c_int * n.value)()
    _check(lib.nvrtcGetSupportedArchs(arr), "nvrtcGetSupportedArchs")
    return list(arr)


def compile_program(source: str, name: str, expressions: Sequence[str],
                    options: Sequence[str], cubin: bool = True
                    ) -> Tuple[bytes, List[str], str]:
    """Compile ``source`` (file name ``name`` in messages; ``#include`` resolved through the
    ``-I`` options) and return (CUBIN, or PTX when not ``cubin``; the lowered (mangled) names of
    ``expressions``, in order; NVRTC's log).  ``NvrtcError`` with the log when it fails."""
    lib = library()
    prog = ctypes.c_void_p()
    _check(lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(), 0, None,
                                  None), "nvrtcCreateProgram")
    try:
        for expr in expressions:
            _check(lib.nvrtcAddNameExpression(prog, expr.encode()), "nvrtcAddNameExpression")
        opts = [o.encode() for o in options]
        arr = (ctypes.c_char_p * len(opts))(*opts)
        result = lib.nvrtcCompileProgram(prog, len(opts), arr)
        size = ctypes.c_size_t()
        _check(lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size)), "nvrtcGetProgramLogSize")
        buf = ctypes.create_string_buffer(size.value)
        _check(lib.nvrtcGetProgramLog(prog, buf), "nvrtcGetProgramLog")
        log = buf.value.decode(errors="replace")
        if result != 0:
            msg = lib.nvrtcGetErrorString(result)
            raise NvrtcError(f"NVRTC could not compile {name} ({msg.decode() if msg else result}, "
                             f"options {' '.join(options)}):\n{log}")
        lowered = []
        for expr in expressions:
            ptr = ctypes.c_char_p()
            _check(lib.nvrtcGetLoweredName(prog, expr.encode(), ctypes.byref(ptr)),
                   f"nvrtcGetLoweredName({expr})")
            lowered.append(ptr.value.decode())
        get_size, get = (("nvrtcGetCUBINSize", "nvrtcGetCUBIN") if cubin
                         else ("nvrtcGetPTXSize", "nvrtcGetPTX"))
        _check(getattr(lib, get_size)(prog, ctypes.byref(size)), get_size)
        out = ctypes.create_string_buffer(size.value)
        _check(getattr(lib, get)(prog, out), get)
        return out.raw, lowered, log
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
