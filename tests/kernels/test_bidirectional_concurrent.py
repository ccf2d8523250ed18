"""Both directions of a bidirectional layer at once: the CPU kernel's concurrent
directions path (the runners ``cpu_plain_pair`` / ``cpu_pipelined_pair`` → ``_C.plain_directions_forward`` /
``_C.plain_directions_backward``, one direction per thread) against the float64 generic path and
against the directions run one after the other, with 1 and 2 threads: outputs, final states and
gradients, padded (lengths, mask, PackedSequence) and unpadded, with and without highway, with
``hx``, recurrent dropout, under ``no_grad`` / ``inference_mode`` and ``create_graph``."""
import contextlib
import dataclasses

import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

import rnn_ablations as ra
from rnn_ablations import AblatedRNN, VARIANTS, get_variant, use_backend, use_pipeline
from rnn_ablations.kernels import autograd as kernel_autograd
from rnn_ablations.aliases import use_concurrent_directions

from conftest import requires_kernel, threads

pytestmark = requires_kernel

#: the variants of the table that the step kernels run (a variant whose gates read no h_{t-1}
#: runs the element-wise scan instead: scan.py)
STEP_VARIANTS = [v for v in VARIANTS if get_variant(v).has_step_kernel]
LENGTHS = [7, 4, 2]


def test_every_variant_runs_a_step_kernel_or_the_scan():
    """The tests below take their variants from the table: every variant that reads h_{t-1}
    has a step kernel (and is among them), every other one runs the scan."""
    assert STEP_VARIANTS
    for name in VARIANTS:
        v = get_variant(name)
        assert v.has_step_kernel == v.reads_hidden, name
        assert (name in STEP_VARIANTS) == v.reads_hidden, name


@contextlib.contextmanager
def path(name, n_threads):
    """``generic``; ``concurrent`` / ``concurrent_pipelined`` (the directions entry points,
    forced, from the input projections / from the layer input); ``sequential`` (one direction
    after the other on the plain kernel); ``pipelined`` (the same on the
    pipelined kernel)."""
    backend = "generic" if name == "generic" else "kernel"
    directions = "always" if name.startswith("concurrent") else "never"
    pipeline = "always" if name.endswith("pipelined") else "never"
    with use_backend(backend), use_concurrent_directions(directions), use_pipeline(pipeline), \
            threads(n_threads):
        yield


class CountingKernel:
    """Delegates to the compiled module and counts the directions entry points' calls."""

    def __init__(self, ext):
        self.ext = ext
        self.calls = {"plain_directions_forward": 0, "plain_directions_backward": 0,
                      "pipelined_directions_forward": 0, "pipelined_directions_backward": 0}

    def __getattr__(self, name):
        fn = getattr(self.ext, name)
        if name not in self.calls:
            return fn

        def counted(*args, **kwargs):
            self.calls[name] += 1
            return fn(*args, **kwargs)
        return counted


@pytest.fixture
def counting(cpu_kernel, given_kernels):
    kernel = CountingKernel(cpu_kernel)
    given_kernels(cpu=kernel)
    return kernel


def _model(variant, highway, dtype=torch.float64, layers=2, **kw):
    torch.manual_seed(1)
    return AblatedRNN(variant, 5, 4, num_layers=layers, bidirectional=True, highway=highway,
                      **kw).to(dtype)


def _run(m, name, n_threads, padded, hx=True, dtype=torch.float64):
    """Outputs, final states and the gradients of a fixed loss w.r.t. the input, h_0, c_0 and
    every parameter."""
    g = torch.Generator().manual_seed(2)  # the same values in every dtype
    x = torch.randn(7, 3, 5, generator=g).to(dtype).requires_grad_()
    shape = (m.num_layers * 2, 3, 4)
    h0 = (torch.randn(shape, generator=g) * 0.5).to(dtype).requires_grad_()
    c0 = (torch.randn(shape, generator=g) * 0.5).to(dtype).requires_grad_()
    w = torch.randn(7, 3, 8, generator=g).to(dtype)
    with path(name, n_threads):
        out, (h, c) = m(x, (h0, c0) if hx else None, lengths=LENGTHS if padded else None)
        loss = (out * w).sum() + (h * h).sum() + (c * 1.5).sum()
        wrt = [x, h0, c0, *m.parameters()] if hx else [x, *m.parameters()]
        grads = torch.autograd.grad(loss, wrt, allow_unused=True)  # srnn reads no c_0
    return [out, h, c, *[torch.zeros_like(t) if g is None else g for g, t in zip(grads, wrt)]]


