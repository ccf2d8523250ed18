"""``onmt_translate -beam_size 5 -replace_unk`` (the papers' NMT evaluation) with OpenNMT-py
3.5.1's RNN decoder with input feeding (its default).

That decoder stacks the attention of its steps time-major, ``(steps, batch, src_len)``, while
the translator's searches index a decoding step's attention batch-first, ``(batch, 1,
src_len)``, as the transformer decoder and the RNN decoder without input feeding return it.  So
whenever the search keeps the attention (``-replace_unk``, ``-phrase_table``, a coverage
penalty), beam search fails with ``IndexError`` in ``beam_search.advance`` (``-beam_size`` > 1)
and greedy search with more than one sentence per batch; the encoder plays no part (OpenNMT's own
``brnn`` fails alike).  :func:`install` makes that decoder return a decoding step's attention
batch-first, during step-wise decoding only (``step`` given: translation); training, which
reads the stacked attention time-major, is unchanged.
"""
from __future__ import annotations

import functools

from .options import wrapped

__all__ = ["install", "step_attention_batch_first"]


def step_attention_batch_first(attns: dict) -> dict:
    """``attns`` of one decoding step of the input-feeding RNN decoder, each ``(1, batch,
    src_len)`` tensor as ``(batch, 1, src_len)``."""
    return {k: (v.transpose(0, 1) if hasattr(v, "dim") and v.dim() == 3 else v)
            for k, v in attns.items()}


def install() -> None:
    """Patch ``onmt.decoders.decoder.InputFeedRNNDecoder.forward`` (idempotent)."""
    from onmt.decoders.decoder import InputFeedRNNDecoder

    current = InputFeedRNNDecoder.__dict__.get("forward")
    if current is not None and wrapped(current):
        return
    original = InputFeedRNNDecoder.forward   # RNNDecoderBase.forward, inherited

    @functools.wraps(original)
    def forward(self, tgt, enc_out, src_len=None, step=None, **kwargs):
        dec_outs, attns = original(self, tgt, enc_out, src_len=src_len, step=step, **kwargs)
        if step is not None:
            attns = step_attention_batch_first(attns)
        return dec_outs, attns

    forward.__rnn_ablations_wrapped__ = True
    InputFeedRNNDecoder.forward = forward
