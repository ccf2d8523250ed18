"""The CUDA kernels' first-use check: before an instantiation serves its first layer call on a
device in this process, a tiny layer runs on it and on the generic path, and the two are
compared; an instantiation that fails is not used again in the process, and the generic path
(same numbers, slower) serves that call and the later ones; with ``backend="kernel"`` (asked for
explicitly) the call raises ``RuntimeError`` with the reason instead.

What is checked together is a *family* of one call: the forward and the backward programs it
runs (:func:`families`) for what their device code branches on: ``step_forward`` +
``step_backward`` of a dtype and of the variant's element-wise rules (its kernel spec: output
rule, content, memory) and highway; ``scan_forward`` + ``scan_backward`` of a dtype, output rule
and highway; ``persistent_forward`` with the backward the plan runs (``persistent_backward`` or
the step kernel's), of a dtype, rules and highway.  So a backward that is wrong shows at the
first forward, not in the middle of a training step, and a wrong rule of one variant shows at
that variant's first call, whichever variant ran before.  The check layer: 4 steps, the last one
with no active row (a trailing empty step), 3 rows of lengths 3, 3, 2 (the per-step row counts
shrink), hidden size 96 for the step families (3 x 96 elements: more than one block of the
element-wise launches) with a recurrent-dropout mask, and for the scan both directions over a
batch-major projection of hidden size 48 (2 x 3 x 48 elements: more than one block), a bias
inside the scan; values from a fixed seed.  The reference is
:func:`rnn_ablations.functional.generic_layer` in float64 on the CPU, differentiated by autograd,
from the same (rounded) inputs (the scan's direction 1 on each row's reversed steps).  The
comparison allows the dtype's rounding (:data:`TOLERANCE`).  The check's float32 GEMMs run in
full float32 (TF32 off while it runs, the user's setting restored after it): the check tests the
kernels' device code, and a TF32 product (10-bit mantissa) differs from the float64 reference
by more than float32's tolerance.

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
from ...variants import SPEC_MEMORY_RULES, SPEC_RULE_NAMES

__all__ = ["verdict", "check_family", "families", "status", "set_enabled", "reset", "TOLERANCE"]

#: (rtol, atol) of the comparison with the float64 reference, per storage dtype
TOLERANCE = {torch.float64: (1e-9, 1e-9), torch.float32: (1e-4, 1e-5),
             torch.bfloat16: (4e-2, 4e-2), torch.float16: (1e-2, 1e-2)}

_NAMES = {torch.float64: "float64", torch.float32: "float32", torch.bfloat16: "bfloat16",
          torch.float16: "float16"}

_lock = threading.Lock()
#: (device, family) -> None (passed) or why it failed
_results: Dict[Tuple[str, str], Optional[str]] = {}
_enabled: Optional[bool] = None  # None: RNN_ABLATIONS_CUDA_CHECK decides


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


@dataclasses.dataclass(frozen=True)
class Family:
    """The programs one layer call runs and what their device code branches on: ``kind``
    ``"step"``, ``"scan"`` or ``"persistent"`` (with ``backward``: the persistent backward, else
    the step kernel's); ``spec``: the variant's kernel spec (its element-wise rules: the step and
    persistent kernels branch on it at run time, the scans read its block layout); ``out``: the
    scan's output rule (a template argument); ``highway``: the call's.  Two calls share a family
    (and its check) exactly when they run the same programs on the same branches."""

    kind: str
    dtype: torch.dtype
    out: Optional[int] = None
    highway: bool = False
    backward: bool = False
    spec: Optional[int] = None

    @property
    def name(self) -> str:
        d = _NAMES[self.dtype]
        if self.kind == "scan":
            rest = (f"{d},{SPEC_MEMORY_RULES.get(self.out, self.out)}"
                    + (",highway" if self.highway else ""))
            return f"scan_forward[{rest}]+scan_backward[{rest}]"
        if self.kind == "step":
            progs = f"step_forward[{d}]+step_backward[{d}]"
        else:
            back = f"persistent_backward[{d}]" if self.backward else f"step_backward[{d}]"
            progs = f"persistent_forward[{d}]+{back}"
        return progs + _rules(self.spec, self.highway)


def _rules(spec: Optional[int], highway: bool) -> str:
    """`` (rules: ...)``: the element-wise rules a step or persistent family runs (a readable
    form of the kernel spec, which it determines), or ``""`` when no spec is given."""
    if spec is None:
        return " (rules: highway)" if highway else ""
    from . import structs
    try:
        s = structs.decode_kernel_spec(spec, highway, "the CUDA kernels' check")
    except RuntimeError:
        return f" (kernel spec {int(spec)}" + (", highway)" if highway else ")")
    content = ("h_{t-1}" if s.content_recurrent else "x_t") + (" tanh" if s.content_tanh else "")
    parts = [f"output {SPEC_RULE_NAMES[s.output]}", f"content {content}"]
    if not s.memory:
        parts.append("no memory")
    if highway:
        parts.append("highway")
    return " (rules: " + ", ".join(parts) + ")"


def _call_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype the kernel sees: under CUDA autocast, the projection's (autocast casts float32,
    not float64, inputs of F.linear)."""
    if x.dtype != torch.float32:  # autocast casts float32 only
        return x.dtype
    cast = autocast_dtype(x.device.type)
    return cast if cast is not None else x.dtype


def families(plan, variant, highway: bool, dtype: torch.dtype) -> List[Family]:
    """The families a CUDA ``plan`` (:class:`rnn_ablations.plan.Plan`) runs for ``variant``."""
    hw, spec = bool(highway), int(variant.kernel_spec)
    if plan.schedule in ("scan", "fused_scan"):
        from . import structs
        sp = structs.decode_scan_spec(spec, highway, "the CUDA kernels' check")
        return [Family("scan", dtype, int(sp.output), hw)]
    if plan.recurrence == "persistent":
        backward = bool(plan.persistent[2])
        fams = [Family("persistent", dtype, highway=hw, backward=backward, spec=spec)]
        return fams if backward else [Family("step", dtype, highway=hw, spec=spec)] + fams
    return [Family("step", dtype, highway=hw, spec=spec)]


def _entry_points(ext):
    """The raw entry points of a kernel object (a wrapper such as the graphed kernel exposes
    them as ``raw``)."""
    return getattr(ext, "raw", ext)


def verdict(device: torch.device, family: Family, variant,
            kernels: Callable[[], object]) -> Optional[str]:
    """The first-use check's verdict on ``family`` (of :func:`families`) on ``device``:
    ``None`` when it passed, else why it failed.  The family is checked (:func:`check_family`)
    the first time it is asked for on the device, with one ``RuntimeWarning`` when it fails;
    the verdict is remembered by ``(device, family.name)``: what was checked (the programs,
    the dtype and the rules), whichever call or plan asked.  ``kernels``: returns the
    kernels' entry points (the run plan passes :func:`rnn_ablations.kernels.registry.
    cuda_kernel`), called only when the family is checked.  While a CUDA graph is being
    captured the check cannot run (it reads its results on the host): ``None``, remembered
    nothing, the kernels run unchecked."""
    key = (str(device), family.name)
    got = _results.get(key, _UNSEEN)
    if got is not _UNSEEN:
        return got
    if _capturing(device):
        return None
    with _lock:
        if key not in _results:
            why = check_family(family, variant, device, _entry_points(kernels()))
            _results[key] = why
            if why is not None:
                warnings.warn(
                    f"rnn_ablations: the CUDA kernels {family.name} failed their check on "
                    f"{key[0]} ({why}); they are not used in this process, the generic "
                    "path runs these layers (same results, slower). "
                    f"{_env.CUDA_CHECK}=0 turns the check off.", RuntimeWarning, stacklevel=2)
    return _results[key]


_UNSEEN = object()


def _capturing(device: torch.device) -> bool:
    if device.type != "cuda":
        return False
    try:
        return torch.cuda.is_current_stream_capturing()
    except RuntimeError:  # pragma: no cover - no CUDA runtime
        return False


# ------------------------------------------------------------------------------ the check
T_ = 4
LENGTHS = [3, 3, 2]  # per row: batch sizes 3, 3, 2, 0 (the last step has no active row)
B_ = len(LENGTHS)
H_STEPS = 96   # 3 x 96 elements: two blocks of the element-wise launches (common.THREADS = 256)
H_SCAN = 48    # 2 directions x 3 rows x 48: two blocks of the scan's launches
H_SMALL = 8    # the persistent check where a block's shared memory does not hold H_STEPS
KEEP = 0.7     # the recurrent-dropout mask's keep probability


def _inputs(shapes: Sequence[Tuple[int, ...]], dtype, device, seed=20240613) -> List[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(*s, generator=g, dtype=torch.float64) * 0.5).to(dtype).to(device)
            for s in shapes]


