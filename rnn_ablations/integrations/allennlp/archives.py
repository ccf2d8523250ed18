"""AllenNLP archives keep the variant record of their encoders.

``AblatedRNN`` records its variant in the state dict's metadata (``state_dict._metadata``), which
``torch.save`` writes into AllenNLP's ``best.th`` / ``weights.th``; AllenNLP's
``allennlp.nn.util.read_state_dict``, through which ``Model.load`` (``allennlp predict``,
``evaluate``, ``load_archive``, ``rnn-ablations visualize``) reads them, copies the tensors into a
new dict and drops it.  A ``ran`` or ``identity_ran`` encoder (whose parameter shapes are the
same) then cannot check the variant and warns.  :func:`install` wraps ``read_state_dict`` (once,
when the integration is imported) to carry the file's metadata over to the dict it returns
(read from the file's pickle; ``mmap``, so no tensor is read twice).
"""
from __future__ import annotations

import functools
from typing import Optional

import torch

__all__ = ["install", "saved_metadata"]


def saved_metadata(path) -> Optional[dict]:
    """The ``_metadata`` of the state dict saved at ``path``, or None (none, or not readable)."""
    try:
        state = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    except Exception:  # noqa: BLE001 - the caller has read the file already; nothing to add
        return None
    metadata = getattr(state, "_metadata", None)
    return dict(metadata) if metadata else None


def install() -> None:
    """Wrap ``allennlp.nn.util.read_state_dict`` (idempotent)."""
    from allennlp.nn import util

    original = util.read_state_dict
    if getattr(original, "_rnn_ablations", False):
        return

    @functools.wraps(original)
    def read_state_dict(path, strip_prefix=None, *args, **kwargs):
        out = original(path, strip_prefix, *args, **kwargs)
        if strip_prefix is None and getattr(out, "_metadata", None) is None:
            metadata = saved_metadata(path)
            if metadata is not None:   # the keys are unchanged: so are the modules' prefixes
                out._metadata = metadata
        return out

    read_state_dict._rnn_ablations = True
    util.read_state_dict = read_state_dict
