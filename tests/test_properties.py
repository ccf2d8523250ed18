"""Property-based tests (hypothesis): random variants, layers, directions, sizes (B = 0 and 1,
H = 1 included), lengths / masks / packed sequences, initial states, dtypes and dropout in eval
mode; the compiled kernel (both schedules) must give the generic path's outputs and gradients,
and ``lstm`` must give ``torch.nn.LSTM``'s.  Bounded and derandomized, so that CI is fast and
reproducible; a failure prints the drawn case (hypothesis shrinks it to a small one)."""
import contextlib

import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

hypothesis = pytest.importorskip(
    "hypothesis", reason="hypothesis is not installed: pip install -c requirements/constraints.txt "
                         "hypothesis (bash scripts/setup.sh installs it)")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

import rnn_ablations as ra  # noqa: E402
from rnn_ablations import AblatedRNN, VARIANTS, use_backend, use_pipeline  # noqa: E402

from conftest import requires_kernel  # noqa: E402

pytestmark = [pytest.mark.usefixtures("one_thread"), requires_kernel]

#: the conftest fixtures are per test, not per example (every example seeds its own generator)
PROPERTY = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])
TOL = {torch.float32: dict(atol=5e-5, rtol=5e-4), torch.float64: dict(atol=1e-10, rtol=1e-8)}


@contextlib.contextmanager
def path(name):
    backend = "generic" if name == "generic" else "kernel"
    with use_backend(backend), use_pipeline("always" if name == "pipelined" else "never"):
        yield


@st.composite
def cases(draw, variants=tuple(VARIANTS)):
    batch = draw(st.sampled_from([0, 1, 2, 3, 5]))
    seq_len = draw(st.integers(1, 6))
    c = dict(
        variant=draw(st.sampled_from(variants)),
        highway=draw(st.booleans()),
        layers=draw(st.integers(1, 3)),
        bidirectional=draw(st.booleans()),
        batch_first=draw(st.booleans()),
        bias=draw(st.booleans()),
        input_size=draw(st.integers(1, 4)),
        hidden=draw(st.sampled_from([1, 2, 3, 5])),
        batch=batch, seq_len=seq_len,
        lengths=draw(st.lists(st.integers(1, seq_len), min_size=batch, max_size=batch)),
        padding=draw(st.sampled_from(["none", "lengths", "mask", "packed"] if batch else
                                     ["none", "lengths", "mask"])),
        hx=draw(st.booleans()),
        dtype=draw(st.sampled_from([torch.float32, torch.float64])),
        dropout=draw(st.sampled_from([0.0, 0.4])),
        kernel=draw(st.sampled_from(["pipelined", "plain"])),
        grad=draw(st.booleans()),
        seed=draw(st.integers(0, 2 ** 31 - 1)),
    )
    if c["variant"] == "lstm" and draw(st.booleans()):
        c["highway"] = False  # the plain LSTM (nn.LSTM's parameter names) more often
    return c


def _build(c):
    gen = torch.Generator().manual_seed(c["seed"])
    # dropout where it has an effect in training (between layers; recurrent dropout on a cell
    # that reads h_{t-1}): elsewhere the constructor warns, as nn.LSTM does
    m = AblatedRNN(c["variant"], c["input_size"], c["hidden"], num_layers=c["layers"],
                   bias=c["bias"], batch_first=c["batch_first"],
                   dropout=c["dropout"] if c["layers"] > 1 else 0.0,
                   bidirectional=c["bidirectional"],
                   recurrent_dropout=c["dropout"] if ra.get_variant(c["variant"]).reads_hidden
                   else 0.0, highway=c["highway"], dtype=c["dtype"])
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.rand(p.shape, generator=gen, dtype=c["dtype"]) * 1.6 - 0.8)
    m.eval()  # dropout and recurrent dropout are off in eval mode
    B, T, D, H = c["batch"], c["seq_len"], c["input_size"], c["hidden"]
    shape = (B, T, D) if c["batch_first"] else (T, B, D)
    x = torch.randn(shape, generator=gen, dtype=c["dtype"]).requires_grad_(c["grad"])
    hx = None
    if c["hx"]:
        n = c["layers"] * (2 if c["bidirectional"] else 1)
        hx = tuple(torch.randn(n, B, H, generator=gen, dtype=c["dtype"]).requires_grad_(c["grad"])
                   for _ in range(2))
    return m, x, hx


