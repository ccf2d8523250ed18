"""Every variant of :class:`rnn_ablations.AblatedRNN` as an AllenNLP ``Seq2SeqEncoder`` and
``Seq2VecEncoder``.

Registered names (``{"type": ...}`` in a config):

=====================================  ==========================================================
name                                   takes the keyword arguments of
=====================================  ==========================================================
``ablated_lstm``, ``srnn``,            AllenNLP's ``lstm`` (= ``torch.nn.LSTM``): ``input_size,
``lstm_minus_srnn``, ``ran``,          hidden_size, num_layers, bias, dropout, bidirectional``
``identity_ran``,                      (+ ``stateful`` for the ``Seq2SeqEncoder``)
``lstm_minus_srnn_minus_hidden``
``stacked_bidirectional_<variant>``    AllenNLP's ``stacked_bidirectional_lstm``: ``input_size,
(the six names above)                  hidden_size, num_layers, recurrent_dropout_probability,
                                       layer_dropout_probability, use_highway`` (+ ``stateful``)
=====================================  ==========================================================

``ablated_lstm`` is this package's LSTM (the same equations as ``torch.nn.LSTM``, the same
parameter names and initialisation, run by the same code as the ablations); AllenNLP's own
``lstm`` keeps its meaning.  So ``{"type": "lstm", ...}`` becomes ``{"type": "ran", ...}`` and
``{"type": "stacked_bidirectional_lstm", ...}`` becomes ``{"type": "stacked_bidirectional_ran",
...}`` with nothing else changed.

Masks: AllenNLP passes a ``(batch, seq_len)`` boolean mask; it is handed to ``AblatedRNN`` as is
(no sorting or packing).  Rows whose mask is all False (AllenNLP allows them) are not run: their
outputs and final states are zeros, as with AllenNLP's ``PytorchSeq2SeqWrapper``.

``stacked_bidirectional_<variant>`` maps onto ``AblatedRNN(bidirectional=True,
recurrent_dropout=recurrent_dropout_probability, dropout=layer_dropout_probability,
highway=use_highway)``; its output has ``2·hidden_size`` features, as AllenNLP's.  The recurrent
dropout is the one of AllenNLP 2.10.1's ``AugmentedLstm``: one mask per sequence on ``h_{t-1}``
where it enters the recurrence (the layer's outputs are not dropped).  The one difference from
AllenNLP's ``StackedBidirectionalLstm`` is the dropout between layers: ordinary dropout here, a
mask shared over time steps (``InputVariationalDropout``) there.

Initialisation (the same rule for every variant inside each kind of encoder, the rule AllenNLP
gives its own LSTM there):

* ``<variant>`` (AllenNLP's ``lstm`` is ``torch.nn.LSTM``): :meth:`AblatedRNN.reset_parameters`,
  ``nn.LSTM``'s rule, every weight and bias ``U(±1/√H)``.
* ``stacked_bidirectional_<variant>`` (AllenNLP's ``StackedBidirectionalLstm`` is made of
  ``AugmentedLstm`` cells, whose ``reset_parameters`` does this):
  :func:`augmented_lstm_init_`: ``weight_ih`` and ``weight_hh`` block-orthogonal with one
  ``H × d_in`` (``H × H``) orthogonal block per gate/content block (AllenNLP's
  ``block_orthogonal``), every bias 0 except the forget gate's, which is 1 (for ``lstm`` without
  highway, whose biases are ``nn.LSTM``'s ``bias_ih`` + ``bias_hh``: ``bias_ih``'s forget slice 1,
  ``bias_hh`` 0).  ``srnn`` has no forget gate: all its biases are 0, like the content block's
  bias in ``AugmentedLstm``.  ``lstm_minus_srnn_minus_hidden`` has no ``weight_hh``: its
  ``weight_ih`` blocks (``i, f, o, c``, + ``r, hw``) are block-orthogonal like the others', its
  gate biases 0 with the forget gate at 1.  ``AugmentedLstm`` in a ``StackedBidirectionalLstm``
  has no input projection bias and neither do the ablations' bias-free input-only blocks.  Model initializers must
  leave these encoders alone (the biaffine parser configs say so with ``prevent_regexes``).

``lstm_minus_srnn_minus_hidden`` (LSTM − S-RNN − HIDDEN) reads no ``h_{t-1}``: its
``recurrent_dropout_probability`` has no effect (accepted so that the parser config, which sets
0.3, runs unchanged; ``AblatedRNN`` warns) and its highway gate reads the input only,
``r_t = σ(W_rx x_t + b_r)``.
"""
from typing import Dict, List, Optional, Tuple, Type