def _mask(B: int, H: int, dtype, device) -> torch.Tensor:
    g = torch.Generator().manual_seed(7)
    keep = torch.bernoulli(torch.full((B, H), KEEP, dtype=torch.float64), generator=g)
    return (keep / KEEP).to(dtype).to(device)


class _FullFloat32Gemms:
    """float32 GEMMs in full float32 while the check runs (TF32 off: ``torch.backends.cuda.
    matmul.fp32_precision = "ieee"``, or on a torch without it ``allow_tf32`` and
    ``torch.set_float32_matmul_precision``), the user's setting restored after it.  The setting
    is the process's: a GEMM another thread runs meanwhile is exact too (slower, never less
    precise)."""

    def __enter__(self):
        m = torch.backends.cuda.matmul
        self.new_api = hasattr(m, "fp32_precision")
        if self.new_api:
            self.saved = m.fp32_precision
            if self.saved != "ieee":
                m.fp32_precision = "ieee"
        else:  # pragma: no cover - torch < 2.9
            self.saved = (torch.get_float32_matmul_precision(), m.allow_tf32)
            torch.set_float32_matmul_precision("highest")
            m.allow_tf32 = False
        return self

    def __exit__(self, *exc):
        m = torch.backends.cuda.matmul
        if self.new_api:
            if m.fp32_precision != self.saved:
                m.fp32_precision = self.saved
        else:  # pragma: no cover - torch < 2.9
            torch.set_float32_matmul_precision(self.saved[0])
            m.allow_tf32 = self.saved[1]
        return False


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
    """Run ``fam``'s forward and backward on the check layer on ``device`` through ``module``
    (the entry points of :mod:`.host`) and on the generic path: ``None`` when they agree, else
    why not (an exception of the kernel is a reason, not raised)."""
    from ...functional import generic_layer
    bs = torch.tensor([sum(1 for n in LENGTHS if n > t) for t in range(T_)], dtype=torch.int64)
    try:
        with torch.inference_mode(False), torch.enable_grad(), \
                torch.autocast(device.type, enabled=False), _FullFloat32Gemms():
            if fam.kind == "scan":
                return _check_scan(fam, variant, device, module, bs, generic_layer)
            return _check_steps(fam, variant, device, module, bs, generic_layer)
    except Exception as exc:  # noqa: BLE001 - any failure of the kernel disables it
        text = str(exc).strip().splitlines()
        return f"{type(exc).__name__}: {text[0] if text else ''}"


