"""AblatedRNN's arguments: an unknown variant lists the valid ones, the aliases name the table's
rows, bad constructor and forward arguments are refused with a message that names them, and
dropout with one layer warns as nn.LSTM does."""

import pytest
import torch

from rnn_ablations import AblatedRNN, VARIANTS


def test_unknown_variant_lists_valid_ones():
    with pytest.raises(ValueError, match="valid variants are lstm, srnn, lstm_minus_srnn, ran, identity_ran"):
        AblatedRNN("gru", 3, 4)


def test_aliases():
    assert AblatedRNN("lstm_minus_gates", 3, 4).variant.name == "srnn"
    assert AblatedRNN("tanh_ran", 3, 4).variant.name == "ran"
    assert AblatedRNN("LSTM-minus-SRNN-minus-OUT", 3, 4).variant.name == "ran"


@pytest.mark.parametrize("kwargs,match", [
    (dict(dropout=1.0), "dropout must be a number in \\[0, 1\\)"),
    (dict(dropout=-0.1), "dropout must be a number in \\[0, 1\\)"),
    (dict(recurrent_dropout=1.5), "recurrent_dropout must be"),
    (dict(num_layers=0), "num_layers must be a positive integer"),
    (dict(proj_size=3), r"proj_size projects h_t = o_t\*tanh\(c_t\)"),  # ran has no output gate
])
def test_bad_constructor_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        AblatedRNN("ran", 3, 4, **kwargs)


def test_bad_forward_inputs():
    m = AblatedRNN("ran", 3, 4, num_layers=2)
    x = torch.randn(5, 2, 3)
    with pytest.raises(ValueError, match="Expected 3, got 7"):
        m(torch.randn(5, 2, 7))
    with pytest.raises(ValueError, match="lengths must have shape \\(2,\\)"):
        m(x, lengths=torch.tensor([5, 4, 3]))
    with pytest.raises(ValueError, match="mask has shape \\(3, 5\\)"):
        m(x, mask=torch.ones(3, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="at least one token; got a length of 0"):
        m(x, lengths=torch.tensor([5, 0]))
    with pytest.raises(ValueError, match="a length of 6 exceeds the input's seq_len 5"):
        m(x, lengths=torch.tensor([6, 2]))
    with pytest.raises(ValueError, match="left-aligned"):
        m(x, mask=torch.tensor([[True, False, True, False, False]] * 2))
    with pytest.raises(ValueError, match="h_0 must have shape \\(2, 2, 4\\)"):
        m(x, (torch.zeros(1, 2, 4), torch.zeros(1, 2, 4)))
    with pytest.raises(ValueError, match="must be a tuple \\(h_0, c_0\\)"):
        m(x, torch.zeros(2, 2, 4))
    with pytest.raises(ValueError, match="either mask or lengths"):
        m(x, mask=torch.ones(2, 5, dtype=torch.bool), lengths=torch.tensor([5, 5]))
    with pytest.raises(ValueError, match="2-D \\(unbatched\\) or 3-D"):
        m(torch.randn(5, 2, 3, 1))


@pytest.mark.parametrize("variant", VARIANTS)
def test_dropout_with_one_layer_warns_as_nn_lstm(variant):
    """dropout acts between layers: with one layer it does nothing, and AblatedRNN says so with
    nn.LSTM's warning, on nn.LSTM's condition (dropout > 0 and num_layers == 1)."""
    import warnings
    with pytest.warns(UserWarning, match="non-zero dropout expects num_layers greater than 1") as w:
        torch.nn.LSTM(3, 4, dropout=0.25)
    want = str(w[0].message)
    with pytest.warns(UserWarning) as got:
        AblatedRNN(variant, 3, 4, dropout=0.25)
    assert [str(r.message) for r in got] == [want]
    assert got[0].filename == __file__  # points at the caller's line
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        AblatedRNN(variant, 3, 4, dropout=0.25, num_layers=2)
        AblatedRNN(variant, 3, 4, dropout=0.0)
        torch.nn.LSTM(3, 4, dropout=0.25, num_layers=2)
