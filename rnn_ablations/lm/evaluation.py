"""Perplexity of a language model on a token stream (the TF PTB tutorial's evaluation).

Perplexity = exp(mean cross-entropy per token) over the whole split, the state carried through
each of ``batch_size`` rows, every window including the last partial one.
"""
from __future__ import annotations

import math
from typing import Dict, Optional

import torch
import torch.nn.functional as F

from .data import Corpus, batchify
from .synthetic import agreement_positions

__all__ = ["evaluate", "long_range_positions"]


@torch.no_grad()
def evaluate(model, data: torch.Tensor, batch_size: int, num_steps: int,
             device=None, positions: Optional[torch.Tensor] = None) -> Dict:
    """Perplexity of ``model`` (a :class:`~rnn_ablations.lm.model.LanguageModel`) on a token
    stream (state carried through each of ``batch_size`` rows; every window including the last
    partial one).  ``positions`` (bool, like ``data``) marks tokens whose next-token accuracy is
    also reported (``long_range_acc``): the synthetic corpus's agreeing verbs."""
    if data is None or data.numel() < 2:
        raise ValueError("cannot evaluate on an empty split")
    device = device or next(model.parameters()).device
    batch_size = max(1, min(batch_size, data.numel() // 2))
    rows = batchify(data, batch_size).to(device)
    pos = None
    if positions is not None:
        pos = positions[: rows.numel()].view(batch_size, -1).to(device)
    was_training = model.training
    model.eval()
    state = model.init_state(batch_size)
    total = torch.zeros((), dtype=torch.float64, device=device)
    n_tok, hits, n_pos = 0, 0, 0
    n = rows.shape[1] - 1
    for i in range(0, n, num_steps):
        t = min(num_steps, n - i)
        x = rows[:, i:i + t].t()
        y = rows[:, i + 1:i + 1 + t].t()
        logits, state = model(x, state)
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="sum")
        total += ce.double()
        n_tok += y.numel()
        if pos is not None:
            m = pos[:, i + 1:i + 1 + t].t()
            hits += int((logits.argmax(-1) == y)[m].sum())
            n_pos += int(m.sum())
    model.train(was_training)
    loss = float(total) / n_tok
    out = {"loss": loss, "ppl": math.exp(min(loss, 700.0)), "tokens": n_tok}
    if pos is not None:
        out["long_range_acc"] = hits / n_pos if n_pos else float("nan")
    return out


def long_range_positions(corpus: Corpus, split: str) -> Optional[torch.Tensor]:
    """The agreeing verbs of the embedded synthetic corpus (``None`` for other corpora)."""
    if not corpus.source.startswith("embedded synthetic"):
        return None
    return agreement_positions(corpus, split)
