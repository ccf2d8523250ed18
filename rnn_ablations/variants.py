"""The variant table: the one place where the equations of the ablations live.

Notation: inputs ``x_t``, outputs ``h_t``, memory ``c_t``,
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

The element-wise rules are fields too: ``content_block`` and ``content_activation`` (c̃_t),
``has_memory`` (gates ``i``, ``f`` and c_t = i∘c̃ + f∘c_{t-1}), ``output`` (h_t from c_t, or
h_t = c̃_t without memory).  The compiled step kernels receive them as
:attr:`Variant.kernel_spec`, an integer of orthogonal fields (``csrc/common/kernel_spec.h``),
never a variant id; ``Variant.code`` is only the stable number saved in state dicts.  Adding a variant
is a new row here (``CONTRIBUTING.md``).

A variant with no recurrent block (``reads_hidden`` False) has no ``weight_hh`` and no per-step
matrix product: its memory is an element-wise linear recurrence, run as one input projection
plus an element-wise scan (:mod:`rnn_ablations.kernels.scan`).

The optional highway connection of AllenNLP's ``AugmentedLstm`` adds a gate ``r`` and an
input-only projection ``hw`` (no bias): ``h_t ← r_t∘h_t + (1 − r_t)∘W_hw x_t``, with
``r_t = σ(W_rh h_{t-1} + W_rx x_t + b_r)`` (a recurrent block) in a cell that reads h_{t-1}, and
``r_t = σ(W_rx x_t + b_r)`` (a biased input-only block) in one that does not.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, Optional, Tuple

__all__ = ["Variant", "VARIANTS", "ALIASES", "get_variant", "recurrent_param_count"]

#: Every variant's code (``Variant.code``; ``AblatedRNN.variant_state`` and the ``variant_state``
#: entry of saved state dicts hold it, so a code never changes meaning).  The kernels do not
#: read it: they receive :attr:`Variant.kernel_spec`.
CODE_LSTM, CODE_SRNN, CODE_MINUS_SRNN, CODE_RAN, CODE_IDENTITY_RAN, CODE_MINUS_HIDDEN = range(6)

#: Output rules (``Variant.output``): how h_t follows from the step.
OUTPUT_RULES = ("o_tanh", "tanh", "identity", "content")
#: The output rules that read an output gate ``o`` (a block of its own, placed after the content).
_GATED_OUTPUTS = ("o_tanh",)

# The step kernels' spec (csrc/common/kernel_spec.h, decode_kernel_spec): one int64 of orthogonal fields.
# Bits 0-2 the output rule (values 4-7 free), then one bit per field, then the tag in bits 8-15.
# This is the one encoding in Python, under these names: the CUDA launcher (kernels/cuda/structs.py,
# kernels/cuda/programs.py) imports them, and the C++ header's constants are checked against
# them (tests/kernels/test_kernel_spec_encoding.py).
#: output rule name -> its code in the spec (kernel_spec.h OutputRule)
SPEC_OUTPUT: Dict[str, int] = {"content": 0, "o_tanh": 1, "tanh": 2, "identity": 3}
#: the spec's one-bit fields (kernel_spec.h kSpec*)
SPEC_FIELDS: Dict[str, int] = {"content_input_only": 1 << 3, "content_tanh": 1 << 4,
                               "memory": 1 << 5, "reads_hidden": 1 << 6}
SPEC_OUTPUT_MASK = 0x7
SPEC_TAG = 0xA5 << 8
SPEC_TAG_MASK = 0xFF << 8
#: the output rules that read tanh(c_t) (kernel_spec.h output_reads_tanh)
_TANH_OUTPUTS = ("o_tanh", "tanh")
#: the spec's output code -> rule name; those of a cell with memory; those that read o
SPEC_RULE_NAMES: Dict[int, str] = {code: name for name, code in SPEC_OUTPUT.items()}
SPEC_MEMORY_RULES: Dict[int, str] = {code: name for code, name in SPEC_RULE_NAMES.items()
                                     if name != "content"}
SPEC_GATED = frozenset(SPEC_OUTPUT[name] for name in _GATED_OUTPUTS)
SPEC_OUT_CONTENT = SPEC_OUTPUT["content"]
#: every bit a spec may set (the decoders refuse a code with another)
SPEC_KNOWN_BITS = SPEC_OUTPUT_MASK | SPEC_TAG_MASK | sum(SPEC_FIELDS.values())


def output_flags(output: str) -> Tuple[bool, bool]:
    """``(reads an output gate o, reads tanh(c_t))`` of the output rule ``output``
    (``Variant.output``), as the kernels read its code (kernel_spec.h ``output_has_gate``,
    ``output_reads_tanh``); :func:`rnn_ablations.functional.cell_step` computes h_t from them."""
    return output in _GATED_OUTPUTS, output in _TANH_OUTPUTS


@dataclasses.dataclass(frozen=True, kw_only=True)
class Variant:
    """One row of the table.  Every rule about a variant is a field (or derived from one), so
    that the implementations never compare variant names or codes."""

    name: str
    paper_name: str
    #: the variant's code (``AblatedRNN.variant_state``; unique, stable: saved state dicts hold
    #: it).
    code: int
    #: blocks (in weight order) that read x_t and h_{t-1} and have a bias; activation σ except
    #: the content block (``content_block``, activation ``content_activation``).
    recurrent: Tuple[str, ...]
    #: blocks that read x_t only and have no bias.
    input_only: Tuple[str, ...] = ()
    #: blocks that read x_t only but have a bias (the gates of a cell that never reads h_{t-1});
    #: in ``weight_ih`` they follow the recurrent blocks and precede ``input_only``.
    input_only_biased: Tuple[str, ...] = ()
    #: the block that holds the content c̃_t, and its activation ("tanh" or "identity").
    content_block: str
    content_activation: str = "identity"
    #: True when the cell has a memory c_t = i∘c̃_t + f∘c_{t-1} (gates ``i`` and ``f``), a
    #: weighted sum of contents; False: no gates, h_t = c̃_t and the state c is h.
    has_memory: bool
    #: how h_t is computed: "o_tanh" (o∘tanh(c_t), gate ``o``), "tanh" (tanh(c_t)), "identity"
    #: (c_t), or "content" (h_t = c̃_t: a cell without memory, the S-RNN).
    output: str
    #: True when the content c̃_t depends on x_t only (the state is then a weighted sum of
    #: linear functions of the inputs).
    context_independent_content: bool
    #: the parameter names and bias layout of ``torch.nn.LSTM`` (two biases ``bias_ih``/
    #: ``bias_hh``): only the plain LSTM (see :meth:`uses_lstm_bias_names`).
    lstm_parameter_names: bool = False
    #: True when ``hx`` may be a single h_0 tensor (as for ``torch.nn.RNN``): a cell whose state
    #: is h alone.  Default: a cell without memory.
    accepts_single_h0: Optional[bool] = None
    equations: str

    def __post_init__(self) -> None:
        if self.output not in OUTPUT_RULES:
            raise ValueError(f"variant {self.name!r}: unknown output rule {self.output!r}; "
                             f"choose one of {', '.join(OUTPUT_RULES)}")
        if self.content_activation not in ("tanh", "identity"):
            raise ValueError(f"variant {self.name!r}: content_activation must be 'tanh' or "
                             f"'identity', got {self.content_activation!r}")
        if self.accepts_single_h0 is None:
            object.__setattr__(self, "accepts_single_h0", not self.has_memory)
        names = self.recurrent + self.input_only_biased + self.input_only
        if len(set(names)) != len(names) or {"r", "hw"} & set(names):
            raise ValueError(f"variant {self.name!r}: block names must be unique and not 'r'/'hw' "
                             f"(the highway blocks), got {names}")
        if self.content_block not in names:
            raise ValueError(f"variant {self.name!r}: content block {self.content_block!r} is not "
                             f"one of its blocks {names}")
        if self.has_memory != (self.output != "content"):
            raise ValueError(f"variant {self.name!r}: output rule 'content' (h_t = c̃_t) is the "
                             "rule of a cell without memory, and only of one")
        gates = {"i", "f"} | ({"o"} if self.output in _GATED_OUTPUTS else set())
        wanted = (gates | {self.content_block}) if self.has_memory else {self.content_block}
        if set(names) != wanted:
            raise ValueError(f"variant {self.name!r}: blocks {names} do not match its rules "
                             f"(memory {self.has_memory}, output {self.output!r}): it needs "
                             f"exactly {sorted(wanted)}")
        if self.content_block in self.input_only_biased:
            raise ValueError(f"variant {self.name!r}: the content block has no bias; list it in "
                             "recurrent or input_only")
        object.__setattr__(self, "_kernel_spec", self._derive_kernel_spec())

    @property
    def reads_hidden(self) -> bool:
        """True when some block reads h_{t-1} (the cell then has ``weight_hh`` and a per-step
        matrix product); False for a cell whose only recurrence is the element-wise memory."""
        return bool(self.recurrent)

    @property
    def kernel_spec(self) -> int:
        """The step kernels' view of the variant (see :meth:`_derive_kernel_spec`)."""
        return self._kernel_spec  # type: ignore[attr-defined]

    def _derive_kernel_spec(self) -> int:
        """The step kernels' view of the variant (``csrc/common/kernel_spec.h``): one integer of
        orthogonal fields (output rule, content source and activation, memory, whether the gates
        read h_{t-1}), passed to every kernel entry point instead of a variant id.

        The kernels index the blocks in a fixed order, which this checks the table follows:
        recurrent ``i, f, [content], [o]``, input-only ``[content]`` (then the highway blocks).
        A variant that reads h_{t-1} in a form the step kernels have no rule for raises
        ``ValueError`` when the table is built (add the rule: ``CONTRIBUTING.md``)."""
        spec = SPEC_TAG | SPEC_OUTPUT[self.output]
        content_recurrent = self.content_block in self.recurrent
        if not content_recurrent:
            spec |= SPEC_FIELDS["content_input_only"]
        if self.content_activation == "tanh":
            spec |= SPEC_FIELDS["content_tanh"]
        if self.has_memory:
            spec |= SPEC_FIELDS["memory"]
        if self.reads_hidden:
            spec |= SPEC_FIELDS["reads_hidden"]
        if self.has_memory:
            expected_rec = ("i", "f") + ((self.content_block,) if content_recurrent else ()) \
                + (("o",) if self.output in _GATED_OUTPUTS else ())
        else:
            expected_rec = (self.content_block,) if content_recurrent else ()
        expected_inp = () if content_recurrent else (self.content_block,)
        if self.reads_hidden and (self.recurrent, self.input_only_biased + self.input_only) != (
                expected_rec, expected_inp):
            raise ValueError(
                f"variant {self.name!r}: the step kernels read the blocks in the order "
                f"recurrent={expected_rec}, input_only={expected_inp}; the table has "
                f"recurrent={self.recurrent}, input_only={self.input_only_biased + self.input_only}"
                " (reorder the blocks in the table)")
        if self.reads_hidden and not content_recurrent and self.content_activation == "tanh":
            raise ValueError(
                f"variant {self.name!r}: the step kernels have no rule for a tanh of an "
                "input-only content; add one to each kernel family (CONTRIBUTING.md)")
        if self.reads_hidden and not self.has_memory and not content_recurrent:
            raise ValueError(f"variant {self.name!r}: a cell without memory whose content reads "
                             "x_t only has no recurrence")
        if not self.reads_hidden and self.has_memory:
            # the element-wise scan derives its block offsets from the spec in this order
            # (csrc/common/kernel_spec.h, decode_scan_spec)
            expected_biased = ("i", "f") + (("o",) if self.output in _GATED_OUTPUTS else ())
            expected_plain = (self.content_block,)
            if (self.input_only_biased, self.input_only) != (expected_biased, expected_plain):
                raise ValueError(
                    f"variant {self.name!r}: the element-wise scan reads the blocks in the order "
                    f"input_only_biased={expected_biased}, input_only={expected_plain}; the table "
                    f"has input_only_biased={self.input_only_biased}, "
                    f"input_only={self.input_only} (reorder the blocks in the table)")
        return spec

    @property
    def has_step_kernel(self) -> bool:
        """True when the step kernels (``plain_forward`` of the CPU and CUDA kernels …) run the variant:
        it reads h_{t-1}.  (A cell that does not runs through :mod:`rnn_ablations.kernels.scan`.)"""
        return self.reads_hidden

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

    def uses_lstm_bias_names(self, highway: bool = False) -> bool:
        """Only the plain LSTM keeps ``torch.nn.LSTM``'s two 4H biases (``bias_ih``/``bias_hh``).

        Every other cell has a single bias called ``bias_l{k}``: an initializer written for
        ``nn.LSTM`` names (AllenNLP's ``lstm_hidden_bias`` on ``.*bias_hh.*`` assumes a 4H vector
        and sets its second quarter to 1) therefore never touches a 1H, 2H, 3H or 5H bias.
        """
        return self.lstm_parameter_names and not highway