import torch
from allennlp.common.checks import ConfigurationError
from allennlp.modules.seq2seq_encoders.seq2seq_encoder import Seq2SeqEncoder
from allennlp.modules.seq2vec_encoders.seq2vec_encoder import Seq2VecEncoder
from allennlp.nn.initializers import block_orthogonal

from rnn_ablations.rnn import AblatedRNN
from rnn_ablations.validation import check_prob
from rnn_ablations.variants import VARIANTS

__all__ = [
    "ENCODER_NAMES", "STACKED_ENCODER_NAMES", "encoder_name", "run_masked", "augmented_lstm_init_",
    "AblatedSeq2SeqEncoder", "AblatedSeq2VecEncoder", "StackedBidirectionalAblatedSeq2SeqEncoder",
    "StackedBidirectionalAblatedSeq2VecEncoder", "ConcatLayersSeq2SeqEncoder", "SEQ2SEQ_CLASSES",
    "SEQ2VEC_CLASSES",
]

#: AllenNLP owns ``lstm``: our LSTM is registered as ``ablated_lstm``.
_LSTM_NAME = "ablated_lstm"


def encoder_name(variant: str) -> str:
    """Registered name of a variant's ``lstm``-style encoder."""
    return _LSTM_NAME if variant == "lstm" else variant


#: ``{registered name: variant}`` of the ``nn.LSTM``-style encoders.
ENCODER_NAMES: Dict[str, str] = {encoder_name(v): v for v in VARIANTS}
#: ``{registered name: variant}`` of the ``stacked_bidirectional_lstm``-style encoders.
STACKED_ENCODER_NAMES: Dict[str, str] = {
    f"stacked_bidirectional_{encoder_name(v)}": v for v in VARIANTS}

State = Tuple[torch.Tensor, torch.Tensor]


def run_masked(rnn: AblatedRNN, inputs: torch.Tensor, mask: Optional[torch.Tensor],
               hidden_state: Optional[State] = None) -> Tuple[torch.Tensor, State]:
    """Run a ``batch_first`` :class:`AblatedRNN` on ``inputs`` ``(B, T, D)`` under an AllenNLP
    mask; rows with no real token are skipped and get zero outputs and zero final states."""
    if inputs.dim() != 3:
        raise ValueError(f"the encoder expects inputs of shape (batch, seq_len, {rnn.input_size}), "
                         f"got {tuple(inputs.shape)}")
    if mask is None:
        return rnn(inputs, hidden_state)
    if mask.shape != inputs.shape[:2]:
        raise ValueError(f"mask has shape {tuple(mask.shape)} but the inputs have (batch, seq_len) "
                         f"= {tuple(inputs.shape[:2])}")
    mask = mask.bool()
    valid = mask.any(dim=1)  # a row that is not left-aligned goes on to AblatedRNN, which says so
    batch = inputs.shape[0]
    if bool(valid.all()):
        return rnn(inputs, hidden_state, mask=mask)
    layers_dirs = rnn.num_layers * rnn.num_directions
    out_dim = rnn.hidden_size * rnn.num_directions
    output = inputs.new_zeros(batch, inputs.shape[1], out_dim)
    h_n = inputs.new_zeros(layers_dirs, batch, rnn.hidden_size)
    c_n = h_n.clone()
    index = valid.nonzero().squeeze(1)
    if index.numel() == 0:
        return output, (h_n, c_n)
    sub_state = None
    if hidden_state is not None:
        sub_state = tuple(s.index_select(1, index) for s in hidden_state)
    out, (h, c) = rnn(inputs.index_select(0, index), sub_state, mask=mask.index_select(0, index))
    output = output.index_copy(0, index, out)
    h_n, c_n = h_n.index_copy(1, index, h), c_n.index_copy(1, index, c)
    return output, (h_n, c_n)


