"""Find the compiled CPU kernel ``rnn_ablations._C``, compiling it on first use when the install
did not (as SRU does).

Order: (1) the module installed inside the package (built by ``setup.py`` when torch was
importable at install time, e.g. ``scripts/setup.sh`` or ``pip install --no-build-isolation .``),
if it loads and was built for the torch now installed; (2) a module compiled earlier for this
torch, Python and source in the cache directory, if it matches the size and SHA-256 recorded
beside it; (3) compile it there now (once, 2-3 minutes; with a lock, so parallel processes wait
for one build).  When that fails (no C++ compiler, no Python headers, a cache folder that cannot
be written) the package warns once, saying what failed and naming the fix, and runs its generic
PyTorch path, which computes the same numbers more slowly.

The cache folder holds the module, ``build.json`` (the module's file name, size and SHA-256, and
the torch and Python it was built for), ``build.log`` and the compiler's object files (so that a
rebuild of the same sources only links).  A module is built in a temporary folder and renamed
into place after it is flushed to disk, its record after it: an interrupted build, a full disk or
a killed process leaves either no module or one that does not match its record, never a
truncated file that the loader maps (loading a truncated shared library kills the process with
SIGBUS).  A module that does not match its record, or that has none, is compiled again.

The module installed inside the package is checked the same way before it is mapped: ``setup.py``
writes its size and SHA-256 beside it (``_C.build.json``, :data:`rnn_ablations.kernels.build.INSTALLED_RECORD`); a
module without that record, or that does not match it, is not loaded (the cache is used instead).

Environment (parsed by :mod:`rnn_ablations._env`, before any module is touched):
``RNN_ABLATIONS_NO_KERNEL=1`` (also accepted as ``RNN_ABLATIONS_DISABLE_KERNEL=1``) loads and
compiles nothing, the installed module included; another value than ``1``/``0`` is refused.
``RNN_ABLATIONS_CACHE`` sets the cache directory (default ``$XDG_CACHE_HOME/rnn_ablations`` or
``~/.cache/rnn_ablations``).
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.machinery
import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from types import ModuleType
from typing import Optional, Tuple

import torch

from .. import _env
from . import verified_file

logger = logging.getLogger("rnn_ablations")

MODULE = __package__.rpartition(".")[0] + "._C"  # rnn_ablations._C
RECORD = "build.json"
#: the fix's second half, after what to install: what builds the kernel then (the command
#: ``rnn-ablations kernels build`` leaves it out of its own error)
THEN_BUILD = (", then run `rnn-ablations kernels build` (or the next layer call compiles it); set "
              "RNN_ABLATIONS_NO_KERNEL=1 to use the generic path without this warning")
_FIX = ("install a C++ compiler and the Python headers (e.g. `apt install g++ python3-dev`)"
        + THEN_BUILD)


class KernelCacheError(RuntimeError):
    """Why the cache could not give a module: ``str(exc)`` says what happened (compiling,
    loading, writing the folder) and ``fix`` what the user can do."""

    def __init__(self, what: str, fix: str = _FIX):
        super().__init__(what)
        self.fix = fix


class _BuildFailed(KernelCacheError):
    """The compiler failed: remembered (FAILED) until the build environment changes."""


#: in a cache folder: the last failed build's environment and message
FAILED = "failed.json"


def build_environment() -> dict:
    """What a failed first-use build depends on besides the folder's key (torch, Python,
    sources): the C++ compiler torch's build would run (``$CXX`` or ``c++`` on the PATH: its
    path, size and modification time) and the Python headers.  A failure is retried when this
    changes."""
    import sysconfig

    name = os.environ.get("CXX") or "c++"
    found = shutil.which(name)
    compiler = {"name": name, "path": None}
    if found:
        real = os.path.realpath(found)
        st = os.stat(real)
        compiler = {"name": name, "path": real, "size": st.st_size, "mtime": int(st.st_mtime)}
    include = sysconfig.get_paths().get("include") or ""
    return {"torch": torch.__version__, "compiler": compiler,
            "python_headers": os.path.isfile(os.path.join(include, "Python.h"))}


def missing_toolchain() -> Optional[str]:
    """What the first-use build lacks before it can start (no C++ compiler on the PATH, no
    Python headers), in one line, or None.  Checked before the build is announced or run, so
    that a machine without a compiler gets this line, not a compiler's error output."""
    env = build_environment()
    missing = []
    if env["compiler"]["path"] is None:
        name = env["compiler"]["name"]
        missing.append(f"no C++ compiler ($CXX={name} is not found)" if os.environ.get("CXX")
                       else f"no C++ compiler ({name} is not on the PATH; $CXX may name another)")
    if not env["python_headers"]:
        missing.append("no Python headers (Python.h)")
    return "; ".join(missing) or None


