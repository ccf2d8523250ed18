"""CUDA-graph replay of the CUDA kernel's step loop (rnn_ablations/kernels/cuda/graphs.py): its
bookkeeping (keys, static buffers, copy-in, replay, copy-out, failures, the kernels' tags) on the
CPU with stand-ins for torch.cuda's graphs; on a GPU, replay against eager launches, the bounded
cache, a caller's own capture of a training step."""
import contextlib
import copy

import pytest
import torch

import rnn_ablations as ra
from _cuda_cases import (_repeat_calls, fresh_graphs, needs_cuda_kernel, no_tf32,  # noqa: F401
                         requires_cuda)
from rnn_ablations import AblatedRNN
from rnn_ablations.kernels.cuda import graphs as cuda_graphs


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


def test_graph_keys_separate_kernels(monkeypatch):
    """Two GraphedKernels with the same entry points (step and persistent) never replay each
    other's graphs: the tag is part of the key."""
    _FakeGraphs.install(monkeypatch)
    cuda_graphs.clear_graphs()

    class Other(_FakeGraphs.Ext):
        def plain_forward(self, spec, highway, proj, w_hh, h0, c0, batch_sizes, mask, train):
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
