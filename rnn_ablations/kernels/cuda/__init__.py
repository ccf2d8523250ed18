"""The CUDA kernels, compiled at first use with NVRTC from the device sources in
``rnn_ablations/csrc/cuda`` (no CUDA toolkit, no nvcc: a CUDA build of torch brings NVRTC), cached
on disk, and launched through the CUDA driver API on torch's current stream.

* :func:`load` -> ``(module, None)`` with the kernels' entry points (:mod:`.host`: ``plain_forward``,
  ``plain_backward``, ``scan_forward``, ``scan_backward``, ``persistent_forward``,
  ``persistent_backward``, ``persistent_plan``, ``scan_abi``), or ``(None, reason)`` saying why
  the CUDA kernels are not in use (no CUDA in this torch, no visible device, no NVRTC, no driver,
  ``RNN_ABLATIONS_NO_KERNEL=1``).  Nothing is compiled here: each program (kernel x cell rules x
  dtype, :mod:`.programs`) is compiled by the first call that needs it, with a one-line message,
  into ``$RNN_ABLATIONS_CACHE/cuda`` (:mod:`.cache`).
* ``python -m rnn_ablations.kernels.cuda.precompile``: compile them all ahead, with the times.

``rnn_ablations.kernels.backend`` calls :func:`load` once at import and wraps the entry points in the
operators (``backend._C_cuda``); importing this package never raises, so a walk over every
submodule (AllenNLP's ``--include-package``) works on any machine.
"""
from __future__ import annotations

from typing import Optional, Tuple

__all__ = ["load", "unavailable_reason"]


def unavailable_reason(respect_switch: bool = True) -> Optional[str]:
    """Why the CUDA kernels cannot run in this process, or ``None`` when they can
    (``respect_switch=False``: whatever ``RNN_ABLATIONS_NO_KERNEL`` says, could they run on this
    machine; benchmarks/gpu_check.sh asks that first)."""
    from ... import _env
    if respect_switch and _env.kernel_disabled():
        return (f"{_env.NO_KERNEL}=1 asks for no compiled kernel (the generic PyTorch path runs "
                "on every device)")
    import torch
    if torch.version.cuda is None:
        return (f"this torch has no CUDA (torch {torch.__version__}); the CUDA kernels run with "
                "a CUDA build of torch on a machine with an NVIDIA GPU")
    if not torch.cuda.is_available():
        return (f"no CUDA device is visible (torch {torch.__version__}, CUDA "
                f"{torch.version.cuda}); the CUDA kernels run when a GPU is present")
    from . import driver, nvrtc
    return nvrtc.library_error() or driver.driver_error()


def load() -> Tuple[Optional[object], Optional[str]]:
    """(the entry points' module, None), or (None, why the CUDA kernels are not in use)."""
    why = unavailable_reason()
    if why is not None:
        return None, why
    from . import host
    return host, None
