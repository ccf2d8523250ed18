"""The CUDA kernels' first-use check (rnn_ablations/kernels/cuda/selfcheck.py) on the emulated
device: the real host loops and device code pass it for every family (no false alarm, also in
the 16-bit types, and with TF32 GEMMs switched on, emulated by rounding the GEMM operands as
TF32 does), a kernel that computes a wrong backward or cannot be loaded fails it at the first
forward, with one warning, the generic path then serving the layer calls, and a wrong rule of
one variant fails that variant's family after another variant's passed."""
import contextlib
import shutil
import warnings

import pytest
import torch

import rnn_ablations as ra
from rnn_ablations import dispatch, get_variant
from rnn_ablations.kernels import registry
from rnn_ablations.kernels.cuda import ops as ops_cuda
from rnn_ablations.kernels.cuda import driver, host, programs, selfcheck
from rnn_ablations.plan import Plan
from rnn_ablations.variants import VARIANTS_TABLE
from _cuda_plans import cuda_plans_on_cpu

from . import emulator

CPU = torch.device("cpu")


pytestmark = pytest.mark.usefixtures("fresh_cuda_selfcheck")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_family_passes_on_the_emulated_device(dtype, emulated_cuda):
    lstm, scan_cell = get_variant("lstm"), get_variant("lstm_minus_srnn_minus_hidden")
    fams = [(lstm, selfcheck.Family("step", dtype, highway=True)),
            (lstm, selfcheck.Family("persistent", dtype, backward=True)),
            (lstm, selfcheck.Family("persistent", dtype, backward=False)),
            (scan_cell, selfcheck.families(Plan("cuda", "", schedule="scan"), scan_cell, False,
                                           dtype)[0])]
    for v, fam in fams:
        assert selfcheck.check_family(fam, v, CPU, host) is None, fam.name


class _Broken:
    """The emulated device with one fault: ``skip`` = a family whose launches do nothing (a
    kernel that writes a wrong result), ``load`` = a family whose program cannot be loaded."""

    def __init__(self, device, skip=None, load=None):
        self.device, self.skip, self.load = device, skip, load

    def kernel(self, prog, device):
        if prog.family == self.load:
            raise driver.CudaDriverError(f"rnn_ablations CUDA kernel: cuModuleLoadData("
                                         f"{prog.name}) failed: CUDA_ERROR_INVALID_PTX (218)")
        return self.device.kernel(prog, device)

    def launch(self, k, args, grid, block, smem=0, cooperative=False):
        if k.prog.family != self.skip:
            self.device.launch(k, args, grid, block, smem, cooperative)

    def device_attribute(self, attr, device):
        return self.device.device_attribute(attr, device)


def _layer(T=5, B=3, D=6, H=4):
    g = torch.Generator().manual_seed(5)
    v = get_variant("lstm")
    x = torch.randn(T, B, D, generator=g)
    w_ih = torch.randn(4 * H, D, generator=g) * 0.3
    w_hh = torch.randn(4 * H, H, generator=g) * 0.3
    bias = torch.randn(4 * H, generator=g) * 0.1
    h0, c0 = torch.randn(B, H, generator=g), torch.randn(B, H, generator=g)
    return v, [t.requires_grad_() for t in (x, w_ih, bias, w_hh, h0, c0)], torch.tensor(
        [3, 3, 2, 2, 1])


def _run(v, tensors, bs):
    x, w_ih, bias, w_hh, h0, c0 = tensors
    out, h_n, c_n = dispatch.run_layer(v, False, x, w_ih, bias, w_hh, h0, c0, bs)
    loss = out.square().sum() + h_n.sum() + 2 * c_n.sum()
    return [out, h_n, c_n] + list(torch.autograd.grad(loss, tensors))


