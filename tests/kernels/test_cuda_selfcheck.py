"""The CUDA kernels' first-use check and fallback (rnn_ablations/kernels/cuda/selfcheck.py), the
step loop's 16-bit GEMM (kernels/cuda/step.py StepGemm) and its driver calls per step, on the
CPU: the kernels' entry points are stood in for by the CPU kernel (the same operators, same
arguments), a copy of it with a wrong sign, or one that fails to compile; the step loop by
host.py's real loop with a counting stand-in for libcuda.  The device code itself runs on the CPU
in tests/cuda_emulation."""
import contextlib
import ctypes
import warnings

import pytest
import torch

import rnn_ablations as ra
from rnn_ablations import _env, dispatch, get_variant
from rnn_ablations.kernels import registry
from rnn_ablations.kernels.cuda import common, driver, host, nvrtc, selfcheck, step
from rnn_ablations.plan import Plan
from _cuda_plans import cuda_plans_on_cpu

needs_cpu_kernel = pytest.mark.skipif(not registry.kernel_available(),
                                      reason="the compiled CPU kernel stands in for the CUDA "
                                             "kernels' entry points here")

CPU = torch.device("cpu")


pytestmark = pytest.mark.usefixtures("fresh_cuda_selfcheck")


class _Wrong:
    """The CPU kernel with one result changed: ``what`` = "d_w_hh" (the backward's weight
    gradient negated), "out" (the forward's output shifted), or "compile" (an NVRTC error)."""

    def __init__(self, what):
        self.inner, self.what, self.calls = registry.cpu_kernel(), what, 0

    def plain_forward(self, *args):
        self.calls += 1
        if self.what == "compile":
            raise nvrtc.NvrtcError("rnn_ablations CUDA kernel: NVRTC could not compile "
                                   "step_forward[float32]: error: expected a ';'")
        res = self.inner.plain_forward(*args)
        if self.what == "out":
            res[0] = res[0] + 1e-3
        return res

    def plain_backward(self, *args):
        res = self.inner.plain_backward(*args)
        if self.what == "d_w_hh":
            res[1] = -res[1]
        return res

    @property
    def raw(self):  # the entry points the check calls, as a CUDA kernel object exposes them
        return self

    def __getattr__(self, name):
        return getattr(self.inner, name)


@needs_cpu_kernel
@pytest.mark.parametrize("name", ["lstm", "srnn", "lstm_minus_srnn", "ran", "identity_ran",
                                  "lstm_minus_srnn_minus_hidden"])
@pytest.mark.parametrize("highway", [False, True])
def test_a_correct_kernel_passes_the_check(name, highway):
    """The check's reference (the generic path in float64) agrees with a correct kernel for
    every variant, forward and backward (no false alarm)."""
    v = get_variant(name)
    plan = Plan("cuda", "test", schedule=None if v.reads_hidden else "scan",
                recurrence="steps" if v.reads_hidden else None)
    for dtype in (torch.float32, torch.float64):
        (fam,) = selfcheck.families(plan, v, highway, dtype)
        assert selfcheck.check_family(fam, v, CPU, registry.cpu_kernel()) is None, fam.name


@needs_cpu_kernel
@pytest.mark.parametrize("what, reason", [("d_w_hh", "d_w_hh differs"),
                                          ("out", "out differs"),
                                          ("compile", "NvrtcError: rnn_ablations CUDA kernel: "
                                                      "NVRTC could not compile")])
def test_a_wrong_or_failing_kernel_fails_the_check(what, reason):
    v = get_variant("lstm")
    fam = selfcheck.Family("step", torch.float32)
    why = selfcheck.check_family(fam, v, CPU, _Wrong(what))
    assert why is not None and why.startswith(reason), why


