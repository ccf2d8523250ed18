"""The step GEMM in bfloat16 (``Plan.bf16_step_gemm``): a bfloat16 CPU call of a step cell hands
``w_hh`` to the float32 kernels in bfloat16, which round h_{t-1} (d_proj in the backward) to
bfloat16 each step and accumulate the product in float32 into the float32 gates
(``csrc/cpu/library_gemm.h``), the states and the element-wise pass staying in float32.

Checked here on any CPU (``Policy.bf16_step_gemm="on"`` forces the path where the CPU has no
bfloat16 instructions): the kernel's library GEMM (MKL) against its ATen emulation
(``RNN_ABLATIONS_PACKED_GEMM=0``: the same bfloat16 products in float32) to float32 rounding;
the kernel against the float32 reference to bfloat16 tolerance, forward and backward; whole
models (lstm, ran, a scan variant, every CPU schedule) against the float32 generic path; and the
plan's choice against the CPU's instructions (mocked)."""
import copy
import dataclasses

import pytest
import torch
from torch.library import opcheck
from torch.utils._python_dispatch import TorchDispatchMode

from conftest import record_plans
from rnn_ablations import AblatedRNN, options
from rnn_ablations import plan as run_plan
from rnn_ablations.kernels import registry
from rnn_ablations.plan import Kernels, LayerCall, Policy, plan_layer
from rnn_ablations.settings import Options
from rnn_ablations.variants import get_variant

needs_kernel = pytest.mark.skipif(registry.cpu_kernel() is None,
                                  reason="the CPU kernel is not built")

BF16_TOL = dict(rtol=3e-2, atol=3e-2)


# --------------------------------------------------------------------------- the plan
KERNELS = Kernels(cpu=True, cpu_scan=True, onednn=True, isa="avx2")
KERNELS_BF16 = dataclasses.replace(KERNELS, isa="avx512", bf16_gemm=True)  # AVX512-BF16 / AMX


def _call(**kw) -> LayerCall:
    base = dict(device="cpu", dtype=torch.bfloat16, steps=8, batch=4, hidden=16, rec_blocks=4,
                proj_weight=64 * 16, needs_grad=True, threads=2, proj_width=64)
    base.update(kw)
    return LayerCall(**base)


@pytest.mark.parametrize("isa", [False, True], ids=["avx2", "avx512_bf16"])
@pytest.mark.parametrize("setting", ["auto", "on", "off"])
def test_plan_takes_the_bf16_step_gemm_where_the_isa_has_it(isa, setting):
    kernels = KERNELS_BF16 if isa else KERNELS
    policy = Policy(bf16_step_gemm=setting)
    want = setting == "on" or (setting == "auto" and isa)
    for call in (_call(), _call(needs_grad=False), _call(directions=2),
                 _call(dtype=torch.float32, weight_dtypes=(torch.bfloat16, torch.float32)),
                 _call(dtype=torch.float32, autocast_dtype=torch.bfloat16)):
        plan = plan_layer(Options(), call, kernels, policy)
        assert plan.path == "cpu" and plan.bf16_on_f32, plan
        assert plan.bf16_step_gemm == want, (call, plan)


@pytest.mark.parametrize("call", [
    _call(dtype=torch.float32),  # float32: the float32 step GEMM
    _call(dtype=torch.float64),
    _call(rec_blocks=0, proj_weight=32 * 16),  # a scan cell has no step GEMM
    _call(projected=True),  # proj_size: the generic path
], ids=["float32", "float64", "scan", "proj_size"])
def test_plan_keeps_other_calls_off_the_bf16_step_gemm(call):
    plan = plan_layer(Options(), call, KERNELS_BF16, Policy(bf16_step_gemm="on"))
    assert not plan.bf16_step_gemm, plan


def test_plan_generic_backend_no_bf16_step_gemm():
    plan = plan_layer(Options(backend="generic"), _call(), KERNELS_BF16,
                      Policy(bf16_step_gemm="on"))
    assert plan.path == "generic" and not plan.bf16_step_gemm


def test_policy_names_the_bf16_step_gemm_choices():
    with pytest.raises(ValueError, match="Policy.bf16_step_gemm must be 'auto', 'on' or 'off'"):
        Policy(bf16_step_gemm="yes")