def _build_rnn(owner: str, variant: str, **kwargs) -> AblatedRNN:
    try:
        return AblatedRNN(variant, batch_first=True, **kwargs)
    except (ValueError, TypeError) as exc:
        raise ConfigurationError(f"encoder {owner!r}: {exc}") from exc


def _stacked_rnn(owner: str, variant: str, input_size, hidden_size, num_layers,
                 recurrent_dropout_probability, layer_dropout_probability, use_highway) -> AblatedRNN:
    rnn = _build_rnn(owner, variant, input_size=input_size, hidden_size=hidden_size,
                     num_layers=num_layers, bias=True, dropout=layer_dropout_probability,
                     bidirectional=True, recurrent_dropout=recurrent_dropout_probability,
                     highway=use_highway)
    augmented_lstm_init_(rnn)
    return rnn


def augmented_lstm_init_(rnn: AblatedRNN) -> AblatedRNN:
    """Initialise ``rnn`` in place as AllenNLP 2.10.1's ``AugmentedLstm.reset_parameters`` does
    (the cells of ``StackedBidirectionalLstm``): ``block_orthogonal`` over ``H × d_in`` blocks of
    ``weight_ih`` and ``H × H`` blocks of ``weight_hh`` (none in a cell that reads no
    ``h_{t-1}``), biases 0, forget-gate bias 1."""
    H = rnn.hidden_size
    with torch.no_grad():
        for layer in range(rnn.num_layers):
            for direction in range(rnn.num_directions):
                names = rnn.parameter_names(layer, direction)
                w_ih = getattr(rnn, names[0])
                block_orthogonal(w_ih, [H, w_ih.shape[1]])
                if names[1] is not None:
                    block_orthogonal(getattr(rnn, names[1]), [H, H])
                for name in names[2:]:
                    getattr(rnn, name).zero_()
    rnn.set_forget_bias_(1.0)
    return rnn


class _StatefulMixin:
    """Stateful encoders keep the final ``(h, c)`` of each row between batches, with the
    bookkeeping of AllenNLP's ``_EncoderBase`` (rows that are fully masked keep their state)."""

    def _stateful_forward(self, inputs, mask, hidden_state):
        if not self.stateful:
            output, state = run_masked(self._module, inputs, mask, hidden_state)
            return output
        if mask is None:
            raise ValueError("Always pass a mask with stateful RNNs.")
        if hidden_state is not None:
            raise ValueError("Stateful RNNs provide their own initial hidden_state.")
        batch = inputs.shape[0]
        identity = torch.arange(batch, device=inputs.device)
        initial = self._get_initial_states(batch, batch, identity)
        output, state = run_masked(self._module, inputs, mask, initial)
        self._update_states(state, identity)
        return output


class _AblatedModuleMixin:
    """Sizes and the wrapped :class:`AblatedRNN` (``self._module``), shared by both encoder kinds."""

    @property
    def rnn(self) -> AblatedRNN:
        return self._module

    def get_input_dim(self) -> int:
        return self._module.input_size

    def get_output_dim(self) -> int:
        return self._module.hidden_size * self._module.num_directions


