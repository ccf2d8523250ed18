"""Short forms of :func:`rnn_ablations.set_options` / :func:`rnn_ablations.options` /
:func:`rnn_ablations.get_options` for one setting each (deprecated: kept for code written
against them; new code names the setting, e.g. ``rnn_ablations.options(backend="generic")``).

``set_X(value)`` sets the process-wide default, ``use_X(value)`` is a ``with`` block for this
thread (``use_kernel_isa``: for the process, the setting being process-wide), ``get_X()`` the
value in effect for this thread.  ``set_pipeline`` / ``set_concurrent_directions`` speak their
own words: ``"auto"``, ``"always"``, ``"never"`` (``docs/options.md``).
"""
from __future__ import annotations

from .settings import get_options, options, set_options

__all__ = ["set_backend", "get_backend", "use_backend", "set_kernel_isa", "use_kernel_isa",
           "set_pipeline", "get_pipeline", "use_pipeline", "set_concurrent_directions",
           "get_concurrent_directions", "use_concurrent_directions", "set_cuda_graphs",
           "get_cuda_graphs", "use_cuda_graphs", "set_cuda_recurrence", "get_cuda_recurrence",
           "use_cuda_recurrence"]


def set_backend(name: str) -> None:
    """``set_options(backend=name)``: ``"auto"`` (a compiled kernel where one applies),
    ``"kernel"`` (required: an error for tensors no kernel handles) or ``"generic"``."""
    set_options(backend=name)


def get_backend() -> str:
    """The ``backend`` setting in effect for this thread."""
    return get_options().backend


def use_backend(name: str):
    """``options(backend=name)``: the backend for this thread inside the ``with`` block."""
    return options(backend=name)


def set_kernel_isa(name: str) -> None:
    """``set_options(kernel_isa=name)``: ``"avx512"``, ``"avx2"``, ``"portable"``, ``"auto"``
    or the test path ``"emulated_avx512"`` (see :func:`rnn_ablations.kernel_isa`).
    ``ValueError`` for a path this CPU/build cannot run, ``RuntimeError`` without a kernel."""
    set_options(kernel_isa=name)


def use_kernel_isa(name: str):
    """``options(kernel_isa=name)``: the vector path inside the ``with`` block (process-wide),
    the previous one after it."""
    return options(kernel_isa=name)


_PIPELINE_WORDS = {"auto": "auto", "always": "pipelined", "never": "plain"}
_DIRECTION_WORDS = {"auto": "auto", "always": "on", "never": "off"}


def _word(table, setting: str, value: str, what: str) -> str:
    if value not in table:
        raise ValueError(f"unknown {what} mode {value!r}; choose one of {', '.join(table)} "
                         f"(or rnn_ablations.options({setting}=...))")
    return table[value]


def _back(table, value: str) -> str:
    return next(k for k, v in table.items() if v == value)


def set_pipeline(mode: str) -> None:
    """``set_options(cpu_schedule=...)`` in the short form's words: ``"auto"``, ``"always"``
    (pipelined) or ``"never"`` (plain)."""
    set_options(cpu_schedule=_word(_PIPELINE_WORDS, "cpu_schedule", mode, "pipeline"))


def get_pipeline() -> str:
    """The ``cpu_schedule`` setting of this thread in the short form's words."""
    return _back(_PIPELINE_WORDS, get_options().cpu_schedule)


def use_pipeline(mode: str):
    """``options(cpu_schedule=...)`` in the short form's words, for this thread inside the
    ``with`` block."""
    return options(cpu_schedule=_word(_PIPELINE_WORDS, "cpu_schedule", mode, "pipeline"))


def set_concurrent_directions(mode: str) -> None:
    """``set_options(concurrent_directions=...)`` in the short form's words: ``"auto"``,
    ``"always"`` (on) or ``"never"`` (off)."""
    set_options(concurrent_directions=_word(_DIRECTION_WORDS, "concurrent_directions", mode,
                                            "concurrent-directions"))


def get_concurrent_directions() -> str:
    """The ``concurrent_directions`` setting of this thread in the short form's words."""
    return _back(_DIRECTION_WORDS, get_options().concurrent_directions)


def use_concurrent_directions(mode: str):
    """``options(concurrent_directions=...)`` in the short form's words, for this thread inside
    the ``with`` block."""
    return options(concurrent_directions=_word(_DIRECTION_WORDS, "concurrent_directions", mode,
                                               "concurrent-directions"))


def set_cuda_graphs(enabled: bool) -> None:
    """``set_options(cuda_graphs=enabled)``: graph replay of the CUDA kernel on (``True``) or off
    (``False``: every call launches its steps one by one) for the process; turning it off frees
    the recorded graphs (:mod:`rnn_ablations.kernels.cuda.graphs`)."""
    if not isinstance(enabled, bool):
        raise TypeError(f"set_cuda_graphs takes True or False, got {enabled!r}")
    set_options(cuda_graphs=enabled)


def get_cuda_graphs() -> bool:
    """The ``cuda_graphs`` setting in effect for this thread."""
    return get_options().cuda_graphs


def use_cuda_graphs(enabled: bool):
    """``options(cuda_graphs=enabled)``: graph replay on or off for this thread inside the
    ``with`` block."""
    if not isinstance(enabled, bool):
        raise TypeError(f"use_cuda_graphs takes True or False, got {enabled!r}")
    return options(cuda_graphs=enabled)


def set_cuda_recurrence(mode: str) -> None:
    """``set_options(cuda_recurrence=mode)``: ``"auto"`` (the step kernel), ``"persistent"`` or
    ``"steps"`` for the process (:mod:`rnn_ablations.kernels.cuda.recurrence`)."""
    set_options(cuda_recurrence=mode)


def get_cuda_recurrence() -> str:
    """The ``cuda_recurrence`` setting in effect for this thread."""
    return get_options().cuda_recurrence


def use_cuda_recurrence(mode: str):
    """``options(cuda_recurrence=mode)``: the mode for this thread inside the ``with`` block."""
    return options(cuda_recurrence=mode)
