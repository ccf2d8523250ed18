"""Which CUDA recurrence runs a layer's forward: the step kernel or the persistent kernel.

* ``"steps"``: the step kernel (``csrc/cuda/step_kernel.cuh``): per step one cuBLAS GEMM and one
  fused element-wise kernel, the step loop replayed as a CUDA graph (:mod:`.graphs`).
* ``"persistent"``: the persistent kernel (``csrc/cuda/persistent_kernel.cuh``): the whole forward
  in one cooperative launch, each thread block keeping its slice of W_hh in shared memory and the
  grid synchronising once per step.  Its saved tensors are the step kernel's, so the backward is the
  step kernel's hand-written one, or, with the ``persistent_backward`` setting, its recurrence in
  one persistent launch too (the W_hh columns of each block's units on chip).  It applies to
  float32, bfloat16 and float16 where the slices fit on chip (``_C_cuda.persistent_plan`` says
  why not otherwise); forcing it where it does not apply raises ``ValueError`` naming the reason.
* ``"auto"`` (the default): the step kernel.  Measured on an H100 (batch 32, 64 steps, hidden
  256 and 650, ``benchmarks/results/speed_cuda_h100_persistent.md`` and
  ``speed_cuda_h100_persistent_backward.md``), the persistent forward was faster in some rows (float32
  inference, ran at hidden 256: 0.85 against 1.15 ms) and slower in others (bfloat16 at hidden
  650, lstm: inference 1.37 against 1.04 ms, training 2.49 against 2.22 ms); ``auto`` keeps the
  step kernel, which is never far behind.

The mode and the persistent kernel's grid (``persistent_blocks``, ``persistent_batch_tile``;
0 = automatic: one block per SM, as many rows as the shared memory holds) are settings of
:func:`rnn_ablations.options`; the run plan (:func:`rnn_ablations.plan.plan_layer`) turns them
into ``Plan.recurrence`` / ``Plan.persistent`` (and checks there, with the compiled kernel's
``persistent_plan``, that the persistent kernel fits the layer); :func:`step_kernel` looks up the
kernel object that runs it.  The short forms ``set_cuda_recurrence`` / ``use_cuda_recurrence`` /
``get_cuda_recurrence`` are in :mod:`rnn_ablations.aliases`.
"""
from __future__ import annotations

from .. import registry, schema
from . import graphs as cuda_graphs
from ...settings import CUDA_RECURRENCES

__all__ = ["RECURRENCES", "persistent_stats", "PersistentKernel", "step_kernel"]

RECURRENCES = CUDA_RECURRENCES
_calls = {"persistent_forward": 0, "persistent_backward": 0}


def persistent_stats() -> dict:
    """``{"persistent_forward": calls, "persistent_backward": calls}``: the calls that went to
    the persistent kernels since import (the tests check that they ran)."""
    return dict(_calls)


class PersistentKernel:
    """The step kernel's entry points (``plain_forward`` / ``plain_backward`` of the CUDA kernel
    ``ext``, same arguments and results) with the forward on the persistent kernel and the
    backward on the step kernel, or (``backward=True``) on the persistent kernel too; ``blocks``
    / ``batch_tile``: the kernels' grid and rows per tile (0 = automatic).  Fixed per instance,
    so that a CUDA graph recorded through one instance always replays the same kernels."""

    #: capabilities (``kernels/interface.py``): a step kernel only, gates in tensors of its own
    in_place_gates = False
    scan = False
    persistent = True

    def __init__(self, ext, backward: bool = False, blocks: int = 0, batch_tile: int = 0):
        self.ext, self.persistent_backward = ext, backward
        self.blocks, self.batch_tile = blocks, batch_tile

    def _forward(self, args):
        _calls["persistent_forward"] += 1
        return self.ext.persistent_forward(*args[:_STEP_ARGS], self.blocks, self.batch_tile)

    def _backward(self, args):
        if self.persistent_backward:
            _calls["persistent_backward"] += 1
            return self.ext.persistent_backward(*args, self.blocks, self.batch_tile)
        return self.ext.plain_backward(*args)

    plain_forward = schema.entry("plain_forward", _forward)
    plain_backward = schema.entry("plain_backward", _backward)


_STEP_ARGS = len(schema.arguments("plain_forward"))  # (without plain_forward's in_place)

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


def step_kernel(plan):
    """The kernel object (``StepKernel`` of ``kernels/interface.py``) that runs a CUDA layer as
    ``plan`` says: the step kernel, or for ``plan.recurrence == "persistent"`` the persistent
    kernel with ``plan.persistent``'s grid, behind CUDA-graph replay where ``plan.graphs``.  The
    plan has made every choice (:func:`rnn_ablations.plan.decide`: whether the persistent kernel
    fits the layer, no graphs inside a compiled graph); this only looks the object up."""
    if plan.recurrence != "persistent":
        return registry.graphed_cuda_kernel() if plan.graphs else registry.cuda_kernel()
    blocks, tile, bwd = plan.persistent
    plain, graphed = _persistent_modules(registry.cuda_kernel(), bwd, blocks, tile)
    return graphed if plan.graphs else plain
