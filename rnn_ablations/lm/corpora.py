"""Which data a run was trained on: the corpus fingerprint and the spec that rebuilds it.

A checkpoint records ``{"kind": "dir", "path": …}`` or ``{"kind": "synthetic", "spec": {…}}``
(plus ``train_tokens`` for a run on the first tokens of the training split) and the
fingerprint of the corpus; every path that rebuilds the corpus from the checkpoint compares the
two (:func:`check_corpus_matches`), so changed data is refused instead of giving other numbers.
"""
from __future__ import annotations

import dataclasses
import hashlib
from typing import Dict, Sequence

from .data import Corpus, load_corpus
from .synthetic import SyntheticSpec, synthetic_corpus

__all__ = ["corpus_fingerprint", "corpus_from_spec", "truncate_train", "check_corpus_matches"]


def corpus_fingerprint(corpus: Corpus) -> str:
    """A digest of the vocabulary and of every split's token ids."""
    h = hashlib.sha256()
    h.update("\n".join(corpus.vocab.words).encode())
    for split in ("train", "valid", "test"):
        t = corpus.split(split)
        h.update(split.encode())
        if t is not None:
            h.update(t.numpy().tobytes())
    return h.hexdigest()[:16]


def corpus_from_spec(spec: Dict) -> Corpus:
    """Rebuild the corpus a run was trained on (``{"kind": "dir", "path": …}`` or
    ``{"kind": "synthetic", "spec": {…}}``)."""
    kind = spec.get("kind")
    if kind == "dir":
        corpus = load_corpus(spec["path"])
    elif kind == "synthetic":
        corpus = synthetic_corpus(SyntheticSpec(**spec["spec"]))
    else:
        raise ValueError(f"unknown corpus kind {kind!r} in the checkpoint")
    if spec.get("train_tokens"):
        corpus = truncate_train(corpus, spec["train_tokens"])
    return corpus


def truncate_train(corpus: Corpus, train_tokens: int) -> Corpus:
    """The corpus with only the first ``train_tokens`` tokens of its training split (a CPU-sized
    run on big data); valid and test are kept whole."""
    if isinstance(train_tokens, bool) or not isinstance(train_tokens, int) or train_tokens < 2:
        raise ValueError(f"--train-tokens must be an integer >= 2, got {train_tokens!r}")
    if train_tokens >= corpus.train.numel():
        return corpus
    return dataclasses.replace(
        corpus, train=corpus.train[:train_tokens].clone(),
        source=f"{corpus.source} (first {train_tokens:,} of {corpus.train.numel():,} training tokens)")


def check_corpus_matches(corpus: Corpus, vocab: Sequence[str], fingerprint: str,
                         where: str) -> None:
    """Refuse ``corpus`` (rebuilt from a checkpoint's own record of its data) unless it is the
    data the checkpoint was trained on: the same vocabulary and the same fingerprint."""
    if list(corpus.vocab.words) != list(vocab):
        raise ValueError(
            f"the data the checkpoint names ({corpus.source}) has a different vocabulary "
            f"({len(corpus.vocab):,} words) from the one {where} was trained on "
            f"({len(vocab):,} words): the files changed since training, and its perplexity "
            "would be on other word ids. Restore the original data, or pass --data DIR with "
            "files of the same vocabulary")
    if fingerprint and corpus_fingerprint(corpus) != fingerprint:
        raise ValueError(
            f"the data the checkpoint names ({corpus.source}) has changed since {where} was "
            "trained (same vocabulary, different text: the corpus fingerprint differs). Restore "
            "the original files, or pass --data DIR to evaluate on this text deliberately")
