"""What ``torch.autocast`` means for the kernels: the dtype it asks for on a device, and the
recurrent tensors cast to the projection's dtype under CUDA autocast.  Below the backend and
the CUDA first-use check, which both read it."""
from __future__ import annotations

from typing import Optional

import torch

__all__ = ["autocast_dtype", "autocast_like"]


def autocast_dtype(device_type: str) -> Optional[torch.dtype]:
    """The autocast dtype when ``torch.autocast(device_type)`` is on, else ``None`` (also for
    a device without autocast, such as ``"meta"``)."""
    try:
        on = torch.is_autocast_enabled(device_type)
    except TypeError:  # pragma: no cover - torch < 2.4
        on = torch.is_autocast_enabled() if device_type == "cuda" else torch.is_autocast_cpu_enabled()
    except RuntimeError:  # a device type autocast does not know ("meta")
        return None
    if not on:
        return None
    try:
        return torch.get_autocast_dtype(device_type)
    except (AttributeError, TypeError):  # pragma: no cover - torch < 2.4
        return (torch.get_autocast_gpu_dtype() if device_type == "cuda"
                else torch.get_autocast_cpu_dtype())


def autocast_like(proj: torch.Tensor, *tensors: Optional[torch.Tensor]):
    """Under ``torch.autocast("cuda")`` the input projection comes out in the autocast dtype
    (F.linear is on its lower-precision list); the recurrence then runs in that dtype too, as
    cuDNN's LSTM does under autocast: ``tensors`` (recurrent weight, states, mask; ``None``
    passes through) are cast to it, differentiably, so their gradients flow back to the float32
    parameters.  Outside CUDA autocast they are returned as they are."""
    if not proj.is_cuda or autocast_dtype("cuda") is None:  # (is_cuda: no device object made)
        return tensors
    return tuple(None if t is None else t.to(proj.dtype) for t in tensors)
