"""The run plan is the whole truth: for a matrix of layer calls (CPU float32 / float64 /
bfloat16 / autocast, gradient or not, one or two directions, packed, large no-gradient calls,
the generic setting, proj_size, CUDA plans under the emulation with a family that fails its
first-use check) the runner that actually executed, and what it did, equal the plan that
``rnn_ablations.explain`` printed for the same forward.

What is observed of a real forward (``dispatch.RUNNERS`` and the functions the runners call,
instrumented): the runner's name and the plan it was given; every input projection the runners
compute (oneDNN or not, bfloat16 GEMM or not); the steps per chunk of a streamed forward; which
autograd Function of the kernels ran; whether the generic loop ran; the result's dtype; the
step-GEMM thresholds the CPU kernel held."""
import dataclasses
import warnings

import pytest
import torch

import rnn_ablations as ra
from rnn_ablations import AblatedRNN, dispatch, explain
from rnn_ablations import plan as run_plan
from rnn_ablations.kernels import autograd as kernel_autograd
from rnn_ablations.kernels import registry, scan as kernel_scan

needs_cpu_kernel = pytest.mark.skipif(not registry.kernel_available(),
                                      reason="the CPU kernel is not built")


class Observed:
    """What the runners did during one forward, per layer call."""

    def __init__(self, monkeypatch):
        self.calls = []
        for name, fn in list(dispatch.RUNNERS.items()):
            monkeypatch.setitem(dispatch.RUNNERS, name, self._runner(name, fn))
        real_proj = dispatch.input_projection
        monkeypatch.setattr(dispatch, "input_projection", self._record(
            "projections", lambda x, w, b, onednn, bf16_gemm=False: (onednn, bf16_gemm),
            real_proj))
        from rnn_ablations.kernels import projection
        monkeypatch.setattr(projection, "_chunk_projection", self._record(
            "projections", lambda xs, w, b, onednn, gemm, dtype: (onednn,
                                                                  gemm is torch.bfloat16),
            projection._chunk_projection))
        for fn_name in ("streamed_forward", "streamed_scan_forward"):
            real = getattr(dispatch, fn_name)
            monkeypatch.setattr(dispatch, fn_name, self._record(
                "chunks", lambda *a, **k: a[15] if len(a) > 15 else a[12], real))
        for fn_name in ("generic_from_projection", "generic_directions"):
            real = getattr(dispatch, fn_name)
            monkeypatch.setattr(dispatch, fn_name, self._record("generic", lambda *a, **k: 1,
                                                                real))
        for cls in ("_KernelLayer", "_PipelinedLayer", "_KernelDirections",
                    "_PipelinedDirections"):
            fn = getattr(kernel_autograd, cls)
            monkeypatch.setattr(fn, "apply", self._record("functions", lambda *a, _c=cls: _c,
                                                          fn.apply))
        for fn_name in ("scan_layer", "fused_scan_layer"):
            real = getattr(kernel_scan, fn_name)
            monkeypatch.setattr(kernel_scan, fn_name, self._record(
                "functions", lambda *a, _c=fn_name: _c, real))

    def _runner(self, name, fn):
        def run(plan, *args):
            self.calls.append(dict(runner=name, plan=plan, projections=[], chunks=[],
                                   generic=[], functions=[]))
            out = fn(plan, *args)
            self.calls[-1]["dtype"] = out[0].dtype
            cpu = registry.cpu_kernel()
            if plan.path == "cpu" and hasattr(cpu, "library_step_gemm"):
                self.calls[-1]["step_gemm"] = tuple(cpu.library_step_gemm())
            return out
        return run

    def _record(self, what, value, real):
        def wrapped(*args, **kwargs):
            if self.calls:
                self.calls[-1][what].append(value(*args, **kwargs))
            return real(*args, **kwargs)
        return wrapped