class AblatedSeq2SeqEncoder(_AblatedModuleMixin, _StatefulMixin, Seq2SeqEncoder):
    """A variant of :class:`AblatedRNN` with the keyword arguments of AllenNLP's ``lstm``
    ``Seq2SeqEncoder`` (``torch.nn.LSTM``'s).  Subclassed once per variant and registered under
    the variant's name (``ablated_lstm`` for the LSTM)."""

    variant: str = ""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 dropout: float = 0.0, bidirectional: bool = False, stateful: bool = False) -> None:
        super().__init__(stateful=stateful)
        self._module = _build_rnn(encoder_name(self.variant), self.variant, input_size=input_size,
                                  hidden_size=hidden_size, num_layers=num_layers, bias=bias,
                                  dropout=dropout, bidirectional=bidirectional)


    def is_bidirectional(self) -> bool:
        return self._module.bidirectional

    def forward(self, inputs: torch.Tensor, mask: torch.BoolTensor,
                hidden_state: Optional[State] = None) -> torch.Tensor:
        return self._stateful_forward(inputs, mask, hidden_state)


class StackedBidirectionalAblatedSeq2SeqEncoder(AblatedSeq2SeqEncoder):
    """A bidirectional stack of one variant with the keyword arguments of AllenNLP's
    ``stacked_bidirectional_lstm``; output ``2·hidden_size``."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int,
                 recurrent_dropout_probability: float = 0.0,
                 layer_dropout_probability: float = 0.0, use_highway: bool = True,
                 stateful: bool = False) -> None:
        Seq2SeqEncoder.__init__(self, stateful=stateful)
        self._module = _stacked_rnn(f"stacked_bidirectional_{encoder_name(self.variant)}",
                                    self.variant, input_size, hidden_size, num_layers,
                                    recurrent_dropout_probability, layer_dropout_probability,
                                    use_highway)


class AblatedSeq2VecEncoder(_AblatedModuleMixin, Seq2VecEncoder):
    """A variant of :class:`AblatedRNN` as a ``Seq2VecEncoder``: the final hidden state of the top
    layer at each row's last real token (both directions concatenated when bidirectional), as
    AllenNLP's ``lstm`` ``Seq2VecEncoder``."""

    variant: str = ""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 dropout: float = 0.0, bidirectional: bool = False) -> None:
        super().__init__(stateful=False)
        self._module = _build_rnn(encoder_name(self.variant), self.variant, input_size=input_size,
                                  hidden_size=hidden_size, num_layers=num_layers, bias=bias,
                                  dropout=dropout, bidirectional=bidirectional)


    def forward(self, inputs: torch.Tensor, mask: torch.BoolTensor,
                hidden_state: Optional[State] = None) -> torch.Tensor:
        _, (h_n, _) = run_masked(self._module, inputs, mask, hidden_state)
        dirs = self._module.num_directions
        # h_n: (layers·dirs, B, H), directions interleaved per layer -> the top layer's
        return h_n[-dirs:].transpose(0, 1).reshape(h_n.shape[1], self.get_output_dim())


