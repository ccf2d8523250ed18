"""CUDA: the CUDA kernels and the generic path against the CPU, against each other,
and against nn.LSTM / nn.RNN (cuDNN); gradcheck on the GPU.

Half precision (bfloat16, float16, torch.autocast) and CUDA-graph replay of the kernel's step
loop (rnn_ablations/kernels/cuda/graphs.py) are tested here too: the half kernel against the float64
generic path, graphs on against graphs off, a caller's own capture of a training step.
The CUDA kernels are NVRTC's (rnn_ablations/kernels/cuda: compiled at first use, no build
step), so on a GPU nothing here skips for a missing kernel.  The persistent kernels
(csrc/cuda/persistent_kernel.cuh, run by rnn_ablations/kernels/cuda/recurrence.py where
the cuda_recurrence setting asks for them, off by default) are tested at the end
(`-k persistent`): every step-kernel variant against the float64 generic path in float32/
bfloat16/float16, forced grids and batch tiles, the saved tensors and the backward against the
step kernel's, sequences longer than one launch, graph replay, autocast.

These tests skip on machines without a GPU (CI has none), except the switch tests at the top;
they were run on a lent GPU machine with `bash benchmarks/gpu_check.sh` (see the README's speed
section), once with graphs on (the default) and once with RNN_ABLATIONS_CUDA_GRAPHS=0.  Matrix
products on CUDA run without TF32 here so that float32 comparisons are meaningful.
"""
import contextlib
import copy

import pytest
import torch
from torch.library import opcheck
from torch.utils._python_dispatch import TorchDispatchMode

import rnn_ablations as ra
from rnn_ablations import AblatedRNN, VARIANTS, get_variant, use_backend, weighted_sum
from rnn_ablations import dispatch
from rnn_ablations.kernels import registry
from rnn_ablations.kernels.cuda import graphs as cuda_graphs
from rnn_ablations.dispatch import cuda_kernel_available, run_layer

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def test_graph_switch_validates_and_restores():
    old = ra.get_cuda_graphs()
    with pytest.raises(TypeError, match="True or False"):
        ra.set_cuda_graphs("yes")
    with ra.use_cuda_graphs(not old):
        assert ra.get_cuda_graphs() is (not old)
    assert ra.get_cuda_graphs() is old


def test_graph_env_flag():
    from rnn_ablations.settings import from_environment
    for value, want in (("0", False), ("off", False), ("1", True), ("on", True), ("", True)):
        assert from_environment({"RNN_ABLATIONS_CUDA_GRAPHS": value}).cuda_graphs is want
    with pytest.raises(ValueError, match="RNN_ABLATIONS_CUDA_GRAPHS must be 0 or 1"):
        from_environment({"RNN_ABLATIONS_CUDA_GRAPHS": "maybe"})


class _FakeGraphs:
    """Stand-ins for torch.cuda's graph and stream objects, so that the bookkeeping of
    rnn_ablations.kernels.cuda.graphs (keys, static buffers, copy-in, replay, copy-out, failures) runs
    on the CPU: a fake "kernel" registers, while a fake graph captures, a closure that recomputes
    its outputs in place from its inputs; replay runs the closures."""

    capturing = None

    class Graph:
        def __init__(self):
            self.ops = []

        def capture_begin(self, capture_error_mode="global"):
            _FakeGraphs.capturing = self

        def capture_end(self):
            _FakeGraphs.capturing = None

        def replay(self):
            for op in self.ops:
                op()

    class Stream:
        def wait_stream(self, other):
            pass

    @classmethod
    def install(cls, monkeypatch):
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: cls.Stream())
        monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: cls.Stream())
        monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
        monkeypatch.setattr(torch.cuda, "CUDAGraph", cls.Graph)
        monkeypatch.setattr(torch.Tensor, "record_stream", lambda self, s: None)
        monkeypatch.setattr(cuda_graphs, "_side_streams", {})

    @classmethod
    def op(cls, outs, compute):
        compute()
        if cls.capturing is not None:
            cls.capturing.ops.append(compute)
        return outs

    class Ext:
        def plain_forward(self, spec, highway, proj, w_hh, h0, c0, batch_sizes, mask, keep_hin):
            outs = [torch.empty_like(proj) for _ in range(6)]

            def compute():
                for i, o in enumerate(outs):
                    o.copy_(proj * (i + 1) + w_hh.sum() + h0.sum() - c0.sum() + spec)
            return _FakeGraphs.op(outs, compute)

        def plain_backward(self, spec, highway, *tensors):
            g_out, gates, proj, w_hh = tensors[0], tensors[3], tensors[7], tensors[8]
            outs = [torch.empty_like(g_out) for _ in range(4)]

            def compute():
                for i, o in enumerate(outs):
                    o.copy_(g_out * (i + 1) + gates.sum() + proj.sum() - w_hh.sum())
            return _FakeGraphs.op(outs, compute)


def test_graph_bookkeeping_with_fake_graphs(monkeypatch):
    """Replays compute on each call's own inputs and return fresh tensors; a shape is recorded
    on its second call; batch_sizes is part of the key; a failed capture runs eagerly after."""
    _FakeGraphs.install(monkeypatch)
    cuda_graphs.clear_graphs()
    ext = _FakeGraphs.Ext()
    gk = cuda_graphs.GraphedKernel(ext)
    bs = torch.tensor([3, 3, 2])
    empty = torch.empty(0)
    with ra.use_cuda_graphs(True):
        for keep_hin in (True, False):
            for _ in range(4):
                args = [torch.randn(3, 3, 4), torch.randn(4, 4), torch.randn(3, 4), torch.randn(3, 4)]
                got = gk.plain_forward(1, False, *args, bs, empty, keep_hin)
                want = ext.plain_forward(1, False, *args, bs, empty, keep_hin)
                n = 6 if keep_hin else 3
                assert len(got) == 6
                for a, b in zip(got[:n], want[:n]):
                    assert torch.equal(a, b)
                entry = next(reversed(cuda_graphs._graphs.values()), None)
                if entry is not None:  # fresh tensors, not the static outputs
                    assert all(a.data_ptr() != s.data_ptr() for a, s in zip(got[:n], entry.static_out))
        stats = cuda_graphs.graph_stats()
        assert (stats["captures"], stats["replays"], stats["eager"]) == (2, 6, 2), stats
        for _ in range(3):
            ts = [torch.randn(3, 3, 4) for _ in range(12)]
            got = gk.plain_backward(1, False, *ts[:11], bs, ts[11])
            for a, b in zip(got, ext.plain_backward(1, False, *ts[:11], bs, ts[11])):
                assert torch.equal(a, b)
        assert cuda_graphs.graph_stats()["captures"] == 3
        gk.plain_forward(1, False, *args, torch.tensor([3, 2, 1]), empty, True)  # a new key
        assert cuda_graphs.graph_stats()["eager"] == 4

        class Failing(_FakeGraphs.Graph):
            def capture_end(self):
                _FakeGraphs.capturing = None
                raise RuntimeError("operation not permitted when stream is capturing")

        monkeypatch.setattr(torch.cuda, "CUDAGraph", Failing)
        with pytest.warns(UserWarning, match="CUDA graph capture failed"):
            for _ in range(3):
                got = gk.plain_forward(2, True, *args, bs, empty, True)
                for a, b in zip(got, ext.plain_forward(2, True, *args, bs, empty, True)):
                    assert torch.equal(a, b)
        stats = cuda_graphs.graph_stats()
        assert stats["failed"] == 1 and stats["eager"] == 7, stats
    cuda_graphs.clear_graphs()


