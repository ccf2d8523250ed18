"""Compile a program (:mod:`.programs`) for one GPU architecture with NVRTC, once: the binary is
kept on disk and read back by every later process, of any user that can read the folder.

Cache key: SHA-256 of the device sources (every header NVRTC reads), the compile options, the
NVRTC version, the target architecture and the instantiation (its name expression).  Files:
``<cache>/cuda/<key>.bin`` holding a one-line JSON header (the entry point's lowered name, the
binary's kind and target, its size, what it was compiled from, and a SHA-256 of the header's
other fields and the payload together) and the CUBIN (or PTX) after it.  An entry is used only
when its header has every field, names this program and target, its payload has the recorded
size, the SHA-256 matches (so an edited entry-point name is refused like edited bytes), the
entry-point name is in the payload, and a CUBIN is a whole ELF file (every segment and section
inside it: :func:`rnn_ablations.kernels.verified_file.elf_problem`, so that a cut file whose
size and SHA-256 were rewritten does not reach the driver): anything else is reported in one
line and the program is compiled again and stored over it.  Nothing unchecked reaches the
driver's ``cuModuleLoadData`` (:mod:`.driver`).

A file is written to a temporary name in the same folder and renamed into place (``os.replace``,
atomic): there is no lock file, so an interrupted compile leaves nothing that blocks the next
one; two processes compiling the same program at once both write a valid entry, and the last
rename wins.  Entries are created with mode ``0o666`` less the process umask (``0o644`` with the
usual umask 022), as any file the user writes: with a folder that others can read, another user
reads the entries instead of compiling them again.  A cache that cannot be written is not an
error: the program is compiled in memory for this process, and the process says so once (not
once per program).

``<cache>`` is ``$RNN_ABLATIONS_CACHE`` (the CPU kernel's cache folder too), else
``$XDG_CACHE_HOME/rnn_ablations`` or ``~/.cache/rnn_ablations``.

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
import threading
import time
from typing import Dict, List, Optional, Set, Tuple

from ... import _env
from .. import verified_file
from . import nvrtc
from .programs import CSRC, Program, sources_digest

__all__ = ["cache_dir", "options_for", "target_for", "binary", "lookup", "Binary",
           "compile_stats", "read_entry", "HEADER_FIELDS"]

logger = logging.getLogger("rnn_ablations")

_MAGIC = b"rnn_ablations-cuda-3\n"
#: the header fields every entry must have
HEADER_FIELDS = ("expression", "lowered", "kind", "target", "size", "sha256")
_lock = threading.Lock()
_memory: Dict[str, "Binary"] = {}
_stats = {"compiled": 0, "from_disk": 0, "seconds": 0.0, "damaged": 0}
# folders this process has already said it cannot write to / read from (one line each)
_unwritable: Set[str] = set()
_unreadable: Set[str] = set()
_UNREADABLE = "cannot be read by this user (permission denied)"


def _entry_digest(meta: dict, data: bytes) -> str:
    """The SHA-256 an entry records: of its header's fields that say what the payload is (the
    program, its entry point's name, kind, target and size) and of the payload."""
    fields = {k: meta[k] for k in ("expression", "lowered", "kind", "target", "size")}
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode() + b"\n" + data).hexdigest()


class Binary:
    """A compiled program: ``data`` (CUBIN or PTX), ``lowered`` (the entry point's mangled
    name), ``kind`` ("cubin" or "ptx"), ``target`` (sm_XY / compute_XY), ``seconds`` (the
    compile time, 0 when read from disk), ``sha256`` (hex digest of ``data``)."""

    def __init__(self, data: bytes, lowered: str, kind: str, target: str, seconds: float,
                 sha256: Optional[str] = None):
        self.data, self.lowered, self.kind = data, lowered, kind
        self.target, self.seconds = target, seconds
        self.sha256 = sha256 or hashlib.sha256(data).hexdigest()


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


