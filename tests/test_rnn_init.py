"""``AblatedRNN``'s initialisation: with no options every variant starts from
``torch.nn.LSTM``'s rule (every weight and bias ``U(±1/√H)``), role by role (see
``_init_roles.py``), so that no ablation gets a head start over the LSTM; ``forget_bias`` is an
explicit option applied alike to every variant with a forget gate, ``lstm`` included."""
import math

import pytest
import torch

from rnn_ablations import VARIANTS, AblatedRNN, get_variant

from _init_roles import ablated_roles, assert_same_distribution, nn_lstm_roles


@pytest.mark.parametrize("highway", [False, True])
@pytest.mark.parametrize("variant", VARIANTS)
def test_default_init_is_nn_lstm_rule_for_every_variant(variant, highway):
    torch.manual_seed(0)
    H = 16
    rnn = AblatedRNN(variant, 24, H, num_layers=2, bidirectional=True, highway=highway)
    bound = 1 / math.sqrt(H)
    for name, p in rnn.named_parameters():
        assert p.abs().max() <= bound, name
        assert p.std() > 0.5 * bound / math.sqrt(3), f"{name} is (nearly) constant"
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(24, H, num_layers=2, bidirectional=True)
    assert_same_distribution(ablated_roles(rnn), nn_lstm_roles(lstm), variant, bound)

@pytest.mark.parametrize("variant", VARIANTS)
def test_forget_bias_option_is_applied_alike_to_every_variant(variant):
    H = 6
    rnn = AblatedRNN(variant, 5, H, num_layers=2, bidirectional=True, forget_bias=1.5)
    roles = ablated_roles(rnn)
    if not get_variant(variant).has_memory:
        assert "forget-gate biases" not in roles  # no forget gate: nothing to set
    else:
        for layer in range(2):
            for direction in range(2):
                b = rnn.layer_parameters(layer, direction)[2]  # lstm: bias_ih + bias_hh
                assert torch.equal(b[H:2 * H].detach(), torch.full((H,), 1.5))
    for role in ("gate biases", "content biases"):
        if role in roles:  # the other entries keep the uniform rule
            assert roles[role].abs().max() <= 1 / math.sqrt(H) and roles[role].std() > 0.05
    # reset_parameters re-applies the option
    with torch.no_grad():
        for p in rnn.parameters():
            p.zero_()
    rnn.reset_parameters()
    if get_variant(variant).has_memory:
        assert torch.equal(rnn.layer_parameters(0, 1)[2][H:2 * H].detach(), torch.full((H,), 1.5))
    assert "forget_bias=1.5" in repr(rnn)

@pytest.mark.parametrize("bad", [True, "1", float("nan"), float("inf")])
def test_forget_bias_must_be_a_finite_number(bad):
    with pytest.raises(ValueError, match="forget_bias must be None"):
        AblatedRNN("ran", 3, 4, forget_bias=bad)
    with pytest.raises(ValueError, match="needs bias=True"):
        AblatedRNN("ran", 3, 4, bias=False, forget_bias=1.0)
