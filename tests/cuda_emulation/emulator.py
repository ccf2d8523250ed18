"""The package's CUDA kernels run on the CPU: the device sources (``rnn_ablations/csrc/cuda``)
compiled by the host C++ compiler against ``emulation.h`` (the CUDA execution model, as far as
they use it), and an emulated driver that :func:`rnn_ablations.kernels.cuda.driver.
set_implementation` installs, so that the host loops (``rnn_ablations.kernels.cuda.host``) run
unchanged on CPU tensors.

* :func:`build` generates one translation unit that instantiates every program of
  ``programs.all_programs()`` (checking each kernel's parameter list against
  ``Program.c_params()``, as the NVRTC signature probe does) and exports
  ``emulation_launch(name, grid, block, smem, params)``; compiled with ``g++ -O1 -pthread`` into
  ``<cache>/cuda_emulation/<digest>/`` (``<cache>``: ``$RNN_ABLATIONS_CACHE``, else
  ``~/.cache/rnn_ablations``), the digest covering the device sources, ``emulation.h``, the
  generated source and the compiler's command, so a process builds once and later runs read it.
* :class:`EmulatedDevice` answers the driver's questions as the GPU of its :class:`Profile`
  would (:data:`PROFILES`: ``default`` 2 SMs, ``small`` 16 SMs, ``h100`` 132 SMs with 227 KiB
  of shared memory per block): cooperative launch, its multiprocessors, the shared memory a
  block may opt in to, and an occupancy computed from the threads and shared memory a block
  asks for; a launch that a GPU would refuse (too many threads, more shared memory than
  allowed, a cooperative grid that cannot be resident) raises ``CudaDriverError``, and so does
  a launch whose spin wait outlasts the watchdog (``watchdog_s``).
* ``RNN_ABLATIONS_EMULATION_ASAN=1`` builds with AddressSanitizer (:func:`asan_environment`).
* :func:`installed` (a context manager) installs it and sets ``common.DEVICE_TYPE = "cpu"``, and
  restores both; ``tests/cuda_emulation/conftest.py`` has it as the fixture ``emulated_cuda``.
"""
from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from typing import Dict, Iterator, Optional

import torch

from rnn_ablations.kernels.cuda import driver, programs

HERE = os.path.dirname(os.path.abspath(__file__))
HEADER = os.path.join(HERE, "emulation.h")
CXX = os.environ.get("CXX", "g++")
FLAGS = ["-std=c++20", "-O1", "-pthread", "-shared", "-fPIC", "-w"]
#: the AddressSanitizer build (RNN_ABLATIONS_EMULATION_ASAN=1): an out-of-bounds access of the
#: device code is reported with its source line; the process must have libasan loaded first
#: (asan_environment() gives the variables of such a child process)
ASAN = "RNN_ABLATIONS_EMULATION_ASAN"
ASAN_FLAGS = ["-fsanitize=address", "-fno-omit-frame-pointer", "-g"]
#: seconds a spin wait of the device code (the grid barrier) or a barrier of the OS-thread mode
#: may last before the launch fails (CudaDriverError) instead of hanging
WATCHDOG = "RNN_ABLATIONS_EMULATION_WATCHDOG"
WATCHDOG_S = 20.0


@dataclasses.dataclass(frozen=True)
class Profile:
    """What the emulated device tells the host code about itself (the driver's attributes and
    the occupancy rules it answers with)."""
    name: str
    sms: int                      # multiprocessors
    smem_optin: int               # the most shared memory one block may opt in to
    smem_per_sm: int              # shared memory of one SM
    threads_per_sm: int = 2048
    blocks_per_sm: int = 16
    smem_default: int = 48 * 1024  # without opting in
    smem_reserved: int = 1024      # per resident block (the driver's own)
    max_threads: int = 1024        # per block
    capability: tuple = (8, 0)


