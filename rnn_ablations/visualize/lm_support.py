"""Language-model checkpoints of ``rnn-ablations lm train`` (:mod:`rnn_ablations.lm`).

A run directory holds ``checkpoint.pt``: a dict with ``"format": "rnn_ablations.lm/1"``, the
variant, the config, the vocabulary (``"vocab"``, a list of words) and the model's state dict.
The model is rebuilt with :func:`rnn_ablations.lm.trainer.model_from_checkpoint`; a text is split
on white space, mapped through the vocabulary (``<unk>`` for unknown words) and run through the
model's embedding and recurrent layers (``layers.0``, ``layers.1``, …, one ``AblatedRNN`` each),
from a zero state.  Nothing is appended: type ``<eos>`` yourself if you want it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Tuple

import torch

CHECKPOINT_NAME = "checkpoint.pt"


def _format():
    from ..lm.trainer import FORMAT
    return FORMAT


def is_lm_checkpoint(obj) -> bool:
    return isinstance(obj, dict) and isinstance(obj.get("format"), str) and \
        obj["format"].startswith("rnn_ablations.lm/")


def is_run_dir(path) -> bool:
    return (Path(path) / CHECKPOINT_NAME).is_file()


def load(path, obj) -> Tuple[torch.nn.Module, object]:
    from ..lm.data import UNK, Vocabulary
    from ..lm.trainer import model_from_checkpoint, verify_checkpoint
    from .loaders import Embedded

    if obj.get("format") != _format():
        raise ValueError(f"{path} is a language-model checkpoint of format {obj.get('format')!r}; "
                         f"this version reads {_format()!r}")
    ckpt_file = Path(path) / CHECKPOINT_NAME if Path(path).is_dir() else Path(path)
    verify_checkpoint(obj, ckpt_file)      # the checksum: a damaged file is refused
    model = model_from_checkpoint(obj).eval()
    vocab = Vocabulary(obj["vocab"])

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