def test_kernel_backend_names_the_cuda_half_dtypes():
    if not (registry.kernel_available() or cuda_kernel_available()):
        pytest.skip("no compiled kernel")
    x, w = torch.zeros(3, 2, 4, dtype=torch.bfloat16), torch.zeros(8, 4, dtype=torch.bfloat16)
    with use_backend("kernel"), pytest.raises(RuntimeError, match="bfloat16/float16"):
        dispatch.layer_plan([x], [(w, w[:, :2], None)])
MEMORY_VARIANTS = [v for v in VARIANTS if get_variant(v).has_memory]
#: the variants the step kernels (run_layer) run; lstm_minus_srnn_minus_hidden runs through the
#: element-wise scan instead (its half-precision test is in tests/kernels/test_minus_hidden.py)
STEP_VARIANTS = [v for v in VARIANTS if get_variant(v).reads_hidden]
#: the CUDA kernels are compiled at first use by NVRTC: where there is a GPU they are in use
#: (test_cuda_kernels_are_in_use fails otherwise); nothing is skipped for a missing build
needs_cuda_kernel = requires_cuda


@requires_cuda
def test_cuda_kernels_are_in_use():
    """On a GPU the package's CUDA kernels run (NVRTC, no build step): no reason to refuse."""
    from rnn_ablations.kernels.cuda import unavailable_reason
    assert unavailable_reason() is None, unavailable_reason()
    assert cuda_kernel_available(), registry._CUDA_KERNEL_ERROR


@requires_cuda
def test_nvrtc_kernels_compile_for_this_gpu_and_come_from_the_cache(tmp_path, monkeypatch):
    """A program compiles to CUBIN for the local GPU, loads, and a second process-level lookup
    reads it from the disk cache; the driver's attributes the persistent plan reads exist."""
    from rnn_ablations.kernels.cuda import cache, driver, programs
    monkeypatch.setenv("RNN_ABLATIONS_CACHE", str(tmp_path))
    major, minor = torch.cuda.get_device_capability()
    prog = programs.Program("step_forward", "float32")
    b, source = cache.lookup(prog, major * 10 + minor, quiet=True, force=True)
    assert source == "compiled" and b.kind in ("cubin", "ptx")
    cache._memory.clear()
    assert cache.lookup(prog, major * 10 + minor, quiet=True)[1] == "disk"
    k = driver.Kernel(prog, torch.cuda.current_device())
    assert k.function.value
    assert driver.device_attribute(driver.ATTR_MULTIPROCESSOR_COUNT, 0) > 0


@pytest.fixture(autouse=True)
def _no_tf32():
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def _run_and_grads(m, x, **kw):
    out, (h, c) = m(x, **kw)
    (out.square().sum() + h.sum() + 2 * c.sum()).backward()
    grads = [x.grad.detach().cpu()] + [p.grad.detach().cpu() for p in m.parameters()]
    return [out.detach().cpu(), h.detach().cpu(), c.detach().cpu()] + grads


@requires_cuda
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("highway", [False, True])
def test_cuda_equals_cpu(variant, highway):
    cpu = AblatedRNN(variant, 5, 7, num_layers=2, bidirectional=True, highway=highway,
                     batch_first=True)
    gpu = AblatedRNN(variant, 5, 7, num_layers=2, bidirectional=True, highway=highway,
                     batch_first=True).cuda()
    gpu.load_state_dict(cpu.state_dict())
    x = torch.randn(4, 9, 5)
    lengths = torch.tensor([9, 4, 6, 1])
    want = _run_and_grads(cpu, x.clone().requires_grad_(), lengths=lengths)
    got = _run_and_grads(gpu, x.cuda().requires_grad_(), lengths=lengths.cuda())
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=2e-5, rtol=1e-4)


@requires_cuda
@pytest.mark.parametrize("bidirectional", [False, True])
def test_cuda_lstm_matches_cudnn(bidirectional):
    ref = torch.nn.LSTM(6, 8, num_layers=2, bidirectional=bidirectional).cuda()
    ours = AblatedRNN("lstm", 6, 8, num_layers=2, bidirectional=bidirectional).cuda()
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(11, 3, 6, device="cuda")
    out, (h, c) = ours(x)
    want, (wh, wc) = ref(x)
    for g, w in ((out, want), (h, wh), (c, wc)):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


@requires_cuda
def test_cuda_srnn_matches_torch_rnn():
    ref = torch.nn.RNN(6, 8, num_layers=2, nonlinearity="tanh").cuda()
    ours = AblatedRNN("srnn", 6, 8, num_layers=2).cuda()
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(7, 3, 6, device="cuda")
    out, (h, _) = ours(x)
    want, wh = ref(x)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(h, wh, atol=1e-5, rtol=1e-5)


@requires_cuda
@needs_cuda_kernel
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("highway,recurrent_dropout", [(False, 0.0), (True, 0.3)])
def test_cuda_kernel_equals_cuda_generic(variant, highway, recurrent_dropout):
    m = AblatedRNN(variant, 5, 6, num_layers=2, bidirectional=True, highway=highway,
                   recurrent_dropout=recurrent_dropout, dropout=0.2).cuda()
    x = torch.randn(7, 4, 5, device="cuda")
    lengths = torch.tensor([7, 3, 5, 1])
    results = []
    for backend in ("kernel", "generic"):
        torch.manual_seed(1)  # same dropout masks
        with use_backend(backend):
            results.append(_run_and_grads(m, x.clone().requires_grad_(), lengths=lengths))
        m.zero_grad()
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


@requires_cuda
@pytest.mark.parametrize("backend", ["auto", "generic"])
@pytest.mark.parametrize("variant,highway", [(v, False) for v in VARIANTS] + [("ran", True),
                                                                           ("srnn", True)])
def test_cuda_gradcheck(backend, variant, highway):
    m = AblatedRNN(variant, 2, 3, bidirectional=True, highway=highway).double().cuda()
    x = torch.randn(4, 3, 2, dtype=torch.double, device="cuda", requires_grad=True)
    h0 = torch.randn(2, 3, 3, dtype=torch.double, device="cuda", requires_grad=True)
    c0 = torch.randn(2, 3, 3, dtype=torch.double, device="cuda", requires_grad=True)
    lengths = torch.tensor([4, 2, 3])

    def f(x, h0, c0):
        out, (h, c) = m(x, (h0, c0), lengths=lengths)
        return out, h, c

    with use_backend(backend):
        assert torch.autograd.gradcheck(f, (x, h0, c0))


