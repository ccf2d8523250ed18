"""AblatedRNN's parameters: the recurrent parameter counts of the RAN paper's Table 1, the names
that keep an initializer written for nn.LSTM off the ablated biases, and the documented
forget-bias initialisation."""

import pytest
import torch

from rnn_ablations import AblatedRNN, VARIANTS, get_variant, recurrent_param_count


@pytest.mark.parametrize("variant,hidden,expected", [
    ("lstm", 650, 6.77e6), ("ran", 650, 4.23e6), ("lstm", 1500, 36.02e6), ("ran", 1500, 22.52e6)])
def test_param_counts_match_ran_paper_table1(variant, hidden, expected):
    n = recurrent_param_count(variant, hidden, hidden, num_layers=2)
    assert abs(n - expected) / expected < 0.005
    if hidden == 650:  # the module allocates exactly that
        m = AblatedRNN(variant, hidden, hidden, num_layers=2)
        assert sum(p.numel() for p in m.parameters()) == n


def test_parameter_names_protect_ablated_biases():
    for v in VARIANTS:
        names = [n for n, _ in AblatedRNN(v, 3, 4, bidirectional=True).named_parameters()]
        if get_variant(v).lstm_parameter_names:
            assert "bias_hh_l0" in names and "bias_ih_l0_reverse" in names
        else:
            assert not any("bias_hh" in n or "bias_ih" in n for n in names), names
            assert "bias_l0" in names and "bias_l0_reverse" in names


@pytest.mark.parametrize("variant", ["lstm_minus_srnn", "ran", "identity_ran"])
def test_documented_init_forget_bias(variant):
    """Default: nn.LSTM's uniform rule (no forget-bias head start); forget_bias=1 on request."""
    H = 4
    m = AblatedRNN(variant, 3, H, highway=True)
    assert m.bias_l0.abs().max() <= 0.5 and m.bias_l0.std() > 0.1
    m = AblatedRNN(variant, 3, H, highway=True, forget_bias=1.0)
    assert torch.equal(m.bias_l0.detach()[H:2 * H], torch.ones(H))  # blocks i, f, (o), r
    others = torch.cat([m.bias_l0.detach()[:H], m.bias_l0.detach()[2 * H:]])
    assert others.abs().max() <= 0.5 and others.std() > 0.1
    assert m.weight_ih_l0.abs().max() <= 0.5 and m.weight_hh_l0.shape == (m.variant.num_recurrent(m.highway) * H, H)
