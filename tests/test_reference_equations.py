"""An independent reference for every variant: the papers' equations, written out by hand here.

Nothing below goes through :class:`rnn_ablations.variants.Variant` (its block tables) or
:mod:`rnn_ablations.functional`: the layout of the parameters is the one documented in
:class:`rnn_ablations.AblatedRNN`'s docstring, typed in again, and each cell is a few lines of
``torch`` on one sequence at a time.  A mistake shared by the variant table, the generic path and
the kernels (a swapped gate, a missing bias, a wrong activation) makes these tests fail.

Checked in float64: outputs, final states and the gradients of a random functional of them with
respect to the input and to every parameter, for multi-layer bidirectional stacks with padded
batches (each row is run alone for its own length), with and without AugmentedLstm's highway.
"""
import math

import pytest
import torch

import rnn_ablations
from rnn_ablations import AblatedRNN
from rnn_ablations import kernel_available, use_backend

sigmoid, tanh = torch.sigmoid, torch.tanh


def _rows(w, k, H):
    """Block k (H rows) of a stacked weight or bias."""
    return w[k * H:(k + 1) * H]


# --------------------------------------------------------------------------- the papers' cells
# Each cell: (x_t, h_{t-1}, c_{t-1}, W_x, W_h, b, H) -> (h_t, c_t), where W_x / W_h / b are the
# layer's weight_ih / weight_hh / bias (for the LSTM the sum of nn.LSTM's two biases).  Row blocks
# (AblatedRNN's documented layout): recurrent blocks first, then the input-only blocks.

def lstm_cell(x, h, c, Wx, Wh, b, H):
    # LSTM: blocks i, f, g, o (as torch.nn.LSTM)
    def pre(k):
        return _rows(Wx, k, H) @ x + _rows(Wh, k, H) @ h + _rows(b, k, H)
    i, f, o = sigmoid(pre(0)), sigmoid(pre(1)), sigmoid(pre(3))
    content = tanh(pre(2))
    c_new = i * content + f * c
    return o * tanh(c_new), c_new


def srnn_cell(x, h, c, Wx, Wh, b, H):
    # LSTM − GATES = S-RNN: h_t = tanh(W_hh h_{t-1} + W_hx x_t + b_h); no memory (c mirrors h)
    h_new = tanh(_rows(Wx, 0, H) @ x + Wh @ h + b)
    return h_new, h_new


def lstm_minus_srnn_cell(x, h, c, Wx, Wh, b, H):
    # LSTM − S-RNN: gates i, f, o read x_t and h_{t-1}; content W_cx x_t (block 3, no bias)
    def gate(k):
        return sigmoid(_rows(Wx, k, H) @ x + _rows(Wh, k, H) @ h + _rows(b, k, H))
    i, f, o = gate(0), gate(1), gate(2)
    c_new = i * (_rows(Wx, 3, H) @ x) + f * c
    return o * tanh(c_new), c_new


def ran_cell(x, h, c, Wx, Wh, b, H):
    # LSTM − S-RNN − OUT = tanh RAN: gates i, f; content W_cx x_t (block 2, no bias); h = tanh(c)
    def gate(k):
        return sigmoid(_rows(Wx, k, H) @ x + _rows(Wh, k, H) @ h + _rows(b, k, H))
    i, f = gate(0), gate(1)
    c_new = i * (_rows(Wx, 2, H) @ x) + f * c
    return tanh(c_new), c_new


def identity_ran_cell(x, h, c, Wx, Wh, b, H):
    # identity RAN: as the tanh RAN with h_t = c_t
    def gate(k):
        return sigmoid(_rows(Wx, k, H) @ x + _rows(Wh, k, H) @ h + _rows(b, k, H))
    i, f = gate(0), gate(1)
    c_new = i * (_rows(Wx, 2, H) @ x) + f * c
    return c_new, c_new


