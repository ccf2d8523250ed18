"""The variant table: the one place where the equations of the ablations live.

Notation (``../shared/DESIGN.md`` §1): inputs ``x_t``, outputs ``h_t``, memory ``c_t``,
``σ`` the logistic sigmoid, ``∘`` the element-wise product.

=====================  ==============================  =============================================
variant                paper name                      recurrence
=====================  ==============================  =============================================
``lstm``               LSTM                            i,f,o = σ(W_·h h_{t-1} + W_·x x_t + b_·)
                                                       c̃_t = tanh(W_ch h_{t-1} + W_cx x_t + b_c)
                                                       c_t = i_t∘c̃_t + f_t∘c_{t-1};  h_t = o_t∘tanh(c_t)
``srnn``               LSTM − GATES (= S-RNN)          h_t = tanh(W_hh h_{t-1} + W_hx x_t + b_h)
``lstm_minus_srnn``    LSTM − S-RNN                    i,f,o as LSTM;  c̃_t = W_cx x_t (no bias)
                                                       c_t = i_t∘c̃_t + f_t∘c_{t-1};  h_t = o_t∘tanh(c_t)
``ran``                LSTM − S-RNN − OUT (tanh RAN)   i,f as LSTM;  c̃_t = W_cx x_t (no bias)
                                                       c_t = i_t∘c̃_t + f_t∘c_{t-1};  h_t = tanh(c_t)
``identity_ran``       identity RAN                    as ``ran`` but h_t = c_t
=====================  ==============================  =============================================

Every implementation (the generic PyTorch path, the C++ kernel, ``weighted_sum``) reads the
layout of the pre-activations from :class:`Variant`:

* ``recurrent``: the blocks of ``H`` rows that read both ``x_t`` and ``h_{t-1}``; they form
  ``weight_hh`` (``len(recurrent)·H × H``) and the bias (one entry per row).
* ``input_only``: the blocks that read only ``x_t`` (the ablations' content ``c̃_t = W_cx x_t``,
  which has no bias).  ``weight_ih`` stacks ``recurrent`` then ``input_only`` blocks.

The optional highway connection of AllenNLP's ``AugmentedLstm`` adds one recurrent block ``r``
(gate) and one input-only block ``hw`` (projection):
``h_t ← r_t∘h_t + (1 − r_t)∘W_hw x_t`` with ``r_t = σ(W_rh h_{t-1} + W_rx x_t + b_r)``.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, Tuple

__all__ = ["Variant", "VARIANTS", "ALIASES", "get_variant", "recurrent_param_count"]

# Integer codes shared with the C++ kernel (rnn_ablations/csrc/ablated_rnn.cpp).
KIND_LSTM, KIND_SRNN, KIND_MINUS_SRNN, KIND_RAN, KIND_IDENTITY_RAN = range(5)


@dataclasses.dataclass(frozen=True)
class Variant:
    name: str
    paper_name: str
    kind: int
    #: blocks (in weight order) that read h_{t-1}; activation σ except the LSTM's "g" (tanh)
    #: and the S-RNN's "h" (tanh).
    recurrent: Tuple[str, ...]
    #: blocks that read x_t only (no bias).
    input_only: Tuple[str, ...]
    #: True when the cell has a memory c_t that is a weighted sum of contents.
    has_memory: bool
    #: how h_t is computed from c_t: "o_tanh", "tanh", "identity" ("srnn" for the S-RNN).
    output: str
    #: True when the content c̃_t depends on x_t only (the state is then a weighted sum of
    #: linear functions of the inputs).
    context_independent_content: bool
    equations: str

    def blocks(self, highway: bool = False) -> Tuple[Tuple[str, ...], Tuple[str, ...]]:
        """(recurrent blocks, input-only blocks), with the highway blocks when asked for."""
        if highway:
            return self.recurrent + ("r",), self.input_only + ("hw",)
        return self.recurrent, self.input_only

    def num_recurrent(self, highway: bool = False) -> int:
        return len(self.blocks(highway)[0])

    def num_input_only(self, highway: bool = False) -> int:
        return len(self.blocks(highway)[1])

    def block_index(self, block: str, highway: bool = False) -> int:
        """Index of ``block`` among the rows of ``weight_ih`` (in units of H)."""
        rec, inp = self.blocks(highway)
        order = rec + inp
        if block not in order:
            raise KeyError(f"variant {self.name!r} has no block {block!r}; it has {order}")
        return order.index(block)

    def uses_lstm_bias_names(self, highway: bool = False) -> bool:
        """Only the plain LSTM keeps ``torch.nn.LSTM``'s two 4H biases (``bias_ih``/``bias_hh``).

        Every other cell has a single bias called ``bias_l{k}``: an initializer written for
        ``nn.LSTM`` names (AllenNLP's ``lstm_hidden_bias`` on ``.*bias_hh.*`` assumes a 4H vector
        and sets its second quarter to 1) therefore never touches a 1H, 2H, 3H or 5H bias.
        """
        return self.kind == KIND_LSTM and not highway


VARIANTS_TABLE: Dict[str, Variant] = {
    v.name: v
    for v in (
        Variant("lstm", "LSTM", KIND_LSTM, ("i", "f", "g", "o"), (), True, "o_tanh", False,
                "i,f,o = σ(W·h h_{t-1} + W·x x_t + b·); c̃ = tanh(W_ch h_{t-1} + W_cx x_t + b_c); "
                "c_t = i∘c̃ + f∘c_{t-1}; h_t = o∘tanh(c_t)"),
        Variant("srnn", "LSTM − GATES (S-RNN)", KIND_SRNN, ("h",), (), False, "srnn", False,
                "h_t = tanh(W_hh h_{t-1} + W_hx x_t + b_h)"),
        Variant("lstm_minus_srnn", "LSTM − S-RNN", KIND_MINUS_SRNN, ("i", "f", "o"), ("c",), True,
                "o_tanh", True,
                "i,f,o = σ(W·h h_{t-1} + W·x x_t + b·); c̃ = W_cx x_t; c_t = i∘c̃ + f∘c_{t-1}; "
                "h_t = o∘tanh(c_t)"),
        Variant("ran", "LSTM − S-RNN − OUT (tanh RAN)", KIND_RAN, ("i", "f"), ("c",), True, "tanh",
                True,
                "i,f = σ(W·h h_{t-1} + W·x x_t + b·); c̃ = W_cx x_t; c_t = i∘c̃ + f∘c_{t-1}; "
                "h_t = tanh(c_t)"),
        Variant("identity_ran", "identity RAN", KIND_IDENTITY_RAN, ("i", "f"), ("c",), True,
                "identity", True,
                "i,f = σ(W·h h_{t-1} + W·x x_t + b·); c̃ = W_cx x_t; c_t = i∘c̃ + f∘c_{t-1}; h_t = c_t"),
    )
}

#: Canonical variant names, in the order of the papers' ablation table.
VARIANTS: Tuple[str, ...] = tuple(VARIANTS_TABLE)

ALIASES: Dict[str, str] = {
    "lstm_minus_gates": "srnn",
    "s_rnn": "srnn",
    "lstm_minus_srnn_minus_out": "ran",
    "tanh_ran": "ran",
}


def canonical_name(name: str) -> str:
    if not isinstance(name, str):
        raise TypeError(f"variant must be a string such as 'ran', got {type(name).__name__}")
    key = name.strip().lower().replace("-", "_")
    key = ALIASES.get(key, key)
    if key not in VARIANTS_TABLE:
        raise ValueError(
            f"unknown variant {name!r}; valid variants are {', '.join(VARIANTS)} "
            f"(aliases: {', '.join(f'{a} → {c}' for a, c in ALIASES.items())})"
        )
    return key


def get_variant(name) -> Variant:
    """Look a variant up by canonical name or alias (case-insensitive, ``-`` = ``_``)."""
    if isinstance(name, Variant):
        return name
    return VARIANTS_TABLE[canonical_name(name)]


def recurrent_param_count(variant, input_size: int, hidden_size: int, num_layers: int = 1,
                          bias: bool = True, bidirectional: bool = False,
                          highway: bool = False) -> int:
    """Number of parameters of a stack of cells (what :class:`AblatedRNN` allocates).

    LSTM layer: 4H² + 4H·d_in (+ 4H, counted once as in the RAN paper's Table 1; ``nn.LSTM``
    stores it twice, which :class:`AblatedRNN` also does for ``lstm`` so that state dicts
    match).  RAN layer: 2H² + 3H·d_in (+ 2H).
    """
    v = get_variant(variant)
    rec, inp = v.num_recurrent(highway), v.num_input_only(highway)
    dirs = 2 if bidirectional else 1
    total = 0
    for layer in range(num_layers):
        d_in = input_size if layer == 0 else hidden_size * dirs
        n = (rec + inp) * hidden_size * d_in + rec * hidden_size * hidden_size
        if bias:
            n += rec * hidden_size * (2 if v.uses_lstm_bias_names(highway) else 1)
        total += n * dirs
    return total
