"""``proj_size`` (nn.LSTM's LSTMP, ``h_t = W_hr (o_t * tanh(c_t))``) under the graph captures
that record the steps: ``torch.jit.trace``, and ONNX export with either exporter run in
onnxruntime, give the eager outputs at every length T = 1..9 (and other batch sizes and
lengths) from one capture: the projected recurrence is the exporters' loop
(``export.run_stack``), not a Python loop unrolled to the example's length."""
import warnings

import pytest
import torch

from rnn_ablations import AblatedRNN
from _onnx import onnx_runner

PROJ_VARIANTS = ["lstm", "lstm_minus_srnn", "lstm_minus_srnn_minus_hidden"]


def _model(variant):
    torch.manual_seed(0)
    return AblatedRNN(variant, 5, 6, num_layers=2, bidirectional=True, proj_size=3).eval()


def _same(got, model, x, **kw):
    out, (h, c) = model(x, **kw)
    want = [out, h, c]
    assert [tuple(g.shape) for g in got] == [tuple(w.shape) for w in want]
    for g, w in zip(got, want):
        torch.testing.assert_close(torch.as_tensor(g), w, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("variant", PROJ_VARIANTS)
def test_traced_proj_size_runs_every_length(variant):
    model = _model(variant)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        traced = torch.jit.trace(model, (torch.randn(5, 3, 5),))
    for t in range(1, 10):
        x = torch.randn(t, 2 + t % 3, 5)
        out, (h, c) = traced(x)
        _same([out, h, c], model, x)


def test_traced_proj_size_of_a_padded_batch():
    model = _model("lstm")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        traced = torch.jit.trace(model, example_kwarg_inputs={
            "input": torch.randn(5, 3, 5), "lengths": torch.tensor([5, 2, 4])})
    for t, lengths in ((9, [9, 3, 1, 7]), (1, [1, 1]), (6, [2, 6, 6])):
        x, lengths = torch.randn(t, len(lengths), 5), torch.tensor(lengths)
        out, (h, c) = traced(input=x, lengths=lengths)
        _same([out, h, c], model, x, lengths=lengths)


@pytest.mark.parametrize("dynamo", [False, True])
@pytest.mark.parametrize("variant", ["lstm", "lstm_minus_srnn_minus_hidden"])
def test_onnx_proj_size_runs_every_length(variant, dynamo, tmp_path):
    if dynamo:
        pytest.importorskip("onnxscript", reason="onnxscript is not installed "
                                                 "(requirements/core.txt)")
    model = _model(variant)
    path = tmp_path / "m.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:
            B, T = torch.export.Dim("B", min=1), torch.export.Dim("T", min=1)
            torch.onnx.export(model, (torch.randn(5, 3, 5),), str(path), dynamo=True,
                              dynamic_shapes=({0: T, 1: B},), verbose=False)
        else:
            torch.onnx.export(model, (torch.randn(5, 3, 5),), str(path), dynamo=False,
                              input_names=["x"], output_names=["out", "h", "c"],
                              dynamic_axes={"x": {0: "T", 1: "B"}, "out": {0: "T", 1: "B"},
                                            "h": {1: "B"}, "c": {1: "B"}})
    run = onnx_runner(path)
    for t in range(1, 10):
        x = torch.randn(t, 2 + t % 3, 5)
        _same(run(x), model, x)