def _persistent_hidden(module, spec, hw, R, X, dtype, device, backward: bool) -> int:
    """H_STEPS where the persistent plan holds it on this device (both directions it runs),
    else H_SMALL (a device whose blocks hold less shared memory)."""
    plan = getattr(module, "persistent_plan", None)
    if plan is None:
        return H_STEPS
    proj = torch.empty(T_, B_, (R + X) * H_STEPS, dtype=dtype, device=device)
    w_hh = torch.empty(R * H_STEPS, H_STEPS, dtype=dtype, device=device)
    for back in ((False, True) if backward else (False,)):
        if not plan(spec, hw, proj, w_hh, 0, 0, back)[0]:
            return H_SMALL
    return H_STEPS


def _check_steps(fam, variant, device, module, bs, generic_layer) -> Optional[str]:
    spec, hw = variant.kernel_spec, fam.highway
    R, X = variant.num_recurrent(hw), variant.num_input_only(hw)
    H = (_persistent_hidden(module, spec, hw, R, X, fam.dtype, device, fam.backward)
         if fam.kind == "persistent" else H_STEPS)
    proj, w_hh, h0, c0, g_out, g_hn, g_cn = _inputs(
        [(T_, B_, (R + X) * H), (R * H, H), (B_, H), (B_, H), (T_, B_, H), (B_, H), (B_, H)],
        fam.dtype, device)
    w_hh = w_hh * (2.0 / H ** 0.5)  # pre-activations of order 1 whatever H
    mask = _mask(B_, H, fam.dtype, device)
    if fam.kind == "persistent":
        fwd = module.persistent_forward(spec, hw, proj, w_hh, h0, c0, bs, mask, True, 0, 0)
    else:
        fwd = module.plain_forward(spec, hw, proj, w_hh, h0, c0, bs, mask, True)
    out, h_n, c_n, gates, cs, hin = fwd
    args = (spec, hw, g_out, g_hn, g_cn, gates, cs, hin, out, proj, w_hh, h0, c0, bs, mask)
    if fam.kind == "persistent" and fam.backward:
        grads = module.persistent_backward(*args, 0, 0)
    else:
        grads = module.plain_backward(*args)
    mask64 = mask.to("cpu", torch.float64)

    def run(p, w, h, c):
        rh = w.shape[0]
        xo = p[..., rh:] if p.shape[-1] > rh else None
        return generic_layer(variant, hw, p[..., :rh], xo, w, h, c, bs, mask64)[:3]

    want = _reference(run, [proj, w_hh, h0, c0], [g_out, g_hn, g_cn])
    return _compare([out, h_n, c_n] + list(grads[:4]), want,
                    ["out", "h_n", "c_n", "d_proj", "d_w_hh", "d_h0", "d_c0"], fam.dtype)


