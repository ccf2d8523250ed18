"""rnn_ablations.analysis.weighted_sum: a memory cell's state as the weighted sum of its contents
(the papers' identity), checked against the layer's own c_t; refused for a cell without
memory."""

import pytest
import torch

from rnn_ablations import AblatedRNN, VARIANTS, get_variant, weighted_sum


MEMORY_VARIANTS = [v for v in VARIANTS if get_variant(v).has_memory]


@pytest.mark.parametrize("variant", MEMORY_VARIANTS)
@pytest.mark.parametrize("layer,direction", [(0, 0), (1, 1)])
def test_weighted_sum_identity(variant, layer, direction):
    m = AblatedRNN(variant, 4, 5, num_layers=2, bidirectional=True, batch_first=True)
    x = torch.randn(3, 6, 4)
    lengths = torch.tensor([6, 3, 5])
    ws = weighted_sum(m, x, layer=layer, direction=direction, lengths=lengths)
    assert ws.weights.shape == (3, 6, 6, 5)
    recon = (ws.weights * ws.content.unsqueeze(1)).sum(dim=2)
    torch.testing.assert_close(recon, ws.memory, atol=1e-5, rtol=1e-5)
    # weights only where the direction reaches
    t, j = torch.meshgrid(torch.arange(6), torch.arange(6), indexing="ij")
    unreachable = (j > t) if direction == 0 else (j < t)
    assert torch.all(ws.weights[:, unreachable] == 0)
    # the memory is the model's own cell: for the top layer, c_n of the model
    out, (h, c) = m(x, lengths=lengths)
    idx = layer * 2 + direction
    last = ws.memory[torch.arange(3), lengths - 1] if direction == 0 else ws.memory[:, 0]
    torch.testing.assert_close(last, c[idx], atol=1e-5, rtol=1e-5)


def test_weighted_sum_refuses_srnn():
    m = AblatedRNN("srnn", 3, 4)
    with pytest.raises(ValueError, match="no memory cell"):
        weighted_sum(m, torch.randn(5, 1, 3))
