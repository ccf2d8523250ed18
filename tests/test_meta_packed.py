"""The meta device (shapes without values) with the inputs whose values the layers read: a
PackedSequence in any batch order, a mask, lengths; the outputs have nn.LSTM's shapes (a meta
PackedSequence for packed input, with the input's batch sizes and orders)."""
import pytest
import torch
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence

import rnn_ablations as ra


@pytest.mark.parametrize("proj_size", [0, 3])
@pytest.mark.parametrize("enforce_sorted", [True, False])
def test_a_meta_packed_sequence_gives_nn_lstms_shapes(enforce_sorted, proj_size):
    m = ra.AblatedRNN("lstm", 3, 4, num_layers=2, bidirectional=True,
                      proj_size=proj_size).to("meta")
    ref = torch.nn.LSTM(3, 4, num_layers=2, bidirectional=True, proj_size=proj_size).to("meta")
    x = torch.empty(5, 3, 3, device="meta")
    lengths = torch.tensor([5, 4, 2]) if enforce_sorted else torch.tensor([2, 5, 4])
    packed = pack_padded_sequence(x, lengths, enforce_sorted=enforce_sorted)
    out, (h, c) = m(packed)
    want, (h_ref, c_ref) = ref(packed)
    assert isinstance(out, PackedSequence) and out.data.is_meta
    assert out.data.shape == want.data.shape and torch.equal(out.batch_sizes, packed.batch_sizes)
    assert out.unsorted_indices is packed.unsorted_indices
    assert h.is_meta and h.shape == h_ref.shape and c.shape == c_ref.shape


def test_a_meta_mask_or_lengths_gives_the_shapes():
    m = ra.AblatedRNN("ran", 3, 4, batch_first=True).to("meta")
    x = torch.empty(2, 5, 3, device="meta")
    for kw in ({"mask": torch.ones(2, 5, dtype=torch.bool, device="meta")},
               {"lengths": torch.ones(2, dtype=torch.int64, device="meta")}):
        out, (h, c) = m(x, **kw)
        assert out.is_meta and out.shape == (2, 5, 4) and h.shape == c.shape == (1, 2, 4)
    with pytest.raises(ValueError, match="mask must be boolean"):
        m(x, mask=torch.ones(2, 5, device="meta"))
    with pytest.raises(ValueError, match=r"mask has shape \(5, 2\)"):
        m(x, mask=torch.ones(5, 2, dtype=torch.bool, device="meta"))
