"""AblatedRNN under PyTorch's graph tools: ``torch.compile(fullgraph=True)`` (forward and
backward, ``aot_eager`` and the default backend), ``torch.export.export``, ``torch.jit.trace``
and ONNX export (through the generic path) give the eager numbers."""
import numpy as np
import pytest
import torch

from conftest import run_python
from rnn_ablations import AblatedRNN, VARIANTS, kernel_available, options

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


@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("variant", VARIANTS)
def test_compile_fullgraph_dynamic_shapes(variant, bidirectional):
    """One compiled model called with several sequence lengths and batch sizes (dynamo then
    traces with symbolic sizes): every call equals eager, and the sizes cost no recompilation
    per length (the plan guards on its thresholds, not on the sizes)."""
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    rnn = _model(variant, bidirectional, 2)
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(rnn, fullgraph=True, backend=counter)
    for T, B in ((7, 3), (9, 3), (11, 4), (13, 2), (6, 5)):
        x = torch.randn(T, B, 5, requires_grad=True)
        _assert_same(_loss_and_grads(compiled, rnn, x), _loss_and_grads(rnn, rnn, x))
    # the first call's static graph, one when the length turns symbolic, one when the batch
    # does; the last two calls reuse the symbolic graph
    assert counter.frame_count <= 3, counter.frame_count


def test_threshold_sizes_give_the_plan_of_the_sizes():
    """The sizes a traced plan sees (plan.threshold_sizes) lead to the same plan as the exact
    sizes, across the policy's thresholds, for every schedule setting."""
    from rnn_ablations import plan
    from rnn_ablations.kernels import registry
    from rnn_ablations.plan import LayerCall, plan_layer
    from rnn_ablations.settings import Options

    kernels = registry.kernels()
    policy = plan.POLICY
    for T in (0, 1, policy.min_steps - 1, policy.min_steps, 3 * policy.min_steps):
        for B in (0, 1, 7, 64, 4096):
            for H, R in ((8, 2), (256, 3), (650, 4)):
                for needs_grad in (False, True):
                    for threads in (1, 2, 4):
                        for directions in (1, 2):
                            steps, batch = plan.threshold_sizes(T, B, R, H, needs_grad)
                            calls = [LayerCall("cpu", torch.float32, s, b, H, R, 8 * R * H,
                                               directions, needs_grad, threads)
                                     for s, b in ((T, B), (steps, batch))]
                            plans = [plan_layer(Options(), c, kernels, policy) for c in calls]
                            assert plans[0] == plans[1], (T, B, H, R, needs_grad, threads)


@pytest.mark.parametrize("variant", ["ran", "lstm", "lstm_minus_srnn_minus_hidden"])
def test_compile_with_a_onednn_sized_weight(variant):
    """An input weight large enough for the oneDNN projection (eager takes it): the compiled
    graph calls it as the operator ``rnn_ablations::onednn_linear`` (inductor's lowering of the
    raw oneDNN op failed in inference; in training the kernel's in-place gate writes into a view
    the projection's autograd Function returned were refused).  Inference with the default
    backend and training with ``aot_eager`` equal eager."""
    from rnn_ablations import plan

    torch.manual_seed(0)
    hidden = 420  # 3 or 4 blocks of 420 x 420: above the plan's onednn_min_weight
    rnn = AblatedRNN(variant, hidden, hidden, num_layers=2, batch_first=True)
    assert rnn.layer_parameters(0, 0)[0].numel() >= plan.POLICY.onednn_min_weight
    x = torch.randn(4, 6, hidden, requires_grad=True)
    with torch.no_grad():
        want = rnn(x)
        torch._dynamo.reset()
        got = torch.compile(rnn, fullgraph=True)(x)
    _assert_same([got[0], *got[1]], [want[0], *want[1]])
    # the plain schedule: the projection of all steps first (the pipelined one projects in C++)
    with options(cpu_schedule="plain"):
        torch._dynamo.reset()
        compiled = torch.compile(rnn, fullgraph=True, backend="aot_eager")
        _assert_same(_loss_and_grads(compiled, rnn, x), _loss_and_grads(rnn, rnn, x))