# --------------------------------------------------------------------------- the kernel
def _inputs(variant, T=6, B=5, H=24, seed=0, ragged=True, mask=True):
    """proj (T, B, (R+X)H), w_hh (bfloat16 values, float32), h0, c0, batch_sizes, rec_mask of a
    layer of ``variant`` (R and X from a float32 model of the variant)."""
    torch.manual_seed(seed)
    model = AblatedRNN(variant, 8, H)
    params = dict(model.named_parameters())
    w_hh = next(p for n, p in params.items() if "weight_hh" in n).detach()
    w_ih = next(p for n, p in params.items() if "weight_ih" in n).detach()
    proj = torch.randn(T, B, w_ih.shape[0]) * 0.5
    h0, c0 = torch.randn(B, H) * 0.5, torch.randn(B, H) * 0.5
    sizes = [B] * T
    if ragged:
        sizes = [B, B, B - 1, B - 1, B - 3, 1][:T] + [1] * max(0, T - 6)
    bs = torch.tensor(sizes, dtype=torch.int64)
    rec_mask = (torch.rand(B, H) > 0.3).float() / 0.7 if mask else torch.empty(0)
    return proj, w_hh.to(torch.bfloat16).float(), h0, c0, bs, rec_mask


def _forward(kernel, v, proj, w_hh, h0, c0, bs, mask, keep):
    return kernel.plain_forward(v.kernel_spec, False, proj.clone(), w_hh, h0, c0, bs, mask, keep,
                                in_place=False)


def _backward(kernel, v, fwd, grads, proj, w_hh, h0, c0, bs, mask):
    out, h_n, c_n, gates, cs, hin = fwd
    g_out, g_hn, g_cn = grads
    return kernel.plain_backward(v.kernel_spec, False, g_out, g_hn, g_cn, gates, cs, hin, out,
                                 proj, w_hh, h0, c0, bs, mask)


@needs_kernel
@pytest.mark.parametrize("variant", ["lstm", "ran", "srnn"])
def test_kernel_library_matches_its_aten_emulation(variant, monkeypatch):
    """MKL's bfloat16 GEMM and the ATen emulation compute the same bfloat16 products (exact in
    float32): they agree to float32 rounding of the sums, forward and backward."""
    kernel, v = registry.cpu_kernel(), get_variant(variant)
    proj, w, h0, c0, bs, mask = _inputs(variant)
    w_bf = w.to(torch.bfloat16)
    grads = (torch.randn(*proj.shape[:2], h0.shape[1]), torch.randn_like(h0),
             torch.randn_like(c0))
    runs = {}
    for gemm in ("1", "0"):  # the library, then ATen's float32 GEMM on the bfloat16 values
        monkeypatch.setenv("RNN_ABLATIONS_PACKED_GEMM", gemm)
        fwd = _forward(kernel, v, proj, w_bf, h0, c0, bs, mask, True)
        runs[gemm] = tuple(fwd[:3]) + tuple(_backward(kernel, v, fwd, grads, proj, w_bf, h0, c0, bs,
                                               mask))
    names = ("out", "h_n", "c_n", "d_proj", "d_w_hh", "d_h0", "d_c0")
    for name, a, b in zip(names, runs["1"], runs["0"]):
        assert a.dtype == b.dtype, name
        torch.testing.assert_close(a.float(), b.float(), rtol=1e-4, atol=1e-4, msg=name)
    assert runs["1"][4].dtype == torch.bfloat16  # d_w_hh in w_hh's dtype


@needs_kernel
@pytest.mark.parametrize("gemm", ["1", "0"], ids=["library", "aten"])
@pytest.mark.parametrize("variant", ["lstm", "ran"])
def test_kernel_bf16_step_gemm_matches_float32(variant, gemm, monkeypatch):
    """Against the float32 kernel on the same (bfloat16-valued) w_hh: only h_{t-1} (d_proj)
    rounded to bfloat16 differs, so the results agree to bfloat16 tolerance; and they differ
    from it (the bfloat16 GEMM did run)."""
    monkeypatch.setenv("RNN_ABLATIONS_PACKED_GEMM", gemm)
    kernel, v = registry.cpu_kernel(), get_variant(variant)
    proj, w, h0, c0, bs, mask = _inputs(variant, T=8, B=4, H=40, seed=3)
    grads = (torch.randn(*proj.shape[:2], h0.shape[1]), torch.randn_like(h0),
             torch.randn_like(c0))
    ref_f = _forward(kernel, v, proj, w, h0, c0, bs, mask, True)
    ref = tuple(ref_f[:3]) + tuple(_backward(kernel, v, ref_f, grads, proj, w, h0, c0, bs, mask))
    w_bf = w.to(torch.bfloat16)
    got_f = _forward(kernel, v, proj, w_bf, h0, c0, bs, mask, True)
    got = tuple(got_f[:3]) + tuple(_backward(kernel, v, got_f, grads, proj, w_bf, h0, c0, bs,
                                             mask))
    names = ("out", "h_n", "c_n", "d_proj", "d_w_hh", "d_h0", "d_c0")
    for name, a, b in zip(names, got, ref):
        assert a.dtype == (torch.bfloat16 if name == "d_w_hh" else torch.float32), name
        scale = b.abs().max().clamp_min(1.0)
        torch.testing.assert_close(a.float() / scale, b / scale, rtol=0, atol=2e-2, msg=name)
    assert not torch.equal(got[0], ref[0])
    # inference (the rolling memory buffer) gives the training forward's results
    inf = _forward(kernel, v, proj, w.to(torch.bfloat16), h0, c0, bs, mask, False)
    for a, b in zip(inf[:3], got_f[:3]):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