def _layer(v, dtype=torch.float32, T=5, B=3, D=6, H=4):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(T, B, D, generator=g, dtype=dtype)
    R, X = v.num_recurrent(), v.num_input_only()
    w_ih = torch.randn((R + X) * H, D, generator=g, dtype=dtype) * 0.3
    w_hh = torch.randn(R * H, H, generator=g, dtype=dtype) * 0.3
    bias = torch.randn(v.num_biased() * H, generator=g, dtype=dtype) * 0.1
    h0 = torch.randn(B, H, generator=g, dtype=dtype)
    c0 = torch.randn(B, H, generator=g, dtype=dtype)
    bs = torch.tensor([3, 3, 2, 2, 1])
    return [t.requires_grad_() for t in (x, w_ih, bias, w_hh, h0, c0)], bs


def _run(v, tensors, bs):
    x, w_ih, bias, w_hh, h0, c0 = tensors
    out, h_n, c_n = dispatch.run_layer(v, False, x, w_ih, bias, w_hh, h0, c0, bs)
    loss = out.square().sum() + h_n.sum() + 2 * c_n.sum()
    return [out, h_n, c_n] + list(torch.autograd.grad(loss, tensors))


@needs_cpu_kernel
@pytest.mark.parametrize("what", ["d_w_hh", "compile"])
def test_the_run_layer_falls_back_to_the_generic_path_with_one_warning(what, monkeypatch):
    """A CUDA plan whose kernels fail their check: the first call and the later ones run on the
    generic path (the numbers of backend='generic'), with exactly one warning, naming the
    programs and the reason; the wrong kernel never serves a call."""
    v = get_variant("lstm")
    tensors, bs = _layer(v)
    with ra.use_backend("generic"):
        want = _run(v, tensors, bs)
    wrong = _Wrong(what)
    cuda_plans_on_cpu(monkeypatch, wrong)
    with warnings.catch_warnings(record=True) as caught, ra.options(cuda_graphs=False):
        warnings.simplefilter("always")
        for _ in range(3):
            got = _run(v, tensors, bs)
            for g, w in zip(got, want):
                torch.testing.assert_close(g, w, rtol=0, atol=0)
    ours = [w for w in caught if "failed their check" in str(w.message)]
    assert len(ours) == 1, [str(w.message) for w in caught]
    text = str(ours[0].message)
    assert "step_forward[float32]+step_backward[float32]" in text and "cpu" in text
    assert ("d_w_hh differs" if what == "d_w_hh" else "NvrtcError") in text
    assert f"{_env.CUDA_CHECK}=0" in text
    assert wrong.calls == 1  # the check's call only
    (why,) = selfcheck.status().values()
    assert why and why in text


@needs_cpu_kernel
def test_a_passed_check_keeps_the_plan_and_runs_once(monkeypatch):
    """A family that passed is checked once per device, whatever plan, shape or layer asks
    next (the verdict is remembered by device and family), and the CUDA plan names it."""
    v = get_variant("lstm")

    class Counting(_Wrong):
        pass
    ok = Counting("none")
    cuda_plans_on_cpu(monkeypatch, ok)
    with ra.options(cuda_graphs=False):
        for T, B in ((2, 1), (3, 1), (2, 4), (7, 2)):
            x, p = torch.zeros(T, B, 3), (torch.zeros(16, 3), torch.zeros(16, 4), None)
            z = torch.zeros(1, B, 4)
            plan = dispatch.decide(x, [p], z, z, variant=v)
            assert (plan.path, plan.check) == ("cuda", "passed")
            assert plan.cuda_checked == tuple(f.name for f in selfcheck.families(
                plan, v, False, torch.float32))
            assert plan.cuda_checked[0].startswith("step_forward[float32]+step_backward[float32]")
    assert ok.calls == 1
    assert selfcheck.status() == {f"cpu {plan.cuda_checked[0]}": None}