@pytest.mark.parametrize("fault", [None, {"skip": "step_backward"}, {"load": "step_forward"}])
def test_layer_calls_through_the_emulated_kernels_or_their_fallback(fault, emulated_cuda,
                                                                    monkeypatch):
    """A CUDA plan's layer calls: with correct kernels they run on them (the emulated launches
    grow) and give the generic path's numbers; with a wrong backward or a program that cannot
    be loaded, the first call's check fails (before any of the call's own launches), one
    warning names the reason, and every call gives exactly the generic path's numbers."""
    v, tensors, bs = _layer()
    with ra.use_backend("generic"):
        want = _run(v, tensors, bs)
    if fault:
        driver.set_implementation(_Broken(emulated_cuda, **fault))
    cuda_plans_on_cpu(monkeypatch, ops_cuda.CudaKernel(host))  # as the registry loads it
    with warnings.catch_warnings(record=True) as caught, ra.options(cuda_graphs=False):
        warnings.simplefilter("always")
        ran = []
        for _ in range(2):
            before = emulated_cuda.launches()
            got = _run(v, tensors, bs)
            ran.append(emulated_cuda.launches() - before)
            for g, w in zip(got, want):
                if fault:
                    torch.testing.assert_close(g, w, rtol=0, atol=0)
                else:
                    torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    # a call: 5 forward and 5 backward steps; the check (first call only): 3 + 3 steps
    check = {None: 6, "skip": 3, "load": 0}[next(iter(fault)) if fault else None]
    assert ran == ([check, 0] if fault else [check + 10, 10])
    ours = [str(w.message) for w in caught if "failed their check" in str(w.message)]
    if fault is None:
        assert ours == [] and list(selfcheck.status().values()) == [None]
    else:
        assert len(ours) == 1
        assert ("d_proj differs" if "skip" in fault else "CUDA_ERROR_INVALID_PTX") in ours[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_step_loop_is_the_same_under_autocast(dtype, emulated_cuda):
    """Under torch.autocast the step loop's pre-activations (gates) stay in the accumulation type
    and every result is the one outside it, bit for bit (the loop runs with autocast off)."""
    v = get_variant("lstm")
    g = torch.Generator().manual_seed(2)
    T, B, H = 4, 3, 8
    proj = torch.randn(T, B, 4 * H, generator=g).to(dtype)
    w_hh = (torch.randn(4 * H, H, generator=g) * 0.3).to(dtype)
    h0, c0 = torch.randn(B, H, generator=g).to(dtype), torch.randn(B, H, generator=g).to(dtype)
    bs = torch.tensor([3, 3, 2, 1])
    args = (v.kernel_spec, False, proj, w_hh, h0, c0, bs, torch.empty(0, dtype=dtype), True)
    want = host.plain_forward(*args)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = host.plain_forward(*args)
    assert got[3].dtype == torch.float32
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and torch.equal(a, b)


# ------------------------------------------------------------------------------ TF32
def _tf32_on() -> bool:
    """Whether cuBLAS would run a float32 GEMM in TF32 now (torch's setting for CUDA)."""
    m = torch.backends.cuda.matmul
    if hasattr(m, "fp32_precision"):
        return m.fp32_precision == "tf32"
    return bool(m.allow_tf32)  # pragma: no cover - torch < 2.9


def _to_tf32(t: torch.Tensor) -> torch.Tensor:
    """float32 rounded to TF32 (10 mantissa bits; to nearest, ties away from zero: cvt.rna)."""
    bits = t.contiguous().view(torch.int32)
    return ((bits + 0x1000) & ~0x1FFF).view(torch.float32).view(t.shape)


@contextlib.contextmanager
def emulated_tf32(monkeypatch, always=False):
    """torch.mm / torch.addmm / Tensor.addmm_ round their float32 operands to TF32 while TF32
    is on (as cuBLAS does on an Ampere or later GPU), or always (``always``: a check that
    ignores the setting); the accumulation stays float32."""
    mm, addmm, addmm_ = torch.mm, torch.addmm, torch.Tensor.addmm_

    def r(*ts):
        on = always or _tf32_on()
        return [_to_tf32(t) if on and isinstance(t, torch.Tensor) and t.dtype == torch.float32
                else t for t in ts]

    monkeypatch.setattr(torch, "mm", lambda a, b, **k: mm(*r(a, b), **k))
    monkeypatch.setattr(torch, "addmm", lambda c, a, b, **k: addmm(c, *r(a, b), **k))
    monkeypatch.setattr(torch.Tensor, "addmm_", lambda self, a, b, **k: addmm_(self, *r(a, b), **k))
    yield


@pytest.fixture
def tf32_on():
    m = torch.backends.cuda.matmul
    saved = m.fp32_precision if hasattr(m, "fp32_precision") else None
    torch.set_float32_matmul_precision("high")  # TF32 GEMMs (common on an H100)
    assert _tf32_on()
    yield
    torch.set_float32_matmul_precision("highest")
    if saved is not None:
        m.fp32_precision = saved


def _every_family(dtype):
    """(variant, family) of every variant, highway or not, every plan kind."""
    out = []
    for name in VARIANTS_TABLE:
        v = get_variant(name)
        for hw in (False, True):
            if not v.reads_hidden:
                out += [(v, f) for f in selfcheck.families(Plan("cuda", "", schedule="scan"), v,
                                                            hw, dtype)]
                continue
            for persistent in ((0, 0, False), (0, 0, True)):
                plan = Plan("cuda", "", recurrence="persistent", persistent=persistent)
                out += [(v, f) for f in selfcheck.families(plan, v, hw, dtype)]
    return list({f: (v, f) for v, f in out}.values())


#: the families whose check failed under TF32 before the check turned it off (lstm: out, ran:
#: d_w_hh, srnn), and the persistent kernels (their weight gradient is a torch GEMM too)
TF32_QUICK = [("lstm", "steps"), ("ran", "steps"), ("srnn", "steps"), ("lstm", "persistent")]


def test_the_families_that_tf32_failed_pass_with_tf32_gemms(emulated_cuda, tf32_on,
                                                             monkeypatch):
    """TF32 on (torch.set_float32_matmul_precision("high")), the GEMMs rounded as TF32 rounds
    them: the families that failed their check so pass it (the check runs its GEMMs in full
    float32), and the user's setting is the same after it (every family: the slow test below)."""
    with emulated_tf32(monkeypatch):
        for name, recurrence in TF32_QUICK:
            v = get_variant(name)
            plan = Plan("cuda", "", recurrence=recurrence, persistent=(0, 0, True))
            for fam in selfcheck.families(plan, v, False, torch.float32):
                assert selfcheck.check_family(fam, v, CPU, host) is None, fam.name
                assert _tf32_on() and torch.get_float32_matmul_precision() == "high"


@pytest.mark.slow
def test_every_family_passes_with_tf32_gemms(emulated_cuda, tf32_on, monkeypatch):
    """As above, every family of every variant (32 checks)."""
    fams = _every_family(torch.float32)
    assert len(fams) == 32  # 5 variants x 2 highway x 3 plan kinds, 1 scan x 2
    with emulated_tf32(monkeypatch):
        for v, fam in fams:
            assert selfcheck.check_family(fam, v, CPU, host) is None, fam.name
            assert _tf32_on() and torch.get_float32_matmul_precision() == "high"


def test_tf32_gemms_fail_a_float32_check(emulated_cuda, monkeypatch):
    """The emulation of TF32 can fail the check: with the GEMM operands rounded whatever the
    setting says, the float32 comparison with the float64 reference fails (what a check that
    ran with the user's TF32 did on an H100)."""
    v = get_variant("lstm")
    fam = selfcheck.families(Plan("cuda", "", recurrence="steps"), v, False, torch.float32)[0]
    with emulated_tf32(monkeypatch, always=True):
        why = selfcheck.check_family(fam, v, CPU, host)
    assert why is not None and "differs from the generic path" in why, why


# ------------------------------------------------------------------------------ per-variant rules
RAN_RULE_BUG = ("    content = static_cast<A>(xo[ks.content_block * xs]);",
                "    content = tanh(static_cast<A>(xo[ks.content_block * xs]));")


@pytest.fixture(scope="module")
def ran_rule_bug_device(emulation_device, tmp_path_factory):
    """The step kernels built from a copy of csrc whose forward applies tanh to a content that
    reads x_t only (the rule of ran and identity_ran; lstm's content reads h_{t-1})."""
    csrc = tmp_path_factory.mktemp("ran_rule") / "csrc"
    shutil.copytree(programs.CSRC, csrc)
    path = csrc / "cuda" / "forward_element.cuh"
    text = path.read_text()
    assert text.count(RAN_RULE_BUG[0]) == 1, f"update RAN_RULE_BUG: not found in {path}"
    path.write_text(text.replace(*RAN_RULE_BUG))
    progs = [p for p in programs.all_programs() if p.family.startswith("step")]
    return emulator.EmulatedDevice(csrc=str(csrc), progs=progs)


def test_a_rule_bug_of_ran_fails_rans_family_after_lstm_passed(ran_rule_bug_device):
    """lstm's first call passes its check on kernels with a wrong rule for ran; ran's first
    call is then checked too (its own family) and fails, naming ran's rules."""
    plan = Plan("cuda", "", recurrence="steps")
    with emulator.installed(ran_rule_bug_device):
        lstm, ran = get_variant("lstm"), get_variant("ran")
        (f_lstm,) = selfcheck.families(plan, lstm, False, torch.float32)
        (f_ran,) = selfcheck.families(plan, ran, False, torch.float32)
        assert f_lstm.name != f_ran.name
        assert selfcheck.check_family(f_lstm, lstm, CPU, host) is None
        why = selfcheck.check_family(f_ran, ran, CPU, host)
    assert why is not None and why.startswith("out differs"), why
    assert "content x_t" in f_ran.name
