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
``lstm_minus_srnn_``   LSTM − S-RNN − HIDDEN           i,f,o = σ(W_·x x_t + b_·)  (no h_{t-1})
``minus_hidden``       (ACL 2018 version)              c̃_t = W_cx x_t (no bias)
                                                       c_t = i_t∘c̃_t + f_t∘c_{t-1};  h_t = o_t∘tanh(c_t)
=====================  ==============================  =============================================

Every implementation (the generic PyTorch path, the C++/CUDA kernels, ``weighted_sum``) reads the
layout of the pre-activations from :class:`Variant`:

* ``recurrent``: the blocks of ``H`` rows that read both ``x_t`` and ``h_{t-1}``; they form
  ``weight_hh`` (``len(recurrent)·H × H``) and the first part of the bias.
* ``input_only_biased``: blocks that read only ``x_t`` but have a bias (the gates of
  LSTM − S-RNN − HIDDEN); they continue the bias.
* ``input_only``: the blocks that read only ``x_t`` and have no bias (the ablations' content
  ``c̃_t = W_cx x_t``).  ``weight_ih`` stacks ``recurrent``, ``input_only_biased``, ``input_only``.

A variant with no recurrent block (``reads_hidden`` False) has no ``weight_hh`` and no per-step
matrix product: its memory is an element-wise linear recurrence, run as one input projection
plus an element-wise scan (:mod:`rnn_ablations.scan`).

The optional highway connection of AllenNLP's ``AugmentedLstm`` adds a gate ``r`` and an
input-only projection ``hw`` (no bias): ``h_t ← r_t∘h_t + (1 − r_t)∘W_hw x_t``, with
``r_t = σ(W_rh h_{t-1} + W_rx x_t + b_r)`` (a recurrent block) in a cell that reads h_{t-1}, and
``r_t = σ(W_rx x_t + b_r)`` (a biased input-only block) in one that does not.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, Optional, Tuple

__all__ = ["Variant", "VARIANTS", "ALIASES", "get_variant", "recurrent_param_count"]

# Integer codes shared with the step kernels (rnn_ablations/csrc/common.h); a variant that never
# reads h_{t-1} has none (``Variant.kind`` is None) and runs through rnn_ablations/scan.py.
KIND_LSTM, KIND_SRNN, KIND_MINUS_SRNN, KIND_RAN, KIND_IDENTITY_RAN = range(5)
# Every variant's code in AblatedRNN's ``variant_state`` buffer (``Variant.code``): the step-kernel
# code where there is one, then codes the step kernels refuse (csrc/common.h ``check_kind`` names
# CODE_MINUS_HIDDEN as the scan kernel's).
CODE_MINUS_HIDDEN = 5