def _assert_all_close(got, want, **tol):
    assert len(got) == len(want)
    for i, (a, b) in enumerate(zip(got, want)):
        torch.testing.assert_close(a, b, msg=lambda m: f"tensor {i}: {m}", **tol)


@pytest.mark.parametrize("padded", [False, True], ids=["full", "padded"])
@pytest.mark.parametrize("highway", [False, True], ids=["plain", "highway"])
@pytest.mark.parametrize("variant", STEP_VARIANTS)
def test_concurrent_directions_match_generic_and_sequential(variant, highway, padded, counting):
    """float64: the concurrent directions (1 and 2 threads) == the generic path == the
    directions one after the other (plain and pipelined kernels), forward and gradients."""
    m = _model(variant, highway)
    want = _run(m, "generic", 1, padded)
    assert set(counting.calls.values()) == {0}
    for n_threads in (1, 2):
        for name in ("concurrent", "concurrent_pipelined"):
            _assert_all_close(_run(m, name, n_threads, padded), want)
    # two layers, forward and backward, per run
    assert set(counting.calls.values()) == {4}
    for name in ("sequential", "pipelined"):
        _assert_all_close(_run(m, name, 2, padded), want)
    assert set(counting.calls.values()) == {4}


@pytest.mark.parametrize("isa", ra.supported_kernel_isas() if ra.kernel_available() else [])
@pytest.mark.parametrize("variant", ["lstm", "ran"])
def test_float32_concurrent_equals_sequential(variant, isa):
    """float32 on every vector path (the packed step GEMM on AVX2): concurrent == sequential
    plain kernel up to float32 rounding, and both close to the float64 generic path."""
    m64 = _model(variant, True, layers=1)
    ref = _run(m64, "generic", 1, True)
    m32 = _model(variant, True, dtype=torch.float32, layers=1)
    with ra.use_kernel_isa(isa):
        seq = _run(m32, "sequential", 2, True, dtype=torch.float32)
        for n_threads in (1, 2):
            for name in ("concurrent", "concurrent_pipelined"):
                con = _run(m32, name, n_threads, True, dtype=torch.float32)
                _assert_all_close(con, seq, rtol=1e-5, atol=1e-5)
    _assert_all_close([t.double() for t in seq], ref, rtol=1e-4, atol=1e-4)


def _forwards(counting):
    return counting.calls["plain_directions_forward"] + counting.calls["pipelined_directions_forward"]


def test_auto_policy(counting, monkeypatch):
    m = _model("ran", False)
    x = torch.randn(6, 3, 5, dtype=torch.float64)
    with use_backend("kernel"):
        with threads(1):
            one, _ = m(x)
        assert _forwards(counting) == 0  # one thread: one direction after the other
        with threads(2):
            two, _ = m(x)
        assert _forwards(counting) == 2  # two layers
        with threads(2), use_concurrent_directions("never"):
            m(x)
        assert _forwards(counting) == 2
    assert counting.calls["pipelined_directions_forward"] == 2  # T = 6, training: pipelined
    torch.testing.assert_close(one, two)
    # more threads: concurrently while a step's GEMM is small (below the split threshold)
    with threads(3), use_backend("kernel"), torch.no_grad():
        m(x)
        assert _forwards(counting) == 4
        monkeypatch.setattr(ra.plan, "POLICY", dataclasses.replace(
            ra.plan.POLICY, max_step_macs_inference=3 * 8 * 4))  # B·RH·H
        m(x)
        assert _forwards(counting) == 4
    # a unidirectional module and the generic backend never take it
    uni = AblatedRNN("ran", 5, 4).double()
    with threads(2):
        uni(x)
        with use_backend("generic"):
            m(x)
    assert _forwards(counting) == 4


