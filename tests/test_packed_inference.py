"""A PackedSequence runs in the order its packing sorted the rows: padded once in that order
(no second copy to reorder the batch), the output packed from it (no sort), only the states
reordered; the results are those of the same rows given as a padded batch with lengths, and it
allocates what that call does plus its padded input and packed output."""
import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import rnn_ablations as ra


@pytest.mark.parametrize("enforce_sorted", [True, False])
@pytest.mark.parametrize("variant", ["lstm", "srnn"])
def test_packed_equals_padded_with_lengths(variant, enforce_sorted):
    torch.manual_seed(0)
    m = ra.AblatedRNN(variant, 5, 6, num_layers=2, bidirectional=True)
    x = torch.randn(7, 4, 5, requires_grad=True)
    lengths = torch.tensor([7, 6, 3, 1]) if enforce_sorted else torch.tensor([3, 7, 1, 6])
    h0 = torch.randn(4, 4, 6, requires_grad=True)
    hx = h0 if not m.variant.has_memory else (h0, torch.randn(4, 4, 6, requires_grad=True))
    packed = pack_padded_sequence(x, lengths, enforce_sorted=enforce_sorted)
    out_p, (h_p, c_p) = m(packed, hx)
    out_l, (h_l, c_l) = m(x, hx, lengths=lengths)
    got, got_len = pad_packed_sequence(out_p)
    assert torch.equal(got_len, lengths)
    torch.testing.assert_close(got, out_l, rtol=0, atol=0)
    torch.testing.assert_close(h_p, h_l, rtol=0, atol=0)
    torch.testing.assert_close(c_p, c_l, rtol=0, atol=0)
    assert out_p.sorted_indices is packed.sorted_indices
    leaves = [x, h0]
    ga = torch.autograd.grad(out_p.data.sum() + h_p.sum() + 2 * c_p.sum(), leaves,
                             retain_graph=True)
    gb = torch.autograd.grad(got.sum() + h_l.sum() + 2 * c_l.sum(), leaves)
    for a, b in zip(ga, gb):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


class _Allocated(TorchDispatchMode):
    """Bytes of the new storages the operators return while it is active (what a call
    allocates in total: deterministic, unlike a resident-memory peak)."""

    def __init__(self):
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0]
                  if isinstance(t, torch.Tensor)}
        new = {}
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                ptr = t.untyped_storage().data_ptr()
                if ptr not in inputs:  # not a view, an in-place or an out= result
                    new[ptr] = t.untyped_storage().nbytes()
        self.bytes += sum(new.values())
        return out


def _allocated(fn) -> int:
    with torch.no_grad(), _Allocated() as mode:
        fn()
    return mode.bytes


def test_packed_inference_allocates_what_the_lengths_call_does():
    """No grad, 2-layer bidirectional lstm: the packed call allocates what the padded call with
    lengths allocates, plus the padded input (its one copy) and the packed output; padding,
    reordering the batch and sorting and packing again around that call (what a packed input
    cost before) allocates a copy of the input and of the output more."""
    T, B, D, H = 30, 16, 8, 8
    torch.manual_seed(0)
    m = ra.AblatedRNN("lstm", D, H, num_layers=2, bidirectional=True)
    x = torch.randn(T, B, D)
    lengths = torch.randint(T // 2, T + 1, (B,))
    lengths[0] = T
    packed = pack_padded_sequence(x, lengths, enforce_sorted=False)
    with torch.no_grad():
        m(packed)  # first-call work (plans, weights) out of the counts
        m(x, lengths=lengths)

    def old():
        xp, n = pad_packed_sequence(packed)
        out, _ = m(xp, lengths=n)
        return pack_padded_sequence(out, n, enforce_sorted=False)

    got = _allocated(lambda: m(packed))
    base = _allocated(lambda: m(x, lengths=lengths))
    before = _allocated(old)
    out_bytes = packed.data.shape[0] * 2 * H * 4
    bound = base + x.numel() * 4 + out_bytes + 4096
    assert got <= bound, (got, base, bound)
    assert before > bound + x.numel() * 4, (before, bound)