@requires_cuda
@pytest.mark.parametrize("variant", MEMORY_VARIANTS)
def test_cuda_weighted_sum_identity(variant):
    m = AblatedRNN(variant, 4, 5, bidirectional=True, batch_first=True).cuda()
    x = torch.randn(3, 6, 4, device="cuda")
    ws = weighted_sum(m, x, direction=1, lengths=torch.tensor([6, 3, 5]))
    recon = (ws.weights * ws.content.unsqueeze(1)).sum(dim=2)
    torch.testing.assert_close(recon, ws.memory, atol=1e-5, rtol=1e-5)


@requires_cuda
def test_cuda_rejects_state_on_another_device():
    m = AblatedRNN("ran", 4, 5).cuda()
    x = torch.randn(3, 2, 4, device="cuda")
    h0 = torch.zeros(1, 2, 5)
    with pytest.raises(ValueError, match="device"):
        m(x, (h0, h0))


# --------------------------------------------------------------------------- half precision
#: relative tolerances (norm of the error / norm of the float64 result) per storage dtype:
#: bfloat16 keeps 8 significant bits (2^-9 = 2e-3 relative rounding), float16 11 (2^-12)
# bfloat16 keeps 8 bits of mantissa: the H200 run gave dx 3.5e-2 (T = 16 steps of backward)
HALF_TOL = {torch.bfloat16: 5e-2, torch.float16: 6e-3}
HALF_DTYPES = [torch.bfloat16, torch.float16]


def _rel_err(got, want) -> float:
    """None (no gradient reached the input) counts as zeros."""
    if got is None and want is None:
        return 0.0
    got = torch.zeros_like(want) if got is None else got
    want = torch.zeros_like(got) if want is None else want
    got, want = got.double().cpu(), want.double().cpu()
    return float((got - want).norm() / want.norm().clamp_min(1e-12))


def _layer_tensors(variant, highway, dtype, T=13, B=6, D=16, H=24, seed=0):
    """Random arguments of run_layer in ``dtype`` on CUDA (values first rounded to ``dtype``, so
    that the float64 copies hold the same numbers)."""
    v = get_variant(variant)
    R, X = v.num_recurrent(highway), v.num_input_only(highway)
    g = torch.Generator().manual_seed(seed)
    scale = H ** -0.5

    def rnd(*shape, s=1.0):
        return (torch.randn(*shape, generator=g) * s).to(dtype).cuda()

    keep = 0.5  # mask values 0 and 2: exact in every dtype
    mask = (torch.rand(B, H, generator=g) < keep).to(dtype).cuda() / keep
    return v, dict(x=rnd(T, B, D), w_ih=rnd((R + X) * H, D, s=scale), bias=rnd(R * H, s=0.1),
                   w_hh=rnd(R * H, H, s=scale), h0=rnd(B, H, s=0.5), c0=rnd(B, H, s=0.5),
                   mask=mask)


def _layer_run(v, highway, t, batch_sizes, use_mask):
    """run_layer's outputs and the gradients of a fixed loss w.r.t. every input."""
    leaves = {k: t[k].clone().requires_grad_() for k in ("x", "w_ih", "bias", "w_hh", "h0", "c0")}
    out, h_n, c_n = run_layer(v, highway, leaves["x"], leaves["w_ih"], leaves["bias"],
                              leaves["w_hh"], leaves["h0"], leaves["c0"], batch_sizes,
                              t["mask"] if use_mask else None)
    w = torch.linspace(-1, 1, out.shape[-1], device=out.device, dtype=torch.float64)
    loss = (out.double() * w).square().sum() + (h_n.double() * w).sum() + 2 * (c_n.double() * w).sum()
    loss.backward()
    return [out, h_n, c_n] + [leaves[k].grad for k in ("x", "w_ih", "bias", "w_hh", "h0", "c0")]


def _check_against_float64_generic(v, highway, t, batch_sizes, use_mask, got, dtype, tol):
    """``got`` (a :func:`_layer_run` result in ``dtype``) against the generic path on the same
    tensors in float64: every output and gradient in ``dtype``, relative error below ``tol``."""
    t64 = {k: a.double() for k, a in t.items()}
    with use_backend("generic"):
        want = _layer_run(v, highway, t64, batch_sizes, use_mask)
    names = ["out", "h_n", "c_n", "dx", "dw_ih", "dbias", "dw_hh", "dh0", "dc0"]
    for name, a, b in zip(names, got, want):
        assert a is None or a.dtype == dtype, f"{name} came back in {a.dtype}, not {dtype}"
        err = _rel_err(a, b)
        assert err < tol, f"{name}: relative error {err:.2e} >= {tol:.1e}"


@requires_cuda
@needs_cuda_kernel
@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=str)
@pytest.mark.parametrize("variant", STEP_VARIANTS)
@pytest.mark.parametrize("highway,use_mask,padded", [(False, False, False), (True, True, True),
                                                     (False, True, True)])
def test_half_kernel_matches_float64_generic(dtype, variant, highway, use_mask, padded):
    v, t = _layer_tensors(variant, highway, dtype)
    T, B = t["x"].shape[:2]
    if padded:
        batch_sizes = torch.tensor([6, 6, 5, 5, 5, 4, 4, 3, 3, 2, 2, 2, 1])
    else:
        batch_sizes = torch.full((T,), B, dtype=torch.int64)
    if not v.has_memory:  # the S-RNN has no cell: c0 is h0
        t["c0"] = t["h0"]
    with use_backend("kernel"):
        got = _layer_run(v, highway, t, batch_sizes, use_mask)
    _check_against_float64_generic(v, highway, t, batch_sizes, use_mask, got, dtype,
                                   HALF_TOL[dtype])


@requires_cuda
@needs_cuda_kernel
@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=str)
@pytest.mark.parametrize("variant", ["ran", "lstm"])
def test_half_module_matches_float64(dtype, variant):
    """A whole module cast with .to(dtype): 2 layers, both directions, padding."""
    m = AblatedRNN(variant, 10, 32, num_layers=2, bidirectional=True, batch_first=True).cuda()
    m_half = copy.deepcopy(m).to(dtype)
    m64 = copy.deepcopy(m_half).double()
    x = torch.randn(5, 17, 10, device="cuda").to(dtype)
    lengths = torch.tensor([17, 9, 12, 3, 17])
    with use_backend("kernel"):
        got = _run_and_grads(m_half, x.clone().requires_grad_(), lengths=lengths)
    with use_backend("generic"):
        want = _run_and_grads(m64, x.double().requires_grad_(), lengths=lengths)
    for a, b in zip(got, want):
        assert a.dtype == dtype
        assert _rel_err(a, b) < HALF_TOL[dtype]


