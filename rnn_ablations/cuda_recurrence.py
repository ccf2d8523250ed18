"""Which CUDA recurrence runs a layer's forward: the step kernel or the persistent kernel.

* ``"steps"``: the step kernel (``csrc/ablated_rnn_cuda.cu``): per step one cuBLAS GEMM and one
  fused element-wise kernel, the step loop replayed as a CUDA graph (:mod:`.cuda_graphs`).
* ``"persistent"``: the persistent kernel (``csrc/persistent_cuda.cu``): the whole forward in one
  cooperative launch, each thread block keeping its slice of W_hh in shared memory and the grid
  synchronising once per step.  Its saved tensors are the step kernel's, so the backward is the
  step kernel's hand-written one, or, with :data:`PERSISTENT_BACKWARD`
  (``RNN_ABLATIONS_PERSISTENT_BACKWARD=1``; off by default), its recurrence in one persistent
  launch too (the W_hh columns of each block's units on chip).  It applies to float32, bfloat16
  and float16 where the slices fit on chip (``_C_cuda.persistent_plan`` says why not
  otherwise); forcing it where it does not apply raises ``ValueError`` naming the reason.
* ``"auto"`` (the default): today the step kernel everywhere.  The persistent kernel has not run
  on a GPU yet; ``auto`` will pick it only for the shapes where it is measured faster.

``RNN_ABLATIONS_CUDA_RECURRENCE=auto|persistent|steps`` sets the mode at import;
:func:`set_cuda_recurrence` / :func:`use_cuda_recurrence` switch it.
``RNN_ABLATIONS_PERSISTENT_BLOCKS`` / ``RNN_ABLATIONS_PERSISTENT_BATCH_TILE`` (or the module
attributes :data:`PERSISTENT_BLOCKS`, :data:`PERSISTENT_BATCH_TILE`) force the persistent
kernel's grid size and batch rows per tile (0 = automatic: one block per SM, as many rows as the
shared memory holds), for tuning and tests.
"""
from __future__ import annotations

import os
from . import backend, cuda_graphs

__all__ = ["set_cuda_recurrence", "get_cuda_recurrence", "use_cuda_recurrence",
           "RECURRENCES", "persistent_stats", "PersistentKernel"]

RECURRENCES = ("auto", "persistent", "steps")
_ENV = "RNN_ABLATIONS_CUDA_RECURRENCE"


def _check(mode) -> str:
    if mode not in RECURRENCES:
        raise ValueError(f"unknown CUDA recurrence {mode!r}; choose one of "
                         f"{', '.join(RECURRENCES)}")
    return mode


def _env_mode() -> str:
    value = os.environ.get(_ENV, "auto").strip().lower() or "auto"
    if value not in RECURRENCES:
        raise ValueError(f"{_ENV} must be one of {', '.join(RECURRENCES)}, got {value!r}")
    return value


def _env_flag(name: str) -> bool:
    value = os.environ.get(name, "0").strip().lower()
    if value in ("1", "true", "on", "yes"):
        return True
    if value in ("0", "false", "off", "no", ""):
        return False
    raise ValueError(f"{name} must be 0 or 1, got {value!r}")


def _env_count(name: str) -> int:
    value = os.environ.get(name, "0").strip() or "0"
    try:
        n = int(value)
    except ValueError:
        n = -1
    if n < 0:
        raise ValueError(f"{name} must be an integer >= 0 (0 = automatic), got {value!r}")
    return n


_mode = _env_mode()
#: grid size of the persistent kernel (0 = one block per SM, at most one per unit)
PERSISTENT_BLOCKS = _env_count("RNN_ABLATIONS_PERSISTENT_BLOCKS")
#: batch rows per tile of the persistent kernel (0 = as many as the shared memory holds)
PERSISTENT_BATCH_TILE = _env_count("RNN_ABLATIONS_PERSISTENT_BATCH_TILE")
#: the backward of a persistent forward also persistent (else the step kernel's backward)
PERSISTENT_BACKWARD = _env_flag("RNN_ABLATIONS_PERSISTENT_BACKWARD")
_calls = {"persistent_forward": 0, "persistent_backward": 0}


