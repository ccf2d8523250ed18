"""The CUDA kernels' first-use check: before an instantiation serves its first layer call on a
device in this process, a tiny layer runs on it and on the generic path, and the two are
compared; an instantiation that fails is not used again in the process, and the generic path
(same numbers, slower) serves that call and the later ones; with ``backend="kernel"`` (asked for
explicitly) the call raises ``RuntimeError`` with the reason instead.

What is checked together is a *family* of one call: the forward and the backward programs it
runs (:func:`families`): ``step_forward`` + ``step_backward`` of a dtype; ``scan_forward`` +
``scan_backward`` of a dtype, output rule and highway; ``persistent_forward`` with the backward
the plan runs (``persistent_backward`` or the step kernel's).  So a backward that is wrong shows
at the first forward, not in the middle of a training step.  The tiny layer: 3 steps, 2 rows
(the second one step shorter, so the per-step row counts are exercised), hidden size 4, the
call's variant and highway, values from a fixed seed; the reference is
:func:`rnn_ablations.functional.generic_layer` in float64 on the CPU, differentiated by autograd,
from the same (rounded) inputs.  The comparison allows the dtype's rounding (:data:`TOLERANCE`).

A compile error (NVRTC), a load or launch error (the driver), any other exception of the
kernel's host code, a result that is not finite, or a mismatch disables the family on that
device with one warning (``RuntimeWarning``) that names the programs, the device and the
reason.  It costs milliseconds once per family and device (the compile of a program the cache
does not hold is the first use's anyway).

Off: ``RNN_ABLATIONS_CUDA_CHECK=0`` (:func:`rnn_ablations._env.cuda_check_enabled`; for
benchmarks that measure the first call), or :func:`set_enabled`.  It is skipped while
``torch.compile`` / ``torch.export`` trace (the graph holds the operators it chose) and while a
CUDA graph is being captured (a check reads its results on the host); the kernels then run
unchecked.  :func:`status` lists the families checked so far.
"""
from __future__ import annotations

import dataclasses
import threading
import warnings
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from ... import _env
from ..autocast import autocast_dtype

__all__ = ["admit", "check_family", "families", "status", "set_enabled", "reset", "TOLERANCE"]

#: (rtol, atol) of the comparison with the float64 reference, per storage dtype
TOLERANCE = {torch.float64: (1e-9, 1e-9), torch.float32: (1e-4, 1e-5),
             torch.bfloat16: (4e-2, 4e-2), torch.float16: (1e-2, 1e-2)}

_NAMES = {torch.float64: "float64", torch.float32: "float32", torch.bfloat16: "bfloat16",
          torch.float16: "float16"}

_lock = threading.Lock()
#: (device, family) -> None (passed) or why it failed
_results: Dict[Tuple[str, str], Optional[str]] = {}
_enabled: Optional[bool] = None  # None: RNN_ABLATIONS_CUDA_CHECK decides
#: (plan, variant, highway, dtype, device) -> the plan admit returned (the later calls of
#: a checked call's shape look it up)
_admitted: Dict[tuple, object] = {}


def set_enabled(on: Optional[bool]) -> None:
    """Turn the check on or off for the process (``None``: as ``RNN_ABLATIONS_CUDA_CHECK``
    says, read again at the next call).  Families already checked keep their result."""
    global _enabled, _from_env
    if on is not None and not isinstance(on, bool):
        raise TypeError(f"set_enabled takes True, False or None, got {on!r}")
    _enabled, _from_env = on, None


_from_env: Optional[bool] = None  # RNN_ABLATIONS_CUDA_CHECK, read at the first call


def enabled() -> bool:
    global _from_env
    if _enabled is not None:
        return _enabled
    if _from_env is None:
        _from_env = _env.cuda_check_enabled()
    return _from_env


def status() -> Dict[str, Optional[str]]:
    """``{"<device> <family>": None (passed) or the reason it failed}`` for every family checked
    in this process."""
    with _lock:
        return {f"{dev} {fam}": why for (dev, fam), why in _results.items()}


def reset() -> None:
    """Forget every result (the next use of each family is checked again)."""
    with _lock:
        _results.clear()
        _admitted.clear()


@dataclasses.dataclass(frozen=True)
class Family:
    """The programs one layer call runs: ``kind`` ``"step"``, ``"scan"`` or ``"persistent"``
    (with ``backward``: the persistent backward, else the step kernel's); ``highway``: the
    call's (a template argument of the scans; the step kernels read it at run time, so their
    check runs with the first call's)."""

    kind: str
    dtype: torch.dtype
    out: Optional[int] = None
    highway: bool = False
    backward: bool = False

    @property
    def name(self) -> str:
        d = _NAMES[self.dtype]
        if self.kind == "step":
            return f"step_forward[{d}]+step_backward[{d}]"
        if self.kind == "scan":
            from .programs import RULES
            rest = f"{d},{RULES.get(self.out, self.out)}" + (",highway" if self.highway else "")
            return f"scan_forward[{rest}]+scan_backward[{rest}]"
        back = f"persistent_backward[{d}]" if self.backward else f"step_backward[{d}]"
        return f"persistent_forward[{d}]+{back}"