@dataclasses.dataclass(frozen=True, kw_only=True)
class Variant:
    """One row of the table.  Every rule about a variant is a field (or derived from one), so
    that the implementations never compare variant names or codes."""

    name: str
    paper_name: str
    #: code of the step kernels (``KIND_*``, shared with ``csrc/common.h``), or ``None`` for a
    #: variant the step kernels do not run (one that never reads h_{t-1}: it runs through the
    #: element-wise scan of :mod:`rnn_ablations.scan`).
    kind: Optional[int]
    #: blocks (in weight order) that read x_t and h_{t-1} and have a bias; activation σ except
    #: the content block (``content_block``) and the S-RNN's "h" (tanh).
    recurrent: Tuple[str, ...]
    #: blocks that read x_t only and have no bias.
    input_only: Tuple[str, ...]
    #: True when the cell has a memory c_t that is a weighted sum of contents.
    has_memory: bool
    #: how h_t is computed from c_t: "o_tanh", "tanh", "identity" ("srnn" for the S-RNN).
    output: str
    #: True when the content c̃_t depends on x_t only (the state is then a weighted sum of
    #: linear functions of the inputs).
    context_independent_content: bool
    equations: str
    #: blocks that read x_t only but have a bias (the gates of a cell that never reads h_{t-1});
    #: in ``weight_ih`` they follow the recurrent blocks and precede ``input_only``.
    input_only_biased: Tuple[str, ...] = ()
    #: the block that holds the content c̃_t (``None``: no memory) and its activation.
    content_block: Optional[str] = None
    content_activation: str = "identity"
    #: the variant's code in :class:`~rnn_ablations.AblatedRNN`'s ``variant_state`` buffer
    #: (unique; equal to ``kind`` when the step kernels run the variant).  ``None``: ``kind``.
    code: Optional[int] = None

    def __post_init__(self) -> None:
        if self.output not in ("o_tanh", "tanh", "identity", "srnn"):
            raise ValueError(f"variant {self.name!r}: unknown output rule {self.output!r}")
        if self.content_activation not in ("tanh", "identity"):
            raise ValueError(f"variant {self.name!r}: content_activation must be 'tanh' or "
                             f"'identity', got {self.content_activation!r}")
        if self.code is None:
            if self.kind is None:
                raise ValueError(f"variant {self.name!r}: a variant without a step-kernel kind "
                                 "needs its own state code")
            object.__setattr__(self, "code", self.kind)
        elif self.kind is not None and self.code != self.kind:
            raise ValueError(f"variant {self.name!r}: code {self.code} must equal kind {self.kind}")
        names = self.recurrent + self.input_only_biased + self.input_only
        if len(set(names)) != len(names) or {"r", "hw"} & set(names):
            raise ValueError(f"variant {self.name!r}: block names must be unique and not 'r'/'hw' "
                             f"(the highway blocks), got {names}")
        if self.has_memory != (self.content_block is not None):
            raise ValueError(f"variant {self.name!r}: a cell has a memory iff it has a content block")
        if self.content_block is not None and self.content_block not in names:
            raise ValueError(f"variant {self.name!r}: content block {self.content_block!r} is not "
                             f"one of its blocks {names}")
        if (self.kind is None) == self.reads_hidden:
            raise ValueError(f"variant {self.name!r}: the step kernels (kind) run exactly the "
                             "variants that read h_{t-1}")

    @property
    def reads_hidden(self) -> bool:
        """True when some block reads h_{t-1} (the cell then has ``weight_hh`` and a per-step
        matrix product); False for a cell whose only recurrence is the element-wise memory."""
        return bool(self.recurrent)

    def _layout(self, highway: bool) -> Tuple[Tuple[str, ...], Tuple[str, ...], Tuple[str, ...]]:
        """(recurrent, input-only with bias, input-only without bias).  The highway gate ``r``
        reads what the other gates read (h_{t-1} too when the cell reads it); the highway
        projection ``hw`` reads x_t only and has no bias."""
        rec, biased, plain = self.recurrent, self.input_only_biased, self.input_only
        if highway:
            if self.reads_hidden:
                rec = rec + ("r",)
            else:
                biased = biased + ("r",)
            plain = plain + ("hw",)
        return rec, biased, plain

    def blocks(self, highway: bool = False) -> Tuple[Tuple[str, ...], Tuple[str, ...]]:
        """(recurrent blocks, input-only blocks), with the highway blocks when asked for; the
        input-only blocks are those with a bias first, then those without (``weight_ih`` order)."""
        rec, biased, plain = self._layout(highway)
        return rec, biased + plain

    def biased_blocks(self, highway: bool = False) -> Tuple[str, ...]:
        """The blocks that have a bias, in the order of the bias vector (the first rows of
        ``weight_ih``)."""
        rec, biased, _ = self._layout(highway)
        return rec + biased

    def num_recurrent(self, highway: bool = False) -> int:
        return len(self.blocks(highway)[0])

    def num_input_only(self, highway: bool = False) -> int:
        return len(self.blocks(highway)[1])

    def num_biased(self, highway: bool = False) -> int:
        return len(self.biased_blocks(highway))

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