@requires_cuda
@needs_cuda_kernel
@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=str)
@pytest.mark.parametrize("variant", ["ran", "lstm_minus_srnn", "lstm", "lstm_minus_srnn_minus_hidden"])
def test_autocast_runs_the_kernel(monkeypatch, dtype, variant):
    """torch.autocast("cuda"): the kernel (the step kernel, or the −HIDDEN variant's scan) runs
    in the autocast dtype (never the Python loop), the results are close to float32, and the
    float32 parameters get float32 gradients; a state carried in the autocast dtype (a language
    model's h_n) is accepted.  (The −HIDDEN scan once refused the float32 states beside the
    autocast projection: "h0 and c0 must be ... of proj's dtype", seen on an H100.)"""
    def no_generic(*args, **kwargs):
        raise AssertionError("the generic Python loop ran under autocast")

    from rnn_ablations import dispatch
    from rnn_ablations.kernels import scan
    monkeypatch.setattr(scan, "generic_directions", no_generic)
    monkeypatch.setattr(dispatch, "generic_directions", no_generic)

    m = AblatedRNN(variant, 12, 32, num_layers=2, recurrent_dropout=0.0).cuda()
    x = torch.randn(9, 4, 12, device="cuda")
    ref = _run_and_grads(m, x.clone().requires_grad_())
    m.zero_grad()
    from rnn_ablations.kernels import autograd as kernel_autograd
    monkeypatch.setattr(kernel_autograd, "generic_from_projection", no_generic)
    xg = x.clone().requires_grad_()
    with torch.autocast("cuda", dtype=dtype):
        out, (h, c) = m(xg)
        assert out.dtype == dtype and h.dtype == dtype and c.dtype == dtype
        out2, _ = m(x, (h.detach(), c.detach()))  # state carried in the autocast dtype
        assert out2.dtype == dtype
    (out.float().square().sum() + h.float().sum() + 2 * c.float().sum()).backward()
    got = [out, h, c, xg.grad] + [p.grad for p in m.parameters()]
    for p in m.parameters():
        assert p.grad.dtype == torch.float32
    for a, b in zip(got, ref):
        assert _rel_err(a, b) < 2 * HALF_TOL[dtype]


# --------------------------------------------------------------------------- CUDA graphs
@pytest.fixture
def fresh_graphs():
    cuda_graphs.clear_graphs()
    yield
    cuda_graphs.clear_graphs()


def _repeat_calls(m, xs, lengths, grad=True):
    results = []
    for x in xs:
        if grad:
            results.append(_run_and_grads(m, x.clone().requires_grad_(), lengths=lengths))
            m.zero_grad(set_to_none=True)
        else:
            with torch.no_grad():
                out, (h, c) = m(x, lengths=lengths)
            results.append([out.cpu(), h.cpu(), c.cpu()])
    return results


@requires_cuda
@needs_cuda_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("grad", [True, False], ids=["train", "inference"])
@pytest.mark.parametrize("variant,highway", [("ran", False), ("lstm", True), ("srnn", False)])
def test_graph_replay_equals_eager(fresh_graphs, dtype, grad, variant, highway):
    """Graph replay gives the eager launches' numbers on new inputs of a recorded shape."""
    m = AblatedRNN(variant, 8, 16, num_layers=2, bidirectional=True, highway=highway,
                   recurrent_dropout=0.25, batch_first=True).cuda().to(dtype)
    xs = [torch.randn(4, 7, 8, device="cuda").to(dtype) for _ in range(4)]
    lengths = torch.tensor([7, 3, 5, 7])
    torch.manual_seed(3)
    with ra.use_cuda_graphs(False):
        want = _repeat_calls(m, xs, lengths, grad)
    cuda_graphs.clear_graphs()
    torch.manual_seed(3)  # the same recurrent-dropout masks
    with ra.use_cuda_graphs(True):
        got = _repeat_calls(m, xs, lengths, grad)
        stats = cuda_graphs.graph_stats()
    assert stats["captures"] > 0 and stats["replays"] >= stats["captures"], stats
    assert stats["failed"] == 0, stats
    # the same kernels run (cuBLAS may pick another algorithm for the capture stream's
    # workspace: last-bit differences, one bfloat16 ulp)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=1e-2, rtol=1e-2)
    for call, (g, w) in enumerate(zip(got, want)):
        for a, b in zip(g, w):
            torch.testing.assert_close(a, b, **tol, msg=lambda s: f"call {call}: {s}")


@requires_cuda
@needs_cuda_kernel
def test_graph_cache_is_bounded(fresh_graphs, monkeypatch):
    m = AblatedRNN("ran", 4, 8).cuda()
    with ra.use_cuda_graphs(True), ra.options(cuda_graphs_max=2):
        for T in (3, 4, 5, 6):
            for _ in range(3):
                with torch.no_grad():
                    m(torch.randn(T, 2, 4, device="cuda"))
        stats = cuda_graphs.graph_stats()
        assert stats["graphs"] <= 2 and stats["evicted"] >= 2, stats
        # the cache thrashes: a new shape is recorded only after CAPTURE_AFTER_THRASH calls
        for call in range(cuda_graphs.CAPTURE_AFTER_THRASH):
            with torch.no_grad():
                m(torch.randn(9, 2, 4, device="cuda"))
            captured = cuda_graphs.graph_stats()["captures"] - stats["captures"]
            assert captured == (1 if call == cuda_graphs.CAPTURE_AFTER_THRASH - 1 else 0)
    # shapes seen once are not recorded
    cuda_graphs.clear_graphs()
    with ra.use_cuda_graphs(True), torch.no_grad():
        for T in range(3, 9):
            m(torch.randn(T, 2, 4, device="cuda"))
    assert cuda_graphs.graph_stats()["captures"] == 0