def _call_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype the kernel sees: under CUDA autocast, the projection's (autocast casts float32,
    not float64, inputs of F.linear)."""
    if x.dtype != torch.float32:  # autocast casts float32 only
        return x.dtype
    cast = autocast_dtype(x.device.type)
    return cast if cast is not None else x.dtype


def families(plan, variant, highway: bool, dtype: torch.dtype) -> List[Family]:
    """The families a CUDA ``plan`` (:class:`rnn_ablations.plan.Plan`) runs for ``variant``."""
    if plan.schedule in ("scan", "fused_scan"):
        from . import structs
        sp = structs.decode_scan_spec(variant.kernel_spec, highway, "the CUDA kernels' check")
        return [Family("scan", dtype, int(sp.output), bool(highway))]
    if plan.recurrence == "persistent":
        backward = bool(plan.persistent[2])
        fams = [Family("persistent", dtype, highway=bool(highway), backward=backward)]
        return fams if backward else [Family("step", dtype, highway=bool(highway))] + fams
    return [Family("step", dtype, highway=bool(highway))]


def _entry_points(ext):
    """The raw entry points of a kernel object (a wrapper such as the graphed kernel exposes
    them as ``raw``)."""
    return getattr(ext, "raw", ext)


def admit(plan, variant, highway: bool, x: torch.Tensor, kernels: Callable[[], object]):
    """``plan`` when every family it runs passed its check on ``x``'s device (checking those
    not checked yet), else the generic plan of the call (:func:`rnn_ablations.dispatch.
    run_layer_call` runs it).  ``kernels``: returns the kernels' entry points (the run layer
    passes :func:`rnn_ablations.kernels.backend.cuda_kernel`); called only when a family is
    checked."""
    if not enabled() or torch.compiler.is_compiling():
        return plan
    dtype = _call_dtype(x)
    memo = (plan, variant.name, bool(highway), dtype, x.device)
    got = _admitted.get(memo)
    if got is plan:
        return plan
    device = str(x.device)
    if got is not None:
        return _refused(got, plan, device)
    if _capturing(x.device):
        return plan
    failed = None
    for fam in families(plan, variant, highway, dtype):
        key = (device, fam.name)
        if key not in _results:
            with _lock:
                if key not in _results:
                    why = check_family(fam, variant, x.device, _entry_points(kernels()))
                    _results[key] = why
                    if why is not None:
                        warnings.warn(
                            f"rnn_ablations: the CUDA kernels {fam.name} failed their check on "
                            f"{device} ({why}); they are not used in this process, the generic "
                            "path runs these layers (same results, slower). "
                            f"{_env.CUDA_CHECK}=0 turns the check off.",
                            RuntimeWarning, stacklevel=4)
        if _results[key] is not None:
            failed = fam
            break
    if failed is None:
        got = plan
    else:
        runner = "generic_scan" if plan.schedule in ("scan", "fused_scan") else "generic"
        got = dataclasses.replace(plan, path="generic", runner=runner, schedule=None,
                                  recurrence=None, graphs=False, persistent=(0, 0, False),
                                  reason=f"the CUDA kernels {failed.name} failed their check",
                                  warning=None)
    _admitted[memo] = got
    return got if got is plan else _refused(got, plan, device)


def _refused(generic, plan, device: str):
    """``generic`` (the fallback of a failed check), or ``RuntimeError`` where the call asked for
    the kernels explicitly (``backend="kernel"``)."""
    from ...settings import get_options
    if get_options().backend == "kernel":
        name = generic.reason[len("the CUDA kernels "):-len(" failed their check")]
        raise RuntimeError(
            f"backend='kernel': the CUDA kernels {name} failed their check on {device} "
            f"({_results.get((device, name))}); the auto backend runs the generic path instead "
            "(rnn_ablations.options(backend='auto'))")
    return generic


def _capturing(device: torch.device) -> bool:
    if device.type != "cuda":
        return False
    try:
        return torch.cuda.is_current_stream_capturing()
    except RuntimeError:  # pragma: no cover - no CUDA runtime
        return False


# ------------------------------------------------------------------------------ the check
T_, B_, H_ = 3, 2, 4
LENGTHS = [3, 2]  # per row: batch sizes 2, 2, 1


def _inputs(shapes: Sequence[Tuple[int, ...]], dtype, device) -> List[torch.Tensor]:
    g = torch.Generator().manual_seed(20240613)
    return [(torch.randn(*s, generator=g, dtype=torch.float64) * 0.5).to(dtype).to(device)
            for s in shapes]


def _compare(got: Sequence[torch.Tensor], want: Sequence[torch.Tensor], names: Sequence[str],
             dtype: torch.dtype) -> Optional[str]:
    rtol, atol = TOLERANCE[dtype]
    for g, w, name in zip(got, want, names):
        g = g.detach().to("cpu", torch.float64)
        w = w.detach().to(torch.float64)
        if tuple(g.shape) != tuple(w.shape):
            return f"{name} has shape {tuple(g.shape)}, the generic path's {tuple(w.shape)}"
        if not torch.isfinite(g).all():
            return f"{name} is not finite"
        err = (g - w).abs() - rtol * w.abs()
        if (err > atol).any():
            return (f"{name} differs from the generic path's by up to "
                    f"{float((g - w).abs().max()):.3g} (allowed {atol:g} + {rtol:g} x |value|)")
    return None


def _reference(run: Callable, inputs: Sequence[torch.Tensor], grads: Sequence[torch.Tensor]):
    leaves = [t.detach().to("cpu", torch.float64).requires_grad_() for t in inputs]
    outs = run(*leaves)
    got = torch.autograd.grad(outs, leaves, [g.detach().to("cpu", torch.float64) for g in grads],
                              allow_unused=True)
    return list(outs) + [z if z is not None else torch.zeros_like(l) for z, l in zip(got, leaves)]


def check_family(fam: Family, variant, device: torch.device, module) -> Optional[str]:
    """Run ``fam``'s forward and backward on a tiny layer on ``device`` through ``module`` (the
    entry points of :mod:`.host`) and on the generic path: ``None`` when they agree, else why
    not (an exception of the kernel is a reason, not raised)."""
    from ...functional import generic_layer
    bs = torch.tensor([sum(1 for n in LENGTHS if n > t) for t in range(T_)], dtype=torch.int64)
    try:
        with torch.inference_mode(False), torch.enable_grad(), \
                torch.autocast(device.type, enabled=False):
            if fam.kind == "scan":
                return _check_scan(fam, variant, device, module, bs, generic_layer)
            return _check_steps(fam, variant, device, module, bs, generic_layer)
    except Exception as exc:  # noqa: BLE001 - any failure of the kernel disables it
        text = str(exc).strip().splitlines()
        return f"{type(exc).__name__}: {text[0] if text else ''}"


def _check_steps(fam, variant, device, module, bs, generic_layer) -> Optional[str]:
    spec, hw, H = variant.kernel_spec, fam.highway, H_
    R, X = variant.num_recurrent(hw), variant.num_input_only(hw)
    proj, w_hh, h0, c0, g_out, g_hn, g_cn = _inputs(
        [(T_, B_, (R + X) * H), (R * H, H), (B_, H), (B_, H), (T_, B_, H), (B_, H), (B_, H)],
        fam.dtype, device)
    empty = torch.empty(0, dtype=fam.dtype, device=device)
    if fam.kind == "persistent":
        fwd = module.persistent_forward(spec, hw, proj, w_hh, h0, c0, bs, empty, True, 0, 0)
    else:
        fwd = module.plain_forward(spec, hw, proj, w_hh, h0, c0, bs, empty, True)
    out, h_n, c_n, gates, cs, hin = fwd
    args = (spec, hw, g_out, g_hn, g_cn, gates, cs, hin, out, proj, w_hh, h0, c0, bs, empty)
    if fam.kind == "persistent" and fam.backward:
        grads = module.persistent_backward(*args, 0, 0)
    else:
        grads = module.plain_backward(*args)

    def run(p, w, h, c):
        rh = w.shape[0]
        xo = p[..., rh:] if p.shape[-1] > rh else None
        return generic_layer(variant, hw, p[..., :rh], xo, w, h, c, bs)[:3]

    want = _reference(run, [proj, w_hh, h0, c0], [g_out, g_hn, g_cn])
    return _compare([out, h_n, c_n] + list(grads[:4]), want,
                    ["out", "h_n", "c_n", "d_proj", "d_w_hh", "d_h0", "d_c0"], fam.dtype)


def _check_scan(fam, variant, device, module, bs, generic_layer) -> Optional[str]:
    from . import structs
    spec, hw, H = variant.kernel_spec, fam.highway, H_
    G = structs.decode_scan_spec(spec, hw, "the CUDA kernels' check").G
    proj, bias, h0, c0, g_out, g_hn, g_cn = _inputs(
        [(T_, B_, G * H), (G * H,), (1, B_, H), (1, B_, H), (T_, B_, H), (1, B_, H),
         (1, B_, H)], fam.dtype, device)
    out, h_n, c_n, cs = module.scan_forward(spec, hw, proj, h0, c0, bs, True, bias)
    dproj, dc0, dbias = module.scan_backward(spec, hw, g_out, g_hn, g_cn, proj, c0, cs, bs,
                                             bias, True)

    def run(p, b, h, c):
        o, hn, cn, _ = generic_layer(variant, hw, p[..., :0], p + b, None, h[0], c[0], bs)
        return o, hn.unsqueeze(0), cn.unsqueeze(0)

    want = _reference(run, [proj, bias, h0, c0], [g_out, g_hn, g_cn])
    # h0 does not enter a cell that reads no h_{t-1}: its gradient is not compared
    del want[5]
    return _compare([out, h_n, c_n, dproj, dbias, dc0], want,
                    ["out", "h_n", "c_n", "d_proj", "d_bias", "d_c0"], fam.dtype)