class StackedBidirectionalAblatedSeq2VecEncoder(AblatedSeq2VecEncoder):
    """``stacked_bidirectional_lstm``-style ``Seq2VecEncoder``: the top layer's final forward and
    backward states, ``2·hidden_size``."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int,
                 recurrent_dropout_probability: float = 0.0,
                 layer_dropout_probability: float = 0.0, use_highway: bool = True) -> None:
        Seq2VecEncoder.__init__(self, stateful=False)
        self._module = _stacked_rnn(f"stacked_bidirectional_{encoder_name(self.variant)}",
                                    self.variant, input_size, hidden_size, num_layers,
                                    recurrent_dropout_probability, layer_dropout_probability,
                                    use_highway)


def _camel(variant: str) -> str:
    return "".join(part.capitalize() for part in variant.split("_"))


def _make(base: type, registry, name: str, variant: str, suffix: str) -> type:
    cls_name = f"{_camel(encoder_name(variant))}{suffix}"
    cls = type(cls_name, (base,), {
        "variant": variant,
        "__module__": __name__,
        "__qualname__": cls_name,
        "__doc__": f"Registered as a `{registry.__name__}` with name {name!r}: "
                   f"{base.__name__} of the {variant!r} variant.\n\n{base.__doc__}",
    })
    registry.register(name)(cls)
    globals()[cls_name] = cls
    return cls


#: ``{registered name: class}``
SEQ2SEQ_CLASSES: Dict[str, Type[Seq2SeqEncoder]] = {}
SEQ2VEC_CLASSES: Dict[str, Type[Seq2VecEncoder]] = {}
for _name, _variant in ENCODER_NAMES.items():
    SEQ2SEQ_CLASSES[_name] = _make(AblatedSeq2SeqEncoder, Seq2SeqEncoder, _name, _variant,
                                   "Seq2SeqEncoder")
    SEQ2VEC_CLASSES[_name] = _make(AblatedSeq2VecEncoder, Seq2VecEncoder, _name, _variant,
                                   "Seq2VecEncoder")
for _name, _variant in STACKED_ENCODER_NAMES.items():
    SEQ2SEQ_CLASSES[_name] = _make(StackedBidirectionalAblatedSeq2SeqEncoder, Seq2SeqEncoder,
                                   _name, _variant, "StackedBidirectionalSeq2SeqEncoder")
    SEQ2VEC_CLASSES[_name] = _make(StackedBidirectionalAblatedSeq2VecEncoder, Seq2VecEncoder,
                                   _name, _variant, "StackedBidirectionalSeq2VecEncoder")
del _name, _variant


@Seq2SeqEncoder.register("concat_layers")
class ConcatLayersSeq2SeqEncoder(Seq2SeqEncoder):
    """Runs ``layers`` (any ``Seq2SeqEncoder``s) one after the other and returns the outputs of
    *all* of them concatenated, as DrQA's stacked bidirectional RNN (``concat_layers=True``):
    ``output = [l_1(x); l_2(l_1(x)); ...]``, ``get_output_dim() = Σ layer output dims``.

    ``dropout`` is applied to the input of every layer (DrQA's "dropout on RNN inputs"), during
    training; with ``dropout_output`` also to the concatenated output (hitvoice/DrQA's
    ``dropout_rnn_output``).  Registered as ``concat_layers``; used by the DrQA configs so that the variant is
    the ``type`` of each layer, e.g. ``{"type": "ran", "input_size": 256, "hidden_size": 128,
    "bidirectional": true}``.
    """

    def __init__(self, layers: List[Seq2SeqEncoder], dropout: float = 0.0,
                 dropout_output: bool = False) -> None:
        super().__init__(stateful=False)
        if not layers:
            raise ConfigurationError("concat_layers: 'layers' must list at least one Seq2SeqEncoder")
        check_prob("concat_layers: dropout", dropout, ConfigurationError)
        for i in range(1, len(layers)):
            want, got = layers[i].get_input_dim(), layers[i - 1].get_output_dim()
            if want != got:
                raise ConfigurationError(
                    f"concat_layers: layer {i} has input_size {want} but layer {i - 1} outputs "
                    f"{got} features; set layer {i}'s input_size to {got}")
        if not isinstance(dropout_output, bool):
            raise ConfigurationError(f"concat_layers: dropout_output must be true or false, got "
                                     f"{dropout_output!r}")
        self.layers = torch.nn.ModuleList(layers)
        self._dropout = torch.nn.Dropout(dropout)
        self.dropout_output = dropout_output

    def get_input_dim(self) -> int:
        return self.layers[0].get_input_dim()

    def get_output_dim(self) -> int:
        return sum(layer.get_output_dim() for layer in self.layers)

    def is_bidirectional(self) -> bool:
        return False  # the concatenation is not split in two directional halves

    def forward(self, inputs: torch.Tensor, mask: torch.BoolTensor) -> torch.Tensor:
        outputs = []
        x = inputs
        for layer in self.layers:
            x = layer(self._dropout(x), mask)
            outputs.append(x)
        output = torch.cat(outputs, dim=-1)
        return self._dropout(output) if self.dropout_output else output