def _assert_truth(explained, observed):
    assert len(explained) == len(observed.calls) > 0, (str(explained), observed.calls)
    for said, did in zip(explained, observed.calls):
        plan = said.plan
        where = f"\n{said}\nran: {did}"
        assert did["runner"] == plan.runner, where
        assert did["plan"] == plan, where
        runner = plan.runner
        # the generic loop runs exactly on the generic runners
        assert bool(did["generic"]) == runner.startswith("generic"), where
        # the streaming chunk
        streamed = runner in ("cpu_streamed", "scan_streamed")
        assert did["chunks"] == ([plan.stream] * len(did["chunks"]) if streamed else []), where
        assert bool(did["chunks"]) == streamed == (plan.stream > 0), where
        # the input projections the runner computed itself (a streamed one: per chunk): the
        # library and dtype it says
        own = runner in ("generic", "generic_scan", "generic_projected", "cpu_plain",
                         "cpu_plain_pair", "cpu_streamed", "scan", "scan_streamed", "cuda")
        assert bool(did["projections"]) == own, where
        assert all(p == (plan.onednn, plan.bf16_gemm) for p in did["projections"]), where
        # the kernels' autograd Functions
        want_fn = {"cpu_plain": "_KernelLayer", "cpu_pipelined": "_PipelinedLayer",
                   "cpu_plain_pair": "_KernelDirections",
                   "cpu_pipelined_pair": "_PipelinedDirections", "cuda": "_KernelLayer",
                   "scan": "scan_layer", "fused_scan": "fused_scan_layer"}.get(runner)
        needs = said.call.needs_grad
        if want_fn in ("scan_layer", "fused_scan_layer"):
            assert did["functions"] == [want_fn], where
        elif want_fn is not None and needs:
            assert set(did["functions"]) == {want_fn}, where
        elif runner not in ("scan", "fused_scan"):
            assert did["functions"] == [], where
        # the dtype path
        if plan.bf16_on_f32:
            assert did["dtype"] == torch.bfloat16, where
        # the step GEMM thresholds the kernel held for the call
        if "step_gemm" in did and said.call.rec_blocks:
            assert did["step_gemm"] == plan.step_gemm, where


def _forward(model, x, grad, **kw):
    with torch.set_grad_enabled(grad):
        out, (h, c) = model(x, **kw)
        if grad:
            (out.float().sum() if not isinstance(out, torch.nn.utils.rnn.PackedSequence)
             else out.data.float().sum()).backward()


def _check(model, x, grad, monkeypatch, **kw):
    with torch.set_grad_enabled(grad):
        said = explain(model, x, **kw)
    observed = Observed(monkeypatch)
    _forward(model, x, grad, **kw)
    _assert_truth(said, observed)
    monkeypatch.undo()
    return said


@pytest.fixture
def small_streams(monkeypatch):
    """Stream every no-gradient CPU call whose projections reach 1 KiB, 3 KiB a chunk."""
    monkeypatch.setattr(run_plan, "POLICY", dataclasses.replace(
        run_plan.POLICY, stream_min_bytes=1024, stream_chunk_bytes=3 * 1024,
        library_step_gemm=((registry.kernel_isa() or "none", -1, 0),)))


CASES = [
    # (id, variant, model kwargs, dtype, grad, packed, settings, autocast)
    ("f32 uni grad", "lstm", {}, torch.float32, True, False, {}, None),
    ("f32 bi no-grad", "ran", dict(bidirectional=True), torch.float32, False, False, {}, None),
    ("f64 bi grad", "lstm_minus_srnn", dict(bidirectional=True), torch.float64, True, False,
     {}, None),
    ("f32 plain schedule", "srnn", dict(bidirectional=True), torch.float32, True, False,
     dict(cpu_schedule="plain"), None),
    ("bf16 grad", "lstm", dict(bidirectional=True), torch.bfloat16, True, False, {}, None),
    ("bf16 no-grad", "identity_ran", {}, torch.bfloat16, False, False,
     dict(cpu_schedule="plain"), None),
    ("bf16 scan", "lstm_minus_srnn_minus_hidden", dict(bidirectional=True), torch.bfloat16,
     True, False, {}, None),
    ("autocast bf16", "ran", dict(bidirectional=True), torch.float32, False, False, {},
     torch.bfloat16),
    ("packed bi grad", "lstm", dict(bidirectional=True), torch.float32, True, True, {}, None),
    ("packed scan", "lstm_minus_srnn_minus_hidden", dict(bidirectional=True), torch.float32,
     True, True, {}, None),
    ("generic setting", "lstm", dict(bidirectional=True), torch.float32, True, True,
     dict(backend="generic"), None),
    ("generic scan", "lstm_minus_srnn_minus_hidden", {}, torch.float32, False, False,
     dict(backend="generic"), None),
    ("proj_size", "lstm", dict(bidirectional=True, proj_size=3), torch.float32, True, True,
     {}, None),
]


