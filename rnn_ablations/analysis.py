"""The weighted-sum view of a memory cell (Levy et al. 2018, §3; Lee et al. 2017, eq. 3).

Unrolling ``c_t = i_t∘c̃_t + f_t∘c_{t-1}`` from ``c_0 = 0`` gives
``c_t = Σ_{j≤t} w_j^t ∘ c̃_j`` with ``w_j^t = i_j ∘ Π_{k=j+1..t} f_k``: every memory state is an
element-wise weighted sum of the contents.  For ``lstm_minus_srnn``, ``ran`` and ``identity_ran``
the content ``c̃_j = W_cx x_j`` depends on the input only; for ``lstm_minus_srnn_minus_hidden``
the gates do too (``i_j, f_k = σ(W x + b)``), so the weights ``w_j^t`` themselves are functions
of the inputs alone.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F

from .functional import generic_layer, reversal_index
from .variants import VARIANTS, get_variant

__all__ = ["WeightedSum", "weighted_sum"]


class WeightedSum(NamedTuple):
    """``memory[b, t] == Σ_j weights[b, t, j] ∘ content[b, j]`` (zero at padded positions)."""

    #: (B, T, T, H): ``weights[b, t, j]`` = w_j^t, zero where the direction does not reach
    #: (j > t for the forward direction, j < t for the backward one) and at padding.
    weights: torch.Tensor
    #: (B, T, H): the content c̃_j (``tanh(W_c [x_j; h_{j-1}] + b_c)`` for ``lstm``).
    content: torch.Tensor
    #: (B, T, H): the memory c_t.
    memory: torch.Tensor
    input_gate: torch.Tensor
    forget_gate: torch.Tensor
    #: (B,) int64 lengths used.
    lengths: torch.Tensor


@torch.no_grad()
def weighted_sum(rnn, input: torch.Tensor, layer: int = 0, direction: int = 0,
                 lengths=None, mask=None) -> WeightedSum:
    """Decompose the memory of one layer/direction of ``rnn`` into its weighted sum.

    ``input`` is laid out as ``rnn`` expects (``batch_first`` or not, ``(T, d_in)`` unbatched);
    the initial state is zero; the model runs without dropout.  Positions are those of the input
    for both directions.
    """
    from .rnn import AblatedRNN

    if not isinstance(rnn, AblatedRNN):
        raise TypeError(f"weighted_sum needs an AblatedRNN, got {type(rnn).__name__}")
    if rnn.proj_size:
        raise ValueError(f"weighted_sum reads h_t unprojected; this AblatedRNN has "
                         f"proj_size={rnn.proj_size}: build it without proj_size for the analysis")
    variant = rnn.variant
    if not variant.has_memory:
        with_memory = [v for v in VARIANTS if get_variant(v).has_memory]
        raise ValueError(f"variant {variant.name!r} ({variant.paper_name}) has no memory cell, so its "
                         f"state is not a weighted sum; use one of {', '.join(with_memory)}")
    if not isinstance(input, torch.Tensor) or input.dim() not in (2, 3):
        raise ValueError("input must be a 2-D (unbatched) or 3-D tensor")
    x = input.unsqueeze(1) if input.dim() == 2 else (input.transpose(0, 1) if rnn.batch_first else input)
    rnn.check_input(x)
    seq_len, batch = x.shape[0], x.shape[1]
    lengths = rnn.normalize_lengths(batch, seq_len, mask=mask, lengths=lengths)
    if lengths is None:
        lengths = torch.full((batch,), seq_len, dtype=torch.int64)
    w_ih, w_hh, b = rnn.projection_parameters(layer, direction)  # validates layer and direction
    was_training = rnn.training
    rnn.eval()
    try:
        layer_input = rnn.layer_input(x, layer, lengths)
    finally:
        rnn.train(was_training)
    steps = torch.arange(seq_len).unsqueeze(1)
    valid = steps < lengths.unsqueeze(0)                         # (T, B)
    if direction == 1:
        pos = reversal_index(lengths, seq_len)  # processing step -> position
        layer_input = layer_input.gather(0, pos.to(x.device).unsqueeze(-1).expand_as(layer_input))
    else:
        pos = steps.expand(seq_len, batch)
    H = rnn.hidden_size
    proj = F.linear(layer_input, w_ih, b)
    rh = 0 if w_hh is None else w_hh.shape[0]  # no weight_hh: the cell reads no h_{t-1}
    z = x.new_zeros(batch, H)
    _, _, _, res = generic_layer(variant, rnn.highway, proj[..., :rh],
                                 proj[..., rh:] if proj.shape[-1] > rh else None, w_hh, z, z,
                                 [batch] * seq_len, keep_steps=True)
    i = torch.stack([r.input_gate for r in res])                 # (T, B, H) processing order
    f = torch.stack([r.forget_gate for r in res])
    content = torch.stack([r.content for r in res])
    memory = torch.stack([r.c for r in res])
    # w[s, j] = i_j Π_{k=j+1..s} f_k, built step by step (no division by small gates)
    w = x.new_zeros(seq_len, seq_len, batch, H)
    for s in range(seq_len):
        if s > 0:
            w[s, :s] = w[s - 1, :s] * f[s]
        w[s, s] = i[s]
    vmask = valid.to(x.device)
    w = w * (vmask.view(seq_len, 1, batch, 1) & vmask.view(1, seq_len, batch, 1))
    # back to input positions
    pos_d = pos.to(x.device)
    inv = torch.empty_like(pos_d)
    inv.scatter_(0, pos_d, steps.expand(seq_len, batch).to(x.device).contiguous())

    def to_pos(t):  # (T, B, ...) processing order -> input positions
        return t.gather(0, inv.view(seq_len, batch, *([1] * (t.dim() - 2))).expand_as(t))

    keep = vmask.unsqueeze(-1)
    content, memory = to_pos(content * keep), to_pos(memory * keep)
    i, f = to_pos(i * keep), to_pos(f * keep)
    inv_w = inv.view(seq_len, 1, batch, 1)
    w = w.gather(0, inv_w.expand_as(w))            # rows (current step) to positions
    w = w.gather(1, inv_w.view(1, seq_len, batch, 1).expand_as(w))  # columns (context word)
    return WeightedSum(weights=w.permute(2, 0, 1, 3).contiguous(), content=content.transpose(0, 1),
                       memory=memory.transpose(0, 1), input_gate=i.transpose(0, 1),
                       forget_gate=f.transpose(0, 1), lengths=lengths)