def set_cuda_recurrence(mode: str) -> None:
    """``"auto"`` (the step kernel, until the persistent one is measured), ``"persistent"`` or
    ``"steps"``; see the module docstring."""
    global _mode
    _mode = _check(mode)


def get_cuda_recurrence() -> str:
    return _mode


def use_cuda_recurrence(mode: str):
    """Context manager: :func:`set_cuda_recurrence` inside the ``with`` block, restored after."""
    return backend._temporarily(set_cuda_recurrence, get_cuda_recurrence, mode)


def persistent_stats() -> dict:
    """``{"persistent_forward": calls, "persistent_backward": calls}``: the calls that went to
    the persistent kernels since import (the tests check that they ran)."""
    return dict(_calls)


class PersistentKernel:
    """The entry points of ``rnn_ablations._C_cuda`` (``forward`` / ``backward``, same arguments
    and results) with the forward on the persistent kernel and the backward on the step kernel,
    or (``backward=True``) on the persistent kernel too; ``blocks`` / ``batch_tile``: the
    kernels' grid and rows per tile (0 = automatic).  Fixed per instance, so that a CUDA graph
    recorded through one instance always replays the same kernels."""

    def __init__(self, ext, backward: bool = False, blocks: int = 0, batch_tile: int = 0):
        self.ext, self.persistent_backward = ext, backward
        self.blocks, self.batch_tile = blocks, batch_tile

    def forward(self, spec, highway, proj, w_hh, h0, c0, batch_sizes, rec_mask, keep_hin):
        _calls["persistent_forward"] += 1
        return self.ext.persistent_forward(spec, highway, proj, w_hh, h0, c0, batch_sizes,
                                           rec_mask, keep_hin, self.blocks, self.batch_tile)

    def backward(self, *args):
        if self.persistent_backward:
            _calls["persistent_backward"] += 1
            return self.ext.persistent_backward(*args, self.blocks, self.batch_tile)
        return self.ext.backward(*args)


_modules = {}


def _persistent_modules(ext, backward: bool, blocks: int, batch_tile: int):
    """(plain, graphed) persistent modules for these settings (kept, so graphs are reused)."""
    key = (id(ext), backward, blocks, batch_tile)
    got = _modules.get(key)
    if got is None or got[0].ext is not ext:
        plain = PersistentKernel(ext, backward, blocks, batch_tile)
        tag = f"persistent(backward={backward}, blocks={blocks}, batch_tile={batch_tile})"
        got = _modules[key] = (plain, cuda_graphs.GraphedKernel(plain, tag=tag))
    return got


def select(ext, variant, highway: bool, proj, w_hh):
    """The module whose ``forward`` / ``backward`` run a CUDA layer (``dispatch.run_layer``):
    ``ext`` (the step kernel, graphed or not) unless the mode is ``"persistent"``; then the
    persistent kernel, or an error that says why it cannot run this call."""
    if ext is None or _mode != "persistent" or proj.device.type != "cuda":
        return ext
    raw = backend._C_cuda
    if raw is None or not hasattr(raw, "persistent_forward"):
        raise RuntimeError(
            "set_cuda_recurrence('persistent'): this build of rnn_ablations._C_cuda has no "
            "persistent kernel (rebuild it: `python setup.py build_ext --inplace` with a CUDA "
            "torch and nvcc), or use set_cuda_recurrence('steps')")
    blocks, tile, bwd = PERSISTENT_BLOCKS, PERSISTENT_BATCH_TILE, bool(PERSISTENT_BACKWARD)
    ok, why = raw.persistent_plan(variant.kernel_spec, highway, proj, w_hh, blocks, tile,
                                  False)[:2]
    if ok and bwd:
        ok, why = raw.persistent_plan(variant.kernel_spec, highway, proj, w_hh, blocks, tile,
                                      True)[:2]
        why = f"(its backward, PERSISTENT_BACKWARD) {why}"
    if not ok:
        raise ValueError(f"set_cuda_recurrence('persistent'): the persistent CUDA kernel does "
                         f"not apply to this layer: {why}; use set_cuda_recurrence('auto') or "
                         "'steps' (the step kernel runs every shape)")
    plain, graphed = _persistent_modules(raw, bwd, blocks, tile)
    return graphed if cuda_graphs.get_cuda_graphs() else plain
