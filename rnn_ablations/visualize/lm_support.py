"""Language-model checkpoints of ``rnn-ablations lm train`` (:mod:`rnn_ablations.lm`).

A run directory holds the checkpoint that :func:`rnn_ablations.lm.load_checkpoint` reads and
verifies (format and checksum): the variant, the config, the vocabulary (``"vocab"``, a list of
words) and the model's state dict.  The model is rebuilt with
:func:`rnn_ablations.lm.model_from_checkpoint`; a text is split on white space, mapped through the
vocabulary (``<unk>`` for unknown words) and run through the model's embedding and recurrent
layers (``layers.0``, ``layers.1``, …, one ``AblatedRNN`` each), from a zero state.  Nothing is
appended: type ``<eos>`` yourself if you want it.
"""
from __future__ import annotations

from typing import Callable, Tuple

import torch

from ..lm import Vocabulary, load_checkpoint, model_from_checkpoint
from ..lm.data import UNK
from .embedded import Embedded

__all__ = ["FORMAT_PREFIX", "is_lm_checkpoint", "load"]

#: every format tag of an ``rnn-ablations lm`` checkpoint starts with this
FORMAT_PREFIX = "rnn_ablations.lm/"


def is_lm_checkpoint(obj) -> bool:
    """Whether a loaded torch object is a language-model checkpoint (of any format version)."""
    return isinstance(obj, dict) and isinstance(obj.get("format"), str) and \
        obj["format"].startswith(FORMAT_PREFIX)


def load(path) -> Tuple[torch.nn.Module, Callable[[str, str], Embedded]]:
    """The model of the run directory or checkpoint file ``path`` (verified: a damaged file is
    refused) and the function that runs a text through its embedding and recurrent layers."""
    ckpt = load_checkpoint(path)
    model = model_from_checkpoint(ckpt).eval()
    vocab = Vocabulary(ckpt["vocab"])

    def run(text: str, target: str) -> Embedded:
        tokens = text.split()
        if not tokens:
            raise ValueError("the text is empty: give at least one word")
        unknown = [t for t in tokens if t not in vocab]
        if unknown and UNK not in vocab:
            raise ValueError(f"word(s) {', '.join(repr(t) for t in unknown)} are not in the "
                             f"language model's vocabulary, which has no {UNK} token")
        ids, _ = vocab.encode(tokens)
        with torch.no_grad():
            model(ids.view(-1, 1))
        return Embedded(tokens, unknown)

    return model, run