@pytest.mark.parametrize("threads", [1, 2], indirect=True)
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("variant", VARIANTS)
def test_compile_fullgraph_default_backend(variant, bidirectional, threads):
    """Inductor compiles the graph around the operators, forward and backward.  Two layers: the
    graph of a 2-layer model holds a 1-layer model's (the first layer) and the hand-over between
    layers; aot_eager above runs 1 and 2 layers (an inductor compile costs seconds)."""
    torch._dynamo.reset()
    rnn = _model(variant, bidirectional, 2)
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


def test_jit_script_names_the_alternatives():
    """torch.jit.script of AblatedRNN, alone or inside a model, fails saying what works instead."""
    for model in (_model("ran", False, 1), torch.nn.Sequential(torch.nn.Identity(),
                                                                _model("lstm", True, 1))):
        with pytest.raises(RuntimeError, match=r"torch\.jit\.trace.*torch\.compile"):
            torch.jit.script(model)


class _Encoder(torch.nn.Module):
    """What one exports to ONNX: a module whose forward takes tensors only."""

    def __init__(self, variant):
        super().__init__()
        self.rnn = _model(variant, True, 2)

    def forward(self, x):
        out, (h_n, c_n) = self.rnn(x)
        return out, h_n, c_n


# Both exporters of torch.onnx.export: the TorchScript-based one on every variant; the
# dynamo-based one (its default; several seconds an export) on the identity output and the scan
# here and on the LSTM in a fresh process below.
_ONNX_CASES = ([(v, False) for v in VARIANTS]
               + [(v, True) for v in ("identity_ran", "lstm_minus_srnn_minus_hidden")])


@pytest.mark.parametrize("variant,dynamo", _ONNX_CASES)
def test_onnx_through_the_generic_path(variant, dynamo, tmp_path):
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed "
                              "(requirements/core.txt installs it)")
    if dynamo:
        pytest.importorskip("onnxscript", reason="onnxscript is not installed "
                            "(requirements/core.txt installs it)")
    model = _Encoder(variant).eval()
    x = torch.randn(6, 3, 5)
    path = tmp_path / "encoder.onnx"
    torch.onnx.export(model, (x,), str(path), dynamo=dynamo, verbose=False)
    import onnx
    graph_ops = {n.domain + "::" + n.op_type for n in onnx.load(str(path)).graph.node}
    assert not any("rnn_ablations" in op for op in graph_ops), graph_ops
    runner = ort.InferenceSession(str(path))
    got = runner.run(None, {runner.get_inputs()[0].name: x.numpy()})
    with torch.no_grad():
        want = model(x)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w.numpy(), rtol=1e-5, atol=1e-5)


_FIRST_CALL = """
import sys, numpy as np, onnxruntime, torch
from rnn_ablations import AblatedRNN


class Encoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = AblatedRNN(sys.argv[1], 5, 4, num_layers=2, bidirectional=True)

    def forward(self, x):
        out, (h_n, c_n) = self.rnn(x)
        return out, h_n, c_n


torch.manual_seed(0)
model = Encoder().eval()
x = torch.randn(6, 3, 5)
torch.onnx.export(model, (x,), sys.argv[2], dynamo=True, verbose=False)  # the first layer call
runner = onnxruntime.InferenceSession(sys.argv[2])
got = runner.run(None, {runner.get_inputs()[0].name: x.numpy()})
with torch.no_grad():
    want = model(x)
for g, w in zip(got, want):
    np.testing.assert_allclose(g, w.numpy(), rtol=1e-5, atol=1e-5)
print("ok")
"""


@pytest.mark.parametrize("variant", ["lstm"])
def test_onnx_export_as_the_first_layer_call_of_a_process(variant, tmp_path):
    """The dynamo-based ONNX export before any eager call: what the plan probes once per process
    (oneDNN's linear) runs on real tensors, not on the exporter's fake ones."""
    pytest.importorskip("onnxruntime", reason="onnxruntime is not installed "
                        "(requirements/core.txt installs it)")
    pytest.importorskip("onnxscript", reason="onnxscript is not installed "
                        "(requirements/core.txt installs it)")
    done = run_python(_FIRST_CALL, variant, str(tmp_path / "encoder.onnx"))
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-3000:]


_FIRST_COMPILE = r"""
import sys
import torch
from rnn_ablations import AblatedRNN

torch.manual_seed(0)
rnn = AblatedRNN(sys.argv[1], 5, 4, num_layers=2, bidirectional=True)
x = torch.randn(6, 3, 5)
compiled = torch.compile(rnn, fullgraph=True, backend="aot_eager")
got = compiled(x)  # the first layer call of the process, traced
want = rnn(x)
torch.testing.assert_close(got[0], want[0])
print("ok")
"""