def test_the_check_is_off_with_the_switch(monkeypatch):
    v = get_variant("lstm")
    wrong = _Wrong("compile")
    cuda_plans_on_cpu(monkeypatch, wrong)
    x, p, z = torch.zeros(2, 1, 3), (torch.zeros(16, 3), torch.zeros(16, 4), None), \
        torch.zeros(1, 1, 4)
    monkeypatch.setenv(_env.CUDA_CHECK, "0")
    selfcheck.set_enabled(None)
    plan = dispatch.decide(x, [p], z, z, variant=v)
    assert (plan.path, plan.check, plan.cuda_checked) == ("cuda", "off", ())
    assert wrong.calls == 0 and selfcheck.status() == {}
    monkeypatch.setenv(_env.CUDA_CHECK, "yes")
    selfcheck.set_enabled(None)  # the variable is read again
    with pytest.raises(ValueError, match="RNN_ABLATIONS_CUDA_CHECK='yes' is not understood"):
        dispatch.decide(x, [p], z, z, variant=v)
    with pytest.raises(TypeError, match="True, False or None"):
        selfcheck.set_enabled("off")


def test_families_of_each_plan():
    lstm, scan_cell = get_variant("lstm"), get_variant("lstm_minus_srnn_minus_hidden")
    names = lambda plan, v: [f.name for f in selfcheck.families(plan, v, True, torch.bfloat16)]
    rules = " (rules: output o_tanh, content h_{t-1} tanh, highway)"
    assert names(Plan("cuda", "", recurrence="steps"), lstm) == [
        "step_forward[bfloat16]+step_backward[bfloat16]" + rules]
    assert names(Plan("cuda", "", recurrence="persistent", persistent=(0, 0, False)), lstm) == [
        "step_forward[bfloat16]+step_backward[bfloat16]" + rules,
        "persistent_forward[bfloat16]+step_backward[bfloat16]" + rules]
    assert names(Plan("cuda", "", recurrence="persistent", persistent=(0, 0, True)), lstm) == [
        "persistent_forward[bfloat16]+persistent_backward[bfloat16]" + rules]
    assert names(Plan("cuda", "", schedule="fused_scan"), scan_cell) == [
        "scan_forward[bfloat16,o_tanh,highway]+scan_backward[bfloat16,o_tanh,highway]"]


def test_each_variants_rules_are_a_family_of_their_own():
    """The step kernels branch on the kernel spec at run time: every variant with a step kernel
    (and highway or not) is a family of its own, so a variant's first call is checked even after
    another variant's passed; the name says which rules (status() shows it)."""
    plan = Plan("cuda", "", recurrence="steps")
    stepped = [get_variant(n) for n in ("lstm", "srnn", "lstm_minus_srnn", "ran", "identity_ran")]
    fams = [selfcheck.families(plan, v, hw, torch.float32)[0] for v in stepped
            for hw in (False, True)]
    assert len(set(fams)) == len(fams) == len({f.name for f in fams}) == 10
    ran = selfcheck.families(plan, get_variant("ran"), False, torch.float32)[0]
    assert ran.name == ("step_forward[float32]+step_backward[float32] (rules: output tanh, "
                        "content x_t)")


def test_env_switches_parse():
    assert _env.cuda_check_enabled({}) and not _env.cuda_check_enabled({_env.CUDA_CHECK: "0"})
    assert not _env.cpu_kernel_disabled({}) and _env.cpu_kernel_disabled({_env.NO_CPU_KERNEL: "1"})
    with pytest.raises(ValueError, match="RNN_ABLATIONS_NO_CPU_KERNEL='true'"):
        _env.cpu_kernel_disabled({_env.NO_CPU_KERNEL: "true"})


# ------------------------------------------------------------------------------ the step GEMM
@pytest.fixture
def fresh_gemm_probe(monkeypatch):
    monkeypatch.setattr(step, "_out_dtype", {})