def lstm_minus_srnn_minus_hidden_cell(x, h, c, Wx, Wh, b, H):
    # LSTM − S-RNN − HIDDEN: gates i, f, o read x_t only (blocks 0-2, with bias); content W_cx x_t
    # (block 3, no bias); h_{t-1} is read nowhere (there is no W_h)
    def gate(k):
        return sigmoid(_rows(Wx, k, H) @ x + _rows(b, k, H))
    i, f, o = gate(0), gate(1), gate(2)
    c_new = i * (_rows(Wx, 3, H) @ x) + f * c
    return o * tanh(c_new), c_new


#: variant -> (cell, number of blocks that read h_{t-1} (rows of W_h), number of input-only blocks
#: without bias, number of blocks with a bias (they come first in W_x))
CELLS = {
    "lstm": (lstm_cell, 4, 0, 4),
    "srnn": (srnn_cell, 1, 0, 1),
    "lstm_minus_srnn": (lstm_minus_srnn_cell, 3, 1, 3),
    "ran": (ran_cell, 2, 1, 2),
    "identity_ran": (identity_ran_cell, 2, 1, 2),
    "lstm_minus_srnn_minus_hidden": (lstm_minus_srnn_minus_hidden_cell, 0, 1, 3),
}


def highway_cell(cell, n_rec, n_inp, n_bias):
    """AllenNLP AugmentedLstm's highway around a cell: the gate r is the last biased block
    (after the cell's own), the projection W_hw the last input-only block:
    h_t <- r ∘ h_t + (1 − r) ∘ W_hw x_t, r = σ(W_rx x_t + W_rh h_{t-1} + b_r); c_t unchanged.
    In a cell that reads no h_{t-1} (n_rec = 0) the gate reads x_t only: r = σ(W_rx x_t + b_r)."""
    def run(x, h, c, Wx, Wh, b, H):
        # the cell sees its own rows: biased blocks 0..n_bias-1, then its input-only blocks
        Wx_cell = torch.cat([Wx[:n_bias * H], Wx[(n_bias + 1) * H:(n_bias + 1 + n_inp) * H]])
        h_cell, c_new = cell(x, h, c, Wx_cell, Wh[:n_rec * H], b[:n_bias * H], H)
        pre_r = _rows(Wx, n_bias, H) @ x + _rows(b, n_bias, H)
        if n_rec:
            pre_r = pre_r + _rows(Wh, n_rec, H) @ h
        r = sigmoid(pre_r)
        projection = _rows(Wx, n_bias + 1 + n_inp, H) @ x
        h_new = r * h_cell + (1 - r) * projection
        if cell is srnn_cell:
            c_new = h_new  # the S-RNN has no memory: its c mirrors h
        return h_new, c_new
    return run


def test_every_variant_has_a_hand_written_cell():
    assert set(CELLS) == set(rnn_ablations.VARIANTS)


# --------------------------------------------------------------------------- the reference stack
def _params(m, layer, direction):
    sfx = f"_l{layer}" + ("_reverse" if direction else "")
    Wx = getattr(m, "weight_ih" + sfx)
    # a cell that reads no h_{t-1} has no weight_hh: an empty W_h (its hand-written cell never
    # reads it)
    Wh = getattr(m, "weight_hh" + sfx, None)
    if Wh is None:
        Wh = Wx.new_zeros(0, m.hidden_size)
    if hasattr(m, "bias_ih" + sfx):
        b = getattr(m, "bias_ih" + sfx) + getattr(m, "bias_hh" + sfx)
    else:
        b = getattr(m, "bias" + sfx)
    return Wx, Wh, b