@pytest.mark.parametrize("variant", ["lstm", "identity_ran"])
def test_mask_packed_sequence_and_batch_first(variant):
    """The padded forms reach the concurrent path with the same semantics: the reverse
    direction of a padded row starts at its last real token."""
    m = _model(variant, False)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(3, 7, 5, generator=g, dtype=torch.float64)
    mask = torch.arange(7).unsqueeze(0) < torch.tensor(LENGTHS).unsqueeze(1)
    m.batch_first = True
    results = {}
    for name in ("generic", "concurrent", "concurrent_pipelined"):
        with path(name, 2):
            out_m, (h_m, _) = m(x, mask=mask)
            packed = pack_padded_sequence(x, torch.tensor(LENGTHS), batch_first=True)
            out_p, (h_p, _) = m(packed)
        out_p, _ = pad_packed_sequence(out_p, batch_first=True, total_length=7)
        results[name] = [out_m, h_m, out_p, h_p]
    _assert_all_close(results["concurrent"], results["generic"])
    _assert_all_close(results["concurrent_pipelined"], results["generic"])
    out_m = results["concurrent"][0]
    assert torch.equal(out_m[1, 4:], torch.zeros_like(out_m[1, 4:]))  # padding stays zero
    # the reverse direction of row 1 (length 4) is a function of its real tokens only
    x2 = x.clone()
    x2[1, 4:] = 100.0
    with path("concurrent", 2):
        out2, _ = m(x2, mask=mask)
    torch.testing.assert_close(out2[1, :4], out_m[1, :4])


def test_recurrent_dropout_draws_the_same_masks():
    """Training with recurrent dropout: one mask per direction, drawn in the same order, so the
    same seed gives the generic path's numbers."""
    m = _model("lstm_minus_srnn", True, recurrent_dropout=0.4, dropout=0.3)
    m.train()
    results = {}
    for name in ("generic", "concurrent", "concurrent_pipelined", "sequential"):
        torch.manual_seed(5)
        results[name] = _run(m, name, 2, True, hx=False)
    _assert_all_close(results["concurrent"], results["generic"])
    _assert_all_close(results["concurrent_pipelined"], results["generic"])
    _assert_all_close(results["sequential"], results["generic"])


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
@pytest.mark.parametrize("variant", ["srnn", "ran", "lstm"])
def test_inference_saves_nothing(variant, mode, counting, monkeypatch):
    """Under no_grad / inference_mode every kernel path (concurrent directions, sequential plain
    and pipelined, unidirectional) runs without an autograd Function (nothing saved for a
    backward), also for input and parameters that require grad."""
    def no_function(*args, **kwargs):
        raise AssertionError("an autograd Function ran under no_grad / inference_mode")
    monkeypatch.setattr(kernel_autograd._KernelDirections, "apply", no_function)
    monkeypatch.setattr(kernel_autograd._KernelLayer, "apply", no_function)
    monkeypatch.setattr(kernel_autograd._PipelinedLayer, "apply", no_function)
    x = torch.randn(7, 3, 5, dtype=torch.float64, requires_grad=True)
    for bidirectional in (True, False):
        m = _model(variant, True)
        if not bidirectional:
            m = AblatedRNN(variant, 5, 4, num_layers=2, highway=True).double()
        with path("generic", 1), torch.no_grad():
            want = m(x, lengths=LENGTHS)
        for name in ("concurrent", "concurrent_pipelined", "sequential", "pipelined"):
            ctx = torch.no_grad() if mode == "no_grad" else torch.inference_mode()
            with path(name, 2), ctx:
                out, (h, c) = m(x, lengths=LENGTHS)
            assert out.grad_fn is None and not out.requires_grad
            if mode == "inference_mode":
                assert out.is_inference()
            _assert_all_close([out, h, c], [want[0], *want[1]])
    # the bidirectional model, concurrent: two layers, each form once
    assert counting.calls["plain_directions_forward"] == counting.calls["pipelined_directions_forward"] == 2


