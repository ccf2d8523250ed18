"""The settings that choose how layers run: :class:`Options`, the context manager
:func:`options`, the process-wide defaults and the environment variables that set them.

This module imports nothing of the package but :mod:`rnn_ablations._env` (the kernel switch,
``RNN_ABLATIONS_NO_KERNEL``: with it on, ``generic`` is the default backend): the run layer reads the settings from here, and the
parts that own something process-wide register what a change of it does
(:func:`on_process_change`: the kernels switch the CPU kernel's vector path, the CUDA graphs
free their cache) and what a setting needs (:func:`on_check`: ``backend="kernel"`` needs a
compiled kernel).

* :func:`options` ``(**settings)``: a context manager; inside its ``with`` block the settings
  apply to the calls made *by this thread* (a :mod:`contextvars` variable: another thread, and a
  thread started inside the block, sees the process-wide defaults).  Blocks nest; each restores
  what was in effect before it.
* :func:`set_options` ``(**settings)``: the process-wide defaults (every thread that is not
  inside an :func:`options` block that overrides the same setting).
* :func:`get_options`: the :class:`Options` in effect for this thread.
* :func:`reset_options`: the process-wide defaults back to the environment's.

Two settings are process-wide whichever form sets them, because what they configure exists once
per process: ``kernel_isa`` (the compiled CPU kernel holds one vector path; switching it while
another thread runs a kernel would hand that call two paths) and ``cuda_graphs_max`` (the size of
the one cache of recorded CUDA graphs).  An :func:`options` block that sets one of them switches
it for the process and restores it on exit; a block of another thread that sets the same one
while the first is open is refused (``RuntimeError``), since one of the two would run under the
other's value and the last to close would restore a stale one.

``docs/options.md`` has the table of the settings and of the environment variables, which are
read here, once, at import (:data:`ENVIRONMENT`, :func:`from_environment`); a bad value stops the
import with a message naming the variable and the values it takes.
"""
from __future__ import annotations

import contextvars
import dataclasses
import functools
import os
import threading
import warnings
from typing import Callable, Dict, List, Mapping, Optional, Tuple

from . import _env

__all__ = ["Options", "options", "set_options", "get_options", "reset_options",
           "process_options", "ENVIRONMENT", "from_environment", "BACKENDS", "KERNEL_ISAS",
           "CPU_SCHEDULES", "CONCURRENT_DIRECTIONS", "CUDA_RECURRENCES", "PROCESS_WIDE",
           "MAX_COUNT", "on_process_change", "on_check"]


BACKENDS = ("auto", "kernel", "generic")
#: ``emulated_avx512`` is a test path (the AVX-512 blocking in AVX2 instructions), never chosen
#: by ``auto``.
KERNEL_ISAS = ("auto", "avx512", "avx2", "portable", "emulated_avx512")
CPU_SCHEDULES = ("auto", "plain", "pipelined")
CONCURRENT_DIRECTIONS = ("auto", "on", "off")
CUDA_RECURRENCES = ("auto", "steps", "persistent")


def _keep_hash(obj) -> None:
    """Hash a frozen settings object once: it is part of the plan cache's key on every layer
    call."""
    object.__setattr__(obj, "_hash", hash(dataclasses.astuple(obj)))


def _kept_hash(obj) -> int:
    return obj._hash