@requires_cuda
@needs_cuda_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_caller_captures_a_training_step(fresh_graphs, dtype):
    """A caller records forward + backward of a whole step with torch.cuda.graph (as the PTB LM
    does): the kernel launches eagerly into that graph (no host sync, no nested capture), and
    replaying it on new data gives the eager numbers."""
    torch.manual_seed(0)
    m = AblatedRNN("ran", 8, 16, num_layers=2, dropout=0.0).cuda().to(dtype)
    ref = copy.deepcopy(m)
    static_x = torch.randn(10, 4, 8, device="cuda", dtype=dtype, requires_grad=True)
    static_h = torch.randn(2, 4, 16, device="cuda", dtype=dtype)

    def step():
        out, (h, c) = m(static_x, (static_h, static_h))
        loss = out.float().square().sum() + h.float().sum() + c.float().sum()
        loss.backward()
        return out, h

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up (this also records the kernel's own graphs)
        for _ in range(3):
            m.zero_grad(set_to_none=True)
            static_x.grad = None
            step()
    torch.cuda.current_stream().wait_stream(side)
    m.zero_grad(set_to_none=True)
    static_x.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, h = step()
    if ra.get_cuda_graphs():  # the kernel's own graphs saw the caller's capture
        assert cuda_graphs.graph_stats()["nested"] > 0  # (off: RNN_ABLATIONS_CUDA_GRAPHS=0)
    for seed in (1, 2):
        torch.manual_seed(seed)
        new_x = torch.randn(10, 4, 8, device="cuda", dtype=dtype)
        with torch.no_grad():
            static_x.copy_(new_x)
        graph.replay()
        torch.cuda.synchronize()
        x_ref = new_x.clone().requires_grad_()
        ref.zero_grad(set_to_none=True)
        with ra.use_cuda_graphs(False):
            r_out, (r_h, r_c) = ref(x_ref, (static_h, static_h))
            (r_out.float().square().sum() + r_h.float().sum() + r_c.float().sum()).backward()
        tol = dict(atol=1e-5, rtol=1e-4) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(out, r_out, **tol)
        torch.testing.assert_close(h, r_h, **tol)
        torch.testing.assert_close(static_x.grad, x_ref.grad, **tol)
        for p, q in zip(m.parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, **tol)


# --------------------------------------------------------------------------- persistent kernel
# the run plan asks for it (cuda_recurrence="persistent"; off by default) and checks that it fits
# (plan.check_persistent), cuda_recurrence.step_kernel looks it up; csrc/cuda/persistent_kernel.cuh.  The policy tests run on the CPU; the kernel tests need a GPU.
from rnn_ablations.kernels.cuda import recurrence as cuda_recurrence  # noqa: E402
from rnn_ablations import use_cuda_recurrence  # noqa: E402


def test_cuda_recurrence_switch_validates_and_restores():
    old = ra.get_cuda_recurrence()
    for bad in ("fast", "", None, "Persistent"):
        with pytest.raises(ValueError, match="auto, steps, persistent"):
            ra.set_cuda_recurrence(bad)
    assert ra.get_cuda_recurrence() == old
    with use_cuda_recurrence("persistent"):
        assert ra.get_cuda_recurrence() == "persistent"
        with use_cuda_recurrence("steps"):
            assert ra.get_cuda_recurrence() == "steps"
        assert ra.get_cuda_recurrence() == "persistent"
    assert ra.get_cuda_recurrence() == old


def test_cuda_recurrence_env():
    from rnn_ablations.settings import from_environment
    assert from_environment({}).cuda_recurrence == "auto"  # untested code is never the default
    for value, want in (("persistent", "persistent"), (" Steps ", "steps"), ("", "auto")):
        assert from_environment({"RNN_ABLATIONS_CUDA_RECURRENCE": value}).cuda_recurrence == want
    with pytest.raises(ValueError, match="RNN_ABLATIONS_CUDA_RECURRENCE must be one of auto, "
                                         "steps, persistent"):
        from_environment({"RNN_ABLATIONS_CUDA_RECURRENCE": "cooperative"})
    for value, want in (("0", 0), ("12", 12), ("", 0)):
        assert from_environment({"RNN_ABLATIONS_PERSISTENT_BLOCKS": value}).persistent_blocks \
            == want
    for value in ("-1", "many"):
        with pytest.raises(ValueError, match="integer >= 0"):
            from_environment({"RNN_ABLATIONS_PERSISTENT_BLOCKS": value})


class _CudaLike:
    """Stands for a CUDA projection tensor in the selection (which reads only device/dtype)."""
    device = torch.device("cuda")
    dtype = torch.float32
    shape = (3, 2, 16)


class _FakePersistentExt:
    def __init__(self, ok=True, why=""):
        self.ok, self.why, self.calls = ok, why, []

    def persistent_plan(self, spec, highway, proj, w_hh, blocks, batch_tile, backward):
        self.calls.append(("plan", spec, highway, blocks, batch_tile, backward))
        return (self.ok or backward, self.why, 4, 2, 2, 1024)

    def persistent_forward(self, *args):
        self.calls.append(("persistent_forward",) + args)
        return "persistent result"

    def plain_backward(self, *args):
        self.calls.append(("backward",) + args)
        return "step backward"

    def persistent_backward(self, *args):
        self.calls.append(("persistent_backward",) + args)
        return "persistent backward"


def test_cuda_recurrence_selection(monkeypatch):
    """auto and steps keep the step kernel (graphed as the plan says, never inside a compiled
    graph); persistent asks the kernel's plan (in the run plan), runs the persistent forward and
    the step kernel's backward, or says why it cannot and what to do."""
    from rnn_ablations.kernels import registry
    from rnn_ablations.plan import Kernels, LayerCall, check_persistent, plan_layer
    v = get_variant("ran")
    fake = _FakePersistentExt()
    monkeypatch.setattr(registry, "_C_cuda", fake)
    kernels = Kernels(cpu=True, cuda=True, persistent=True)
    call = LayerCall(device="cuda", dtype=torch.float32, steps=3, batch=2, hidden=8,
                     rec_blocks=2, proj_weight=48)

    def select(**settings):
        plan = plan_layer(ra.get_options().replace(**settings), call, kernels)
        check_persistent(plan, fake, v.kernel_spec, True, _CudaLike(), None)
        return cuda_recurrence.step_kernel(plan)

    for mode in ("auto", "steps"):
        assert select(cuda_recurrence=mode, cuda_graphs=False) is fake
        graphed = select(cuda_recurrence=mode, cuda_graphs=True)
        assert isinstance(graphed, cuda_graphs.GraphedKernel) and graphed.ext is fake
    assert fake.calls == []  # auto = steps: the persistent kernel is not even asked
    ext = select(cuda_recurrence="persistent", persistent_blocks=3, cuda_graphs=False)
    assert isinstance(ext, cuda_recurrence.PersistentKernel)
    assert fake.calls[-1] == ("plan", v.kernel_spec, True, 3, 0, False)
    before = cuda_recurrence.persistent_stats()["persistent_forward"]
    assert ext.plain_forward(v.kernel_spec, True, "p", "w", "h", "c", "bs", "m", True) == \
        "persistent result"
    assert fake.calls[-1] == ("persistent_forward", v.kernel_spec, True, "p", "w", "h", "c",
                              "bs", "m", True, 3, 0)
    assert cuda_recurrence.persistent_stats()["persistent_forward"] == before + 1
    grads = tuple(range(15))  # the 15 arguments of plain_backward
    assert ext.plain_backward(*grads) == "step backward"
    ext_b = select(cuda_recurrence="persistent", persistent_blocks=3, persistent_backward=True,
                   cuda_graphs=False)
    assert fake.calls[-1] == ("plan", v.kernel_spec, True, 3, 0, True)
    assert ext_b is not ext and ext_b.plain_backward(*grads) == "persistent backward"
    assert fake.calls[-1] == ("persistent_backward",) + grads + (3, 0)
    assert ext.plain_backward(*grads) == "step backward"  # chosen at the forward, kept
    graphed = select(cuda_recurrence="persistent", persistent_blocks=3, persistent_backward=True,
                     cuda_graphs=True)
    assert isinstance(graphed, cuda_graphs.GraphedKernel)
    assert graphed.tag.startswith("persistent(backward=True, blocks=3")
    fake.ok, fake.why = False, "the W_hh slice does not fit"
    with pytest.raises(ValueError, match="does not fit.*'steps'"):
        select(cuda_recurrence="persistent")
    with pytest.raises(RuntimeError, match="no persistent kernel"):
        plan_layer(ra.get_options().replace(cuda_recurrence="persistent"), call,
                   Kernels(cpu=True, cuda=True, persistent=False))
    for mode in ("steps", "persistent"):  # a compiled graph holds the operators themselves
        plan = plan_layer(ra.get_options().replace(cuda_recurrence=mode, cuda_graphs=True),
                          call._replace(compiling=True), kernels)
        assert plan.runner == "cuda" and not plan.graphs


def test_graph_keys_separate_kernels(monkeypatch):
    """Two GraphedKernels with the same entry points (step and persistent) never replay each
    other's graphs: the tag is part of the key."""
    _FakeGraphs.install(monkeypatch)
    cuda_graphs.clear_graphs()

    class Other(_FakeGraphs.Ext):
        def forward(self, spec, highway, proj, w_hh, h0, c0, batch_sizes, mask, keep_hin):
            outs = [torch.empty_like(proj) for _ in range(6)]

            def compute():
                for o in outs:
                    o.copy_(-proj)
            return _FakeGraphs.op(outs, compute)

    exts = {"steps": _FakeGraphs.Ext(), "persistent": Other()}
    kernels = {tag: cuda_graphs.GraphedKernel(e, tag=tag) for tag, e in exts.items()}
    bs, empty = torch.tensor([2, 2]), torch.empty(0)
    with ra.use_cuda_graphs(True):
        for _ in range(3):
            for tag, gk in kernels.items():
                args = [torch.randn(2, 2, 4), torch.randn(4, 4), torch.randn(2, 4),
                        torch.randn(2, 4)]
                got = gk.plain_forward(1, False, *args, bs, empty, True)
                want = exts[tag].plain_forward(1, False, *args, bs, empty, True)
                for a, b in zip(got, want):
                    assert torch.equal(a, b), tag
        assert cuda_graphs.graph_stats()["captures"] == 2
    cuda_graphs.clear_graphs()


#: float32 against the float64 generic path: relative error of the norms (T = 13 steps)
PERSISTENT_TOL = {torch.float32: 2e-5, **HALF_TOL}
PERSISTENT_DTYPES = [torch.float32] + HALF_DTYPES
#: (blocks, batch tile) forced on the kernel (0 = automatic): with H = 24 and B = 6, 5 blocks
#: of 5 units leave the last block a unit past H, tiles of 4 rows leave a partial tile; one
#: block runs every unit, one row per tile
PERSISTENT_CONFIGS = {"auto": (0, 0), "tiles": (5, 4), "one_block": (1, 1)}


def _persistent(config="auto", graphs=False, backward=False):
    """The persistent forward (and with ``backward`` the persistent backward) forced."""
    blocks, tile = PERSISTENT_CONFIGS[config]
    return ra.options(cuda_recurrence="persistent", cuda_graphs=graphs, persistent_blocks=blocks,
                      persistent_batch_tile=tile, persistent_backward=backward)


def _persistent_ran(fn, backward=False):
    """fn() under the persistent kernel; asserts that its forward (and backward) ran."""
    before = cuda_recurrence.persistent_stats()
    result = fn()
    after = cuda_recurrence.persistent_stats()
    assert after["persistent_forward"] > before["persistent_forward"], \
        "the persistent kernel did not run"
    if backward:
        assert after["persistent_backward"] > before["persistent_backward"], \
            "the persistent backward did not run"
    return result


@requires_cuda
@needs_cuda_kernel
def test_persistent_kernel_is_available():
    assert hasattr(registry.cuda_kernel(), "persistent_forward"), \
        "rnn_ablations._C_cuda has no persistent kernel entry point"


def _persistent_case(variant, highway, dtype, use_mask, padded, config, backward=False):
    v, t = _layer_tensors(variant, highway, dtype)
    T, B = t["x"].shape[:2]
    batch_sizes = (torch.tensor([6, 6, 5, 5, 5, 4, 4, 3, 3, 2, 2, 2, 1]) if padded
                   else torch.full((T,), B, dtype=torch.int64))
    if not v.has_memory:  # the S-RNN has no cell: c0 is h0
        t["c0"] = t["h0"]
    with use_backend("kernel"), _persistent(config, backward=backward):
        got = _persistent_ran(lambda: _layer_run(v, highway, t, batch_sizes, use_mask), backward)
    _check_against_float64_generic(v, highway, t, batch_sizes, use_mask, got, dtype,
                                   PERSISTENT_TOL[dtype])


@requires_cuda
@needs_cuda_kernel
@pytest.mark.parametrize("dtype", PERSISTENT_DTYPES, ids=str)
@pytest.mark.parametrize("variant", STEP_VARIANTS)
@pytest.mark.parametrize("highway,use_mask,padded", [(False, False, False), (True, True, True),
                                                     (False, True, True)])
def test_persistent_matches_float64_generic(dtype, variant, highway, use_mask, padded):
    """Every step-kernel variant of the table: outputs, final states (h0/c0 given) and, through
    the step kernel's backward from the persistent kernel's saved tensors, every gradient."""
    _persistent_case(variant, highway, dtype, use_mask, padded, "auto")


@requires_cuda
@needs_cuda_kernel
@pytest.mark.parametrize("dtype", PERSISTENT_DTYPES, ids=str)
@pytest.mark.parametrize("variant", STEP_VARIANTS)
@pytest.mark.parametrize("highway,use_mask,padded", [(False, False, False), (True, True, True),
                                                     (False, True, True)])
def test_persistent_backward_matches_float64_generic(dtype, variant, highway, use_mask, padded):
    """The persistent backward (the persistent_backward setting) after the persistent forward."""
    _persistent_case(variant, highway, dtype, use_mask, padded, "auto", backward=True)


@requires_cuda
@needs_cuda_kernel
@pytest.mark.parametrize("backward", [False, True], ids=["fwd", "fwd+bwd"])
@pytest.mark.parametrize("config", ["tiles", "one_block"])
@pytest.mark.parametrize("variant", STEP_VARIANTS)
@pytest.mark.parametrize("highway,use_mask,padded", [(False, False, False), (True, True, True)])
def test_persistent_forced_grid_and_tiles(backward, config, variant, highway, use_mask, padded):
    """Partial blocks (units past H), partial batch tiles, one block for all units."""
    _persistent_case(variant, highway, torch.float32, use_mask, padded, config, backward)


@requires_cuda
@needs_cuda_kernel
@pytest.mark.parametrize("variant", STEP_VARIANTS)
@pytest.mark.parametrize("highway", [False, True])
def test_persistent_backward_equals_step_backward(variant, highway):
    """The raw entry points, float32, from the same saved tensors and incoming gradients (padded
    rows, steps without any row, mask, grad_hn, grad_cn): the step kernel's results."""
    ext = registry.cuda_kernel()
    v, t = _layer_tensors(variant, highway, torch.float32)
    pbias = torch.cat([t["bias"], t["bias"].new_zeros(t["w_ih"].shape[0] - t["bias"].shape[0])])
    proj = torch.nn.functional.linear(t["x"], t["w_ih"], pbias).contiguous()
    c0 = t["c0"] if v.has_memory else t["h0"]
    bs = torch.tensor([6, 6, 5, 5, 5, 4, 4, 3, 3, 2, 2, 0, 0])
    out, h_n, c_n, gates, cs, hin = ext.plain_forward(v.kernel_spec, highway, proj.clone(), t["w_hh"],
                                                t["h0"], c0, bs, t["mask"], True)
    g = torch.Generator(device="cuda").manual_seed(5)
    grads = [torch.randn(x.shape, device="cuda", generator=g) for x in (out, h_n, c_n)]
    args = (v.kernel_spec, highway, *grads, gates, cs, hin, out, proj, t["w_hh"], t["h0"], c0,
            bs, t["mask"])
    want = ext.plain_backward(*args)
    for blocks, tile in PERSISTENT_CONFIGS.values():
        got = ext.persistent_backward(*args, blocks, tile)
        for name, a, b in zip(["dproj", "dw_hh", "dh0", "dc0"], got, want):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4, msg=name)