@pytest.mark.parametrize("variant", ["lstm", "ran"])
def test_compile_fullgraph_as_the_first_layer_call_of_a_process(variant):
    """torch.compile(fullgraph=True) before any eager call: what the run layer gives the CPU
    kernel once per process (the step-GEMM thresholds) is not a call traced into the graph."""
    done = run_python(_FIRST_COMPILE, variant)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-3000:]


def test_masked_generic_layer_gives_the_sliced_numbers():
    """Traced, the generic path does not read batch_sizes' values (every step runs on all rows,
    inactive ones selected away); compiled with ragged lengths it gives the eager numbers, which
    slice the active rows."""
    from rnn_ablations.functional import generic_layer
    from rnn_ablations.variants import get_variant

    torch.manual_seed(0)
    T, B, H = 5, 4, 3
    batch_sizes = torch.tensor([4, 3, 3, 1, 1])
    for name in ("lstm", "srnn", "lstm_minus_srnn_minus_hidden"):
        v = get_variant(name)
        rec, inp = v.blocks(False)
        xr = torch.randn(T, B, len(rec) * H)
        xo = torch.randn(T, B, len(inp) * H) if inp else None
        w_hh = torch.randn(len(rec) * H, H) if rec else None
        h0, c0 = torch.randn(B, H), torch.randn(B, H)

        def run(batch_sizes):
            return generic_layer(v, False, xr, xo, w_hh, h0, c0, batch_sizes)[:3]

        torch._dynamo.reset()
        got = torch.compile(run, backend="aot_eager", fullgraph=True)(batch_sizes)
        want = run(batch_sizes.tolist())
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)
        assert float(got[0][3:, 1:].abs().max()) == 0.0  # inactive rows output zeros


@pytest.mark.parametrize("variant,bidirectional",
                         [("lstm", True), ("srnn", True), ("ran", True),
                          ("lstm_minus_srnn_minus_hidden", True), ("lstm", False)])
def test_padded_batches_compile_and_export(variant, bidirectional):
    """Padded batches (lengths or a mask) under torch.compile(fullgraph=True) and torch.export:
    the traced graph reads no length's value (it reorders the batch and runs every step), so
    one graph serves other lengths, with the eager numbers, forward and backward."""
    torch.manual_seed(0)
    rnn = AblatedRNN(variant, 5, 4, num_layers=2, bidirectional=bidirectional, batch_first=True)
    x = torch.randn(3, 6, 5, requires_grad=True)
    lengths = torch.tensor([4, 3, 2])
    torch._dynamo.reset()
    compiled = torch.compile(rnn, fullgraph=True, backend="aot_eager")

    def with_lengths(fn):
        return lambda inp: fn(inp, lengths=lengths)

    _assert_same(_loss_and_grads(with_lengths(compiled), rnn, x),
                 _loss_and_grads(with_lengths(rnn), rnn, x))
    with torch.no_grad():
        program = torch.export.export(rnn, (x.detach(),), {"lengths": lengths})
        for other in (lengths, torch.tensor([5, 1, 3]), torch.tensor([6, 6, 6])):
            want = rnn(x, lengths=other)
            for got in (program.module()(x.detach(), lengths=other), compiled(x, lengths=other)):
                _assert_same([got[0], *got[1]], [want[0], *want[1]])
        mask = torch.arange(6).unsqueeze(0) < torch.tensor([5, 2, 6]).unsqueeze(1)
        got, want = compiled(x, mask=mask), rnn(x, mask=mask)
        _assert_same([got[0], *got[1]], [want[0], *want[1]])


def test_compiled_model_refuses_bad_lengths():
    """Traced, the lengths are checked when the graph runs (the values are unknown when it is
    traced): a length beyond seq_len or of zero fails, as in eager."""
    torch._dynamo.reset()
    compiled = torch.compile(_model("ran", False, 1), fullgraph=True, backend="aot_eager")
    x = torch.randn(6, 3, 5)
    with pytest.raises(RuntimeError, match="exceeds the input's seq_len"):
        compiled(x, lengths=torch.tensor([7, 2, 1]))
    with pytest.raises(RuntimeError, match="at least one token"):
        compiled(x, lengths=torch.tensor([6, 0, 1]))