def _forward(m, x, hx, c):
    lengths = torch.tensor(c["lengths"], dtype=torch.int64)
    if c["padding"] == "lengths":
        out, (h, cn) = m(x, hx, lengths=lengths)
    elif c["padding"] == "mask":
        mask = torch.arange(c["seq_len"]).unsqueeze(0) < lengths.unsqueeze(1)
        out, (h, cn) = m(x, hx, mask=mask)
    elif c["padding"] == "packed":
        packed = pack_padded_sequence(x, lengths, batch_first=c["batch_first"],
                                      enforce_sorted=False)
        out, (h, cn) = m(packed, hx)
        out = pad_packed_sequence(out, batch_first=c["batch_first"],
                                  total_length=c["seq_len"])[0]
    else:
        out, (h, cn) = m(x, hx)
    return out, h, cn


def _run(m, x, hx, c, backend):
    """Outputs and (when c["grad"]) the gradients of a fixed random loss w.r.t. the input,
    the initial state and every parameter."""
    inputs = [x] + (list(hx) if hx is not None else [])
    with path(backend), torch.set_grad_enabled(c["grad"]):
        out, h, cn = _forward(m, x, hx, c)
        results = [out.detach(), h.detach(), cn.detach()]
        if c["grad"]:
            gen = torch.Generator().manual_seed(c["seed"] + 1)
            weights = [torch.randn(t.shape, generator=gen, dtype=t.dtype) for t in (out, h, cn)]
            loss = sum((w * t).sum() for w, t in zip(weights, (out, h, cn))) + out.square().sum()
            targets = inputs + list(m.parameters())
            grads = torch.autograd.grad(loss, targets, allow_unused=True)
            results += [g if g is not None else torch.zeros_like(t)
                        for g, t in zip(grads, targets)]
    return results


@PROPERTY
@given(cases())
def test_kernel_equals_generic(c):
    m, x, hx = _build(c)
    fast = _run(m, x, hx, c, c["kernel"])
    ref = _run(m, x, hx, c, "generic")
    assert len(fast) == len(ref)
    for a, b in zip(fast, ref):
        assert a.shape == b.shape and a.dtype == b.dtype
        torch.testing.assert_close(a, b, **TOL[c["dtype"]])


@PROPERTY
@given(cases(variants=("lstm",)))
def test_lstm_equals_nn_lstm(c):
    c = dict(c, highway=False, padding="none" if c["padding"] != "packed" else "packed")
    m, x, hx = _build(c)
    ref = torch.nn.LSTM(c["input_size"], c["hidden"], num_layers=c["layers"], bias=c["bias"],
                        batch_first=c["batch_first"],
                        bidirectional=c["bidirectional"], dtype=c["dtype"]).eval()
    ref.load_state_dict({k: v for k, v in m.state_dict().items() if k != "variant_state"})
    ours = _run(m, x, hx, c, c["kernel"])
    with torch.set_grad_enabled(c["grad"]):
        if c["padding"] == "packed":
            lengths = torch.tensor(c["lengths"], dtype=torch.int64)
            packed = pack_padded_sequence(x, lengths, batch_first=c["batch_first"],
                                          enforce_sorted=False)
            out, (h, cn) = ref(packed, hx)
            out = pad_packed_sequence(out, batch_first=c["batch_first"],
                                      total_length=c["seq_len"])[0]
        else:
            out, (h, cn) = ref(x, hx)
    for a, b in zip(ours[:3], (out, h, cn)):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b.detach(), **TOL[c["dtype"]])


@settings(PROPERTY, max_examples=15)
@given(cases())
def test_second_derivatives_equal_generic(c):
    """A gradient penalty through the kernel path (create_graph=True) equals the generic path's."""
    c = dict(c, grad=True, dtype=torch.float64)
    m, x, hx = _build(c)
    results = []
    for backend in (c["kernel"], "generic"):
        with path(backend):
            out, h, cn = _forward(m, x, hx, c)
            gx, = torch.autograd.grad(out.square().sum() + h.sum() + cn.sum(), x,
                                      create_graph=True)
            params = list(m.parameters())
            second = torch.autograd.grad(gx.square().sum(), [x] + params, allow_unused=True)
        results.append([gx.detach()] + [g if g is not None else torch.zeros_like(t)
                                        for g, t in zip(second, [x] + params)])
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, **TOL[torch.float64])