def _out_dtype_torch(monkeypatch, refused):
    """torch as step.py sees it, with mm / addmm taking ``out_dtype=float32`` (as on CUDA; the
    CPU refuses it) except the operators in ``refused``."""
    def mm(a, b, out_dtype=None, out=None):
        if out_dtype is None:
            return torch.mm(a, b, out=out)
        if "mm" in refused:
            raise RuntimeError("mm: out_dtype is not supported here")
        return out.copy_(torch.mm(a.to(out_dtype), b.to(out_dtype)))

    def addmm(c, a, b, out_dtype=None, out=None):
        if out_dtype is None:
            return torch.addmm(c, a, b, out=out)
        if "addmm" in refused:
            raise NotImplementedError("addmm: out_dtype is not supported here")
        return out.copy_(c + torch.mm(a.to(out_dtype), b.to(out_dtype)))

    class Torch:
        def __getattr__(self, name):
            return {"mm": mm, "addmm": addmm}.get(name) or getattr(torch, name)
    monkeypatch.setattr(step, "torch", Torch())


@pytest.mark.parametrize("refused", [(), ("mm",), ("addmm",), ("mm", "addmm")])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_step_gemm_probes_each_operator_and_keeps_fp32_sums(refused, dtype, monkeypatch,
                                                            fresh_gemm_probe):
    """mm and addmm are probed apart; where one refuses out_dtype its GEMM takes W in fp32,
    converted once per call (the same tensor at every step); the sums are fp32's either way,
    also under autocast."""
    _out_dtype_torch(monkeypatch, refused)
    g = torch.Generator().manual_seed(0)
    w = torch.randn(8, 12, generator=g).to(dtype)
    a = [torch.randn(3, 8, generator=g).to(dtype) for _ in range(3)]
    for accumulate in (True, False):
        gemm = step.StepGemm(w, torch.float32, accumulate)
        op = "addmm" if accumulate else "mm"
        assert gemm.out_dtype == (op not in refused)
        assert (gemm.w_acc is None) == (op not in refused)
        w_acc = gemm.w_acc
        dst = torch.full((3, 12), 0.25)
        want = dst.double().clone()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            for ai in a:
                with torch.autocast("cpu", enabled=False):
                    gemm(dst, ai)
                prod = ai.double() @ w.double()
                want = want + prod if accumulate else prod
        assert gemm.w_acc is w_acc and dst.dtype == torch.float32
        torch.testing.assert_close(dst.double(), want, rtol=1e-6, atol=1e-6)
    assert step._out_dtype == {("cpu", "mm"): "mm" not in refused,
                               ("cpu", "addmm"): "addmm" not in refused}


# ------------------------------------------------------------------------------ driver calls
class _CountingLib:
    """libcuda's calls as the host loop makes them, counted (a launch does nothing)."""

    def __init__(self):
        self.calls = {}

    def __getattr__(self, name):
        if not name.startswith("cu"):
            raise AttributeError(name)

        def call(*args):
            self.calls[name] = self.calls.get(name, 0) + 1
            if name == "cuDevicePrimaryCtxRetain":
                args[0]._obj.value = 0x1234
            return 0
        return call


@contextlib.contextmanager
def _counting_driver(monkeypatch):
    lib = _CountingLib()
    streams = []

    class Stream:
        cuda_stream = 0

    def current_stream(device=None):
        streams.append(device)
        return Stream()

    def kernel(prog, device):
        k = object.__new__(driver.Kernel)  # a loaded kernel, without a module behind it
        k.prog, k.device, k.function = prog, device, ctypes.c_void_p(0x10)
        return k

    monkeypatch.setattr(driver, "_lib", lib)
    monkeypatch.setattr(driver, "kernel", kernel)
    monkeypatch.setattr(driver, "_implementation", None)
    monkeypatch.setattr(driver.torch.cuda, "current_stream", current_stream)
    if hasattr(driver, "_primary"):
        monkeypatch.setattr(driver, "_primary", {})
    monkeypatch.setattr(common, "DEVICE_TYPE", "cpu")
    yield lib, streams