#: the default device (2 SMs: a persistent grid of 2 blocks), one with 16 SMs, and one shaped
#: like an H100 SXM (132 SMs, 227 KiB of shared memory per block)
PROFILES = {
    "default": Profile("default", sms=2, smem_optin=99 * 1024, smem_per_sm=100 * 1024),
    "small": Profile("small", sms=16, smem_optin=99 * 1024, smem_per_sm=100 * 1024,
                     capability=(8, 6)),
    "h100": Profile("h100", sms=132, smem_optin=227 * 1024, smem_per_sm=228 * 1024,
                    blocks_per_sm=32, capability=(9, 0)),
}

#: the default device's numbers (PROFILES["default"])
SMS = PROFILES["default"].sms
THREADS_PER_SM = PROFILES["default"].threads_per_sm
BLOCKS_PER_SM = PROFILES["default"].blocks_per_sm
SMEM_PER_SM = PROFILES["default"].smem_per_sm
SMEM_OPTIN = PROFILES["default"].smem_optin
SMEM_DEFAULT = PROFILES["default"].smem_default
SMEM_RESERVED = PROFILES["default"].smem_reserved
MAX_THREADS = PROFILES["default"].max_threads

#: how the threads of a block that synchronises run (emulation.h Mode): "fibers" (one fiber per
#: CUDA thread, switched at its barriers) or "os" (one OS thread per CUDA thread); the blocks of a
#: grid always run on OS threads of their own, concurrently
THREAD_MODES = {"os": 0, "fibers": 1}

_THREADED = ("persistent_forward", "persistent_backward")  # kernels that synchronise


def asan_enabled() -> bool:
    value = os.environ.get(ASAN, "0")
    if value not in ("0", "1"):
        raise ValueError(f"{ASAN}={value!r}: 1 builds the emulation with AddressSanitizer, 0 "
                         "(the default) without")
    return value == "1"


def asan_runtime() -> str:
    """The path of the compiler's libasan (to preload)."""
    done = subprocess.run([CXX, "-print-file-name=libasan.so"], capture_output=True, text=True)
    path = done.stdout.strip()
    if done.returncode != 0 or not os.path.isabs(path):
        raise RuntimeError(f"{CXX} names no libasan.so (-print-file-name=libasan.so gave "
                           f"{path!r}); install the compiler's AddressSanitizer runtime")
    return os.path.realpath(path)


def asan_environment(base=None) -> Dict[str, str]:
    """The environment of a child process that runs the emulation under AddressSanitizer: the
    flag, libasan preloaded, and leak detection off (the interpreter's own allocations)."""
    env = dict(os.environ if base is None else base)
    env[ASAN] = "1"
    env["LD_PRELOAD"] = asan_runtime()
    env["ASAN_OPTIONS"] = "detect_leaks=0:abort_on_error=1:detect_stack_use_after_return=0"
    return env


def _asan_loaded() -> bool:
    try:
        with open("/proc/self/maps") as f:
            return "libasan" in f.read()
    except OSError:  # pragma: no cover - not Linux
        return False


def source(progs=None) -> str:
    """The translation unit: every program's kernel, its signature checked, in one table."""
    progs = programs.all_programs() if progs is None else progs
    headers = sorted({p.header for p in progs})
    lines = ['#include "emulation.h"'] + [f'#include "{h}"' for h in headers]
    entries = []
    for p in progs:
        sig = ", ".join(p.c_params())
        lines.append(f"static_assert(std::is_same<decltype({p.expression}), void({sig})>::value, "
                     f"\"{p.name}: the kernel's parameters are not the launcher's\");")
        entries.append(f'  {{"{p.name}", &rnn_emu::call<&{p.expression}>, '
                       f'{"true" if p.family in _THREADED else "false"}}},')
    lines += ["static const rnn_emu::Entry kEntries[] = {"] + entries + ["};", r'''
extern "C" int emulation_launch(const char* name, unsigned int grid, unsigned int block,
                                unsigned long long smem, void** params) {
  for (const rnn_emu::Entry& e : kEntries)
    if (std::strcmp(e.name, name) == 0) return rnn_emu::run_grid(e, grid, block, smem, params);
  return 1;
}
extern "C" long long emulation_launches() { return rnn_emu::launch_count.load(); }
extern "C" int emulation_programs() { return sizeof(kEntries) / sizeof(kEntries[0]); }
extern "C" void emulation_set_mode(int m) { rnn_emu::mode.store(m); }
extern "C" void emulation_set_watchdog(long long ms) { rnn_emu::watchdog_ms.store(ms); }
// device_types.cuh's 16-bit conversions: kind 0 Half, 1 BFloat16; bits and the value read back
extern "C" void emulation_convert(int kind, const float* in, uint16_t* bits, float* back, long n) {
  for (long i = 0; i < n; ++i) {
    if (kind == 0) {
      const rnn_ablations::Half h(in[i]);
      bits[i] = h.x;
      back[i] = static_cast<float>(h);
    } else {
      const rnn_ablations::BFloat16 h(in[i]);
      bits[i] = h.x;
      back[i] = static_cast<float>(h);
    }
  }
}
''']
    return "\n".join(lines)


