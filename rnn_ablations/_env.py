"""The environment variables that decide whether the compiled kernels are used and where the
first-use build is cached, parsed in one place.

This module imports nothing from ``rnn_ablations`` (the kernel loader reads it before any
compiled module is touched, ``setup.py`` may read it at install time).

* ``RNN_ABLATIONS_NO_KERNEL``: ``1`` = the compiled kernels are neither loaded nor compiled (the
  one installed inside the package included) and the generic PyTorch path runs; ``0`` or unset =
  they are used when available.  ``RNN_ABLATIONS_DISABLE_KERNEL`` is accepted as another name for
  it, with the same values; when both are set they must agree.  Any other value is refused with
  a ``ValueError`` that names the accepted ones (``yes`` / ``true`` are not guessed at).
* ``RNN_ABLATIONS_NO_CPU_KERNEL``: ``1`` = the compiled CPU kernel alone is neither loaded nor
  compiled (the CUDA kernels stay in use); ``0`` or unset = as ``RNN_ABLATIONS_NO_KERNEL`` says.
* ``RNN_ABLATIONS_CUDA_CHECK``: ``0`` = the CUDA kernels' first-use check against the generic
  path (``rnn_ablations/kernels/cuda/selfcheck.py``) is off; ``1`` or unset = on.
* ``RNN_ABLATIONS_CACHE``: the folder of the first-use build (default
  ``$XDG_CACHE_HOME/rnn_ablations``, else ``~/.cache/rnn_ablations``); ``~`` is expanded and a
  relative path is taken from the working folder.
"""
from __future__ import annotations

import os
from typing import Mapping, Optional

__all__ = ["NO_KERNEL", "NO_KERNEL_ALIASES", "kernel_disabled", "kernel_switch_set",
           "CACHE", "cache_root", "NO_CPU_KERNEL", "cpu_kernel_disabled", "CUDA_CHECK",
           "cuda_check_enabled"]

#: the documented switch
NO_KERNEL = "RNN_ABLATIONS_NO_KERNEL"
#: other names accepted for it (same values)
NO_KERNEL_ALIASES = ("RNN_ABLATIONS_DISABLE_KERNEL",)
_ON, _OFF = ("1",), ("0", "")

CACHE = "RNN_ABLATIONS_CACHE"


def _switch_value(var: str, raw: str) -> bool:
    value = raw.strip()
    if value in _ON:
        return True
    if value in _OFF:
        return False
    alias = f" ({var} is another name for {NO_KERNEL})" if var != NO_KERNEL else ""
    raise ValueError(
        f"{var}={raw!r} is not understood{alias}: set it to 1 to run without the compiled "
        "kernels (the generic PyTorch path), or to 0 or unset it to use them")


def kernel_disabled(environ: Optional[Mapping[str, str]] = None) -> bool:
    """Whether ``RNN_ABLATIONS_NO_KERNEL`` (or its other name ``RNN_ABLATIONS_DISABLE_KERNEL``)
    asks for no compiled kernel, in ``environ`` (``os.environ`` when ``None``).  ``ValueError``
    for a value other than ``1``, ``0`` or empty, and for the two names set to different
    values."""
    env = os.environ if environ is None else environ
    seen = {}
    for var in (NO_KERNEL,) + NO_KERNEL_ALIASES:
        raw = env.get(var)
        if raw is not None:
            seen[var] = _switch_value(var, raw)
    if len(set(seen.values())) > 1:
        told = ", ".join(f"{var}={env[var]!r}" for var in seen)
        raise ValueError(f"{told} disagree ({NO_KERNEL_ALIASES[0]} is another name for "
                         f"{NO_KERNEL}): set only {NO_KERNEL}")
    return any(seen.values())


def kernel_switch_set(environ: Optional[Mapping[str, str]] = None) -> str:
    """The ``NAME=value`` that turned the kernels off (for messages), or ``""``."""
    env = os.environ if environ is None else environ
    for var in (NO_KERNEL,) + NO_KERNEL_ALIASES:
        raw = env.get(var)
        if raw is not None and raw.strip() in _ON:
            return f"{var}={raw.strip()}"
    return ""


def cache_root(environ: Optional[Mapping[str, str]] = None) -> str:
    """The folder that holds the first-use builds (absolute)."""
    env = os.environ if environ is None else environ
    chosen = (env.get(CACHE) or "").strip()
    if chosen:
        return os.path.abspath(os.path.expanduser(chosen))
    base = (env.get("XDG_CACHE_HOME") or "").strip() or os.path.join(os.path.expanduser("~"),
                                                                     ".cache")
    return os.path.join(os.path.abspath(base), "rnn_ablations")


#: ``1`` = the compiled CPU kernel alone is neither loaded nor compiled (the CUDA kernels stay in
#: use): a GPU machine's check that need not wait for the CPU build
NO_CPU_KERNEL = "RNN_ABLATIONS_NO_CPU_KERNEL"
#: ``0`` = the CUDA kernels' first-use check against the generic path is off
#: (rnn_ablations/kernels/cuda/selfcheck.py)
CUDA_CHECK = "RNN_ABLATIONS_CUDA_CHECK"


def _flag(var: str, environ: Optional[Mapping[str, str]], default: bool, meaning: str) -> bool:
    env = os.environ if environ is None else environ
    raw = env.get(var)
    if raw is None or raw.strip() == "":
        return default
    value = raw.strip()
    if value in ("0", "1"):
        return value == "1"
    raise ValueError(f"{var}={raw!r} is not understood: set it to 1 or 0 ({meaning}), or unset "
                     f"it (default {int(default)})")


def cpu_kernel_disabled(environ: Optional[Mapping[str, str]] = None) -> bool:
    """Whether ``RNN_ABLATIONS_NO_CPU_KERNEL=1`` asks for no compiled CPU kernel (the generic
    path runs CPU layers; the CUDA kernels are unaffected).  ``ValueError`` for a value other
    than ``1``, ``0`` or empty."""
    return _flag(NO_CPU_KERNEL, environ, False, "1 = no compiled CPU kernel")


def cuda_check_enabled(environ: Optional[Mapping[str, str]] = None) -> bool:
    """Whether the CUDA kernels' first-use check runs (``RNN_ABLATIONS_CUDA_CHECK``, default
    ``1``; ``0`` turns it off).  ``ValueError`` for a value other than ``1``, ``0`` or empty."""
    return _flag(CUDA_CHECK, environ, True, "0 = the CUDA kernels' first-use check is off")