@pytest.mark.parametrize("backward", [False, True])
def test_step_loop_makes_one_driver_call_per_step(backward, monkeypatch):
    """Per step the loop calls cuLaunchKernel and nothing else of the driver; the context and
    the stream are resolved once per call whatever the number of steps."""
    v = get_variant("lstm")
    H, B, R = 4, 2, 4
    counts = {}
    with _counting_driver(monkeypatch) as (lib, streams):
        for T in (2, 7):
            lib.calls.clear()
            streams.clear()
            proj = torch.randn(T, B, R * H)
            w_hh = torch.randn(R * H, H)
            h0 = c0 = torch.zeros(B, H)
            bs = torch.full((T,), B)
            res = host.plain_forward(v.kernel_spec, False, proj, w_hh, h0, c0, bs,
                                     torch.empty(0), True)
            if backward:
                lib.calls.clear()
                streams.clear()
                out, _, _, gates, cs, hin = res
                host.plain_backward(v.kernel_spec, False, torch.ones(T, B, H),
                                    torch.ones(B, H), torch.ones(B, H), gates, cs, hin, out, proj,
                                    w_hh, h0, c0, bs, torch.empty(0))
            counts[T] = (dict(lib.calls), len(streams))
    for T, (calls, n_streams) in counts.items():
        assert calls.pop("cuLaunchKernel") == T
        assert n_streams == 1
    # the other calls do not grow with the steps (the primary context is retained once per
    # process: by the first call)
    assert all(n <= counts[2][0].get(name, 0) for name, n in counts[7][0].items())
    assert sum(counts[7][0].values()) <= 2, counts[7][0]


@needs_cpu_kernel
def test_backend_kernel_raises_where_the_check_failed(monkeypatch):
    """Asked for explicitly (backend='kernel'), a family that failed its check is an error that
    says why, at every call; the auto backend then runs the generic path."""
    v = get_variant("lstm")
    tensors, bs = _layer(v)
    wrong = _Wrong("d_w_hh")
    cuda_plans_on_cpu(monkeypatch, wrong)
    with pytest.warns(RuntimeWarning, match="failed their check"), \
            ra.options(cuda_graphs=False):
        _run(v, tensors, bs)
    for _ in range(2):
        with ra.use_backend("kernel"), ra.options(cuda_graphs=False), pytest.raises(
                RuntimeError, match=r"backend='kernel': the CUDA kernels "
                                    r"step_forward\[float32\]\+step_backward\[float32\].* failed "
                                    r"their check on cpu \(d_w_hh differs"):
            _run(v, tensors, bs)


def test_no_cpu_kernel_switch_turns_off_the_cpu_kernel_alone():
    """RNN_ABLATIONS_NO_CPU_KERNEL=1: no CPU kernel (a CPU layer runs, on the generic path),
    while the CUDA kernels' availability is not decided by the switch."""
    import os
    import subprocess
    import sys
    code = (
        "import torch, rnn_ablations as ra\n"
        "from rnn_ablations.kernels import registry, cuda\n"
        "print(ra.kernel_available(), registry.cpu_kernel_error())\n"
        "print(cuda.unavailable_reason())\n"
        "m = ra.AblatedRNN('lstm', 3, 4); torch.manual_seed(0); x = torch.randn(5, 2, 3)\n"
        "print(m(x)[0].sum().item())\n")
    env = dict(os.environ, RNN_ABLATIONS_NO_CPU_KERNEL="1")
    env.pop("RNN_ABLATIONS_NO_KERNEL", None)
    env.pop("RNN_ABLATIONS_DISABLE_KERNEL", None)
    got = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=300)
    assert got.returncode == 0, got.stderr
    first, cuda_why = got.stdout.splitlines()[:2]
    assert first.startswith("False RNN_ABLATIONS_NO_CPU_KERNEL=1 is set")
    assert "RNN_ABLATIONS_NO_KERNEL" not in cuda_why  # not the switch that turns CUDA off