@requires_cuda
@needs_cuda_kernel
@pytest.mark.parametrize("variant", STEP_VARIANTS)
@pytest.mark.parametrize("highway", [False, True])
def test_persistent_saves_what_the_step_kernel_saves(variant, highway):
    """The raw entry points, float32: out, h_n, c_n, cs, hin and the gate activations of the
    active rows as the step kernel's forward returns them (its backward reads them); inference
    (keep_hin=False) returns no gates."""
    ext = registry.cuda_kernel()
    v, t = _layer_tensors(variant, highway, torch.float32)
    proj = torch.nn.functional.linear(t["x"], t["w_ih"], torch.cat(
        [t["bias"], t["bias"].new_zeros(t["w_ih"].shape[0] - t["bias"].shape[0])])).contiguous()
    c0 = t["c0"] if v.has_memory else t["h0"]
    bs = torch.tensor([6, 6, 5, 5, 5, 4, 4, 3, 3, 2, 2, 0, 0])  # the last two steps: no row
    args = (v.kernel_spec, highway, proj, t["w_hh"], t["h0"], c0, bs, t["mask"])
    want = ext.plain_forward(*args, True)
    for blocks, tile in PERSISTENT_CONFIGS.values():
        got = ext.persistent_forward(*args, True, blocks, tile)
        for i, name in enumerate(["out", "h_n", "c_n"]):
            torch.testing.assert_close(got[i], want[i], atol=1e-5, rtol=1e-5, msg=name)
        for step, n in enumerate(bs.tolist()):
            torch.testing.assert_close(got[3][step, :n], want[3][step, :n], atol=1e-5,
                                       rtol=1e-5, msg=f"gates, step {step}")
            torch.testing.assert_close(got[4][step, :n], want[4][step, :n], atol=1e-5,
                                       rtol=1e-5, msg=f"cs, step {step}")
            if highway:
                torch.testing.assert_close(got[5][step, :n], want[5][step, :n], atol=1e-5,
                                           rtol=1e-5, msg=f"hin, step {step}")
        inference = ext.persistent_forward(*args, False, blocks, tile)
        assert inference[3].numel() == 0 and inference[5].numel() == 0
        for a, b in zip(inference[:3], got[:3]):
            torch.testing.assert_close(a, b, atol=0, rtol=0)


