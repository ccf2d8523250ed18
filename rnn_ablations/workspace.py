"""The buffers of one inference call of a layer stack on the CPU kernel, reused from layer to
layer.

Under ``torch.no_grad()`` / ``torch.inference_mode()`` (or whenever nothing needs a gradient)
nothing is kept for a backward, so a layer's large tensors are dead once the next layer has read
them.  Instead of a fresh allocation per layer and tensor (which the allocator may hand back to
the OS and fault in again, page by page), :class:`Workspace` holds one buffer per role and gives
every layer a view of it:

* ``("out", p, d)``: the kernel's output of direction ``d`` in layers of parity ``p``.  Layer
  ``l + 1`` reads layer ``l``'s output while it runs (the pipelined kernel projects its input
  chunk by chunk during the recurrence), so consecutive layers write different buffers and layer
  ``l + 2`` takes layer ``l``'s;
* ``("cat", p)``: a bidirectional layer's output (both directions side by side), which is the
  next layer's input: by parity too;
* ``("scratch", d)``: the input projections of direction ``d`` (the plain kernel turns them into
  the gate activations in place; the pipelined kernel's chunks), consumed inside the layer;
* ``("reversed input",)``, ``("reversed output",)``: the reverse direction's copies of the layer
  input and of its output (each row reversed within its length), consumed inside the layer.

A workspace lives for one call of :meth:`AblatedRNN._run <rnn_ablations.rnn.AblatedRNN>`: the
tensors it returns may be views of these buffers, and nothing reuses them after the call.  The
kernels check every buffer they are given (contiguous, dtype, device, size, no memory shared
with the call's inputs or another direction's buffer; ``take_buffer`` in ``csrc/common.h``).
"""
from __future__ import annotations

import math
from typing import Dict, Hashable, Sequence

import torch

__all__ = ["Workspace", "allocations"]

_allocated = [0]


def allocations() -> int:
    """How many workspace buffers were allocated since the package was imported (the tests
    check that a deeper stack allocates no more than a two-layer one)."""
    return _allocated[0]


class Workspace:
    """Buffers by role (see the module docstring), grown on demand; one per inference call."""

    def __init__(self) -> None:
        self._buffers: Dict[Hashable, torch.Tensor] = {}

    def take(self, key: Hashable, shape: Sequence[int], like: torch.Tensor) -> torch.Tensor:
        """A contiguous tensor of ``shape`` with ``like``'s dtype and device, a view of the
        buffer for ``key`` (allocated, or replaced by a larger one, when it is too small)."""
        numel = math.prod(shape)
        buf = self._buffers.get(key)
        if buf is None or buf.numel() < numel or buf.dtype != like.dtype or buf.device != like.device:
            buf = torch.empty(max(numel, 1), dtype=like.dtype, device=like.device)
            self._buffers[key] = buf
            _allocated[0] += 1
        return buf[:numel].view(tuple(shape))

    def layer(self, index: int) -> "LayerWorkspace":
        """The buffers of layer ``index``."""
        return LayerWorkspace(self, index % 2)


class LayerWorkspace:
    """The view of a :class:`Workspace` that one layer uses (its parity picks the buffers of the
    tensors the next layer still reads)."""

    def __init__(self, ws: Workspace, parity: int) -> None:
        self._ws, self._parity = ws, parity

    def out(self, direction: int, shape: Sequence[int], like: torch.Tensor) -> torch.Tensor:
        return self._ws.take(("out", self._parity, direction), shape, like)

    def scratch(self, direction: int, shape: Sequence[int], like: torch.Tensor) -> torch.Tensor:
        return self._ws.take(("scratch", direction), shape, like)

    def concat(self, shape: Sequence[int], like: torch.Tensor) -> torch.Tensor:
        return self._ws.take(("cat", self._parity), shape, like)

    def reversed_input(self, shape: Sequence[int], like: torch.Tensor) -> torch.Tensor:
        return self._ws.take(("reversed input",), shape, like)

    def reversed_output(self, shape: Sequence[int], like: torch.Tensor) -> torch.Tensor:
        return self._ws.take(("reversed output",), shape, like)