@needs_kernel
def test_kernel_bf16_w_hh_needs_float32_others():
    kernel, v = registry.cpu_kernel(), get_variant("lstm")
    proj, w, h0, c0, bs, mask = _inputs("lstm")
    d = lambda t: t.double()
    with pytest.raises(RuntimeError, match=r"w_hh must have the dtype of the other tensors "
                       r"\(Double\), or bfloat16 with float32 ones.*cast w_hh with \.to\(Double\)"):
        _forward(kernel, v, d(proj), w.to(torch.bfloat16), d(h0), d(c0), bs, d(mask), True)
    with pytest.raises(RuntimeError, match="w_hh must have the dtype of the other tensors"):
        _forward(kernel, v, proj, w.half(), h0, c0, bs, mask, True)


# --------------------------------------------------------------------------- whole models
@pytest.fixture
def step_gemm_on(monkeypatch):
    """The bfloat16 step GEMM forced on (any CPU), the projection's GEMM as the policy says."""
    monkeypatch.setattr(run_plan, "POLICY",
                        dataclasses.replace(run_plan.POLICY, bf16_step_gemm="on"))


def _reference(model, x):
    """The float32 generic path on the same (bfloat16-valued) parameters and input:
    ``(module, its input, its outputs)``."""
    ref = copy.deepcopy(model).float()
    xr = x.float().detach().requires_grad_(x.requires_grad)
    with options(backend="generic"):
        return ref, xr, ref(xr)


@needs_kernel
@pytest.mark.parametrize("schedule,bidirectional", [
    ("plain", False), ("pipelined", False), ("plain", True), ("pipelined", True)])
@pytest.mark.parametrize("variant", ["lstm", "ran", "lstm_minus_srnn_minus_hidden"])
def test_bfloat16_model_with_bf16_step_gemm_matches_float32(variant, schedule, bidirectional,
                                                            step_gemm_on, monkeypatch):
    torch.manual_seed(0)
    model = AblatedRNN(variant, 8, 20, num_layers=2, bidirectional=bidirectional).bfloat16()
    x = torch.randn(9, 3, 8).bfloat16().requires_grad_()
    seen = record_plans(monkeypatch)
    with options(backend="kernel", cpu_schedule=schedule,
                 concurrent_directions="on" if bidirectional else "off"):
        out, (h, c) = model(x)
    step_cell = get_variant(variant).reads_hidden
    assert len(seen) == 2 and all(p.bf16_on_f32 and p.bf16_step_gemm == step_cell
                                  for p in seen), seen
    if step_cell:
        assert all(p.runner.startswith(f"cpu_{schedule}") for p in seen), seen
    assert out.dtype == h.dtype == c.dtype == torch.bfloat16
    ref, xr, (rout, (rh, rc)) = _reference(model, x)
    torch.testing.assert_close(out.float(), rout, **BF16_TOL)
    torch.testing.assert_close(h.float(), rh, **BF16_TOL)
    torch.testing.assert_close(c.float(), rc, **BF16_TOL)
    (out.float().sum() + h.float().sum()).backward()
    (rout.sum() + rh.sum()).backward()
    torch.testing.assert_close(x.grad.float(), xr.grad, **BF16_TOL)
    for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        assert p.grad is not None and p.grad.dtype == torch.bfloat16, name
        scale = q.grad.abs().max().clamp_min(1.0)
        torch.testing.assert_close(p.grad.float() / scale, q.grad / scale, rtol=0, atol=5e-2,
                                   msg=name)


@needs_kernel
@pytest.mark.parametrize("variant", ["lstm", "ran"])
def test_streamed_inference_with_bf16_step_gemm(variant, step_gemm_on, monkeypatch):
    monkeypatch.setattr(run_plan, "POLICY", dataclasses.replace(
        run_plan.POLICY, stream_min_bytes=1, stream_chunk_bytes=3 * 2 * 4 * 4 * 16))
    torch.manual_seed(2)
    model = AblatedRNN(variant, 8, 16, bidirectional=True).bfloat16()
    x = torch.randn(11, 3, 8).bfloat16()
    seen = record_plans(monkeypatch)
    with torch.no_grad(), options(backend="kernel"):
        out, (h, c) = model(x)
    assert seen and all(p.runner == "cpu_streamed" and p.bf16_step_gemm for p in seen), seen
    _, _, (rout, (rh, rc)) = _reference(model, x)
    torch.testing.assert_close(out.float(), rout.detach(), **BF16_TOL)
    torch.testing.assert_close(h.float(), rh.detach(), **BF16_TOL)