@requires_cuda
@needs_cuda_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("variant", ["ran", "lstm", "srnn"])
def test_persistent_module_matches_float64(dtype, variant):
    """A whole module: 2 layers, both directions, highway, padding, given h0/c0, training
    (gradients) and inference."""
    m = AblatedRNN(variant, 10, 32, num_layers=2, bidirectional=True, highway=True,
                   batch_first=True).cuda()
    m_half = copy.deepcopy(m).to(dtype)
    m64 = copy.deepcopy(m_half).double()
    x = torch.randn(5, 17, 10, device="cuda").to(dtype)
    h0 = (0.5 * torch.randn(4, 5, 32, device="cuda")).to(dtype)
    c0 = (0.5 * torch.randn(4, 5, 32, device="cuda")).to(dtype)
    lengths = torch.tensor([17, 9, 12, 3, 17])

    def run(model, x, state):
        out, (h, c) = model(x, state, lengths=lengths)
        (out.double().square().sum() + h.double().sum() + 2 * c.double().sum()).backward()
        return [out, h, c, x.grad] + [p.grad for p in model.parameters()]

    with use_backend("kernel"), _persistent():
        got = _persistent_ran(lambda: run(m_half, x.clone().requires_grad_(), (h0, c0)))
        with torch.no_grad():
            inf_out, (inf_h, inf_c) = m_half(x, (h0, c0), lengths=lengths)
    with use_backend("generic"):
        want = run(m64, x.double().requires_grad_(), (h0.double(), c0.double()))
    tol = PERSISTENT_TOL[dtype]
    for a, b in zip(got, want):
        assert a.dtype == dtype
        assert _rel_err(a, b) < tol
    for a, b in zip((inf_out, inf_h, inf_c), got[:3]):  # the same kernel without saving
        torch.testing.assert_close(a, b)


@requires_cuda
@needs_cuda_kernel
@pytest.mark.parametrize("variant", ["ran", "lstm"])
def test_persistent_long_sequence_spans_launches(variant):
    """More steps than one launch carries (1024): the second launch continues the first (forward
    and backward); a row ends exactly at the first forward launch's last step."""
    m = AblatedRNN(variant, 4, 8).cuda()
    x = torch.randn(1030, 3, 4, device="cuda")
    lengths = torch.tensor([1030, 1024, 3])
    with use_backend("kernel"):
        with use_cuda_recurrence("steps"), ra.use_cuda_graphs(False):
            want = _run_and_grads(m, x.clone().requires_grad_(), lengths=lengths)
        m.zero_grad()
        with _persistent(backward=True):
            got = _persistent_ran(
                lambda: _run_and_grads(m, x.clone().requires_grad_(), lengths=lengths), True)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-3)


