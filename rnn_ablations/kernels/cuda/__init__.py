"""The CUDA kernels, compiled at first use with NVRTC from the device sources in
``rnn_ablations/csrc/cuda`` (no CUDA toolkit, no nvcc: a CUDA build of torch brings NVRTC), cached
on disk, and launched through the CUDA driver API on torch's current stream.

* :func:`load` -> ``(module, None)`` with the kernels' entry points (:mod:`.host`: ``plain_forward``,
  ``plain_backward``, ``scan_forward``, ``scan_backward``, ``persistent_forward``,
  ``persistent_backward``, ``persistent_plan``, ``scan_abi``), or ``(None, reason)`` saying why
  the CUDA kernels are not in use (no CUDA in this torch, no visible device, no NVRTC, no driver,
  a GPU older than NVRTC compiles for, a driver older than NVRTC's CUDA version,
  ``RNN_ABLATIONS_NO_KERNEL=1``): the generic PyTorch path runs then.  Nothing is compiled here: each program (kernel x cell rules x
  dtype, :mod:`.programs`) is compiled by the first call that needs it, with a one-line message,
  into ``$RNN_ABLATIONS_CACHE/cuda`` (:mod:`.cache`).
* :func:`arch_problem` and :func:`driver_problem`: the checks of NVRTC against the devices and
  the driver, as functions of the numbers (testable without a GPU).
* ``python -m rnn_ablations.kernels.cuda.precompile``: compile them all ahead, for every visible
  device's architecture, with the times.

``rnn_ablations.kernels.registry`` calls :func:`load` once at import and wraps the entry points in the
operators (``registry.cuda_kernel()``); importing this package never raises, so a walk over every
submodule (AllenNLP's ``--include-package``) works on any machine.
"""
from __future__ import annotations

from typing import Mapping, Optional, Sequence, Tuple

__all__ = ["load", "unavailable_reason", "arch_problem", "driver_problem"]


def _v(version: Sequence[int]) -> str:
    return ".".join(map(str, version))


def arch_problem(archs: Mapping[int, int], supported: Sequence[int],
                 nvrtc_version: Tuple[int, int]) -> Optional[str]:
    """Why NVRTC ``nvrtc_version``, which compiles for the architectures ``supported`` (as
    ``nvrtcGetSupportedArchs`` lists them: 75, 80, ...), cannot serve the devices ``archs``
    (device ordinal -> compute capability, 7.0 -> 70), or ``None`` when it can.  A device newer
    than the newest it knows is served (PTX for that one, compiled by the driver at load); one
    older than the oldest is not (CUDA 13 dropped sm_70 and older)."""
    if not supported:
        return f"NVRTC {_v(nvrtc_version)} lists no architecture it compiles for"
    low = min(supported)
    old = {d: a for d, a in sorted(archs.items()) if a < low}
    if not old:
        return None
    names = ", ".join(f"device {d} (sm_{a})" for d, a in old.items())
    ok = [d for d, a in sorted(archs.items()) if a >= low]
    fix = (f"a torch built for CUDA {nvrtc_version[0] - 1} (its NVRTC compiles for older "
           "GPUs) runs them" if nvrtc_version[0] > 12 else "the CUDA kernels need a newer GPU")
    if ok:
        fix += ("; or keep the older GPU(s) out of this process: CUDA_VISIBLE_DEVICES="
                + ",".join(map(str, ok)))
    return (f"NVRTC {_v(nvrtc_version)} (the CUDA kernels' compiler) compiles for sm_{low} and "
            f"newer, and {names} is older: the CUDA kernels cannot run on it, so the generic "
            f"PyTorch path runs on every device ({fix})")


def driver_problem(driver_version: int, nvrtc_version: Tuple[int, int],
                   ptx: bool = False) -> Optional[str]:
    """Why a driver that supports CUDA ``driver_version`` (``cuDriverGetVersion``: 12040 is
    12.4) cannot load what NVRTC ``nvrtc_version`` compiles, or ``None`` when it can.  CUBIN of
    NVRTC X.y loads with a driver for CUDA X.0 or newer (minor version compatibility); ``ptx``
    (a GPU newer than NVRTC knows: the driver compiles the PTX at load) needs a driver for
    X.y or newer."""
    if driver_version <= 0:
        return None  # the driver did not say: the loads will
    have = (driver_version // 1000, (driver_version % 1000) // 10)
    fix = (f"install an NVIDIA driver for CUDA {nvrtc_version[0]}.{nvrtc_version[1]} or newer, "
           f"or use a torch built for CUDA {have[0]}.x, whose NVRTC ({have[0]}) this driver "
           "loads; until then the generic PyTorch path runs")
    if have[0] < nvrtc_version[0]:
        return (f"the NVIDIA driver supports CUDA {_v(have)}, older than NVRTC "
                f"{_v(nvrtc_version)} (CUDA {nvrtc_version[0]}): it cannot load the CUBIN or PTX "
                f"that NVRTC compiles for the CUDA kernels ({fix})")
    if ptx and have < tuple(nvrtc_version):
        return (f"the NVIDIA driver supports CUDA {_v(have)}, older than NVRTC "
                f"{_v(nvrtc_version)}: the GPU is newer than this NVRTC knows, so the CUDA "
                f"kernels are compiled to PTX, which this driver cannot read ({fix})")
    return None


def _compatibility_problem() -> Optional[str]:
    """NVRTC against the visible devices and the driver (:func:`arch_problem`,
    :func:`driver_problem`)."""
    from . import driver, nvrtc
    try:
        archs = {d: driver.compute_capability(d) for d in range(driver.device_count())}
        supported, version = nvrtc.supported_archs(), nvrtc.version()
        why = arch_problem(archs, supported, version)
        if why is None:
            ptx = any(a not in supported for a in archs.values())
            why = driver_problem(driver.driver_version(), version, ptx)
    except (nvrtc.NvrtcError, driver.CudaDriverError) as exc:
        return str(exc)
    return why


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
    return nvrtc.library_error() or driver.driver_error() or _compatibility_problem()


def load() -> Tuple[Optional[object], Optional[str]]:
    """(the entry points' module, None), or (None, why the CUDA kernels are not in use)."""
    why = unavailable_reason()
    if why is not None:
        return None, why
    from . import host
    return host, None