def _remembered_failure(folder: str) -> Optional[str]:
    """The message of an earlier failed build in ``folder`` made in this same environment."""
    try:
        with open(os.path.join(folder, FAILED)) as f:
            record = json.load(f)
        if record.get("environment") == build_environment():
            return str(record["message"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def _remember_failure(folder: str, message: str) -> None:
    try:
        path = os.path.join(folder, FAILED)
        with open(path + ".tmp", "w") as f:
            json.dump({"environment": build_environment(), "message": message,
                       "time": time.time()}, f)
        os.replace(path + ".tmp", path)
    except OSError:  # a read-only cache: every import tries again
        pass


def cache_root() -> str:
    return _env.cache_root()


def _kernel_disabled() -> bool:
    return _env.kernel_disabled()


def _load_file(path: str) -> ModuleType:
    loader = importlib.machinery.ExtensionFileLoader(MODULE, path)
    spec = importlib.util.spec_from_file_location(MODULE, path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    sys.modules[MODULE] = module
    return module


def _installed_file() -> Optional[str]:
    """The path of the module installed inside the package (found, not loaded), or None.

    Looked up in this package's own folder only: an import-system lookup of ``rnn_ablations._C``
    can be answered by another copy's finder (an editable install's maps the name to its
    checkout), which would load a module built from other sources."""
    folder = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # rnn_ablations/
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = os.path.join(folder, "_C" + suffix)
        if os.path.isfile(path):
            return path
    return None


def installed_record_problem(path: str) -> Optional[str]:
    """What is wrong with the installed module ``path`` against the size and SHA-256 recorded
    beside it at build time (no record, another size or digest), or None when it matches."""
    from . import build as _build

    record_path = os.path.join(os.path.dirname(path), _build.INSTALLED_RECORD)
    rebuild = ("rebuild it (`python setup.py build_ext --inplace`, `bash scripts/setup.sh` or "
               "`pip install --no-build-isolation .`), or delete it to compile into the cache")
    try:
        with open(record_path) as f:
            record = json.load(f)
        name, size, sha = record["module"], int(record["size"]), str(record["sha256"])
    except FileNotFoundError:
        return (f"the kernel module {path} has no size and SHA-256 record ({record_path}), so it "
                f"is not loaded (a damaged one would kill the process); {rebuild}")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return (f"the record {record_path} of the kernel module {path} cannot be read "
                f"({type(exc).__name__}: {exc}); {rebuild}")
    if name != os.path.basename(path):
        return f"the record {record_path} is for {name}, not for {path}; {rebuild}"
    with open(path, "rb") as f:
        data = f.read()
    if len(data) != size:
        return (f"the kernel module {path} is {len(data)} bytes, its record says {size} "
                f"(truncated or overwritten), so it is not loaded; {rebuild}")
    if hashlib.sha256(data).hexdigest() != sha:
        return (f"the kernel module {path} does not match the SHA-256 in its record "
                f"(overwritten or damaged), so it is not loaded; {rebuild}")
    broken = verified_file.elf_problem(data, f"the kernel module {path}") \
        if path.endswith(".so") else None
    if broken:
        return f"{broken}, so it is not loaded; {rebuild}"
    # Refused before it is mapped, too: a module built for another torch (its ABI), or from
    # other sources (the digest the module carries as a string; a stale module, once loaded,
    # would stay the one that Python returns for this name, the cache's included).
    built_for = record.get("torch")
    if built_for is not None and built_for != torch.__version__:
        return (f"the kernel installed with the package was built for torch {built_for}, "
                f"this is torch {torch.__version__}")
    now = _build.sources_digest()
    if now and now.encode() not in data:
        return (f"the kernel module {path} was compiled from other sources than the C++ files "
                f"in {_build.CSRC} (their digest {now} is not in it); rebuild it "
                "(`python setup.py build_ext --inplace`, `bash scripts/setup.sh` or "
                "`pip install --no-build-isolation -e .`)")
    return None


def _installed() -> Tuple[Optional[ModuleType], str]:
    """The module built at install time, if it matches its record, loads and matches this
    torch."""
    if MODULE not in sys.modules:
        path = _installed_file()
        if path is None:
            return None, "no kernel built at install time"
        problem = installed_record_problem(path)
        if problem:
            # a damaged module is worth a warning; one without a record (built before records
            # were written) or out of date is simply replaced by the cache's, as before
            quiet = ("has no size and SHA-256 record" in problem or "other sources" in problem
                     or "built for torch" in problem)
            (logger.info if quiet else logger.warning)("rnn_ablations: %s", problem)
            return None, problem
    try:
        module = importlib.import_module(MODULE)
    except ImportError as exc:
        return None, f"no kernel built at install time ({exc})"
    built_for = getattr(module, "torch_version", None)
    if not hasattr(module, "kernel_isa"):  # compiled from older sources (a stale in-place build)
        sys.modules.pop(MODULE, None)
        return None, (f"the kernel module {module.__file__} was built from older sources; "
                      "rebuild it (`bash scripts/setup.sh` or `pip install --no-build-isolation -e .`)")
    if built_for is not None and built_for != torch.__version__:
        sys.modules.pop(MODULE, None)
        return None, (f"the kernel installed with the package was built for torch {built_for}, "
                      f"this is torch {torch.__version__}")
    stale = _stale_sources(module)
    if stale:
        sys.modules.pop(MODULE, None)
        return None, stale
    return module, ""


def _stale_sources(module: ModuleType) -> str:
    """Why ``module`` was not compiled from the C++ sources beside it (an in-place or editable
    build that predates an edit of ``csrc/``), or "" when it was (or no sources are here)."""
    from . import build as _build

    now = _build.sources_digest()
    built_from = getattr(module, "sources_digest", None)
    if not now or built_from == now:
        return ""
    return (f"the kernel module {module.__file__} was compiled from other sources than the "
            f"C++ files in {_build.CSRC} (digest {built_from or 'not recorded'}, the files now: "
            f"{now}); rebuild it (`python setup.py build_ext --inplace`, `bash scripts/setup.sh` "
            "or `pip install --no-build-isolation -e .`)")


def _cache_dir() -> str:
    from . import build as _build

    fp = _build.fingerprint()
    name = "cpu-{python}-torch{torch}-{sources}".format(**fp).replace("+", "_")
    return os.path.join(cache_root(), name)


def _digest(path: str) -> Tuple[int, str]:
    """``(size in bytes, SHA-256 hex digest)`` of a file."""
    from . import build as _build

    return _build.file_digest(path)


def _is_module_name(name: str) -> bool:
    return name.startswith("_C") and name.endswith((".so", ".pyd")) and os.sep not in name


def cached_module(folder: str) -> Tuple[Optional[str], Optional[str]]:
    """``(path, None)`` for a module in ``folder`` that matches its record; ``(None, None)`` when
    the folder holds no module; ``(None, what is wrong)`` for a module that cannot be trusted
    (no record, a different size or SHA-256: truncated or overwritten), which must not be
    loaded."""
    if not os.path.isdir(folder):
        return None, None
    present = [os.path.join(folder, f) for f in sorted(os.listdir(folder)) if _is_module_name(f)]
    record_path = os.path.join(folder, RECORD)
    try:
        with open(record_path) as f:
            record = json.load(f)
        name, size, sha = record["module"], int(record["size"]), str(record["sha256"])
        if not isinstance(name, str) or not _is_module_name(name):
            raise ValueError(f"bad module name {name!r}")
    except FileNotFoundError:
        if not present:
            return None, None
        return None, f"{present[0]} has no size and SHA-256 record ({record_path})"
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return None, f"its record {record_path} cannot be read ({type(exc).__name__}: {exc})"
    path = os.path.join(folder, name)
    if not os.path.isfile(path):
        if not present:
            return None, None
        return None, f"{present[0]} is not the module its record names ({name})"
    problem = verified_file.record_problem(path, size, sha)
    return (None, problem) if problem else (path, None)


def _fsync_dir(folder: str) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # pragma: no cover - e.g. systems without directory file descriptors
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


#: The build process's prologue: it leads a process group of its own (``start_new_session``), asks
#: Linux to send it SIGTERM when the importing thread dies (``PR_SET_PDEATHSIG``: a SIGTERM or
#: SIGKILL of the importer, whose default action runs no Python), and on SIGTERM, SIGINT or
#: SIGHUP stops its whole group (ninja, which stops its compilers, and the compilers it runs
#: itself) before it exits.  It holds the folder's build lock (an inherited descriptor of the
#: same open file), so no second build starts in the folder until this one has stopped.
_BUILD_PROLOGUE = r"""
import os, signal, sys, time
def _stop(signum, frame):
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, signal.SIG_IGN)
    try:
        os.killpg(0, signal.SIGTERM)
        time.sleep(1.0)
    finally:
        os.killpg(0, signal.SIGKILL)
for _s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(_s, _stop)
_parent = int(sys.argv.pop(1))
if sys.platform.startswith("linux"):
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
if os.getppid() != _parent:  # the importer died before the request took effect
    _stop(signal.SIGTERM, None)
import runpy
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def _stop_group(proc: subprocess.Popen) -> None:
    """Stop the build's process group (SIGTERM, then SIGKILL) and reap the build process."""
    import signal

    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _run_build(folder: str, out: str, build_temp: str, log_path: str,
               lock_fd: Optional[int] = None) -> int:
    from . import build as _build

    with open(log_path, "a") as log:
        # -c: sys.path[0] is the working folder, not rnn_ablations/ (whose module names could
        # shadow others); the build does not import this package.
        proc = subprocess.Popen(
            [sys.executable, "-c", _BUILD_PROLOGUE, str(os.getpid()), _build.__file__, "--out",
             out, "--build-temp", build_temp],
            cwd=folder, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            pass_fds=() if lock_fd is None else (lock_fd,))
        start = time.time()
        files = max(1, len(_build.cpu_sources()))
        while True:
            try:
                return proc.wait(timeout=PROGRESS_EVERY)
            except subprocess.TimeoutExpired:
                logger.warning("rnn_ablations: still compiling the CPU kernel: %s (log: %s)",
                               progress(time.time() - start,
                                        _compiled_since(build_temp, start), files), log_path)
            except BaseException:  # Ctrl-C, SystemExit: the build stops with this process
                _stop_group(proc)
                raise


#: seconds between two progress messages of a first-use build (or of a wait for another one)
PROGRESS_EVERY = 30.0
#: CPU seconds the compilers spend on the kernel (every file and the link) where no build in the
#: cache has recorded its own (``build.json``'s ``cpu_seconds``): 75 s in a first-use build on a
#: 2-core AMD EPYC with AVX2 (g++ 12, torch 2.13; 41 s wall, the load average 2.5-3 with the
#: build's own compilers); a first build records its own
_DEFAULT_CPU_SECONDS = 75.0
#: the largest file's share of that work (``csrc/bindings.cpp``: 23 of about 78 CPU seconds, its
#: files compiled one at a time on that machine under load): one compiler runs it, so no number
#: of cores makes a build shorter
_LARGEST_SHARE = 0.3
#: how much more CPU time the same compile takes on cores shared with other work (caches and
#: memory bandwidth shared): builds timed on 2 cores at a load of 7 to 11 took 1.8-2.1 times the
#: work of a quiet one
_CONTENDED = 0.9


def _contention(others: float, cores: int) -> float:
    """The factor on the compilers' CPU time when ``others`` runnable processes share the
    ``cores``: 1 on a quiet machine, 1 + :data:`_CONTENDED` once they fill the cores."""
    return 1.0 + _CONTENDED * min(1.0, others / max(1, cores))
BUILDING = "building.json"


def _recorded_cpu_seconds() -> Optional[float]:
    """The compilers' CPU seconds of the latest build recorded in the cache (any torch or
    sources: the work is nearly the same), as on quiet cores (its own load taken out), or
    None."""
    latest = None
    try:
        for entry in os.listdir(cache_root()):
            try:
                with open(os.path.join(cache_root(), entry, RECORD)) as f:
                    record = json.load(f)
                stamp, cpu = os.path.getmtime(f.name), float(record["cpu_seconds"])
                # the work on quiet cores (the estimate applies the load it meets)
                cores = int(record.get("cores") or 1)
                others = max(0.0, float(record.get("load") or 0.0) - _build_jobs(cores))
                cpu /= _contention(others, cores)
            except (OSError, ValueError, KeyError, TypeError):
                continue
            if cpu > 0 and (latest is None or stamp > latest[0]):
                latest = (stamp, cpu)
    except OSError:
        pass
    return latest[1] if latest else None


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def _load() -> float:
    """The load (runnable processes): the mean of the 1- and 5-minute load averages (the one
    follows a change sooner, the other keeps a burst from swinging the estimate), 0 where the OS
    has none."""
    try:
        one, five, _ = os.getloadavg()
    except (AttributeError, OSError):  # pragma: no cover - Windows
        return 0.0
    return (one + five) / 2


def _build_jobs(cores: int) -> int:
    """Compilers the build runs at once: ``MAX_JOBS``, else ninja's default (cores + 2, 3 on two
    cores, 2 on one) where ninja is installed, else 1 (setuptools compiles one file at a time)."""
    jobs = os.environ.get("MAX_JOBS", "")
    if jobs.isdigit() and int(jobs) > 0:
        return int(jobs)
    if shutil.which("ninja") is None:
        return 1
    return {1: 2, 2: 3}.get(cores, cores + 2)


def estimate_seconds(cpu_seconds: Optional[float] = None, files: Optional[int] = None,
                     cores: Optional[int] = None, load: Optional[float] = None,
                     jobs: Optional[int] = None, building: int = 0,
                     largest: bool = True) -> float:
    """Wall seconds of compiling ``files`` files that take ``cpu_seconds`` of compiler time (the
    whole build: the latest build recorded in the cache, else :data:`_DEFAULT_CPU_SECONDS`) on
    ``cores`` cores whose 1-minute load is ``load``, ``building`` of those runnable processes
    being this build's own compilers.  ``jobs`` compilers run at once, each getting a core, or
    its share of the cores once more processes want one than there are cores; and no build is
    shorter than its largest file (:data:`_LARGEST_SHARE`, while ``largest``: it is among the
    files) on one compiler."""
    from . import build as _build

    work = cpu_seconds if cpu_seconds is not None else (
        _recorded_cpu_seconds() or _DEFAULT_CPU_SECONDS)
    files = max(1, files if files is not None else len(_build.cpu_sources()))
    cores = max(1, cores or _cores())
    others = max(0.0, (_load() if load is None else load) - building)
    jobs = max(1, min(jobs or _build_jobs(cores), files))
    share = min(1.0, cores / (others + jobs))  # of a core, for each compiler
    work *= _contention(others, cores)
    wall = work / (jobs * share)
    if largest:
        full = cpu_seconds if cpu_seconds is not None and files == len(_build.cpu_sources()) \
            else (_recorded_cpu_seconds() or _DEFAULT_CPU_SECONDS)
        wall = max(wall, min(work, _LARGEST_SHARE * full * _contention(others, cores)) / share)
    return wall


def _expected_seconds() -> float:
    """How long a whole build takes here now (:func:`estimate_seconds`)."""
    return estimate_seconds()


#: the largest file's name (:data:`_LARGEST_SHARE`)
_LARGEST = "bindings"


def _compiled_since(build_temp: str, start: float) -> list:
    """The names of the object files the build has written into ``build_temp`` since
    ``start``."""
    done = []
    for root, _, names in os.walk(build_temp):
        for name in names:
            if name.endswith((".o", ".obj")):
                try:
                    if os.path.getmtime(os.path.join(root, name)) >= start - 1:
                        done.append(name)
                except OSError:
                    pass
    return done


def progress(elapsed: float, done: list, files: int) -> str:
    """A progress line's middle: the time so far, the files compiled (``done``: their object
    files' names), and the time left at the present load: the work left (the largest file's
    share while it is not compiled, the other files not yet compiled at an equal share of the
    rest), less what the compilers running now have done of it (the CPU time the build had at
    this load since it started, beyond the files it finished, up to those files' work)."""
    left_files = max(0, files - len(done))
    if left_files == 0:
        return f"{elapsed:.0f} s, all {files} files compiled, linking"
    whole = _recorded_cpu_seconds() or _DEFAULT_CPU_SECONDS
    largest = not any(name.startswith(_LARGEST) for name in done)
    per_file = whole * (1 - _LARGEST_SHARE) / max(1, files - 1)
    work = per_file * (left_files - largest) + (whole * _LARGEST_SHARE if largest else 0.0)
    cores = _cores()
    jobs = min(_build_jobs(cores), left_files)
    others = max(0.0, _load() - jobs)
    share = min(1.0, cores / (others + jobs))
    slower = _contention(others, cores)
    running = per_file * (jobs - largest) + (whole * _LARGEST_SHARE if largest else 0.0)
    credit = min(running, max(0.0, elapsed * jobs * share / slower - (whole - work)))
    left = estimate_seconds(cpu_seconds=max(work - credit, 0.02 * whole), files=left_files,
                            jobs=jobs, building=jobs, largest=False)
    if largest:  # one compiler runs the largest file: not sooner than its rest on one core
        left = max(left, max(0.0, whole * _LARGEST_SHARE * slower - elapsed * share) / share)
    return (f"{elapsed:.0f} s, {len(done)} of {files} files compiled, about {left:.0f} s to go "
            "at the present load")


def _lock_waiting(fcntl, lock, folder: str) -> None:
    """Take the build lock; while another process holds it (it is compiling), say so, and
    again every PROGRESS_EVERY seconds."""
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return
    except BlockingIOError:
        pass
    who = ""
    try:
        with open(os.path.join(folder, BUILDING)) as f:
            info = json.load(f)
        who = (f" (pid {int(info['pid'])}, compiling for {time.time() - float(info['started']):.0f} s"
               f" of about {_expected_seconds():.0f} s)")
    except (OSError, ValueError, KeyError, TypeError):
        pass
    start = time.time()
    logger.warning("rnn_ablations: waiting for another process%s that is compiling the CPU "
                   "kernel into %s; this process uses it when it is done", who, folder)
    last = start
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            time.sleep(0.5)
        if time.time() - last >= PROGRESS_EVERY:
            last = time.time()
            logger.warning("rnn_ablations: still waiting for the other process's build of the "
                           "CPU kernel (%.0f s)", last - start)


def _children_cpu_seconds() -> float:
    """CPU seconds (user + system) of this process's finished child processes and theirs: the
    build's compilers, once it has returned."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not POSIX
        return 0.0
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _publish(folder: str, built: str, seconds: float, cpu_seconds: float = 0.0) -> str:
    """Move the module ``built`` (in a temporary folder inside ``folder``) into place with its
    record, each flushed to disk and then renamed, so that no reader sees a partial file."""
    name = os.path.basename(built)
    with open(built, "rb+") as f:
        os.fsync(f.fileno())
    size, sha = _digest(built)
    record = {"module": name, "size": size, "sha256": sha, "torch": torch.__version__,
              "python": sys.version.split()[0], "seconds": round(seconds, 1),
              "cpu_seconds": round(cpu_seconds, 1), "cores": _cores(), "load": round(_load(), 1)}
    fd, temp_record = tempfile.mkstemp(prefix=".build-", suffix=".json", dir=folder)
    os.chmod(temp_record, 0o644)  # mkstemp's 0600 would hide the record from other users
    with os.fdopen(fd, "w") as f:
        json.dump(record, f)
        f.flush()
        os.fsync(f.fileno())
    final = os.path.join(folder, name)
    os.replace(built, final)
    os.replace(temp_record, os.path.join(folder, RECORD))
    _fsync_dir(folder)
    return final


def _compile(folder: str) -> str:
    """Compile into ``folder`` (under a lock) unless another process did; returns the module's
    path.  A module there that does not match its record is replaced, with a warning that says
    what is wrong with it."""
    try:
        import fcntl  # POSIX; elsewhere the generic path is used
    except ImportError as exc:  # pragma: no cover - not POSIX
        raise KernelCacheError(f"compiling on first use needs POSIX file locks ({exc})") from exc

    try:
        os.makedirs(folder, exist_ok=True)
        lock = open(os.path.join(folder, ".lock"), "w")
    except OSError as exc:
        raise KernelCacheError(
            f"the cache folder {folder} cannot be written ({exc})",
            fix=f"set RNN_ABLATIONS_CACHE to a writable folder, or {_FIX}") from exc
    with lock:
        _lock_waiting(fcntl, lock, folder)
        try:
            done, damaged = cached_module(folder)
            if done:  # another process built (or repaired) it while this one waited
                return done
            for entry in os.listdir(folder):  # left by a build that was killed
                if entry.startswith(".out-"):
                    shutil.rmtree(os.path.join(folder, entry), ignore_errors=True)
                elif entry.startswith(".build-") and entry.endswith(".json"):
                    os.remove(os.path.join(folder, entry))
            missing = missing_toolchain()
            if missing:  # before the announcement: one clean line, no compiler output
                raise _BuildFailed(
                    ("the cached module cannot be used (" + damaged + ") and compiling it "
                     "again failed: " if damaged else "it cannot be compiled here: ") + missing,
                    f"{_FIX} (deleting the folder {folder} removes the damaged module)"
                    if damaged else _FIX)
            if damaged:
                logger.warning("rnn_ablations: the cached CPU kernel cannot be used (%s); "
                               "compiling it again (%s)", damaged, folder)
            else:
                logger.warning("rnn_ablations: compiling the CPU kernel for torch %s (once, about "
                               "%.0f s here: %d cores, load %.1f; cached in %s; "
                               "RNN_ABLATIONS_NO_KERNEL=1 skips it and runs the generic path)",
                               torch.__version__, _expected_seconds(), _cores(), _load(), folder)
            try:
                with open(os.path.join(folder, BUILDING), "w") as f:
                    json.dump({"pid": os.getpid(), "started": time.time()}, f)
            except OSError:
                pass
            build_temp = os.path.join(folder, "build")
            log_path = os.path.join(folder, "build.log")
            open(log_path, "w").close()
            out = tempfile.mkdtemp(prefix=".out-", dir=folder)
            try:
                start, cpu_start = time.time(), _children_cpu_seconds()
                reused = os.path.isdir(build_temp)
                rc = _run_build(folder, out, build_temp, log_path, lock.fileno())
                if rc != 0 and reused:  # the object files kept from an earlier build may be bad
                    shutil.rmtree(build_temp, ignore_errors=True)
                    rc = _run_build(folder, out, build_temp, log_path, lock.fileno())
                what = (f"the cached module cannot be used ({damaged}) and compiling it again"
                        if damaged else "compiling it on first use")
                fix = (f"{_FIX} (deleting the folder {folder} removes the damaged module)"
                       if damaged else _FIX)
                if rc != 0:
                    # the compiler and the headers are here (missing_toolchain said so): the
                    # log's errors say what failed, and installing a compiler would not help
                    fix = (f"read the compiler's errors in {log_path}: a compiler older than "
                           "the one torch was built with (C++20), or a broken torch install, "
                           "is the usual cause; an error in this package's own sources is a "
                           "bug to report with that log" + THEN_BUILD)
                    with open(log_path) as f:
                        tail = "".join(f.readlines()[-15:])
                    # remembered only when the build ran to its own end (a build killed by a
                    # signal, e.g. out of memory, is tried again by the next import)
                    error = _BuildFailed if rc > 0 else KernelCacheError
                    raise error(
                        f"{what} failed: the compiler failed (log: {log_path}):\n{tail}", fix)
                built = [f for f in sorted(os.listdir(out)) if _is_module_name(f)]
                if not built:
                    raise _BuildFailed(
                        f"{what} failed: the build produced no module (log: {log_path})", fix)
                return _publish(folder, os.path.join(out, built[0]), time.time() - start,
                                _children_cpu_seconds() - cpu_start)
            finally:
                shutil.rmtree(out, ignore_errors=True)
                try:
                    os.remove(os.path.join(folder, BUILDING))
                except OSError:
                    pass
        except OSError as exc:
            raise KernelCacheError(
                f"writing the cache folder {folder} failed ({exc})",
                fix=f"free disk space or set RNN_ABLATIONS_CACHE to a writable folder, or {_FIX}"
            ) from exc
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _remove_module(folder: str) -> None:
    """Remove the module and its record (under the lock), so the next build replaces them."""
    import fcntl

    with open(os.path.join(folder, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            for entry in os.listdir(folder):
                if entry == RECORD or _is_module_name(entry):
                    os.remove(os.path.join(folder, entry))
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _from_cache() -> Tuple[ModuleType, str]:
    folder = _cache_dir()
    path, _ = cached_module(folder)
    source = "cache"
    if path is None:  # absent or damaged: _compile checks again under its lock and says which
        path = _compile(folder)
        source = "compiled"
    try:
        return _load_file(path), source
    except ImportError as exc:
        if source == "compiled":
            raise KernelCacheError(
                f"loading the module just compiled, {path}, failed ({exc})") from exc
        # Matches its record but does not load (e.g. a library it links against changed):
        # compiled once more.
        logger.warning("rnn_ablations: the cached CPU kernel %s does not load (%s); compiling "
                       "it again", path, exc)
        try:
            _remove_module(folder)
        except OSError as exc2:
            raise KernelCacheError(
                f"the cached module {path} does not load ({exc}) and cannot be removed ({exc2})",
                fix=f"delete the folder {folder}") from exc2
        path = _compile(folder)
        try:
            return _load_file(path), "compiled"
        except ImportError as exc2:
            raise KernelCacheError(
                f"loading the module just compiled, {path}, failed ({exc2})") from exc2


#: seconds the last :func:`load_cpu_kernel` took (what the kernel adds to its first use)
last_load_seconds: Optional[float] = None
#: the last failure of :func:`load_cpu_kernel` in parts: ``(why the installed module is not
#: used, what failed, the fix)``, or None
last_failure: Optional[Tuple[str, str, str]] = None


def load_cpu_kernel(report: bool = True,
                    retry_failed: bool = False) -> Tuple[Optional[ModuleType], Optional[str], str]:
    """``(module or None, why not, where from)``; where from is ``"installed"``, ``"cache"``,
    ``"compiled"`` or ``""``.  ``report=False``: a failure is not logged (the caller says it,
    from :data:`last_failure`); ``retry_failed``: compile even where a build failed before in this
    environment (``rnn-ablations kernels build``)."""
    global last_load_seconds
    start = time.perf_counter()
    try:
        return _load_cpu_kernel(report, retry_failed)
    finally:
        last_load_seconds = time.perf_counter() - start


def _load_cpu_kernel(report: bool = True,
                     retry_failed: bool = False) -> Tuple[Optional[ModuleType], Optional[str], str]:
    global last_failure
    last_failure = None
    if _kernel_disabled():  # read first: nothing is loaded (a ValueError for a bad value)
        return None, (f"{_env.kernel_switch_set()} is set: no compiled kernel is loaded, the "
                      "generic path runs"), ""
    if _env.cpu_kernel_disabled():  # the CPU kernel alone (the CUDA kernels stay in use)
        return None, (f"{_env.NO_CPU_KERNEL}=1 is set: the compiled CPU kernel is not loaded, "
                      "the generic path runs CPU layers"), ""
    module, why = _installed()
    if module is not None:
        return module, None, "installed"
    folder = None
    try:
        folder = _cache_dir()
        remembered = (None if retry_failed or cached_module(folder)[0]
                      else _remembered_failure(folder))
        if remembered is not None:  # warned when it failed; not retried in this environment
            msg = (f"{remembered} (remembered from an earlier use: not compiled again until "
                   f"the compiler, the Python headers or torch change, or {FAILED} is deleted "
                   f"from {folder})")
            logger.info(msg)
            return None, msg, ""
        module, source = _from_cache()
        if source == "compiled":
            try:  # an earlier failure in another environment is history now
                os.remove(os.path.join(folder, FAILED))
            except OSError:
                pass
        return module, None, source
    except Exception as exc:  # no compiler, no headers, read-only cache, ...
        fix = getattr(exc, "fix", _FIX)
        what = str(exc) if isinstance(exc, KernelCacheError) else (
            f"the kernel cache failed: {type(exc).__name__}: {exc}")
        msg = (f"rnn_ablations: the CPU kernel is not available ({why}; {what}). Using the "
               f"generic PyTorch path (same numbers, slower). To fix: {fix}.")
        if isinstance(exc, _BuildFailed) and folder is not None:
            _remember_failure(folder, msg)
            msg += (" (Later processes do not compile again, and say nothing, until the "
                    "compiler, the Python headers or torch change.)")
        last_failure = (why, what, fix)
        if report:
            logger.warning(msg)
        return None, msg, ""