def _cache_root() -> str:
    base = os.environ.get("RNN_ABLATIONS_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "rnn_ablations")
    return os.path.join(base, "cuda_emulation")


def _digest(csrc: str, text: str, command) -> str:
    h = hashlib.sha256()
    for path in sorted(_device_files(csrc)) + [HEADER]:
        h.update(os.path.relpath(path, csrc if path != HEADER else HERE).encode() + b"\0")
        with open(path, "rb") as f:
            h.update(f.read() + b"\0")
    h.update(text.encode() + b"\0" + " ".join(command).encode())
    return h.hexdigest()[:24]


def _device_files(csrc: str):
    cuda = os.path.join(csrc, "cuda")
    return [os.path.join(cuda, f) for f in os.listdir(cuda) if f.endswith(".cuh")] + [
        os.path.join(csrc, "common", "kernel_spec.h"), os.path.join(csrc, "common", "elementwise.h")]


_build_lock = threading.Lock()
last_build_seconds: Optional[float] = None  # the compiler's time of the last build (None: cached)


def build(csrc: Optional[str] = None, cache_root: Optional[str] = None, progs=None) -> str:
    """The shared library of the emulated kernels compiled from the device sources under
    ``csrc`` (default: the package's), of the programs ``progs`` (default: all), built once per
    digest; -> its path."""
    global last_build_seconds
    import time
    csrc = os.path.abspath(csrc or programs.CSRC)
    text = source(progs)
    include = [f"-I{HERE}", f"-I{csrc}"] + [f"-I{p}" for p in _torch_includes()]
    flags = FLAGS + (ASAN_FLAGS if asan_enabled() else [])
    digest = _digest(csrc, text, [CXX] + flags)
    folder = os.path.join(cache_root or _cache_root(), digest)
    lib = os.path.join(folder, "cuda_emulation.so")
    with _build_lock:
        if os.path.exists(lib):
            last_build_seconds = None
            return lib
        if shutil.which(CXX) is None:
            raise RuntimeError(f"the CUDA emulation needs a C++ compiler ({CXX} not found; set CXX)")
        os.makedirs(folder, exist_ok=True)
        work = tempfile.mkdtemp(prefix=".build-", dir=folder)
        try:
            src = os.path.join(work, "cuda_emulation.cpp")
            with open(src, "w") as f:
                f.write(text)
            out = os.path.join(work, "cuda_emulation.so")
            start = time.perf_counter()
            done = subprocess.run([CXX] + flags + include + [src, "-o", out],
                                  capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError("the CUDA emulation does not compile:\n"
                                   + done.stderr[-6000:])
            last_build_seconds = time.perf_counter() - start
            os.replace(out, lib)  # atomic: a concurrent run sees all of it or none
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return lib


def _torch_includes():
    # kernel_spec.h's host part includes c10/util/Exception.h (TORCH_CHECK); nothing of it is
    # used by the device code, but the header must be found
    root = os.path.join(os.path.dirname(torch.__file__), "include")
    return [root]


_libs: Dict[str, ctypes.CDLL] = {}


def load(csrc: Optional[str] = None, cache_root: Optional[str] = None, progs=None) -> ctypes.CDLL:
    path = build(csrc, cache_root, progs)
    lib = _libs.get(path)
    if lib is None:
        if asan_enabled() and not _asan_loaded():
            raise RuntimeError(
                f"{ASAN}=1: the AddressSanitizer build needs libasan loaded before the "
                f"interpreter's own libraries: LD_PRELOAD={asan_runtime()} "
                "ASAN_OPTIONS=detect_leaks=0 (emulator.asan_environment() gives them)")
        lib = ctypes.CDLL(path)
        lib.emulation_launch.argtypes = [ctypes.c_char_p, ctypes.c_uint, ctypes.c_uint,
                                         ctypes.c_ulonglong, ctypes.POINTER(ctypes.c_void_p)]
        lib.emulation_launch.restype = ctypes.c_int
        lib.emulation_launches.restype = ctypes.c_longlong
        lib.emulation_programs.restype = ctypes.c_int
        lib.emulation_set_mode.argtypes = [ctypes.c_int]
        lib.emulation_set_watchdog.argtypes = [ctypes.c_longlong]
        lib.emulation_convert.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                          ctypes.c_void_p, ctypes.c_long]
        _libs[path] = lib
    return lib


class EmulatedKernel:
    """A program "loaded" on the emulated device: the attributes and occupancy of
    ``driver.Kernel``."""

    def __init__(self, prog: programs.Program, device, profile: Profile):
        self.prog, self.device, self.profile = prog, device, profile
        self.smem_limit = profile.smem_default

    def allow_shared_memory(self, nbytes: int) -> None:
        if nbytes > self.profile.smem_optin:
            raise driver.CudaDriverError(
                f"emulated cuFuncSetAttribute({self.prog.name}, {nbytes} bytes of shared "
                f"memory): CUDA_ERROR_INVALID_VALUE, the device allows {self.profile.smem_optin}")
        self.smem_limit = max(self.smem_limit, nbytes)

    def resident_blocks_per_sm(self, threads: int, smem: int) -> int:
        """As cuOccupancyMaxActiveBlocksPerMultiprocessor: the blocks of ``threads`` threads and
        ``smem`` bytes that one SM holds at once (threads, shared memory, block slots)."""
        p = self.profile
        if threads <= 0 or threads > p.max_threads or smem > self.smem_limit:
            return 0
        by_threads = p.threads_per_sm // threads
        by_smem = p.smem_per_sm // (smem + p.smem_reserved)
        return max(0, min(by_threads, by_smem, p.blocks_per_sm))


class EmulatedDevice:
    """The implementation of ``driver.kernel`` / ``launch`` / ``device_attribute`` that runs the
    kernels on the CPU (see the module docstring); ``profile``: a name of :data:`PROFILES` or a
    :class:`Profile`; ``watchdog_s``: the longest a spin wait may last (``WATCHDOG`` in the
    environment, else :data:`WATCHDOG_S`)."""

    def __init__(self, csrc: Optional[str] = None, threads: Optional[str] = None, progs=None,
                 profile="default", watchdog_s: Optional[float] = None):
        threads = threads or os.environ.get("RNN_ABLATIONS_EMULATION_THREADS", "fibers")
        if threads not in THREAD_MODES:
            raise ValueError(f"EmulatedDevice: threads={threads!r}; one of {sorted(THREAD_MODES)} "
                             "(RNN_ABLATIONS_EMULATION_THREADS)")
        if isinstance(profile, str):
            if profile not in PROFILES:
                raise ValueError(f"EmulatedDevice: profile={profile!r}; one of "
                                 f"{sorted(PROFILES)} or a Profile")
            profile = PROFILES[profile]
        if watchdog_s is None:
            watchdog_s = float(os.environ.get(WATCHDOG, WATCHDOG_S))
        self.threads, self.profile, self.watchdog_s = threads, profile, float(watchdog_s)
        self.lib = load(csrc, progs=progs)
        self._kernels: Dict[tuple, EmulatedKernel] = {}

    def kernel(self, prog, device):
        key = (device, prog)
        if key not in self._kernels:
            self._kernels[key] = EmulatedKernel(prog, device, self.profile)
        return self._kernels[key]

    def device_attribute(self, attr: int, device) -> int:
        p = self.profile
        values = {driver.ATTR_MULTIPROCESSOR_COUNT: p.sms, driver.ATTR_COOPERATIVE_LAUNCH: 1,
                  driver.ATTR_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: p.smem_optin,
                  driver.ATTR_COMPUTE_CAPABILITY_MAJOR: p.capability[0],
                  driver.ATTR_COMPUTE_CAPABILITY_MINOR: p.capability[1]}
        if attr not in values:
            raise driver.CudaDriverError(f"the CUDA emulation has no device attribute {attr}")
        return values[attr]

    def launches(self) -> int:
        """Launches run so far in this process (all emulated devices of one build)."""
        return int(self.lib.emulation_launches())

    def launch(self, k, args, grid, block, smem=0, cooperative=False):
        p = self.profile
        what = f"emulated launch of {k.prog.name} (grid {grid}, block {block}, smem {smem})"
        if not (0 < block <= p.max_threads and grid > 0):
            raise driver.CudaDriverError(f"{what}: CUDA_ERROR_INVALID_VALUE")
        if smem > k.smem_limit:
            raise driver.CudaDriverError(f"{what}: CUDA_ERROR_INVALID_VALUE, {smem} bytes of "
                                         f"shared memory above the kernel's {k.smem_limit}")
        if cooperative and grid > k.resident_blocks_per_sm(block, smem) * p.sms:
            raise driver.CudaDriverError(f"{what}: CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE")
        if k.prog.family in _THREADED and not cooperative:
            raise driver.CudaDriverError(f"{what}: a grid barrier needs a cooperative launch")
        params = args if isinstance(args, ctypes.Array) else driver.params_of(args)
        params = ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p))
        self.lib.emulation_set_mode(THREAD_MODES[self.threads])
        self.lib.emulation_set_watchdog(max(1, int(self.watchdog_s * 1000)))
        code = self.lib.emulation_launch(k.prog.name.encode(), grid, block, smem, params)
        if code == 3:
            raise driver.CudaDriverError(
                f"{what}: a spin wait of the device code (the grid barrier) lasted more than "
                f"the emulation's watchdog of {self.watchdog_s:g} s ({WATCHDOG}): a block that "
                "never arrives, or a barrier that counts its arrivals wrong (on a GPU: a hang)")
        if code != 0:
            raise driver.CudaDriverError(f"{what}: "
                                         + ("no such program" if code == 1
                                            else "could not start its threads"))