@dataclasses.dataclass(frozen=True)
class Options:
    """How layers run (see ``docs/options.md`` for each setting's effect).

    backend: ``"auto"`` (a compiled kernel where one applies, else the generic path with a
        warning once), ``"kernel"`` (a compiled kernel or an error) or ``"generic"`` (the
        reference path in torch ops).
    kernel_isa: the CPU kernel's vector path: ``"auto"`` (the best this CPU runs),
        ``"avx512"``, ``"avx2"``, ``"portable"``, or the test path ``"emulated_avx512"``.
        Process-wide.
    cpu_schedule: ``"auto"`` (the measured policy of :func:`rnn_ablations.plan.plan_layer`),
        ``"plain"`` (the input projection of all steps first, each step's GEMM split over the
        threads) or ``"pipelined"`` (the recurrence on one thread while another computes the
        projections of later steps / the input gradient of finished ones).
    concurrent_directions: ``"auto"``, ``"on"`` or ``"off"``: the two directions of a
        bidirectional layer run at the same time, one per thread (CPU kernel).
    pipeline_chunk: steps per chunk of the pipelined schedule; 0 = automatic (about 256 rows
        per chunk GEMM and at least four chunks).
    cuda_recurrence: ``"auto"`` (the step kernel), ``"steps"`` or ``"persistent"`` (the whole
        forward in one cooperative launch; an error where it cannot run).
    cuda_graphs: replay the CUDA step loop as a recorded CUDA graph (``True``/``False``).
    cuda_graphs_max: recorded graphs kept at once (least recently used evicted). Process-wide.
    persistent_blocks: the persistent kernel's grid size; 0 = one block per SM.
    persistent_batch_tile: batch rows per tile of the persistent kernel; 0 = as many as the
        shared memory holds.
    persistent_backward: the backward of a persistent forward runs persistent too (else the
        step kernel's backward).
    """

    backend: str = "auto"
    kernel_isa: str = "auto"
    cpu_schedule: str = "auto"
    concurrent_directions: str = "auto"
    pipeline_chunk: int = 0
    cuda_recurrence: str = "auto"
    cuda_graphs: bool = True
    cuda_graphs_max: int = 32
    persistent_blocks: int = 0
    persistent_batch_tile: int = 0
    persistent_backward: bool = False

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            _check(f.name, getattr(self, f.name))
        _keep_hash(self)

    __hash__ = _kept_hash

    def replace(self, **settings) -> "Options":
        """A copy with ``settings`` changed (checked)."""
        _check_names(settings)
        return dataclasses.replace(self, **settings)


_CHOICES = {"backend": BACKENDS, "kernel_isa": KERNEL_ISAS, "cpu_schedule": CPU_SCHEDULES,
            "concurrent_directions": CONCURRENT_DIRECTIONS, "cuda_recurrence": CUDA_RECURRENCES}
_FLAGS = ("cuda_graphs", "persistent_backward")
_COUNTS = ("pipeline_chunk", "cuda_graphs_max", "persistent_blocks", "persistent_batch_tile")
#: the largest value of a count setting (the kernels take it as a 32-bit integer)
MAX_COUNT = 2 ** 31 - 1
#: settings that exist once per process (see the module docstring)
PROCESS_WIDE = ("kernel_isa", "cuda_graphs_max")
_NAMES = tuple(f.name for f in dataclasses.fields(Options))


def _check_names(settings: Mapping) -> None:
    unknown = [k for k in settings if k not in _NAMES]
    if unknown:
        raise TypeError(f"unknown setting {unknown[0]!r}; the settings are {', '.join(_NAMES)}")


def _check(name: str, value) -> None:
    if name in _CHOICES:
        if not isinstance(value, str) or value not in _CHOICES[name]:
            raise ValueError(f"{name} must be one of {', '.join(_CHOICES[name])}; got {value!r}")
    elif name in _FLAGS:
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be True or False, got {value!r}")
    elif name in _COUNTS:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNT:
            raise ValueError(f"{name} must be an integer >= 0 and <= {MAX_COUNT}"
                             f"{' (0 = automatic)' if name != 'cuda_graphs_max' else ''}, "
                             f"got {value!r}")


# --------------------------------------------------------------------------- environment
#: The environment variables that set the defaults: name -> (setting, kind).  Read once, at
#: import, by :func:`from_environment`; ``docs/options.md`` lists them with the ones the kernel
#: loader reads.
ENVIRONMENT: Dict[str, Tuple[str, str]] = {
    "RNN_ABLATIONS_BACKEND": ("backend", "choice"),
    "RNN_ABLATIONS_ISA": ("kernel_isa", "choice"),
    "RNN_ABLATIONS_CPU_SCHEDULE": ("cpu_schedule", "choice"),
    "RNN_ABLATIONS_CONCURRENT_DIRECTIONS": ("concurrent_directions", "choice"),
    "RNN_ABLATIONS_PIPELINE_CHUNK": ("pipeline_chunk", "count"),
    "RNN_ABLATIONS_CUDA_RECURRENCE": ("cuda_recurrence", "choice"),
    "RNN_ABLATIONS_CUDA_GRAPHS": ("cuda_graphs", "flag"),
    "RNN_ABLATIONS_CUDA_GRAPHS_MAX": ("cuda_graphs_max", "count"),
    "RNN_ABLATIONS_PERSISTENT_BLOCKS": ("persistent_blocks", "count"),
    "RNN_ABLATIONS_PERSISTENT_BATCH_TILE": ("persistent_batch_tile", "count"),
    "RNN_ABLATIONS_PERSISTENT_BACKWARD": ("persistent_backward", "flag"),
}
_TRUE, _FALSE = ("1", "true", "on", "yes"), ("0", "false", "off", "no")