def test_create_graph_second_derivatives():
    """create_graph=True: the concurrent path's backward recomputes each direction on the
    differentiable generic path, so gradient-of-gradient terms match the generic path's."""
    m = _model("ran", True, layers=1)
    results = {}
    for name in ("generic", "concurrent", "concurrent_pipelined"):
        x = torch.randn(5, 2, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(4),
                        requires_grad=True)
        with path(name, 2):
            out, _ = m(x, lengths=[5, 3])
            gx, = torch.autograd.grad(out.square().sum(), x, create_graph=True)
            second = torch.autograd.grad(gx.square().sum(), [x, m.weight_hh_l0_reverse])
        results[name] = [gx, *second]
    _assert_all_close(results["concurrent"], results["generic"])
    _assert_all_close(results["concurrent_pipelined"], results["generic"])


def test_gradcheck_through_the_concurrent_path():
    m = AblatedRNN("lstm_minus_srnn", 3, 2, bidirectional=True, highway=True).double()
    names = [n for n, _ in m.named_parameters()]
    x = torch.randn(4, 2, 3, dtype=torch.float64, requires_grad=True)
    h0 = torch.randn(2, 2, 2, dtype=torch.float64, requires_grad=True)

    def f(x, h0, *params):
        out, (h, c) = torch.func.functional_call(m, dict(zip(names, params)), (x, (h0, h0)),
                                                 {"lengths": [4, 2]})
        return out, h, c

    params = [p.detach().requires_grad_() for p in m.parameters()]
    for name in ("concurrent", "concurrent_pipelined"):
        with path(name, 2):
            assert torch.autograd.gradcheck(f, (x, h0, *params))


def test_directions_entry_point_checks_its_lists():
    from rnn_ablations import _C
    proj = torch.randn(3, 2, 12, dtype=torch.float64)  # ran: i, f (recurrent), c (input-only)
    w = torch.randn(8, 4, dtype=torch.float64)
    h = torch.zeros(2, 4, dtype=torch.float64)
    bs = torch.tensor([2, 2, 1])
    e = torch.empty(0, dtype=torch.float64)
    spec = get_variant("ran").kernel_spec
    with pytest.raises(RuntimeError, match="w_hh must be a list of one tensor per direction"):
        _C.plain_directions_forward(spec, False, [proj, proj], [w], [h, h], [h, h], bs, [e, e], False)
    with pytest.raises(RuntimeError, match="the directions must have the same shapes"):
        _C.plain_directions_forward(spec, False, [proj, proj[:2]], [w, w], [h, h], [h, h], bs, [e, e],
                              False)
    # an error inside one direction (bad h0) is raised after the parallel region, not lost
    with threads(2), pytest.raises(RuntimeError, match="h0/c0 must be contiguous"):
        _C.plain_directions_forward(spec, False, [proj, proj.clone()], [w, w],
                              [h, torch.zeros(2, 3, dtype=torch.float64)], [h, h], bs, [e, e],
                              False)


def test_concurrent_mode_is_validated():
    with pytest.raises(ValueError, match="unknown concurrent-directions mode 'sometimes'"):
        ra.aliases.set_concurrent_directions("sometimes")
    assert ra.aliases.get_concurrent_directions() == "auto"






def test_cpu_autocast_keeps_the_sequential_way(counting):
    """Under torch.autocast("cpu") the input projections come out in bfloat16, which the step
    kernels do not run: the directions go one after the other through run_layer (same
    numbers)."""
    m = AblatedRNN("ran", 5, 4, bidirectional=True)
    x = torch.randn(6, 2, 5)
    results = []
    for mode in ("auto", "never"):
        with threads(2), use_concurrent_directions(mode), torch.autocast("cpu", torch.bfloat16):
            results.append(m(x)[0])
    assert counting.calls["plain_directions_forward"] == 0
    torch.testing.assert_close(results[0], results[1])


