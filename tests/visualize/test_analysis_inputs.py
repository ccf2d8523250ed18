"""``rnn_ablations.weighted_sum`` on degenerate input: refused with what was wrong, or (an
empty batch) empty results, as the RNN gives."""
import pytest
import torch

from rnn_ablations import AblatedRNN, weighted_sum

def test_weighted_sum_refuses_degenerate_input():
    m = AblatedRNN("ran", 3, 4)
    with pytest.raises(ValueError, match="seq_len 0"):
        weighted_sum(m, torch.randn(0, 2, 3))
    with pytest.raises(ValueError, match="floating-point"):
        weighted_sum(m, torch.ones(5, 2, 3, dtype=torch.int64))
    with pytest.raises(ValueError, match="input dtype \\(torch.float64\\)"):
        weighted_sum(m, torch.randn(5, 2, 3, dtype=torch.float64))
    ws = weighted_sum(m, torch.randn(5, 0, 3))  # an empty batch: empty results, as the RNN
    assert ws.weights.shape == (0, 5, 5, 4) and ws.memory.shape == (0, 5, 4)