_IFO = "i,f,o = σ(W·h h_{t-1} + W·x x_t + b·); "
_MEMORY = "c_t = i∘c̃ + f∘c_{t-1}; "
VARIANTS_TABLE: Dict[str, Variant] = {
    v.name: v
    for v in (
        Variant(name="lstm", paper_name="LSTM", code=CODE_LSTM,
                recurrent=("i", "f", "g", "o"), content_block="g", content_activation="tanh",
                has_memory=True, output="o_tanh", context_independent_content=False,
                lstm_parameter_names=True,
                equations=_IFO + "c̃ = tanh(W_ch h_{t-1} + W_cx x_t + b_c); " + _MEMORY
                + "h_t = o∘tanh(c_t)"),
        Variant(name="srnn", paper_name="LSTM − GATES (S-RNN)", code=CODE_SRNN,
                recurrent=("h",), content_block="h", content_activation="tanh",
                has_memory=False, output="content", context_independent_content=False,
                equations="h_t = tanh(W_hh h_{t-1} + W_hx x_t + b_h)"),
        Variant(name="lstm_minus_srnn", paper_name="LSTM − S-RNN", code=CODE_MINUS_SRNN,
                recurrent=("i", "f", "o"), input_only=("c",), content_block="c",
                has_memory=True, output="o_tanh", context_independent_content=True,
                equations=_IFO + "c̃ = W_cx x_t; " + _MEMORY + "h_t = o∘tanh(c_t)"),
        Variant(name="ran", paper_name="LSTM − S-RNN − OUT (tanh RAN)", code=CODE_RAN,
                recurrent=("i", "f"), input_only=("c",), content_block="c",
                has_memory=True, output="tanh", context_independent_content=True,
                equations="i,f = σ(W·h h_{t-1} + W·x x_t + b·); c̃ = W_cx x_t; " + _MEMORY
                + "h_t = tanh(c_t)"),
        Variant(name="identity_ran", paper_name="identity RAN", code=CODE_IDENTITY_RAN,
                recurrent=("i", "f"), input_only=("c",), content_block="c",
                has_memory=True, output="identity", context_independent_content=True,
                equations="i,f = σ(W·h h_{t-1} + W·x x_t + b·); c̃ = W_cx x_t; " + _MEMORY
                + "h_t = c_t"),
        Variant(name="lstm_minus_srnn_minus_hidden", paper_name="LSTM − S-RNN − HIDDEN",
                code=CODE_MINUS_HIDDEN, recurrent=(), input_only_biased=("i", "f", "o"),
                input_only=("c",), content_block="c",
                has_memory=True, output="o_tanh", context_independent_content=True,
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