def _parse(var: str, name: str, kind: str, raw: str):
    value = raw.strip().lower()
    if kind == "choice":
        if value not in _CHOICES[name]:
            raise ValueError(f"{var} must be one of {', '.join(_CHOICES[name])}, got {raw!r} "
                             f"(it sets options' {name}; unset it for the default)")
        return value
    if kind == "flag":
        if value in _TRUE:
            return True
        if value in _FALSE:
            return False
        raise ValueError(f"{var} must be 0 or 1, got {raw!r} (it sets options' {name}; unset it "
                         "for the default)")
    try:
        n = int(value)
    except ValueError:
        n = -1
    if not 0 <= n <= MAX_COUNT:
        raise ValueError(f"{var} must be an integer >= 0 and <= {MAX_COUNT}, got {raw!r} (it "
                         f"sets options' {name}; unset it for the default)")
    return n


def from_environment(environ: Optional[Mapping[str, str]] = None) -> Options:
    """The defaults set by the environment variables in ``environ`` (``os.environ`` when
    ``None``); an empty value counts as unset; the kernel switch (``RNN_ABLATIONS_NO_KERNEL`` or
    its other name ``RNN_ABLATIONS_DISABLE_KERNEL``, :mod:`rnn_ablations._env`) set to ``1``
    makes ``generic`` the default backend.  Raises ``ValueError`` naming the variable and its
    allowed values for a bad one."""
    env = os.environ if environ is None else environ
    settings = {}
    for var, (name, kind) in ENVIRONMENT.items():
        raw = env.get(var, "")
        if raw.strip():
            settings[name] = _parse(var, name, kind, raw)
    if _env.kernel_disabled(env):  # the one kernel switch (RNN_ABLATIONS_NO_KERNEL)
        if settings.get("backend", "generic") != "generic":
            raise ValueError(f"{_env.kernel_switch_set(env)} keeps the compiled kernels from "
                             f"loading, but RNN_ABLATIONS_BACKEND={settings['backend']} asks for "
                             "one; unset one of them")
        settings["backend"] = "generic"
    return Options(**settings)


# --------------------------------------------------------------------------- state
_lock = threading.RLock()
_ENV_DEFAULTS = from_environment()
_defaults = _ENV_DEFAULTS
#: this thread's overrides, as a tuple of (name, value) pairs; () = none
_overrides: "contextvars.ContextVar[Tuple]" = contextvars.ContextVar("rnn_ablations_options",
                                                                      default=())


@functools.lru_cache(maxsize=64)
def _merged(base: Options, overrides: Tuple) -> Options:
    return dataclasses.replace(base, **dict(overrides))


def get_options() -> Options:
    """The settings in effect for this thread: the process-wide defaults with this thread's
    :func:`options` blocks applied."""
    ov = _overrides.get()
    return _merged(_defaults, ov) if ov else _defaults


def process_options() -> Options:
    """The process-wide defaults (what a thread outside any :func:`options` block sees)."""
    return _defaults


def _validated(settings: Mapping) -> Dict:
    _check_names(settings)
    for name, value in settings.items():
        _check(name, value)
    for check in _checks:
        check(settings)
    return dict(settings)


#: what a change of the process-wide settings does: ``hook(old, new)``, called under the lock
#: before the change takes effect (a hook that raises refuses the change)
_hooks: List[Callable[[Options, Options], None]] = []
#: what a setting needs: ``check(settings)`` for every set of settings given, before any applies
_checks: List[Callable[[Mapping], None]] = []


def on_process_change(hook: Callable[[Options, Options], None]) -> None:
    """Register ``hook(old, new)``: called (under the settings' lock) before a change of the
    process-wide settings takes effect; an exception refuses the change."""
    _hooks.append(hook)


def on_check(check: Callable[[Mapping], None]) -> None:
    """Register ``check(settings)``: called with every set of settings given to
    :func:`set_options` / :func:`options` before any applies; an exception refuses them."""
    _checks.append(check)


