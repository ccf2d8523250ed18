"""Graph captures that record the steps keep the sequence length dynamic, as for nn.LSTM
(rnn_ablations/export.py): ``torch.jit.trace`` and ``torch.onnx.export`` with either exporter
(``dynamo=False`` with ``dynamic_axes``, the default dynamo-based one with ``dynamic_shapes``),
of the bare module, give the eager outputs, shapes included, on three lengths (and batch
sizes) other than the traced ones; padded batches (``lengths``) too."""
import warnings

import pytest
import torch

from rnn_ablations import VARIANTS, AblatedRNN
from rnn_ablations.plan import stack_runner
from _onnx import onnx_runner

LENGTHS = (1, 5, 14)   # traced with 9


def _model(variant, layers=1, highway=False, batch_first=False):
    torch.manual_seed(0)
    return AblatedRNN(variant, 5, 4, num_layers=layers, bidirectional=True, highway=highway,
                      batch_first=batch_first).eval()


def _same(got, model, x, **kw):
    want = model(x, **kw)
    want = [want[0], *want[1]]
    assert [tuple(g.shape) for g in got] == [tuple(w.shape) for w in want]
    for g, w in zip(got, want):
        torch.testing.assert_close(torch.as_tensor(g), w, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("highway", [False, True])
@pytest.mark.parametrize("variant", VARIANTS)
def test_jit_trace_runs_any_length(variant, highway):
    model = _model(variant, layers=2, highway=highway)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        traced = torch.jit.trace(model, (torch.randn(9, 3, 5),))
    assert stack_runner() == "layers"
    for n, t in enumerate(LENGTHS):
        x = torch.randn(t, 2 + n, 5)
        out, (h, c) = traced(x)
        _same([out, h, c], model, x)


def test_jit_trace_of_a_padded_batch_runs_any_length_and_lengths():
    model = _model("lstm_minus_srnn", layers=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        traced = torch.jit.trace(model, example_kwarg_inputs={
            "input": torch.randn(9, 3, 5), "lengths": torch.tensor([9, 4, 7])})
    for t, lengths in ((5, [5, 2, 1, 3]), (14, [3, 14, 7]), (1, [1, 1])):
        x = torch.randn(t, len(lengths), 5)
        lengths = torch.tensor(lengths)
        out, (h, c) = traced(input=x, lengths=lengths)
        _same([out, h, c], model, x, lengths=lengths)


@pytest.mark.parametrize("variant", VARIANTS)
def test_onnx_torchscript_exporter_runs_any_length(variant, tmp_path):
    """The bare module (no wrapper) with dynamic_axes on batch and time."""
    model = _model(variant, layers=2, batch_first=True)
    path = tmp_path / "m.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (torch.randn(3, 9, 5),), str(path), dynamo=False,
                          input_names=["x"], output_names=["out", "h", "c"],
                          dynamic_axes={"x": {0: "B", 1: "T"}, "out": {0: "B", 1: "T"},
                                        "h": {1: "B"}, "c": {1: "B"}})
    run = onnx_runner(path)
    for n, t in enumerate(LENGTHS):
        x = torch.randn(2 + n, t, 5)
        _same(run(x), model, x)


@pytest.mark.parametrize("dynamo", [False, True])
def test_onnx_export_of_a_padded_batch_runs_any_length(dynamo, tmp_path):
    """Both exporters; the dynamo one with dynamic_shapes, two stacked bidirectional layers
    (a scan that reads another scan's output) and lengths."""
    pytest.importorskip("onnxscript", reason="onnxscript is not installed (requirements/core.txt)")
    model = _model("ran", layers=2, batch_first=True)
    path = tmp_path / "m.onnx"
    x, lengths = torch.randn(3, 9, 5), torch.tensor([9, 4, 6])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:
            B, T = torch.export.Dim("B", min=1), torch.export.Dim("T", min=2)
            torch.onnx.export(model, (x,), str(path), kwargs={"lengths": lengths}, dynamo=True,
                              dynamic_shapes={"input": {0: B, 1: T}, "lengths": {0: B}},
                              verbose=False)
        else:
            torch.onnx.export(model, (x,), str(path), kwargs={"lengths": lengths}, dynamo=False,
                              input_names=["input", "lengths"],
                              dynamic_axes={"input": {0: "B", 1: "T"}, "lengths": {0: "B"}})
    run = onnx_runner(path)
    for t, lens in ((5, [5, 2, 1, 3]), (14, [3, 14, 7]), (2, [1, 2])):
        x = torch.randn(len(lens), t, 5)
        lens = torch.tensor(lens)
        _same(run(x, lens), model, x, lengths=lens)


@pytest.mark.parametrize("variant,highway", [("identity_ran", False),
                                             ("lstm_minus_srnn_minus_hidden", True)])
def test_onnx_dynamo_exporter_runs_any_length(variant, highway, tmp_path):
    """The default exporter on full batches: a cell whose h_t is c_t (the scan's outputs may not
    alias) and one without a recurrent matrix."""
    pytest.importorskip("onnxscript", reason="onnxscript is not installed (requirements/core.txt)")
    model = _model(variant, highway=highway)
    path = tmp_path / "m.onnx"
    B, T = torch.export.Dim("B", min=1), torch.export.Dim("T", min=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (torch.randn(9, 3, 5),), str(path), dynamo=True,
                          dynamic_shapes=({0: T, 1: B},), verbose=False)
    run = onnx_runner(path)
    for n, t in enumerate(LENGTHS):
        x = torch.randn(t, 2 + n, 5)
        _same(run(x), model, x)


def test_the_stack_runner_is_decided_in_the_plan(monkeypatch):
    """Under torch.jit.trace the stack runs as a scripted loop: the plan says so, and the module
    carries out what it says (a wrong answer from the plan reaches the module)."""
    from rnn_ablations import plan, rnn as rnn_module

    seen = []

    def spy():
        seen.append(plan.stack_runner())
        return seen[-1]

    monkeypatch.setattr(rnn_module, "stack_runner", spy)
    model = _model("ran", layers=1, highway=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        torch.jit.trace(model, (torch.randn(4, 2, 5),), check_trace=False)
    assert seen and set(seen) == {"script"}
    model(torch.randn(4, 2, 5))
    assert seen[-1] == "layers"
    monkeypatch.setattr(rnn_module, "stack_runner", lambda: "unknown")
    with pytest.raises(ValueError, match="'script' or 'scan'"):
        model(torch.randn(4, 2, 5))


@pytest.mark.parametrize("schedule", ["auto", "plain"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_torch_export_with_a_length_from_one(variant, schedule):
    """``torch.export`` with ``Dim("T", min=1)``: the plan holds no guard on the length (its
    step threshold is not compared with a symbolic size), and the one program equals eager at
    every length from 1 to 6, both directions, on the CPU schedule setting given."""
    from rnn_ablations import options

    model = _model(variant)
    T = torch.export.Dim("T", min=1)
    with options(cpu_schedule=schedule):
        program = torch.export.export(model, (torch.randn(5, 2, 5),), dynamic_shapes=({0: T},))
        for t in range(1, 7):
            x = torch.randn(t, 2, 5)
            out, (h, c) = program.module()(x)
            _same([out, h, c], model, x)