@requires_cuda
@needs_cuda_kernel
@pytest.mark.parametrize("backward", [False, True], ids=["fwd", "fwd+bwd"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_persistent_graph_replay(fresh_graphs, dtype, backward):
    """With CUDA graphs on, the persistent forward (a cooperative launch) is captured and
    replayed, giving the eager numbers (training and inference)."""
    m = AblatedRNN("ran", 8, 16, num_layers=2, bidirectional=True, recurrent_dropout=0.25,
                   batch_first=True).cuda().to(dtype)
    xs = [torch.randn(4, 7, 8, device="cuda").to(dtype) for _ in range(4)]
    lengths = torch.tensor([7, 3, 5, 7])
    results = {}
    for graphs in (False, True):
        torch.manual_seed(3)
        with use_backend("kernel"), _persistent(graphs=graphs, backward=backward):
            results[graphs] = (_repeat_calls(m, xs, lengths, True)
                               + _repeat_calls(m, xs, lengths, False))
            stats = cuda_graphs.graph_stats()
    assert stats["captures"] > 0 and stats["replays"] > 0, stats
    assert stats["failed"] == 0, f"capture of the persistent kernel failed: {stats}"
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=1e-2, rtol=1e-2)
    for g, w in zip(results[True], results[False]):
        for a, b in zip(g, w):
            torch.testing.assert_close(a, b, **tol)


@requires_cuda
@needs_cuda_kernel
def test_persistent_under_autocast():
    m = AblatedRNN("ran", 12, 32, num_layers=2).cuda()
    x = torch.randn(9, 4, 12, device="cuda")
    ref = _run_and_grads(m, x.clone().requires_grad_())
    m.zero_grad()
    xg = x.clone().requires_grad_()
    with _persistent(), torch.autocast("cuda", dtype=torch.bfloat16):
        out, (h, c) = _persistent_ran(lambda: m(xg))
    assert out.dtype == torch.bfloat16
    (out.float().square().sum() + h.float().sum() + 2 * c.float().sum()).backward()
    got = [out, h, c, xg.grad] + [p.grad for p in m.parameters()]
    for a, b in zip(got, ref):
        assert _rel_err(a, b) < 2 * HALF_TOL[torch.bfloat16]


@requires_cuda
@needs_cuda_kernel
def test_persistent_forced_where_it_cannot_run():
    """float64, and a W_hh slice too large for one block's shared memory: a clear error that
    names the fix; the step kernel runs the same layer under auto."""
    m = AblatedRNN("lstm", 8, 512).cuda()
    x = torch.randn(3, 2, 8, device="cuda")
    with _persistent(), pytest.raises(ValueError, match="float64.*'steps'"):
        m.double()(x.double())
    m.float()
    with _persistent("one_block"), pytest.raises(ValueError, match="shared memory"):
        m(x)  # all 512 units in one block: 4 MiB of W_hh
    with use_cuda_recurrence("auto"):
        m(x)


@requires_cuda
@needs_cuda_kernel
@pytest.mark.parametrize("dtype", PERSISTENT_DTYPES, ids=str)
@pytest.mark.parametrize("variant,hidden", [("ran", 256), ("ran", 650), ("lstm", 650)])
def test_persistent_applies_to_the_benchmark_shapes(dtype, variant, hidden):
    """The benchmark's shapes (B = 32) fit: every unit in a block, all blocks resident."""
    v = get_variant(variant)
    proj = torch.empty(2, 32, v.num_recurrent(False) * hidden + v.num_input_only(False) * hidden,
                       device="cuda", dtype=dtype)
    w_hh = torch.empty(v.num_recurrent(False) * hidden, hidden, device="cuda", dtype=dtype)
    for backward in (False, True):
        ok, why, blocks, units, tile, smem = registry.cuda_kernel().persistent_plan(
            v.kernel_spec, False, proj, w_hh, 0, 0, backward)
        assert ok, why
        assert blocks * units >= hidden > (blocks - 1) * units
        assert blocks <= torch.cuda.get_device_properties(0).multi_processor_count
        assert 1 <= tile <= 32 and smem > 0


def test_speed_recurrence_choices():
    from rnn_ablations.commands.speed import measure
    with pytest.raises(ValueError, match="recurrence must be one of auto, steps, persistent, both"):
        measure(hidden_sizes=(4,), batch=1, seq_len=2, repeats=1, variants=["ran"],
                recurrence="fast")
    rows = measure(hidden_sizes=(4,), batch=1, seq_len=2, repeats=1, warmup=0, variants=["ran"],
                   recurrence="both")  # on the CPU: no CUDA recurrence, no persistent rows
    assert {r["model"] for r in rows} == {"nn.LSTM", "ran"}
    assert {r["recurrence"] for r in rows} == {"-"}


@requires_cuda
@needs_cuda_kernel
def test_speed_rows_of_the_persistent_kernel():
    from rnn_ablations.commands.speed import measure
    rows = measure(hidden_sizes=(16,), batch=2, seq_len=3, repeats=1, warmup=0,
                   variants=["ran"], device="cuda", recurrence="both", dtype="bfloat16")
    got = {(r["model"], r["mode"]): r for r in rows}
    assert set(got) == {(m, mode) for m in ("nn.LSTM", "ran", "ran [persistent]")
                        for mode in ("train", "inference")}
    assert got[("ran", "train")]["recurrence"] == "steps"
    assert got[("ran [persistent]", "inference")]["recurrence"] == "persistent"
    assert all(r["dtype"] == "bfloat16" for r in rows)
    calls = got[("ran [persistent]", "train")]["cuda_graph_calls"]
    assert calls["replays"] + calls["eager"] >= 2  # the forward and backward of the round


# --------------------------------------------------------------------------- operators
# rnn_ablations/kernels/cuda/ops.py: the CUDA kernels as the CUDA implementations of the operators
# (tests/kernels/test_ops_cuda.py checks the registration and the fake kernels without a GPU).

class _RecordOps(TorchDispatchMode):
    """Keeps every call of an rnn_ablations operator with copies of its arguments."""

    def __init__(self):
        super().__init__()
        self.calls = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace == "rnn_ablations":
            self.calls.setdefault(func, []).append(
                (tuple(a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args),
                 dict(kwargs)))
        return func(*args, **kwargs)


@requires_cuda
@needs_cuda_kernel
@pytest.mark.parametrize("recurrence", ["steps", "persistent"])
def test_cuda_operators_opcheck(recurrence):
    """The layers' CUDA calls go through the operators, and each passes ``opcheck`` (schema,
    fake kernel against the kernel's results, traceability)."""
    rec = _RecordOps()
    for variant in STEP_VARIANTS:
        for bidirectional in (False, True):
            for highway in (False, True):
                torch.manual_seed(0)
                rnn = AblatedRNN(variant, 5, 8, num_layers=2, bidirectional=bidirectional,
                                 highway=highway).cuda()
                x = torch.randn(6, 3, 5, device="cuda", requires_grad=True)
                with ra.options(backend="kernel", cuda_graphs=False,
                                cuda_recurrence=recurrence, persistent_backward=True), rec:
                    out, _ = rnn(x)
                    out.square().sum().backward()
                    with torch.no_grad():
                        rnn(x)
    names = {f._schema.name.split("::")[1] for f in rec.calls}
    want = ({"persistent_forward", "persistent_backward"} if recurrence == "persistent"
            else {"plain_forward", "plain_backward"})
    assert want <= names, names
    for func, calls in rec.calls.items():
        seen = set()
        for args, kwargs in calls:
            key = tuple(a if isinstance(a, (bool, int)) else
                        tuple(a.shape) if isinstance(a, torch.Tensor) else None for a in args)
            if key not in seen:
                seen.add(key)
                opcheck(func, args, kwargs)


@requires_cuda
@needs_cuda_kernel
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("bidirectional", [False, True])
def test_cuda_compile_fullgraph_equals_eager(variant, bidirectional):
    """``torch.compile(fullgraph=True)`` of a CUDA layer holds the kernel operators and gives the
    eager forward and gradients."""
    torch.manual_seed(0)
    rnn = AblatedRNN(variant, 5, 8, num_layers=2, bidirectional=bidirectional).cuda()
    x = torch.randn(7, 3, 5, device="cuda")

    def run(f):
        rnn.zero_grad()
        out, (h, c) = f(x)
        (out.square().sum() + h.sum() + c.sum()).backward()
        return [out.detach(), h.detach(), c.detach()] + [p.grad.clone() for p in rnn.parameters()]

    with ra.options(backend="kernel"):
        want = run(rnn)
        torch._dynamo.reset()
        got = run(torch.compile(rnn, fullgraph=True, backend="aot_eager"))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


@requires_cuda
@needs_cuda_kernel
def test_cuda_export_runs_the_operators():
    torch.manual_seed(0)
    rnn = AblatedRNN("ran", 5, 8, num_layers=2, bidirectional=True).cuda().eval()
    x = torch.randn(7, 3, 5, device="cuda")
    with ra.options(backend="kernel"):
        want = rnn(x)[0]
        exported = torch.export.export(rnn, (x,))
    assert any(str(n.target).startswith("rnn_ablations.") for n in exported.graph.nodes)
    torch.testing.assert_close(exported.module()(x)[0], want, rtol=1e-5, atol=1e-6)
