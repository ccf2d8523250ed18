"""What a measurement ran on: the CPU (model, vector flags, cores), the torch build and its
threads, the CPU kernel's vector path, the GPU.  Every timing the package writes
(``rnn-ablations speed`` and the scripts in ``benchmarks/``) records the machine through these
functions, so that every results file names its machine the same way.

    >>> from rnn_ablations.commands.machine import describe
    >>> describe()            # doctest: +SKIP
    'AMD EPYC (no AVX-512, AVX2+FMA), 2 cores, torch 2.13.0+cpu (2 threads, CPU capability AVX2), kernel vector path avx2'
"""
from __future__ import annotations

import os
import platform
import re
import subprocess
from typing import Dict, Optional

import torch

from .. import kernel_isa, supported_kernel_isas

__all__ = ["cpu_info", "cpu_file_name", "gpu_info", "describe", "describe_gpu", "machine_info",
           "reset_peak_memory", "peak_memory", "call_peak_memory"]

#: the CPU flags worth recording for this package's kernels (what a reader needs to place a timing)
VECTOR_FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512_bf16", "amx_tile")


def _lscpu() -> str:
    try:
        return subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10,
                              env=dict(os.environ, LC_ALL="C")).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def cpu_info() -> Dict:
    """The CPU as ``lscpu`` names it (``/proc/cpuinfo`` where ``lscpu`` is missing; the
    platform's processor name where neither exists)::

        {"model", "cores", "threads", "avx2", "fma", "avx512f", "avx512_flags", "vector_flags",
         "kernel_isa", "kernel_isas"}

    ``cores`` is the number of CPUs the OS shows, ``threads`` torch's thread count now;
    ``kernel_isa`` / ``kernel_isas``: the CPU kernel's vector path in use and those this CPU and
    build can run (``None`` / ``[]`` without the compiled kernel)."""
    model, flags = platform.processor() or platform.machine(), set()
    text = _lscpu()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "Model name":
            model = value.strip()
        elif key.strip() == "Flags":
            flags = set(value.split())
    if not flags:
        try:
            with open("/proc/cpuinfo") as f:
                for line in f:
                    key, _, value = line.partition(":")
                    if key.strip() == "model name" and not text:
                        model = value.strip()
                    elif key.strip() == "flags":
                        flags = set(value.split())
                        break
        except OSError:
            pass
    return {"model": model, "cores": os.cpu_count(), "threads": torch.get_num_threads(),
            "avx2": "avx2" in flags, "fma": "fma" in flags, "avx512f": "avx512f" in flags,
            "avx512_flags": sorted(f for f in flags if f.startswith("avx512")),
            "vector_flags": [f for f in VECTOR_FLAGS if f in flags],
            "kernel_isa": kernel_isa(), "kernel_isas": supported_kernel_isas()}


def cpu_file_name() -> str:
    """The CPU as result files are named for it: ``<vendor>_<isa>``, e.g. ``amd_epyc_avx2`` or
    ``intel_xeon_avx512_amx``."""
    cpu = cpu_info()
    model = str(cpu.get("model", "cpu")).lower()
    vendor = ("amd_epyc" if "epyc" in model else "intel_xeon" if "xeon" in model else
              re.sub(r"[^a-z0-9]+", "_", model)[:24].strip("_") or "cpu")
    flags = cpu.get("vector_flags", [])
    isa = "avx512" if cpu.get("avx512f") else ("avx2" if cpu.get("avx2") else "portable")
    return f"{vendor}_{isa}" + ("_amx" if "amx_tile" in flags else "")


def gpu_info(device: str = "cuda") -> Dict:
    """The GPU of ``device`` and the CUDA stack: ``{"gpu", "multiprocessors", "gpu_memory_gib",
    "torch", "cuda", "cudnn"}``.  Raises ``ValueError`` naming the problem when there is none."""
    if not torch.cuda.is_available():
        raise ValueError(f"no CUDA device for {device!r}: torch {torch.__version__} sees none")
    props = torch.cuda.get_device_properties(torch.device(device))
    return {"gpu": props.name, "multiprocessors": props.multi_processor_count,
            "gpu_memory_gib": round(props.total_memory / 2 ** 30, 1),
            "torch": torch.__version__, "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version()}


def describe(info: Optional[Dict] = None) -> str:
    """One line naming the CPU machine: model, AVX-512 or not, cores, torch, threads, CPU
    capability, the kernel's vector path (``info``: a :func:`cpu_info` dict, taken now if
    ``None``)."""
    info = info or cpu_info()
    isa = ("AVX-512" if info["avx512f"] else "no AVX-512") + (
        ", AVX2+FMA" if info["avx2"] and info["fma"] else "")
    return (f"{info['model']} ({isa}), {info['cores']} cores, torch {torch.__version__} "
            f"({info.get('threads', torch.get_num_threads())} threads, CPU capability "
            f"{torch.backends.cpu.get_cpu_capability()}), kernel vector path "
            f"{info['kernel_isa']}")


def describe_gpu(gpu: Dict, host: Optional[str] = None) -> str:
    """One line naming the GPU machine (``gpu``: a :func:`gpu_info` dict), with the host's line
    after it when given."""
    line = f"{gpu['gpu']} (CUDA {gpu['cuda']}, cuDNN {gpu['cudnn']}, torch {gpu['torch']})"
    return line + (f"; host {host}" if host else "")


def machine_info(device: str = "cpu") -> Dict:
    """Everything above as one JSON-ready dict: ``{"machine": <one line>, "cpu": cpu_info(),
    "python", "torch"}`` and, for a CUDA ``device``, ``"gpu": gpu_info(device)``."""
    cpu = cpu_info()
    line = describe(cpu)
    out = {"cpu": cpu, "python": platform.python_version(), "torch": torch.__version__}
    if str(device).startswith("cuda"):
        out["gpu"] = gpu_info(device)
        line = describe_gpu(out["gpu"], host=line)
    out["machine"] = line
    return out


# ------------------------------------------------------------------------------- peak memory
# The peak resident size of this process as Linux keeps it: ``VmHWM`` in /proc/self/status,
# reset by writing "5" to /proc/self/clear_refs.  (``getrusage``'s ``ru_maxrss`` cannot be reset
# and, in a child, also holds the size its parent had before ``exec``: a test's child would read
# pytest's size.)
def _status_bytes(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {key} line")


def reset_peak_memory() -> int:
    """Reset the process's peak resident size to its current size; returns that size (bytes).
    Linux only (``FileNotFoundError`` where /proc/self/clear_refs does not exist)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _status_bytes("VmRSS:")


def peak_memory() -> int:
    """The process's peak resident size (bytes) since it started (``exec``: unlike
    ``ru_maxrss``, nothing of the parent's) or since the last :func:`reset_peak_memory`."""
    return _status_bytes("VmHWM:")


def call_peak_memory(fn) -> int:
    """Run ``fn()`` and return how far the process's resident size rose above where it stood
    before the call, at the call's peak (bytes): its own peak memory, what it returns included."""
    before = reset_peak_memory()
    fn()
    return max(0, peak_memory() - before)