def reference(m, variant, highway, x, lengths):
    """x (T, B, d) -> output (T, B, dirs·H) with zeros past each row's length, h_n, c_n."""
    cell, n_rec, n_inp, n_bias = CELLS[variant]
    if highway:
        cell = highway_cell(cell, n_rec, n_inp, n_bias)
    H, dirs, L = m.hidden_size, m.num_directions, m.num_layers
    T, B = x.shape[0], x.shape[1]
    outputs, h_n, c_n = [], [[None] * (L * dirs) for _ in range(B)], [[None] * (L * dirs) for _ in range(B)]
    for row in range(B):
        n = int(lengths[row])
        seq = [x[t, row] for t in range(n)]
        for layer in range(L):
            per_dir = []
            for d in range(dirs):
                Wx, Wh, b = _params(m, layer, d)
                h = x.new_zeros(H)
                c = x.new_zeros(H)
                out = [None] * n
                steps = range(n) if d == 0 else range(n - 1, -1, -1)
                for t in steps:
                    h, c = cell(seq[t], h, c, Wx, Wh, b, H)
                    out[t] = h
                per_dir.append(out)
                h_n[row][layer * dirs + d], c_n[row][layer * dirs + d] = h, c
            seq = [torch.cat([per_dir[d][t] for d in range(dirs)]) for t in range(n)]
        pad = [x.new_zeros(dirs * H)] * (T - n)
        outputs.append(torch.stack(seq + pad))
    output = torch.stack(outputs, dim=1)
    h_n = torch.stack([torch.stack(hs) for hs in h_n], dim=1)
    c_n = torch.stack([torch.stack(cs) for cs in c_n], dim=1)
    return output, h_n, c_n


BACKENDS = ["generic"] + (["kernel"] if kernel_available() else [])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("highway", [False, True], ids=["plain", "highway"])
@pytest.mark.parametrize("variant", sorted(CELLS))
def test_module_matches_the_papers_equations(variant, highway, backend):
    torch.manual_seed(17)
    d_in, H, T = 3, 4, 5
    lengths = torch.tensor([5, 2, 4])
    m = AblatedRNN(variant, d_in, H, num_layers=2, bidirectional=True, highway=highway,
                   dtype=torch.float64).eval()
    with torch.no_grad():  # wider than nn.LSTM's init, so that every term matters
        for p in m.parameters():
            p.uniform_(-0.8, 0.8)
    x = torch.randn(T, len(lengths), d_in, dtype=torch.float64, requires_grad=True)
    g_out = torch.randn(T, len(lengths), 2 * H, dtype=torch.float64)
    g_h, g_c = (torch.randn(4, len(lengths), H, dtype=torch.float64) for _ in range(2))

    def loss(out, h, c):
        return (out * g_out).sum() + (h * g_h).sum() + (c * g_c).sum()

    params = list(m.parameters())
    ref = reference(m, variant, highway, x, lengths)
    ref_grads = torch.autograd.grad(loss(*ref), [x] + params)
    with use_backend(backend):
        out, (h, c) = m(x, lengths=lengths)
    got_grads = torch.autograd.grad(loss(out, h, c), [x] + params)
    for name, a, b in (("output", out, ref[0]), ("h_n", h, ref[1]), ("c_n", c, ref[2])):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12, msg=lambda s: f"{name}: {s}")
    names = ["input"] + [n for n, _ in m.named_parameters()]
    for name, a, b in zip(names, got_grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11,
                                   msg=lambda s, name=name: f"grad of {name}: {s}")


def test_the_reference_is_not_vacuous():
    """The hand-written cells differ from one another on the same weights (so a variant table
    that swapped two variants would fail above)."""
    torch.manual_seed(0)
    H = 4
    x, h, c = (torch.randn(H, dtype=torch.float64) for _ in range(3))
    outs = {}
    for v, (cell, n_rec, n_inp, n_bias) in CELLS.items():
        Wx = torch.randn((n_bias + n_inp) * H, H, dtype=torch.float64)
        Wh = torch.randn(n_rec * H, H, dtype=torch.float64)
        b = torch.randn(n_bias * H, dtype=torch.float64)
        outs[v] = cell(x, h, c, Wx, Wh, b, H)[0]
    vals = list(outs.values())
    for i in range(len(vals)):
        for j in range(i + 1, len(vals)):
            assert not torch.allclose(vals[i], vals[j])
    assert math.isfinite(float(sum(v.sum() for v in vals)))