_IFO = "i,f,o = σ(W·h h_{t-1} + W·x x_t + b·); "
_MEMORY = "c_t = i∘c̃ + f∘c_{t-1}; "
VARIANTS_TABLE: Dict[str, Variant] = {
    v.name: v
    for v in (
        Variant(name="lstm", paper_name="LSTM", kind=KIND_LSTM,
                recurrent=("i", "f", "g", "o"), input_only=(), has_memory=True, output="o_tanh",
                content_block="g", content_activation="tanh",
                context_independent_content=False,
                equations=_IFO + "c̃ = tanh(W_ch h_{t-1} + W_cx x_t + b_c); " + _MEMORY
                + "h_t = o∘tanh(c_t)"),
        Variant(name="srnn", paper_name="LSTM − GATES (S-RNN)", kind=KIND_SRNN,
                recurrent=("h",), input_only=(), has_memory=False, output="srnn",
                context_independent_content=False,
                equations="h_t = tanh(W_hh h_{t-1} + W_hx x_t + b_h)"),
        Variant(name="lstm_minus_srnn", paper_name="LSTM − S-RNN", kind=KIND_MINUS_SRNN,
                recurrent=("i", "f", "o"), input_only=("c",), has_memory=True, output="o_tanh",
                content_block="c", context_independent_content=True,
                equations=_IFO + "c̃ = W_cx x_t; " + _MEMORY + "h_t = o∘tanh(c_t)"),
        Variant(name="ran", paper_name="LSTM − S-RNN − OUT (tanh RAN)", kind=KIND_RAN,
                recurrent=("i", "f"), input_only=("c",), has_memory=True, output="tanh",
                content_block="c", context_independent_content=True,
                equations="i,f = σ(W·h h_{t-1} + W·x x_t + b·); c̃ = W_cx x_t; " + _MEMORY
                + "h_t = tanh(c_t)"),
        Variant(name="identity_ran", paper_name="identity RAN", kind=KIND_IDENTITY_RAN,
                recurrent=("i", "f"), input_only=("c",), has_memory=True, output="identity",
                content_block="c", context_independent_content=True,
                equations="i,f = σ(W·h h_{t-1} + W·x x_t + b·); c̃ = W_cx x_t; " + _MEMORY
                + "h_t = c_t"),
        Variant(name="lstm_minus_srnn_minus_hidden", paper_name="LSTM − S-RNN − HIDDEN",
                kind=None, code=CODE_MINUS_HIDDEN, recurrent=(), input_only_biased=("i", "f", "o"),
                input_only=("c",),
                has_memory=True, output="o_tanh", content_block="c",
                context_independent_content=True,
                equations="i,f,o = σ(W·x x_t + b·); c̃ = W_cx x_t; " + _MEMORY
                + "h_t = o∘tanh(c_t)"),
    )
}

#: Canonical variant names, in the order of the papers' ablation table.
VARIANTS: Tuple[str, ...] = tuple(VARIANTS_TABLE)
if len({v.code for v in VARIANTS_TABLE.values()}) != len(VARIANTS_TABLE):  # pragma: no cover
    raise ValueError("every variant needs its own Variant.code (AblatedRNN's variant_state)")

ALIASES: Dict[str, str] = {
    "lstm_minus_gates": "srnn",
    "s_rnn": "srnn",
    "lstm_minus_srnn_minus_out": "ran",
    "tanh_ran": "ran",
    "minus_hidden": "lstm_minus_srnn_minus_hidden",
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
    match).  RAN layer: 2H² + 3H·d_in (+ 2H).  LSTM − S-RNN − HIDDEN layer: 4H·d_in (+ 3H), no
    H² term.
    """
    v = get_variant(variant)
    rec, inp = v.num_recurrent(highway), v.num_input_only(highway)
    dirs = 2 if bidirectional else 1
    total = 0
    for layer in range(num_layers):
        d_in = input_size if layer == 0 else hidden_size * dirs
        n = (rec + inp) * hidden_size * d_in + rec * hidden_size * hidden_size
        if bias:
            n += v.num_biased(highway) * hidden_size * (2 if v.uses_lstm_bias_names(highway) else 1)
        total += n * dirs
    return total