def _apply_process_wide(old: Options, new: Options) -> None:
    """Side effects of a change of the process-wide settings (called under the lock)."""
    for hook in _hooks:
        hook(old, new)


def set_options(**settings) -> Options:
    """Set the process-wide defaults (see :class:`Options` for the settings; every one is
    checked before any changes).  Returns the new defaults."""
    global _defaults
    checked = _validated(settings)
    with _lock:
        new = dataclasses.replace(_defaults, **checked)
        _apply_process_wide(_defaults, new)
        _defaults = new
    return new


def reset_options() -> Options:
    """The process-wide defaults back to those of the environment at import."""
    global _defaults
    with _lock:
        _apply_process_wide(_defaults, _ENV_DEFAULTS)
        _defaults = _ENV_DEFAULTS
    return _defaults


#: process-wide setting -> (thread id, thread name, open blocks) of the thread whose options
#: blocks set it now
_owners: Dict[str, Tuple[int, str, int]] = {}


def _claim(shared: Mapping) -> None:
    """Record that this thread's block sets the process-wide settings ``shared``; refuse it
    while another thread's block sets one of them (called under the lock)."""
    me = threading.get_ident()
    for name in shared:
        owner = _owners.get(name)
        if owner is not None and owner[0] != me:
            args = ", ".join(f"{k}={v!r}" for k, v in shared.items())
            raise RuntimeError(
                f"rnn_ablations.options({args}): {name} is process-wide, and thread "
                f"{owner[1]!r} is inside an options block that sets it; blocks of different "
                f"threads that set {name} cannot overlap. Set it once for the process with "
                f"rnn_ablations.set_options({name}=...), or open the blocks one after another")
    for name in shared:
        owner = _owners.get(name)
        _owners[name] = (me, threading.current_thread().name, (owner[2] if owner else 0) + 1)


def _release(shared: Mapping) -> None:
    for name in shared:
        me, who, depth = _owners[name]
        if depth > 1:
            _owners[name] = (me, who, depth - 1)
        else:
            del _owners[name]


class options:
    """Context manager: ``settings`` apply to this thread's calls inside the ``with`` block
    (``kernel_isa`` and ``cuda_graphs_max`` to the process's, see the module docstring); the
    ``with`` statement gives the :class:`Options` in effect inside.  Every setting is checked
    when ``options(...)`` is called::

        with rnn_ablations.options(backend="generic"):
            out, _ = model(x)

    Called without a ``with`` it changes nothing, and says so with a warning that names
    :func:`set_options`, the process-wide form."""

    def __init__(self, **settings) -> None:
        checked = _validated(settings)
        self._shared = {k: v for k, v in checked.items() if k in PROCESS_WIDE}
        self._local = tuple((k, v) for k, v in checked.items() if k not in PROCESS_WIDE)
        self._stack = []
        self._settings = settings
        self._entered = False  # set last: a refused call (above) has nothing to warn about

    def __enter__(self) -> Options:
        global _defaults
        self._entered = True
        saved = None
        if self._shared:
            with _lock:
                _claim(self._shared)
                saved = {k: getattr(_defaults, k) for k in self._shared}
                new = dataclasses.replace(_defaults, **self._shared)
                try:
                    _apply_process_wide(_defaults, new)
                except BaseException:
                    _release(self._shared)
                    raise
                _defaults = new
        token = _overrides.set(_overrides.get() + self._local) if self._local else None
        self._stack.append((token, saved))
        return get_options()

    def __exit__(self, *exc) -> None:
        global _defaults
        token, saved = self._stack.pop()
        if token is not None:
            _overrides.reset(token)
        if saved is not None:
            with _lock:
                new = dataclasses.replace(_defaults, **saved)
                try:
                    _apply_process_wide(_defaults, new)
                    _defaults = new
                finally:
                    _release(saved)

    def __del__(self) -> None:
        if not getattr(self, "_entered", True):
            args = ", ".join(f"{k}={v!r}" for k, v in self._settings.items())
            warnings.warn(f"rnn_ablations.options({args}) was called outside a `with` "
                          "statement and changed nothing: use `with rnn_ablations.options(...):` "
                          f"for a block, or rnn_ablations.set_options({args}) for the process",
                          stacklevel=2)


