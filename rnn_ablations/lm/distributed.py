"""The process a run trains in: the device, and the process group under ``torchrun``.

Multi-process (``torchrun --nproc-per-node N rnn-ablations lm train …``; gloo on CPU, NCCL on
GPU): process ``r`` takes the rows ``r·B/N … (r+1)·B/N − 1`` of every batch, and
``DistributedDataParallel`` averages the gradients, which is then exactly the gradient of the
single-process batch (the loss is a mean over rows, all processes hold as many rows).
"""
from __future__ import annotations

import os
from typing import Optional

import torch
import torch.distributed as dist

__all__ = ["DistContext", "resolve_device", "init_distributed"]


class DistContext:
    """Rank, world size and device of this process (a single process when not under torchrun)."""

    def __init__(self, rank: int = 0, world_size: int = 1, local_rank: int = 0,
                 device: Optional[torch.device] = None):
        self.rank, self.world_size, self.local_rank = rank, world_size, local_rank
        self.device = device or torch.device("cpu")

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()

    def all_sum(self, t: torch.Tensor) -> torch.Tensor:
        if self.distributed:
            t = t.clone()
            dist.all_reduce(t)
        return t

    def gather_rows(self, t: torch.Tensor) -> torch.Tensor:
        """Concatenate every process's rows along dim 1 (the batch) — in rank order."""
        if not self.distributed:
            return t
        parts = [torch.empty_like(t) for _ in range(self.world_size)]
        dist.all_gather(parts, t.contiguous())
        return torch.cat(parts, dim=1)


def resolve_device(device) -> torch.device:
    """``None``/``"auto"``: CUDA when available, else the CPU; otherwise the device named,
    checked."""
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        d = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"invalid device {device!r}: use cpu, cuda or cuda:N") from exc
    if d.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} was asked for but CUDA is not available; use --device cpu")
    return d


def init_distributed(device=None) -> DistContext:
    """Join the process group when started by ``torchrun`` (``WORLD_SIZE`` > 1), else a single
    process.  Backend: NCCL on CUDA, gloo on CPU."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistContext(device=resolve_device(device))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    dev = resolve_device(device)
    if dev.type == "cuda":
        dev = torch.device("cuda", local_rank)
        torch.cuda.set_device(dev)
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo")
    if dev.type == "cpu" and "OMP_NUM_THREADS" not in os.environ:
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))
    return DistContext(rank, world, local_rank, dev)