def read_entry(path: str, prog: Program, target: str
               ) -> Tuple[Optional[Binary], Optional[str]]:
    """The entry at ``path`` for ``prog`` compiled for ``target``: ``(Binary, None)`` when it is
    whole (every header field, this program and target, the recorded size and SHA-256 of the
    payload), ``(None, None)`` when there is none (or one in an older format of the package,
    replaced like a missing one), ``(None, why)`` when there is one that cannot be used (``why``
    says what is wrong with it)."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except (FileNotFoundError, NotADirectoryError):
        return None, None
    except PermissionError:
        return None, _UNREADABLE
    except OSError as exc:
        return None, f"cannot be read ({exc.strerror or exc})"
    if not raw.startswith(_MAGIC):
        if raw.startswith(b"rnn_ablations-cuda-"):
            return None, None  # an older format: compiled again and replaced, as a new program
        return None, "is not a cache entry (its first line is not the package's)"
    head, sep, data = raw[len(_MAGIC):].partition(b"\n")
    try:
        meta = json.loads(head)
    except ValueError:
        return None, "has a header that is not JSON"
    if not sep or not isinstance(meta, dict):
        return None, "has no header line"
    missing = [k for k in HEADER_FIELDS if k not in meta]
    if missing:
        return None, f"has a header without the field(s) {', '.join(missing)}"
    if meta["expression"] != prog.expression:
        return None, (f"holds another program ({str(meta['expression'])[:80]!r}, not "
                      f"{prog.expression!r})")
    kind = "ptx" if target.startswith("compute_") else "cubin"
    if meta["target"] != target or meta["kind"] != kind:
        return None, (f"holds {meta['kind']} for {meta['target']}, not the {kind} for {target} "
                      "it is filed under")
    if not isinstance(meta["lowered"], str) or not meta["lowered"]:
        return None, "has an empty entry-point name in its header"
    if len(data) != meta["size"]:
        return None, (f"holds {len(data)} bytes, its header says {meta['size']} (truncated or "
                      "overwritten)")
    digest = _entry_digest(meta, data)
    if digest != meta["sha256"]:
        return None, (f"does not match the SHA-256 in its header ({digest[:12]}..., recorded "
                      f"{str(meta['sha256'])[:12]}...: its bytes or its header were changed)")
    if kind == "cubin":
        broken = verified_file.elf_problem(data, "its CUBIN")
        if broken:
            return None, broken
    if meta["lowered"].encode() not in data:
        return None, (f"names an entry point {meta['lowered'][:80]!r} that its "
                      f"{meta['kind'].upper()} does not hold")
    return Binary(data, meta["lowered"], meta["kind"], meta["target"], 0.0), None


def _warn_unwritable(folder: str, exc: OSError) -> None:
    with _lock:
        if folder in _unwritable:
            return
        _unwritable.add(folder)
    logger.warning("rnn_ablations: cannot write the CUDA kernel cache %s (%s); the kernels this "
                   "process compiles are kept in memory only and compiled again by the next "
                   "process (set RNN_ABLATIONS_CACHE to a writable folder, or run `python -m "
                   "rnn_ablations.kernels.cuda.precompile` as a user that can write it)",
                   folder, exc.strerror or exc)


def _write(path: str, prog: Program, b: Binary) -> None:
    meta = {"expression": prog.expression, "lowered": b.lowered, "kind": b.kind,
            "target": b.target, "size": len(b.data), "seconds": round(b.seconds, 3)}
    meta["sha256"] = _entry_digest(meta, b.data)
    folder = os.path.dirname(path)
    tmp = os.path.join(folder, f".tmp-{os.getpid()}-{threading.get_ident()}-"
                               f"{os.urandom(4).hex()}.bin")
    try:
        os.makedirs(folder, exist_ok=True)
        # 0o666 less the umask, as any file the user creates (mkstemp's 0600 would hide the
        # entry from every other user of a shared cache)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0),
                     0o666)
    except OSError as exc:
        _warn_unwritable(folder, exc)
        return
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(_MAGIC + json.dumps(meta).encode() + b"\n" + b.data)
        os.replace(tmp, path)
    except OSError as exc:  # a full disk, a quota
        _warn_unwritable(folder, exc)
        try:
            os.unlink(tmp)
        except OSError:
            pass


def binary(prog: Program, arch: int, quiet: bool = False, force: bool = False) -> Binary:
    """``prog`` compiled for a GPU of compute capability ``arch`` (e.g. 90): from this process's
    memory, else from the disk cache (checked: :func:`read_entry`), else compiled now (a
    one-line message unless ``quiet``; a damaged entry is always reported) and stored.
    ``force``: compiled now whatever the caches hold (and stored)."""
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
    folder = cache_dir()
    path = os.path.join(folder, key + ".bin")
    got, problem = (None, None) if force else read_entry(path, prog, target)
    source = "disk"
    if got is not None:
        _stats["from_disk"] += 1
    else:
        source = "compiled"
        if problem == _UNREADABLE:
            with _lock:
                first = folder not in _unreadable
                _unreadable.add(folder)
            if first:
                logger.warning("rnn_ablations: the CUDA kernel cache %s holds entries this user "
                               "cannot read (permission denied: written with a restrictive "
                               "umask by another user?); they are compiled again (make the files "
                               "readable, e.g. chmod a+r %s/*.bin, or set RNN_ABLATIONS_CACHE to "
                               "a folder of your own)", folder, folder)
        elif problem is not None:
            _stats["damaged"] += 1
            logger.warning("rnn_ablations: the cached CUDA kernel %s for %s (%s) %s; compiling "
                           "it again", prog.name, target, path, problem)
        elif not quiet:
            logger.warning("rnn_ablations: compiling the CUDA kernel %s for %s with NVRTC (once; "
                           "cached in %s)", prog.name, target, folder)
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
    "seconds": compile time in total, "damaged": cache entries found unusable and replaced}."""
    return dict(_stats)
