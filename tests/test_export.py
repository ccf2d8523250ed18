"""AblatedRNN under PyTorch's graph tools: ``torch.compile(fullgraph=True)`` (forward and
backward, ``aot_eager`` and the default backend), ``torch.export.export``, ``torch.jit.trace``
and ONNX export (through the generic path) give the eager numbers."""
import numpy as np
import pytest
import torch

from rnn_ablations import AblatedRNN, VARIANTS, kernel_available

pytestmark = pytest.mark.skipif(not kernel_available(), reason="the CPU kernel is not built")


@pytest.fixture
def threads(request):
    old = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(old)


def _model(variant, bidirectional, layers):
    torch.manual_seed(0)
    return AblatedRNN(variant, 5, 4, num_layers=layers, bidirectional=bidirectional)


def _loss_and_grads(fn, rnn, x):
    x.grad = None
    rnn.zero_grad(set_to_none=True)
    out, (h_n, c_n) = fn(x)
    (out.square().sum() + h_n.sum() + c_n.square().sum()).backward()
    return [out.detach(), h_n.detach(), c_n.detach(), x.grad] + [p.grad for p in rnn.parameters()]


def _assert_same(got, want):
    for g, w in zip(got, want):
        assert (g is None) == (w is None)
        if g is not None:
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("threads", [1, 2], indirect=True)
@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("variant", VARIANTS)
def test_compile_fullgraph_aot_eager(variant, bidirectional, layers, threads):
    torch._dynamo.reset()
    rnn = _model(variant, bidirectional, layers)
    x = torch.randn(6, 3, 5, requires_grad=True)
    compiled = torch.compile(rnn, fullgraph=True, backend="aot_eager")
    _assert_same(_loss_and_grads(compiled, rnn, x), _loss_and_grads(rnn, rnn, x))


@pytest.mark.parametrize("variant", VARIANTS)
def test_compile_fullgraph_default_backend(variant):
    """Inductor compiles the graph around the operators (one shape per variant: each compile
    takes seconds)."""
    torch._dynamo.reset()
    rnn = _model(variant, True, 2)
    x = torch.randn(6, 3, 5, requires_grad=True)
    compiled = torch.compile(rnn, fullgraph=True)
    _assert_same(_loss_and_grads(compiled, rnn, x), _loss_and_grads(rnn, rnn, x))


def test_compiled_graph_holds_the_kernel_operators():
    """The compiled graph calls the kernels (not the generic loop): their operators are in it
    (inference, where no autograd Function wraps them)."""
    torch._dynamo.reset()
    rnn = _model("ran", True, 1)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm

    with torch.no_grad():
        torch.compile(rnn, fullgraph=True, backend=backend)(torch.randn(6, 3, 5))
    targets = {str(n.target) for gm in graphs for n in gm.graph.nodes}
    assert any("rnn_ablations" in t for t in targets), targets


@pytest.mark.parametrize("threads", [1, 2], indirect=True)
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("variant", VARIANTS)
def test_export(variant, bidirectional, threads):
    rnn = _model(variant, bidirectional, 2).eval()
    x = torch.randn(6, 3, 5)
    program = torch.export.export(rnn, (x,))
    ops = {str(n.target) for n in program.graph.nodes}
    assert any(t.startswith("rnn_ablations.") for t in ops), ops
    with torch.no_grad():
        want = rnn(x)
    got = program.module()(x)
    _assert_same([got[0], *got[1]], [want[0], *want[1]])


@pytest.mark.parametrize("variant", VARIANTS)
def test_jit_trace(variant):
    rnn = _model(variant, True, 2).eval()
    x = torch.randn(6, 3, 5)
    traced = torch.jit.trace(rnn, (x,))
    with torch.no_grad():
        want = rnn(x)
    got = traced(x)
    _assert_same([got[0], *got[1]], [want[0], *want[1]])


class _Encoder(torch.nn.Module):
    """What one exports to ONNX: a module whose forward takes tensors only."""

    def __init__(self, variant):
        super().__init__()
        self.rnn = _model(variant, True, 2)

    def forward(self, x):
        out, (h_n, c_n) = self.rnn(x)
        return out, h_n, c_n


@pytest.mark.parametrize("variant", VARIANTS)
def test_onnx_through_the_generic_path(variant, tmp_path):
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed "
                              "(requirements/core.txt installs it)")
    model = _Encoder(variant).eval()
    x = torch.randn(6, 3, 5)
    path = tmp_path / "encoder.onnx"
    torch.onnx.export(model, (x,), str(path), dynamo=False)
    import onnx
    graph_ops = {n.op_type for n in onnx.load(str(path)).graph.node}
    assert not any("rnn_ablations" in op for op in graph_ops)
    runner = ort.InferenceSession(str(path))
    got = runner.run(None, {runner.get_inputs()[0].name: x.numpy()})
    with torch.no_grad():
        want = model(x)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w.numpy(), rtol=1e-5, atol=1e-5)
