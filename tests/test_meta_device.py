"""A forward on the meta device (no data: shapes and dtypes only, as ``nn.LSTM`` gives them) for
every variant: full, padded (``lengths``) and packed batches, one and two directions, and under
``FlopCounterMode`` (the same count as the same call on the CPU's generic path)."""
from __future__ import annotations

import pytest
import torch
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence
from torch.utils.flop_counter import FlopCounterMode

import rnn_ablations as ra
from rnn_ablations.variants import VARIANTS


@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("variant", VARIANTS)
def test_meta_forward_shapes(variant, bidirectional):
    dirs = 2 if bidirectional else 1
    for dtype in (torch.float32, torch.float64):
        rnn = ra.AblatedRNN(variant, 3, 4, num_layers=2, bidirectional=bidirectional,
                            device="meta", dtype=dtype)
        x = torch.randn(5, 2, 3, device="meta", dtype=dtype)
        out, (h, c) = rnn(x)
        for t, shape in ((out, (5, 2, 4 * dirs)), (h, (2 * dirs, 2, 4)), (c, (2 * dirs, 2, 4))):
            assert t.device.type == "meta" and t.dtype == dtype and tuple(t.shape) == shape
        out, (h, c) = rnn(x, lengths=[5, 3])
        assert out.device.type == "meta" and tuple(out.shape) == (5, 2, 4 * dirs)
        packed = pack_padded_sequence(x, torch.tensor([5, 3]))
        out, (h, c) = rnn(packed)
        assert isinstance(out, PackedSequence)
        assert out.data.device.type == "meta" and tuple(out.data.shape) == (8, 4 * dirs)
        assert h.device.type == "meta" and tuple(h.shape) == (2 * dirs, 2, 4)


@pytest.mark.parametrize("variant", VARIANTS)
def test_meta_flops_match_cpu(variant):
    def count(device):
        torch.manual_seed(0)
        rnn = ra.AblatedRNN(variant, 3, 4, bidirectional=True, device=device)
        with ra.options(backend="generic"), FlopCounterMode(display=False) as counter:
            rnn(torch.randn(5, 2, 3, device=device))
        return counter.get_total_flops()

    assert count("meta") == count("cpu") > 0
