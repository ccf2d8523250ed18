"""A config that cannot train on this torch, said in one line before training starts.

allennlp-models' configs give some embeddings ``"sparse": true``; with ``"grad_norm"`` in the
trainer, AllenNLP's ``GradientDescentTrainer`` clips the gradients with ``torch.nn.utils.
clip_grad_norm_``, which on torch 2.x cannot take sparse gradients: training stops at the first
batch with a ``NotImplementedError`` and a list of dispatch keys that does not name the config.
:func:`install` wraps the trainer's constructor (once, when the integration is imported) so that
such a config stops when the trainer is built, with a ``ConfigurationError`` of one line naming
the embedding and what to set (:func:`check_sparse_embeddings`).
"""
from __future__ import annotations

import functools
from typing import List, Optional

import torch

__all__ = ["check_sparse_embeddings", "sparse_gradients_clip", "install"]

_SPARSE_CLIP: Optional[bool] = None


def sparse_gradients_clip() -> bool:
    """Whether this torch's ``clip_grad_norm_`` takes a sparse gradient (tried once, on a
    two-row embedding)."""
    global _SPARSE_CLIP
    if _SPARSE_CLIP is None:
        embedding = torch.nn.Embedding(2, 1, sparse=True)
        embedding(torch.tensor([0])).sum().backward()
        try:
            torch.nn.utils.clip_grad_norm_(embedding.parameters(), 1.0)
            _SPARSE_CLIP = True
        except (NotImplementedError, RuntimeError):
            _SPARSE_CLIP = False
    return _SPARSE_CLIP


def _sparse_embeddings(model: torch.nn.Module) -> List[str]:
    """The modules with sparse weight gradients: ``torch.nn.Embedding`` / ``EmbeddingBag`` and
    AllenNLP's ``Embedding`` (not a subclass of torch's) with ``sparse=True``."""
    return [name or "the model" for name, module in model.named_modules()
            if getattr(module, "sparse", False) is True
            and isinstance(getattr(module, "weight", None), torch.nn.Parameter)]


def check_sparse_embeddings(model: torch.nn.Module, grad_norm) -> None:
    """Raise AllenNLP's ``ConfigurationError`` when the trainer would clip (``grad_norm`` a
    number) sparse gradients that this torch cannot clip."""
    if isinstance(grad_norm, bool) or not grad_norm:
        return
    names = _sparse_embeddings(model)
    if not names or sparse_gradients_clip():
        return
    from allennlp.common.checks import ConfigurationError

    raise ConfigurationError(
        f'set "sparse": false in the config\'s embedding ({", ".join(names)}): with "sparse": '
        f'true and the trainer\'s "grad_norm", torch {torch.__version__}\'s clip_grad_norm_ '
        "fails on its sparse gradients")


def install() -> None:
    """Wrap ``GradientDescentTrainer.__init__`` to run :func:`check_sparse_embeddings`
    (idempotent)."""
    from allennlp.training.gradient_descent_trainer import GradientDescentTrainer

    original = GradientDescentTrainer.__init__
    if getattr(original, "_rnn_ablations", False):
        return

    @functools.wraps(original)
    def __init__(self, model, *args, **kwargs):
        original(self, model, *args, **kwargs)
        check_sparse_embeddings(self.model, getattr(self, "_grad_norm", None))

    __init__._rnn_ablations = True
    GradientDescentTrainer.__init__ = __init__
