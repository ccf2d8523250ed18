"""AblatedRNN's numbers against references on every code path (the pipelined and plain kernels,
the generic PyTorch path): the LSTM against torch.nn.LSTM, the S-RNN against torch.nn.RNN,
packed and unbatched inputs as torch takes them, and padding that changes nothing of a row's
results in either direction."""
import contextlib

import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

import rnn_ablations as ra
from rnn_ablations import AblatedRNN, VARIANTS


#: the three code paths: the pipelined kernel, the plain kernel, the generic PyTorch path
BACKENDS = ["pipelined", "plain", "generic"] if ra.kernel_available() else ["generic"]


@contextlib.contextmanager
def path(name):
    """Force one code path (``auto`` would pick the pipeline only from 4 steps up)."""
    backend = "generic" if name == "generic" else "kernel"
    with ra.options(backend=backend, cpu_schedule="pipelined" if name == "pipelined" else "plain"):
        yield


def _run(m, x, **kw):
    out, (h, c) = m(x, **kw)
    return out, h, c


# --------------------------------------------------------------------------- references
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("layers,bidirectional,batch_first", [
    (1, False, False), (2, True, True), (3, True, False), (3, False, True)])
@pytest.mark.parametrize("sizes", [(5, 7, 6, 3), (16, 12, 9, 4)])
def test_lstm_matches_torch(backend, layers, bidirectional, batch_first, sizes):
    d_in, hidden, seq_len, batch = sizes
    ref = torch.nn.LSTM(d_in, hidden, num_layers=layers, bidirectional=bidirectional,
                        batch_first=batch_first)
    ours = AblatedRNN("lstm", d_in, hidden, num_layers=layers, bidirectional=bidirectional,
                      batch_first=batch_first)
    ours.load_state_dict(ref.state_dict())
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in ref.named_parameters()]
    x = torch.randn((batch, seq_len, d_in) if batch_first else (seq_len, batch, d_in))
    h0 = torch.randn(layers * (2 if bidirectional else 1), batch, hidden)
    c0 = torch.randn_like(h0)
    with path(backend):
        for hx in (None, (h0, c0)):
            got = _run(ours, x, hx=hx) if hx is not None else _run(ours, x)
            want = ref(x, hx) if hx is not None else ref(x)
            want = (want[0], *want[1])
            for g, w in zip(got, want):
                torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("layers,bidirectional,batch_first", [(1, False, True), (2, True, False), (3, True, True)])
def test_srnn_matches_torch_rnn(backend, layers, bidirectional, batch_first):
    ref = torch.nn.RNN(6, 8, num_layers=layers, bidirectional=bidirectional, nonlinearity="tanh",
                       batch_first=batch_first)
    ours = AblatedRNN("srnn", 6, 8, num_layers=layers, bidirectional=bidirectional,
                      batch_first=batch_first)
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(4, 5, 6)
    h0 = torch.randn(layers * (2 if bidirectional else 1), 5 if not batch_first else 4, 8)
    if batch_first:
        h0 = torch.randn(layers * (2 if bidirectional else 1), 4, 8)
    with path(backend):
        out, (h, c) = ours(x, h0)
    want_out, want_h = ref(x, h0)
    torch.testing.assert_close(out, want_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(h, want_h, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(c, h)  # documented: c_n is a copy of h_n for the S-RNN


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bidirectional", [False, True])
def test_packed_sequence_matches_torch(backend, bidirectional):
    ref = torch.nn.LSTM(4, 6, num_layers=2, bidirectional=bidirectional)
    ours = AblatedRNN("lstm", 4, 6, num_layers=2, bidirectional=bidirectional)
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(7, 4, 4)
    lengths = torch.tensor([3, 7, 1, 5])
    packed = pack_padded_sequence(x, lengths, enforce_sorted=False)
    with path(backend):
        out, (h, c) = ours(packed)
    want_out, (want_h, want_c) = ref(packed)
    assert torch.equal(out.batch_sizes, want_out.batch_sizes)
    torch.testing.assert_close(out.data, want_out.data, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(h, want_h, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(c, want_c, atol=1e-5, rtol=1e-5)
    # lengths= on the padded tensor gives the same as the packed input
    with path(backend):
        out2, (h2, c2) = ours(x, lengths=lengths)
    padded, _ = pad_packed_sequence(want_out)
    torch.testing.assert_close(out2[:padded.shape[0]], padded, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(h2, want_h, atol=1e-5, rtol=1e-5)


def test_unbatched_input_matches_torch():
    ref = torch.nn.LSTM(3, 5)
    ours = AblatedRNN("lstm", 3, 5)
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(6, 3)
    out, (h, c) = ours(x)
    want, (wh, wc) = ref(x)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(h, wh, atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------- padding
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_padding_invariance_both_directions(backend, variant):
    m = AblatedRNN(variant, 4, 5, num_layers=2, bidirectional=True, batch_first=True).eval()
    lengths = [6, 2, 4]
    rows = [torch.randn(n, 4) for n in lengths]
    padded = torch.zeros(3, 6, 4)
    for i, r in enumerate(rows):
        padded[i, :len(r)] = r
    padded_garbage = padded.clone()
    padded_garbage[1, 2:] = 100.0  # padding content must not matter
    mask = torch.arange(6).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)
    with path(backend):
        out, (h, c) = m(padded_garbage, mask=mask)
        for i, r in enumerate(rows):
            alone, (ha, ca) = m(r.unsqueeze(0))
            n = len(r)
            torch.testing.assert_close(out[i, :n], alone[0], atol=1e-5, rtol=1e-5)
            assert torch.all(out[i, n:] == 0)
            torch.testing.assert_close(h[:, i], ha[:, 0], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(c[:, i], ca[:, 0], atol=1e-5, rtol=1e-5)
