"""Compile a program (:mod:`.programs`) for one GPU architecture with NVRTC, once: the binary is
kept on disk and read back by every later process.

Cache key: SHA-256 of the device sources (every header NVRTC reads), the compile options, the
NVRTC version, the target architecture and the instantiation (its name expression).  Files:
``<cache>/cuda/<key>.bin`` holding a one-line JSON header (the entry point's lowered name, the
binary's kind, what it was compiled from) and the CUBIN (or PTX) after it.  A file is written
to a temporary name in the same folder and renamed into place (``os.replace``, atomic): there is
no lock file, so an interrupted compile leaves nothing that blocks the next one; two processes
compiling the same program at once both write the same bytes, and the last rename wins.

``<cache>`` is ``$RNN_ABLATIONS_CACHE`` (the CPU kernel's cache folder too), else
``$XDG_CACHE_HOME/rnn_ablations`` or ``~/.cache/rnn_ablations``.  A cache that cannot be
written is not an error: the program is compiled in memory for this process.

Architecture: ``sm_XY`` of the GPU; CUBIN, loaded as it is (no driver JIT).  When this NVRTC
does not know the GPU's architecture (a torch older than the GPU), the program is compiled to
PTX for the newest architecture it knows below it (``compute_XY``), which the driver compiles at
load.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import threading
import time
from typing import Dict, List, Optional, Tuple

from ... import _env
from . import nvrtc
from .programs import CSRC, Program, sources_digest

__all__ = ["cache_dir", "options_for", "target_for", "binary", "lookup", "Binary",
           "compile_stats"]

logger = logging.getLogger("rnn_ablations")

_MAGIC = b"rnn_ablations-cuda-1\n"
_lock = threading.Lock()
_memory: Dict[str, "Binary"] = {}
_stats = {"compiled": 0, "from_disk": 0, "seconds": 0.0}


class Binary:
    """A compiled program: ``data`` (CUBIN or PTX), ``lowered`` (the entry point's mangled
    name), ``kind`` ("cubin" or "ptx"), ``target`` (sm_XY / compute_XY), ``seconds`` (the
    compile time, 0 when read from disk)."""

    def __init__(self, data: bytes, lowered: str, kind: str, target: str, seconds: float):
        self.data, self.lowered, self.kind = data, lowered, kind
        self.target, self.seconds = target, seconds


def cache_dir() -> str:
    """The folder of the compiled CUDA programs (``<cache>/cuda``)."""
    return os.path.join(_env.cache_root(), "cuda")


def target_for(arch: int) -> Tuple[str, bool]:
    """(NVRTC's --gpu-architecture, whether it is CUBIN) for a GPU of compute capability
    ``arch`` (e.g. 90): ``sm_90`` when this NVRTC knows it, else PTX for the newest it knows
    below it."""
    known = nvrtc.supported_archs()
    if arch in known:
        return f"sm_{arch}", True
    below = [a for a in known if a < arch]
    if not below:
        raise nvrtc.NvrtcError(
            f"this NVRTC {'.'.join(map(str, nvrtc.version()))} compiles for sm_{min(known)} and "
            f"newer; the GPU is sm_{arch} (the CUDA kernels need a newer GPU, or a torch built "
            "for an older CUDA)")
    return f"compute_{max(below)}", False


def options_for(target: str) -> List[str]:
    """NVRTC's options: the target, C++17, device code by default, the package's sources on the
    include path (fused multiply-add on, as nvcc's default)."""
    return [f"--gpu-architecture={target}", "--std=c++17", "-default-device", "--fmad=true",
            f"-I{CSRC}"]


def _key(prog: Program, options: List[str]) -> str:
    h = hashlib.sha256()
    for part in (sources_digest(), "\0".join(
            o for o in options if not o.startswith("-I")), ".".join(map(str, nvrtc.version())),
            prog.expression):
        h.update(part.encode() + b"\n")
    return h.hexdigest()


def _read(path: str, prog: Program) -> Optional[Binary]:
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError:
        return None
    if not raw.startswith(_MAGIC):
        return None
    head, sep, data = raw[len(_MAGIC):].partition(b"\n")
    try:
        meta = json.loads(head)
    except ValueError:
        return None
    if not sep or meta.get("expression") != prog.expression or len(data) != meta.get("size"):
        return None
    return Binary(data, meta["lowered"], meta["kind"], meta["target"], 0.0)


def _write(path: str, prog: Program, b: Binary) -> None:
    meta = {"expression": prog.expression, "lowered": b.lowered, "kind": b.kind,
            "target": b.target, "size": len(b.data), "seconds": round(b.seconds, 3)}
    folder = os.path.dirname(path)
    try:
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".bin")
    except OSError as exc:
        logger.warning("rnn_ablations: cannot write the CUDA kernel cache %s (%s); the kernels "
                       "are compiled again in each process (set RNN_ABLATIONS_CACHE to a "
                       "writable folder)", folder, exc)
        return
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(_MAGIC + json.dumps(meta).encode() + b"\n" + b.data)
        os.replace(tmp, path)
    except OSError as exc:  # pragma: no cover - a full disk
        logger.warning("rnn_ablations: cannot write %s (%s)", path, exc)
        try:
            os.unlink(tmp)
        except OSError:
            pass


def binary(prog: Program, arch: int, quiet: bool = False, force: bool = False) -> Binary:
    """``prog`` compiled for a GPU of compute capability ``arch`` (e.g. 90): from this process's
    memory, else from the disk cache, else compiled now (a one-line message unless ``quiet``)
    and stored.  ``force``: compiled now whatever the caches hold (and stored)."""
    return lookup(prog, arch, quiet, force)[0]


def lookup(prog: Program, arch: int, quiet: bool = False, force: bool = False
           ) -> Tuple[Binary, str]:
    """:func:`binary`, and where it came from: "memory", "disk" or "compiled"."""
    target, cubin = target_for(arch)
    options = options_for(target)
    key = _key(prog, options)
    with _lock:
        got = None if force else _memory.get(key)
    if got is not None:
        return got, "memory"
    path = os.path.join(cache_dir(), key + ".bin")
    got = None if force else _read(path, prog)
    source = "disk"
    if got is not None:
        _stats["from_disk"] += 1
    else:
        source = "compiled"
        if not quiet:
            logger.warning("rnn_ablations: compiling the CUDA kernel %s for %s with NVRTC (once; "
                           "cached in %s)", prog.name, target, cache_dir())
        start = time.perf_counter()
        data, lowered, _ = nvrtc.compile_program(prog.source, prog.name + ".cu",
                                                 [prog.expression], options, cubin=cubin)
        seconds = time.perf_counter() - start
        got = Binary(data, lowered[0], "cubin" if cubin else "ptx", target, seconds)
        _stats["compiled"] += 1
        _stats["seconds"] += seconds
        _write(path, prog, got)
    with _lock:
        _memory[key] = got
    return got, source


def compile_stats() -> dict:
    """{"compiled": programs compiled by this process, "from_disk": read from the cache,
    "seconds": compile time in total}."""
    return dict(_stats)