@contextlib.contextmanager
def installed(device: Optional[EmulatedDevice] = None) -> Iterator[EmulatedDevice]:
    """Run the host loops on CPU tensors with the kernels emulated: installs ``device`` (a new
    :class:`EmulatedDevice` by default) as the driver's implementation, sets
    ``common.DEVICE_TYPE = "cpu"`` (the host loops then skip ``torch.cuda.device`` and name the
    device from the driver), and, on a torch without CUDA, lets ``Tensor.pin_memory`` return
    the CPU tensor itself; restores all."""
    from rnn_ablations.kernels.cuda import common
    device = device or EmulatedDevice()
    saved = [(common, "DEVICE_TYPE", common.DEVICE_TYPE)]
    common.DEVICE_TYPE = "cpu"
    if not torch.cuda.is_available():  # the scan's row lengths are copied from pinned memory
        saved.append((torch.Tensor, "pin_memory", torch.Tensor.pin_memory))
        torch.Tensor.pin_memory = lambda self, *a, **k: self
    props = _plan_caches()
    for cache in props:
        cache.clear()
    previous = driver.set_implementation(device)
    try:
        yield device
    finally:
        driver.set_implementation(previous)
        for cache in props:
            cache.clear()
        for owner, name, value in reversed(saved):
            setattr(owner, name, value)


def _plan_caches():
    """The host modules' caches of device properties (so that the emulated device's answers,
    not an earlier device's, are read)."""
    import importlib
    caches = []
    for mod in ("host", "persistent", "common"):
        try:
            m = importlib.import_module(f"rnn_ablations.kernels.cuda.{mod}")
        except ImportError:
            continue
        got = getattr(m, "_props", None)
        if isinstance(got, dict):
            caches.append(got)
    return caches
