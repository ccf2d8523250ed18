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
The ``nn.LSTM``-style encoders (``ablated_lstm``, ``ran``, … in place of ``lstm``) have
``nn.LSTM``'s weight names, so the regexes treat their weights as ``nn.LSTM``'s.  Their one bias
``bias_l{k}`` (every variant but ``lstm``) stands for ``nn.LSTM``'s ``bias_ih_l{k} + bias_hh_l{k}``:
where a regex selects those (``.*bias_hh.*`` with ``lstm_hidden_bias``) and none selects
``bias_l{k}``, the two are built and initialised as ``nn.LSTM``'s would be and each gate's slice
of their sum (``i``, ``f``, ``o``; the S-RNN's content ``h`` takes ``g``'s) becomes that gate's
slice of ``bias_l{k}`` (:func:`lstm_bias_roles`).
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


def lstm_bias_roles(module: torch.nn.Module):
    """``[(name of a single bias in module, [name of nn.LSTM's bias_ih, bias_hh at its place],
    the AblatedRNN, its biased blocks)]`` for the nn.LSTM-style ablated encoders."""
    from .encoders import AblatedSeq2SeqEncoder, AblatedSeq2VecEncoder
    from .encoders import (StackedBidirectionalAblatedSeq2SeqEncoder,
                           StackedBidirectionalAblatedSeq2VecEncoder)

    found = []
    for prefix, encoder in module.named_modules():
        if (not isinstance(encoder, (AblatedSeq2SeqEncoder, AblatedSeq2VecEncoder))
                or isinstance(encoder, (StackedBidirectionalAblatedSeq2SeqEncoder,
                                        StackedBidirectionalAblatedSeq2VecEncoder))):
            continue
        rnn = encoder._module
        base = f"{prefix}._module." if prefix else "_module."
        for layer in rnn._param_names:
            for names in layer:
                if len(names) == 3:  # one bias: bias_l{k}[_reverse]
                    sfx = names[2][len("bias"):]
                    found.append((base + names[2], [base + "bias_ih" + sfx, base + "bias_hh" + sfx],
                                  rnn, rnn.variant.biased_blocks(rnn.highway)))
    return found


_LSTM_SLOT = {"i": 0, "f": 1, "g": 2, "o": 3}


def _first(self, name: str, prevent):
    if prevent is not None and re.search(prevent, name):
        return None
    for regex, initializer in self._initializers:
        if re.search(regex, name):
            return regex, initializer
    return None


def _lstm_biases(self, module, prevent) -> None:
    parameters = dict(module.named_parameters())
    for name, stock, rnn, blocks in lstm_bias_roles(module):
        if _first(self, name, prevent) is not None:
            continue  # a regex names this bias itself: AllenNLP applied it
        chosen = [_first(self, s, prevent) for s in stock]
        if all(c is None for c in chosen):
            continue
        H = rnn.hidden_size
        bound = 1.0 / H ** 0.5
        bias = parameters[name]
        with torch.no_grad():
            total = None
            for s, c in zip(stock, chosen):  # nn.LSTM's 4H bias, its init, then the regex's
                b = torch.empty(4 * H, dtype=bias.dtype, device=bias.device).uniform_(-bound, bound)
                if c is not None:
                    c[1](b, parameter_name=s)
                total = b if total is None else total + b
            for k, block in enumerate(blocks):
                slot = _LSTM_SLOT.get("g" if block == rnn.variant.content_block else block)
                if slot is not None:
                    bias[k * H:(k + 1) * H] = total[slot * H:(slot + 1) * H]
        logger.info("Initializing %s as the sum of nn.LSTM's %s (%s), gate by gate", name,
                    " + ".join(stock), ", ".join(c[0] for c in chosen if c is not None))


def _call(original):
    def __call__(self, module: torch.nn.Module) -> None:
        aliases = stock_names(module)
        if not aliases:
            original(self, module)
            _lstm_biases(self, module, self._prevent_regex)
            return
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
        _lstm_biases(self, module, saved)
    __call__.__wrapped__ = original
    __call__._rnn_ablations = True
    return __call__


def install() -> None:
    """Wrap ``allennlp.nn.InitializerApplicator.__call__`` (idempotent)."""
    from allennlp.nn import InitializerApplicator

    if not getattr(InitializerApplicator.__call__, "_rnn_ablations", False):
        InitializerApplicator.__call__ = _call(InitializerApplicator.__call__)