@needs_cpu_kernel
@pytest.mark.parametrize("name,variant,kw,dtype,grad,packed,settings,autocast", CASES,
                         ids=[c[0] for c in CASES])
def test_the_runner_that_ran_is_the_plan_explain_printed(name, variant, kw, dtype, grad,
                                                         packed, settings, autocast,
                                                         monkeypatch):
    torch.manual_seed(0)
    model = AblatedRNN(variant, 5, 6, num_layers=2, **kw).to(dtype)
    x = torch.randn(7, 4, 5, dtype=dtype)
    if packed:
        x = torch.nn.utils.rnn.pack_padded_sequence(x, torch.tensor([7, 3, 5, 1]),
                                                    enforce_sorted=False)
    ctx = torch.autocast("cpu", autocast) if autocast else torch.autocast("cpu", enabled=False)
    with ra.options(**settings), ctx:
        said = _check(model, x, grad, monkeypatch)
    assert len(said) == 2
    if dtype is torch.bfloat16 and not settings:
        assert all(p.plan.bf16_on_f32 for p in said)
    if settings.get("backend") == "generic":
        assert all(p.plan.path == "generic" for p in said)


@needs_cpu_kernel
@pytest.mark.parametrize("variant,dtype,bidirectional", [
    ("lstm", torch.float32, True), ("ran", torch.float64, False),
    ("lstm_minus_srnn_minus_hidden", torch.float32, True),
    ("lstm_minus_srnn_minus_hidden", torch.bfloat16, False), ("lstm", torch.bfloat16, True)])
def test_large_no_gradient_calls_stream_as_explained(variant, dtype, bidirectional,
                                                     small_streams, monkeypatch):
    """A no-gradient call above the streaming threshold (lowered here): the step and the scan
    runners stream (bfloat16 too, widened a chunk at a time), with the plan's chunk, and the
    CPU kernel holds the plan's step-GEMM thresholds."""
    torch.manual_seed(1)
    model = AblatedRNN(variant, 5, 6, num_layers=2, bidirectional=bidirectional).to(dtype)
    x = torch.randn(30, 5, 5, dtype=dtype)
    lengths = torch.tensor([30, 12, 29, 3, 17])
    said = _check(model, x, False, monkeypatch, lengths=lengths)
    assert all(p.plan.stream > 0 and p.plan.runner.endswith("_streamed") for p in said), \
        str(said)
    try:
        with torch.no_grad():
            got = model(x, lengths=lengths)
        with torch.no_grad(), ra.options(backend="generic"):
            want = model(x, lengths=lengths)
    finally:
        if registry.cpu_kernel() is not None:
            registry.cpu_kernel().set_library_step_gemm(-1, -1)
    tol = dict(rtol=3e-2, atol=3e-2) if dtype is torch.bfloat16 else {}
    for a, b in zip([got[0], *got[1]], [want[0], *want[1]]):
        torch.testing.assert_close(a.float(), b.float(), **tol)


# --------------------------------------------------------------------------- CUDA, emulated
class _SkipFamily:
    """The emulated device with the launches of one program family doing nothing (a kernel
    that computes a wrong result)."""

    def __init__(self, device, skip):
        self.device, self.skip = device, skip

    def kernel(self, prog, device):
        return self.device.kernel(prog, device)

    def launch(self, k, args, grid, block, smem=0, cooperative=False):
        if k.prog.family != self.skip:
            self.device.launch(k, args, grid, block, smem, cooperative)

    def device_attribute(self, attr, device):
        return self.device.device_attribute(attr, device)