def _reversed_steps(lengths: Sequence[int], T: int) -> torch.Tensor:
    """(T, B) time index of direction 1: row b's steps [0, L_b) reversed, its padding kept."""
    idx = torch.arange(T).unsqueeze(1).repeat(1, len(lengths))
    for b, n in enumerate(lengths):
        idx[:n, b] = torch.arange(n - 1, -1, -1)
    return idx


def _check_scan(fam, variant, device, module, bs, generic_layer) -> Optional[str]:
    from . import structs
    spec, hw, H, D = variant.kernel_spec, fam.highway, H_SCAN, 2
    G = structs.decode_scan_spec(spec, hw, "the CUDA kernels' check").G
    proj_bm, bias, h0, c0, g_out, g_hn, g_cn = _inputs(
        [(B_, T_, D * G * H), (D * G * H,), (D, B_, H), (D, B_, H), (T_, B_, D * H),
         (D, B_, H), (D, B_, H)], fam.dtype, device)
    proj = proj_bm.transpose(0, 1)  # (T, B, D*G*H), batch-major in memory
    out, h_n, c_n, cs = module.scan_forward(spec, hw, proj, h0, c0, bs, True, bias)
    dproj, dc0, dbias = module.scan_backward(spec, hw, g_out, g_hn, g_cn, proj, c0, cs, bs,
                                             bias, True)
    rev = _reversed_steps(LENGTHS, T_)

    def run(p, b, h, c):
        outs, hns, cns = [], [], []
        for d in range(D):
            pd = p[..., d * G * H:(d + 1) * G * H] + b[d * G * H:(d + 1) * G * H]
            if d == 1:
                pd = pd.gather(0, rev.unsqueeze(2).expand_as(pd))
            o, hn, cn, _ = generic_layer(variant, hw, pd[..., :0], pd, None, h[d], c[d], bs)
            if d == 1:
                o = o.gather(0, rev.unsqueeze(2).expand_as(o))
            outs.append(o)
            hns.append(hn)
            cns.append(cn)
        return torch.cat(outs, 2), torch.stack(hns), torch.stack(cns)

    want = _reference(run, [proj, bias, h0, c0], [g_out, g_hn, g_cn])
    # h0 does not enter a cell that reads no h_{t-1}: its gradient is not compared
    del want[5]
    return _compare([out, h_n, c_n, dproj, dbias, dc0], want,
                    ["out", "h_n", "c_n", "d_proj", "d_bias", "d_c0"], fam.dtype)
