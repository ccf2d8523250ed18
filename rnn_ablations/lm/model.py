"""The word-level language model of Zaremba et al. (2014) with any recurrent variant.

embedding (V → H) → dropout → ``num_layers`` × [:class:`~rnn_ablations.AblatedRNN` layer →
dropout] → linear softmax layer (H → V).  Dropout is applied to the non-recurrent connections
only: the embedding output, between layers and before the softmax.

Each layer is its own single-layer :class:`~rnn_ablations.AblatedRNN` so that the dropout masks
between layers can be drawn by this module for the *whole* batch from a dedicated generator and
then cut to the rows this process holds: a ``torchrun`` run that gives each process a share of
the batch rows then sees exactly the masks of the single-process run (see
:mod:`rnn_ablations.lm.trainer`).

Initialisation (:meth:`LanguageModel.init_weights`): every parameter U(−init_scale, init_scale)
as the TF tutorial; then the recurrent biases are set to 0 with ``forget_bias`` on the forget
gate's slice (the tutorial's ``BasicLSTMCell`` has a zero-initialised bias and adds
``forget_bias=0.0``).  The same rule is applied to every gated ablation, whose own
:meth:`~rnn_ablations.AblatedRNN.reset_parameters` (forget bias 1) is therefore *not* used here.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from ..rnn import AblatedRNN
from ..validation import Probability, check_positive_int
from ..variants import get_variant, recurrent_param_count

__all__ = ["LanguageModel", "State"]

State = Tuple[torch.Tensor, torch.Tensor]  # (h, c), each (num_layers, B, H)


class LanguageModel(nn.Module):
    dropout = Probability("The dropout on the embedding's and every layer's outputs, in "
                          "training.")

    def __init__(self, variant: str, vocab_size: int, hidden_size: int, num_layers: int,
                 dropout: float = 0.0, init_scale: float = 0.1, forget_bias: float = 0.0):
        super().__init__()
        self.variant = get_variant(variant)
        for name, v in (("vocab_size", vocab_size), ("hidden_size", hidden_size),
                        ("num_layers", num_layers)):
            check_positive_int(name, v)
        self.vocab_size, self.hidden_size, self.num_layers = vocab_size, hidden_size, num_layers
        self.dropout = dropout
        self.init_scale = float(init_scale)
        self.forget_bias = float(forget_bias)
        self.embedding = nn.Embedding(vocab_size, hidden_size)
        self.layers = nn.ModuleList(
            [AblatedRNN(self.variant.name, hidden_size, hidden_size) for _ in range(num_layers)])
        self.decoder = nn.Linear(hidden_size, vocab_size)
        self.init_weights()

    def init_weights(self) -> None:
        """U(−init_scale, init_scale) everywhere; recurrent biases 0, forget gate ``forget_bias``."""
        with torch.no_grad():
            for p in self.parameters():
                p.uniform_(-self.init_scale, self.init_scale)
            rec = self.variant.biased_blocks()  # the bias's blocks, in its order
            H = self.hidden_size
            for layer in self.layers:
                biases = [p for n, p in layer.named_parameters() if n.startswith("bias")]
                for i, b in enumerate(biases):  # lstm: bias_ih, bias_hh; others: one bias
                    b.zero_()
                    if i == 0 and "f" in rec:
                        f = rec.index("f")
                        b[f * H:(f + 1) * H] = self.forget_bias

    def recurrent_parameters(self) -> int:
        """Parameters of the recurrent layers (what the papers' tables count)."""
        return recurrent_param_count(self.variant.name, self.hidden_size, self.hidden_size,
                                     self.num_layers)

    def init_state(self, batch_size: int, device=None, dtype=None) -> State:
        p = self.decoder.weight
        z = torch.zeros(self.num_layers, batch_size, self.hidden_size,
                        device=device or p.device, dtype=dtype or p.dtype)
        return z, z.clone()

    def _drop(self, x: torch.Tensor, rows: Optional[Tuple[int, int, int]],
              generator: Optional[torch.Generator]) -> torch.Tensor:
        # (the boolean and the exact ratio, not the float: validation.Probability)
        if not self.training or not self._dropout_on:
            return x
        num, den = self._dropout_ratio
        if generator is None:
            return F.dropout(x, num / den, True)
        T, B, D = x.shape
        lo, hi, total = rows if rows is not None else (0, B, B)
        keep = 1.0 - num / den
        mask = torch.empty(T, total, D, device=generator.device, dtype=x.dtype)
        mask.bernoulli_(keep, generator=generator)
        mask = mask[:, lo:hi].to(x.device)
        return x * mask / keep

    def forward(self, tokens: torch.Tensor, state: Optional[State] = None, *,
                generator: Optional[torch.Generator] = None,
                rows: Optional[Tuple[int, int, int]] = None):
        """``tokens`` (T, B) int64 → ``logits`` (T, B, V), new ``state`` (h, c) (L, B, H).

        ``generator`` draws the dropout masks (else torch's global RNG); ``rows = (lo, hi,
        total)`` says that these B rows are rows ``lo:hi`` of a batch of ``total`` rows, and the
        masks are drawn for all ``total`` rows and cut (for multi-process training).
        """
        if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2 or tokens.is_floating_point():
            raise ValueError(f"tokens must be a (seq_len, batch) integer tensor, got "
                             f"{getattr(tokens, 'shape', type(tokens).__name__)}")
        T, B = tokens.shape
        if state is None:
            state = self.init_state(B)
        h0, c0 = state
        if tuple(h0.shape) != (self.num_layers, B, self.hidden_size):
            raise ValueError(f"state must be (h, c), each ({self.num_layers}, {B}, "
                             f"{self.hidden_size}); got {tuple(h0.shape)}")
        x = self._drop(self.embedding(tokens), rows, generator)
        hs: List[torch.Tensor] = []
        cs: List[torch.Tensor] = []
        for k, layer in enumerate(self.layers):
            x, (h, c) = layer(x, (h0[k:k + 1], c0[k:k + 1]))
            x = self._drop(x, rows, generator)
            hs.append(h)
            cs.append(c)
        return self.decoder(x), (torch.cat(hs), torch.cat(cs))