@pytest.fixture
def emulated(monkeypatch, fresh_cuda_selfcheck):
    from _cuda_plans import emulator_or_skip
    emulator = emulator_or_skip()
    from rnn_ablations.kernels.cuda import driver, host
    from rnn_ablations.kernels.cuda import ops as ops_cuda
    from _cuda_plans import cuda_plans_on_cpu
    with emulator.installed() as device:
        driver.set_implementation(_SkipFamily(device, "step_backward"))
        cuda_plans_on_cpu(monkeypatch, ops_cuda.CudaKernel(host), scan=True)
        with ra.options(cuda_graphs=False):
            yield device


@needs_cpu_kernel
def test_cuda_plans_with_a_failed_family_are_what_ran(emulated, monkeypatch):
    """CUDA plans on the emulated device where the step family fails its check (its backward
    launches do nothing) and the scan family passes: explain says the step cell runs on the
    generic path because of that family, and the scan cell on the CUDA scan kernel with its
    family passed; the forwards run exactly that, and the step family's failure is warned once."""
    torch.manual_seed(2)
    lstm = AblatedRNN("lstm", 5, 6, num_layers=2)
    scan_cell = AblatedRNN("lstm_minus_srnn_minus_hidden", 5, 6, num_layers=2,
                           bidirectional=True)
    x = torch.randn(4, 3, 5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        said = _check(lstm, x, True, monkeypatch)
        from _cuda_plans import cuda_plans_on_cpu
        from rnn_ablations.kernels.cuda import host
        from rnn_ablations.kernels.cuda import ops as ops_cuda
        cuda_plans_on_cpu(monkeypatch, ops_cuda.CudaKernel(host), scan=True)
        said_scan = _check(scan_cell, x, True, monkeypatch)
    ours = [str(w.message) for w in caught if "failed their check" in str(w.message)]
    assert len(ours) == 1 and "step_forward[float32]+step_backward[float32]" in ours[0], ours
    for p in said:
        assert (p.plan.path, p.plan.runner) == ("generic", "generic"), str(p)
        assert "failed their check" in p.plan.reason and "step_backward" in p.plan.reason
        assert "first-use check: failed" in str(p)
    for p in said_scan:
        assert (p.plan.path, p.plan.runner, p.plan.check) == ("cuda", "fused_scan", "passed")
        assert p.plan.cuda_checked and p.plan.cuda_checked[0].startswith("scan_forward[float32")
        assert "first-use check: passed" in str(p)


# --------------------------------------------------------------------------- the command
def test_explain_command_prints_the_plan_of_each_layer(capsys):
    from rnn_ablations.cli import main
    assert main(["explain", "--variant", "ran", "--input-size", "8", "--hidden-size", "6",
                 "--layers", "2", "--bidirectional", "--steps", "5", "--batch", "3",
                 "--no-grad"]) == 0
    out = capsys.readouterr().out
    assert out.count("layer call") == 2 and "ran, 2 directions, T=5 B=3 d_in=8 H=6" in out
    model = AblatedRNN("ran", 8, 6, num_layers=2, bidirectional=True).eval()
    with torch.no_grad():
        want = str(explain(model, torch.zeros(5, 3, 8)))
    assert out.strip() == want.strip()


def test_explain_refuses_what_is_not_a_module():
    with pytest.raises(TypeError, match="explain takes a module"):
        explain(lambda x: x, torch.zeros(1))


def test_only_the_plan_reads_the_policy():
    """How a layer call runs is decided in rnn_ablations/plan.py alone: no other module of the
    package reads ``POLICY`` (explain and the runners read the plan's fields)."""
    import pathlib
    import re
    root = pathlib.Path(ra.__file__).parent
    readers = sorted(str(p.relative_to(root)) for p in root.rglob("*.py")
                     if p.name != "plan.py" and re.search(r"\bPOLICY\b", p.read_text()))
    assert readers == [], readers
