"""Find the compiled CPU kernel ``rnn_ablations._C``, compiling it on first use when the install
did not (as SRU does).

Order: (1) the module installed inside the package (built by ``setup.py`` when torch was
importable at install time, e.g. ``scripts/setup.sh`` or ``pip install --no-build-isolation .``),
if it loads and was built for the torch now installed; (2) a module compiled earlier for this
torch, Python and source in the cache directory; (3) compile it there now (once, 2-3 minutes;
with a lock, so parallel processes wait for one build).  When that fails (no C++ compiler, no
Python headers) the package warns once, naming the fix, and runs its generic PyTorch path, which
computes the same numbers more slowly.

Environment: ``RNN_ABLATIONS_NO_KERNEL=1`` (or ``RNN_ABLATIONS_DISABLE_KERNEL=1``) skips (2)-(3);
``RNN_ABLATIONS_CACHE`` sets the cache directory (default ``$XDG_CACHE_HOME/rnn_ablations`` or
``~/.cache/rnn_ablations``).
"""
from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import json
import logging
import os
import subprocess
import sys
import time
from types import ModuleType
from typing import Optional, Tuple

import torch

logger = logging.getLogger("rnn_ablations")

MODULE = __package__ + "._C"
_FIX = ("install a C++ compiler and the Python headers (e.g. `apt install g++ python3-dev`) and "
        "import rnn_ablations again, or reinstall with `pip install --no-build-isolation .` in an "
        "environment that has them; set RNN_ABLATIONS_NO_KERNEL=1 to use the generic path "
        "without this warning")


def cache_root() -> str:
    env = os.environ.get("RNN_ABLATIONS_CACHE")
    if env:
        return os.path.abspath(os.path.expanduser(env))
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "rnn_ablations")


def _kernel_disabled() -> bool:
    return (os.environ.get("RNN_ABLATIONS_NO_KERNEL") == "1"
            or os.environ.get("RNN_ABLATIONS_DISABLE_KERNEL") == "1")


def _load_file(path: str) -> ModuleType:
    loader = importlib.machinery.ExtensionFileLoader(MODULE, path)
    spec = importlib.util.spec_from_file_location(MODULE, path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    sys.modules[MODULE] = module
    return module


def _installed() -> Tuple[Optional[ModuleType], str]:
    """The module built at install time, if it loads and matches this torch."""
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
    return module, ""


def _cache_dir() -> str:
    from . import _build

    fp = _build.fingerprint()
    name = "cpu-{python}-torch{torch}-{sources}".format(**fp).replace("+", "_")
    return os.path.join(cache_root(), name)


def _module_in(folder: str) -> Optional[str]:
    if not os.path.isdir(folder):
        return None
    for f in sorted(os.listdir(folder)):
        if f.startswith("_C") and f.endswith((".so", ".pyd")):
            return os.path.join(folder, f)
    return None


def _compile(folder: str) -> str:
    """Compile into ``folder`` (under a lock); returns the module's path."""
    import fcntl  # POSIX; on other systems the import fails and the generic path is used

    from . import _build

    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            done = _module_in(folder)
            if done:  # another process built it while this one waited
                return done
            logger.warning("rnn_ablations: compiling the CPU kernel for torch %s (once: 2-3 "
                           "minutes of CPU; cached in %s)", torch.__version__, folder)
            temp = os.path.join(folder, "build")
            out = os.path.join(folder, "out")
            log_path = os.path.join(folder, "build.log")
            code = ("import runpy, sys; sys.argv = sys.argv[1:]; "
                    "runpy.run_path(sys.argv[0], run_name='__main__')")
            start = time.time()
            with open(log_path, "w") as log:
                # -c: sys.path[0] is the working folder, not rnn_ablations/ (whose module names
                # could shadow others); the build does not import this package.
                proc = subprocess.run(
                    [sys.executable, "-c", code, _build.__file__, "--out", out,
                     "--build-temp", temp],
                    cwd=folder, stdout=log, stderr=subprocess.STDOUT)
            if proc.returncode != 0:
                with open(log_path) as f:
                    tail = "".join(f.readlines()[-15:])
                raise RuntimeError(f"the compiler failed (log: {log_path}):\n{tail}")
            built = _module_in(out)
            if built is None:
                raise RuntimeError(f"the build produced no module (log: {log_path})")
            final = os.path.join(folder, os.path.basename(built))
            os.replace(built, final)
            with open(os.path.join(folder, "build.json"), "w") as f:
                json.dump({"torch": torch.__version__, "python": sys.version.split()[0],
                           "seconds": round(time.time() - start, 1)}, f)
            return final
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def load_cpu_kernel() -> Tuple[Optional[ModuleType], Optional[str], str]:
    """``(module or None, why not, where from)``; where from is ``"installed"``, ``"cache"``,
    ``"compiled"`` or ``""``."""
    module, why = _installed()
    if module is not None:
        return module, None, "installed"
    if _kernel_disabled():
        return None, why + "; RNN_ABLATIONS_NO_KERNEL/RNN_ABLATIONS_DISABLE_KERNEL is set", ""
    try:
        folder = _cache_dir()
        path = _module_in(folder)
        source = "cache"
        if path is None:
            path = _compile(folder)
            source = "compiled"
        return _load_file(path), None, source
    except Exception as exc:  # no compiler, no headers, read-only cache, ...
        msg = (f"rnn_ablations: the CPU kernel is not available ({why}; compiling it on first "
               f"use failed: {exc}). Using the generic PyTorch path (same numbers, slower). "
               f"To fix: {_FIX}.")
        logger.warning(msg)
        return None, msg, ""
