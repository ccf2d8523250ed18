"""AllenNLP's ``InitializerApplicator`` on the ablated encoders: a config's initializer treats a
``stacked_bidirectional_<variant>`` encoder exactly as it treats the
``stacked_bidirectional_lstm`` (``AugmentedLstm``) it replaces.

An initializer block selects parameters by name.  The stock biaffine parser's block
(allennlp-models) has the ``nn.LSTM``-style regexes ``.*weight_ih.*`` (xavier),
``.*weight_hh.*`` (orthogonal) and ``.*bias_hh.*`` (``lstm_hidden_bias``), which match none of
``AugmentedLstm``'s parameters (``…forward_layer_{k}.cell.input_linearity.weight``,
``….state_linearity.weight``, ``….state_linearity.bias``), so the stock encoder keeps its own
initialisation.  ``AblatedRNN``'s parameters carry ``nn.LSTM``'s names (``weight_ih_l{k}``, …), so
the same regexes would re-initialise every matrix of a ``stacked_bidirectional_ran`` put in its
place by a one-line change of the config, and the comparison would be confounded.

:func:`install` wraps ``InitializerApplicator.__call__`` (once, when the integration is
imported): inside a ``stacked_bidirectional_<variant>`` encoder each parameter is matched, against
the regexes and the ``prevent_regexes``, under the name of the ``AugmentedLstm`` parameter of the
same role (:func:`stock_names`), and initialised by the first regex that matches that name, as
the stock encoder's parameter would be.  Every other parameter is handled by AllenNLP as before.
The ``nn.LSTM``-style encoders (``ablated_lstm``, ``ran``, … in place of ``lstm``) already have
``nn.LSTM``'s names, so the regexes treat them as they treat ``nn.LSTM``.
"""
from __future__ import annotations

import logging
import re
from typing import Dict

import torch

logger = logging.getLogger(__name__)

__all__ = ["stock_names", "install"]


def stock_names(module: torch.nn.Module) -> Dict[str, str]:
    """``{name of an ablated stacked encoder's parameter in module: the name of the AugmentedLstm
    parameter of the same role in the stacked_bidirectional_lstm it replaces}``."""
    from .encoders import (StackedBidirectionalAblatedSeq2SeqEncoder,
                           StackedBidirectionalAblatedSeq2VecEncoder)

    found: Dict[str, str] = {}
    for prefix, encoder in module.named_modules():
        if not isinstance(encoder, (StackedBidirectionalAblatedSeq2SeqEncoder,
                                    StackedBidirectionalAblatedSeq2VecEncoder)):
            continue
        base = f"{prefix}._module." if prefix else "_module."
        rnn = encoder._module
        for layer in range(rnn.num_layers):
            for direction in range(rnn.num_directions):
                cell = f"{base}{'backward' if direction else 'forward'}_layer_{layer}.cell."
                names = rnn.parameter_names(layer, direction)
                roles = (["input_linearity.weight", "state_linearity.weight"]
                         + ["state_linearity.bias"] * (len(names) - 2))
                for name, role in zip(names, roles):
                    if name is not None:
                        found[base + name] = cell + role
    return found


def _call(original):
    def __call__(self, module: torch.nn.Module) -> None:
        aliases = stock_names(module)
        if not aliases:
            return original(self, module)
        # AllenNLP's own pass, with the ablated stacked encoders' parameters held out
        held_out = "|".join("^" + re.escape(name) + "$" for name in aliases)
        saved = self._prevent_regex
        self._prevent_regex = held_out if saved is None else f"{saved}|{held_out}"
        try:
            original(self, module)
        finally:
            self._prevent_regex = saved
        parameters = dict(module.named_parameters())
        for name, stock in aliases.items():
            if saved is not None and re.search(saved, stock):
                continue
            for regex, initializer in self._initializers:
                if re.search(regex, stock):
                    logger.info("Initializing %s (as %s of stacked_bidirectional_lstm) using %s "
                                "initializer", name, stock, regex)
                    initializer(parameters[name], parameter_name=name)
                    break
    __call__.__wrapped__ = original
    __call__._rnn_ablations = True
    return __call__


def install() -> None:
    """Wrap ``allennlp.nn.InitializerApplicator.__call__`` (idempotent)."""
    from allennlp.nn import InitializerApplicator

    if not getattr(InitializerApplicator.__call__, "_rnn_ablations", False):
        InitializerApplicator.__call__ = _call(InitializerApplicator.__call__)