@needs_kernel
def test_autocast_float32_model_with_bf16_step_gemm(step_gemm_on, monkeypatch):
    """Under CPU bfloat16 autocast the float32 w_hh goes to the kernel in bfloat16 and its
    gradient comes back to the float32 parameter in float32."""
    torch.manual_seed(4)
    model = AblatedRNN("lstm", 6, 12)
    x = torch.randn(5, 4, 6)
    seen = record_plans(monkeypatch)
    with options(backend="kernel"), torch.autocast("cpu", torch.bfloat16):
        out, _ = model(x)
    assert seen and all(p.bf16_step_gemm for p in seen), seen
    out.float().sum().backward()
    with options(backend="generic"):
        ref = AblatedRNN("lstm", 6, 12)
        ref.load_state_dict(model.state_dict())
        rout, _ = ref(x)
    rout.sum().backward()
    torch.testing.assert_close(out.float(), rout, **BF16_TOL)
    for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        assert p.grad.dtype == torch.float32, name
        scale = q.grad.abs().max().clamp_min(1.0)
        torch.testing.assert_close(p.grad / scale, q.grad / scale, rtol=0, atol=5e-2, msg=name)


class _Record(TorchDispatchMode):
    """The rnn_ablations operator calls, with copies of their arguments."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace == "rnn_ablations":
            copy_ = (lambda a: a.detach().clone() if isinstance(a, torch.Tensor) else
                     [t.detach().clone() for t in a]
                     if isinstance(a, (list, tuple)) and a and isinstance(a[0], torch.Tensor)
                     else a)
            self.calls.append((func, tuple(copy_(a) for a in args), dict(kwargs)))
        return func(*args, **kwargs)


@needs_kernel
def test_opcheck_with_a_bfloat16_w_hh(step_gemm_on):
    """Schema, fake kernels (d_w_hh in w_hh's dtype) and traceability of every step operator
    a bfloat16 model calls with the step GEMM in bfloat16."""
    rec = _Record()
    for schedule in ("plain", "pipelined"):
        for bidirectional in (False, True):
            torch.manual_seed(0)
            model = AblatedRNN("lstm", 5, 4, num_layers=1,
                               bidirectional=bidirectional).bfloat16()
            x = torch.randn(6, 3, 5).bfloat16().requires_grad_()
            with options(backend="kernel", cpu_schedule=schedule,
                         concurrent_directions="on" if bidirectional else "off"), rec:
                out, _ = model(x, lengths=torch.tensor([6, 4, 1]))
                out.float().square().sum().backward()
                with torch.no_grad():
                    model(x)
    names = set()
    for func, args, kwargs in rec.calls:
        names.add(func._schema.name.split("::")[1])
        assert any(isinstance(a, torch.Tensor) and a.dtype == torch.bfloat16 or
                   isinstance(a, list) and a[0].dtype == torch.bfloat16 for a in args), func
        opcheck(func, args, kwargs)
    assert {"plain_forward_", "plain_backward", "pipelined_forward", "pipelined_backward",
            "plain_directions_forward_", "plain_directions_backward",
            "pipelined_directions_forward", "pipelined_directions_backward"} <= names, names


@needs_kernel
def test_double_backward_with_bf16_step_gemm(step_gemm_on):
    """``create_graph=True`` recomputes the layer on the generic path from the bfloat16 w_hh
    (widened differentiably): second derivatives as the float32 generic path's."""
    torch.manual_seed(5)
    model = AblatedRNN("lstm", 4, 6).bfloat16()
    x = torch.randn(5, 2, 4).bfloat16().requires_grad_()
    with options(backend="kernel", cpu_schedule="plain"):
        out, _ = model(x)
    (gx,) = torch.autograd.grad(out.float().square().sum(), x, create_graph=True)
    gx.float().sum().backward()
    ref, xr, (rout, _) = _reference(model, x)
    (rgx,) = torch.autograd.grad(rout.square().sum(), xr, create_graph=True)
    rgx.sum().backward()
    torch.testing.assert_close(gx.float(), rgx, **BF16_TOL)
    for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        scale = q.grad.abs().max().clamp_min(1.0)
        torch.testing.assert_close(p.grad.float() / scale, q.grad / scale, rtol=0, atol=5e-2,
                                   msg=name)
