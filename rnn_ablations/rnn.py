"""``AblatedRNN``: every variant of :mod:`rnn_ablations.variants` as a drop-in for ``torch.nn.LSTM``."""
from __future__ import annotations

import math
import numbers
import warnings
from typing import List, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

from .dispatch import run_layer_call
from .kernels import registry
from .export import run_stack
from .functional import Reversal, projection_bias, reversal_index, shape_checks
from .plan import stack_runner
from .validation import Probability, check_positive_int
from .variants import VARIANTS, Variant, get_variant

__all__ = ["AblatedRNN"]


def _autocast_on(device_type: str) -> bool:
    return registry.autocast_dtype(device_type) is not None


def _autocast_output_dtype(x: torch.Tensor) -> Optional[torch.dtype]:
    """The dtype of the outputs under ``torch.autocast`` for a float32 input: ``lstm`` is on the
    autocast lists of CPU and CUDA (lower precision), so ``nn.LSTM`` returns the autocast dtype;
    ``None`` outside autocast, for other input dtypes (autocast leaves float64 alone) and on a
    device autocast does not know (``"meta"``)."""
    if x.dtype != torch.float32:
        return None
    dtype = registry.autocast_dtype("cpu" if x.is_cpu else x.device.type)
    return dtype if dtype is not None and dtype != x.dtype else None


HiddenState = Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]


def _has_output_gate(variant: Variant) -> bool:
    """Whether the cell's h_t passes an output gate ``o`` (what ``proj_size`` projects after)."""
    return "o" in variant.blocks(False)[0] + variant.blocks(False)[1]


class AblatedRNN(nn.Module):
    r"""A multi-layer recurrent network of one of the papers' variants, with ``torch.nn.LSTM``'s API.

    For each element of the input sequence each layer computes, depending on ``variant``
    (the table lives in :mod:`rnn_ablations.variants`)::

        lstm            i,f,o = σ(W_·x x_t + W_·h h_{t-1} + b_·),  c̃_t = tanh(W_cx x_t + W_ch h_{t-1} + b_c)
                        c_t = i_t ∘ c̃_t + f_t ∘ c_{t-1},           h_t = o_t ∘ tanh(c_t)
        srnn            h_t = tanh(W_hx x_t + W_hh h_{t-1} + b_h)            (LSTM − GATES)
        lstm_minus_srnn i,f,o as above, c̃_t = W_cx x_t (no bias), c_t as above, h_t = o_t ∘ tanh(c_t)
        ran             i,f as above,   c̃_t = W_cx x_t (no bias), c_t as above, h_t = tanh(c_t)
        identity_ran    as ``ran`` with h_t = c_t
        lstm_minus_srnn_minus_hidden   i,f,o = σ(W_·x x_t + b_·) (no h_{t-1}), c̃_t = W_cx x_t,
                        c_t as above, h_t = o_t ∘ tanh(c_t)   (LSTM − S-RNN − HIDDEN)

    Args:
        variant: ``"lstm"``, ``"srnn"``, ``"lstm_minus_srnn"``, ``"ran"``, ``"identity_ran"``,
            ``"lstm_minus_srnn_minus_hidden"`` (aliases: ``lstm_minus_gates``,
            ``lstm_minus_srnn_minus_out``, ``tanh_ran``, ``minus_hidden``).
        input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional, proj_size:
            as in :class:`torch.nn.LSTM` (``dropout`` is applied to the outputs of every layer
            but the last, during training; with one layer it has no effect, and a warning
            says so, as ``nn.LSTM``'s does).  ``proj_size`` (``nn.LSTM``'s, ``weight_hr_l{k}``,
            ``h_t = W_hr (o_t ∘ tanh(c_t))``) for the variants with that output rule (``lstm``,
            ``lstm_minus_srnn``, ``lstm_minus_srnn_minus_hidden``), without highway; it runs the
            generic path (the run plan's ``generic_projected`` runner; the exporters' loop
            under ``torch.jit.trace`` / ONNX export); the other variants refuse it.
        recurrent_dropout: variational dropout on ``h_{t-1}`` where it enters the recurrent
            projection: one mask per sequence (per layer and direction), drawn at every forward
            in training mode (Gal & Ghahramani 2016), as AllenNLP 2.10.1's ``AugmentedLstm``
            (which also leaves the layer's outputs undropped).  ``lstm_minus_srnn_minus_hidden``
            reads no h_{t-1}, so there is nothing to drop: the value is accepted (configs written
            for the LSTM keep working) and has no effect, with a warning at construction.
        highway: AllenNLP ``AugmentedLstm``'s highway connection in every layer:
            ``h_t ← r_t ∘ h_t + (1 − r_t) ∘ W_hw x_t``, ``r_t = σ(W_rx x_t + W_rh h_{t-1} + b_r)``;
            for ``lstm_minus_srnn_minus_hidden`` the gate reads the input only, like its other
            gates: ``r_t = σ(W_rx x_t + b_r)``.
        forget_bias: ``None`` (default): the uniform init below for every bias.  A number sets
            the forget-gate slice of the bias to it after that init, the same way for every
            variant that has a forget gate (``lstm``, ``lstm_minus_srnn``, ``ran``,
            ``identity_ran``, ``lstm_minus_srnn_minus_hidden``); the other bias entries stay
            uniform.  ``lstm`` has two biases
            (``nn.LSTM``'s ``bias_ih`` and ``bias_hh``, which are summed): its ``bias_ih``
            forget slice is set to the value and its ``bias_hh`` forget slice to 0, so the
            effective forget bias is the value.  ``srnn`` has no forget gate: the option changes
            nothing there.  Needs ``bias=True``.  :meth:`set_forget_bias_` applies the same rule
            to an existing module.

    Parameters (``{k}`` = layer, ``_reverse`` suffix for the backward direction); ``R`` = number
    of recurrent blocks (4 LSTM, 1 S-RNN, 3 LSTM − S-RNN, 2 RAN, +1 with highway), ``X`` = input-only
    blocks (0 LSTM and S-RNN, 1 content block for the others, +1 with highway):

    * ``weight_ih_l{k}`` ``((R + X)·H, d_in)``: recurrent blocks first, in the order
      ``i, f, g, o`` (LSTM, as ``nn.LSTM``), ``h`` (S-RNN), ``i, f, o`` (LSTM − S-RNN), ``i, f``
      (RAN), then ``r`` (highway gate); then the input-only blocks ``c`` and ``hw``.
      ``lstm_minus_srnn_minus_hidden`` (R = 0): ``i, f, o`` (``r``), ``c`` (``hw``).
    * ``weight_hh_l{k}`` ``(R·H, H)``; ``lstm_minus_srnn_minus_hidden`` has none.
    * plain LSTM: ``bias_ih_l{k}`` and ``bias_hh_l{k}`` ``(4H)`` exactly like ``nn.LSTM``, so its
      ``state_dict`` loads as is.  Every other cell: one bias ``bias_l{k}`` ``(R·H)``; the name
      contains neither ``bias_ih`` nor ``bias_hh`` on purpose, so initializers written for LSTM
      biases (AllenNLP's ``lstm_hidden_bias`` on ``.*bias_hh.*``, which assumes 4H entries) cannot
      touch it (``lstm_minus_srnn_minus_hidden``: ``(3H)`` for ``i, f, o``, ``(4H)`` with
      highway).  An ``nn.RNN`` ``state_dict`` (``bias_ih_l{k}`` + ``bias_hh_l{k}``) is accepted by
      ``srnn``: the two biases are summed on load.
    * no other key: the ``state_dict`` of ``lstm`` (without highway) has exactly
      ``nn.LSTM``'s keys and loads into ``nn.LSTM`` with ``strict=True``.  The variant and the
      highway flag travel in the state dict's metadata (``state_dict._metadata[prefix]``, kept
      by ``torch.save`` / ``torch.load``, entries ``"rnn_ablations.variant"`` and
      ``"rnn_ablations.highway"``): loading a state dict saved from another variant (``ran``
      into ``identity_ran``, whose shapes match) or highway setting raises an error naming both.
      A state dict without them (``nn.LSTM``, ``nn.RNN``, or a plain ``dict`` copy or a
      safetensors file, which drop the metadata) loads, its shapes being the check; where those
      shapes fit another variant too (:meth:`shape_twins`: ``ran`` and ``identity_ran``) a
      warning says so.  To keep the check in such formats store ``rnn.variant_state`` under the
      key ``variant_state`` (with the module's prefix) before saving.  A ``variant_state`` key (int64
      ``[Variant.code, highway]``, written by earlier versions of the package, e.g. in AllenNLP
      and OpenNMT-py checkpoints) is checked the same way and then dropped; the property
      ``variant_state`` gives that pair for the module.

    Initialisation (:meth:`reset_parameters`): ``torch.nn.LSTM``'s rule for *every* variant:
    every weight and every bias ``U(−1/√H, 1/√H)`` (gate, content, S-RNN and highway blocks
    alike; ``lstm_minus_srnn_minus_hidden`` included), so that wherever a framework's LSTM
    baseline is ``nn.LSTM`` every ablation starts from the same distribution as the LSTM.
    A forget-gate bias init is the explicit option ``forget_bias`` (see Args).

    Inputs: ``input, hx=None, mask=None, lengths=None`` (see :meth:`forward`)
        * ``input``: ``(T, B, d_in)`` (``(B, T, d_in)`` with ``batch_first``), ``(T, d_in)`` for an
          unbatched sequence, or a :class:`~torch.nn.utils.rnn.PackedSequence`.
        * ``hx``: ``(h_0, c_0)``, each ``(num_layers·num_directions, B, H)``; ``srnn`` also accepts
          ``h_0`` alone and ignores ``c_0``.  Zeros when omitted.
        * ``mask`` ``(B, T)`` bool (True = real token, left-aligned) or ``lengths`` ``(B,)``, for
          padded input: a row's backward direction starts at its last real token, outputs at
          padded positions are zero and final states are taken at each row's last real token.

    Not a subclass of ``torch.nn.RNNBase`` (``isinstance(rnn, nn.RNNBase)`` is False) on purpose:
    ``nn.RNNBase``'s methods (``_init_flat_weights``, ``_apply``, ``__setattr__``,
    ``flatten_parameters``) keep ``_flat_weights`` in the layout that ``torch._VF.lstm`` /
    cuDNN run, for ``mode`` in ``"LSTM"``, ``"GRU"``, ``"RNN_TANH"``, ``"RNN_RELU"``, and code
    that tests for ``nn.RNNBase`` does so to rely on that; given these weights it would compute
    an LSTM for every variant (or fail on the shapes).  To accept either, test
    ``isinstance(rnn, (nn.RNNBase, AblatedRNN))``: the attributes such code reads
    (``mode``, ``input_size``, ``hidden_size``, ``num_layers``, ``bias``, ``batch_first``,
    ``dropout``, ``bidirectional``, ``proj_size``, ``all_weights``, ``_flat_weights_names``,
    ``flatten_parameters()``) are there.

    ``torch.jit.script`` does not compile the module; trace it and script the model around it
    (``model.rnn = torch.jit.trace(model.rnn, (example,))``): the traced module runs every
    sequence length and batch size (the error from ``torch.jit.script`` says so).

    Outputs: ``output, (h_n, c_n)`` with ``nn.LSTM``'s shapes.  For ``srnn``, which has no memory
    cell, ``c_n`` is a copy of ``h_n`` (so that code that unpacks ``(h, c)`` keeps working).
    """

    def __init__(self, variant: Union[str, Variant], input_size: int, hidden_size: int,
                 num_layers: int = 1, bias: bool = True, batch_first: bool = False,
                 dropout: float = 0.0, bidirectional: bool = False, proj_size: int = 0,
                 recurrent_dropout: float = 0.0, highway: bool = False,
                 forget_bias: Optional[float] = None, device=None, dtype=None) -> None:
        super().__init__()
        self.variant = get_variant(variant)
        self.input_size = check_positive_int("input_size", input_size)
        self.hidden_size = check_positive_int("hidden_size", hidden_size)
        self.num_layers = check_positive_int("num_layers", num_layers)
        for name, flag in (("bias", bias), ("batch_first", batch_first),
                           ("bidirectional", bidirectional), ("highway", highway)):
            if not isinstance(flag, bool):
                raise ValueError(f"{name} must be True or False, got {flag!r}")
        if isinstance(proj_size, bool) or not isinstance(proj_size, int) or proj_size < 0:
            raise ValueError(f"proj_size must be a non-negative integer, got {proj_size!r}")
        if proj_size:
            projectable = [v for v in VARIANTS if _has_output_gate(get_variant(v))]
            if not _has_output_gate(self.variant):
                raise ValueError(
                    f"proj_size projects h_t = o_t*tanh(c_t) (nn.LSTM's LSTMP), which needs an "
                    f"output gate; {self.variant.name!r} has none: leave proj_size at 0, or use "
                    f"one of {', '.join(map(repr, projectable))}")
            if highway:
                raise ValueError("proj_size and highway=True cannot be combined (the highway "
                                 "mixes W_hw x_t into the unprojected h_t); choose one")
            if proj_size >= hidden_size:
                raise ValueError(f"proj_size has to be smaller than hidden_size (as in nn.LSTM), "
                                 f"got proj_size={proj_size}, hidden_size={hidden_size}")
        self.bias = bias
        if forget_bias is not None:
            if (isinstance(forget_bias, bool) or not isinstance(forget_bias, numbers.Real)
                    or not math.isfinite(forget_bias)):
                raise ValueError(f"forget_bias must be None (nn.LSTM's uniform init) or a finite "
                                 f"number, got {forget_bias!r}")
            if not bias:
                raise ValueError("forget_bias sets a slice of the bias: it needs bias=True "
                                 "(or leave forget_bias at None)")
            forget_bias = float(forget_bias)
        self.forget_bias = forget_bias
        self.batch_first = batch_first
        self.dropout = dropout
        if self._dropout_on and self.num_layers == 1:
            # torch.nn.LSTM's warning, on the same condition
            warnings.warn("dropout option adds dropout after all but last recurrent layer, so "
                          "non-zero dropout expects num_layers greater than 1, but got "
                          f"dropout={dropout} and num_layers={num_layers}", stacklevel=2)
        self.recurrent_dropout = recurrent_dropout
        if self._recurrent_dropout_on and not self.variant.reads_hidden:
            warnings.warn(f"recurrent_dropout={self.recurrent_dropout} has no effect on "
                          f"{self.variant.name!r}: its gates and content read x_t only, so there "
                          "is no h_{t-1} to drop", stacklevel=2)
        self.bidirectional = bidirectional
        self.highway = highway
        self.num_directions = 2 if bidirectional else 1
        #: the variant's name, where ``nn.LSTM`` has ``mode = "LSTM"`` (code that reads an RNN's
        #: ``mode`` to tell the cells apart sees which ablation this is)
        self.mode = self.variant.name
        rec, inp = self.variant.num_recurrent(highway), self.variant.num_input_only(highway)
        n_bias = self.variant.num_biased(highway)
        H = self.hidden_size
        #: nn.LSTM's attribute: the size of h_t after the projection ``weight_hr`` (0: none)
        self.proj_size = proj_size
        P = proj_size or H  # the size of h_t: what the next step and the next layer read
        factory = {"device": device, "dtype": dtype}
        self._param_names: List[List[Tuple[str, ...]]] = []
        #: ``weight_hr_l{k}[_reverse]`` per layer and direction, with proj_size (else empty)
        self._proj_names: List[List[str]] = []
        for layer in range(self.num_layers):
            d_in = self.input_size if layer == 0 else P * self.num_directions
            per_dir = []
            for direction in range(self.num_directions):
                sfx = f"_l{layer}" + ("_reverse" if direction else "")
                # names[1] is None for a cell that reads no h_{t-1} (no weight_hh)
                names = [f"weight_ih{sfx}", f"weight_hh{sfx}" if rec else None]
                setattr(self, names[0], nn.Parameter(torch.empty((rec + inp) * H, d_in, **factory)))
                if rec:
                    setattr(self, names[1], nn.Parameter(torch.empty(rec * H, P, **factory)))
                if bias:
                    if self.variant.uses_lstm_bias_names(highway):
                        names += [f"bias_ih{sfx}", f"bias_hh{sfx}"]
                        for n in names[2:]:
                            setattr(self, n, nn.Parameter(torch.empty(rec * H, **factory)))
                    else:
                        names.append(f"bias{sfx}")
                        setattr(self, names[2], nn.Parameter(torch.empty(n_bias * H, **factory)))
                if proj_size:
                    setattr(self, f"weight_hr{sfx}",
                            nn.Parameter(torch.empty(proj_size, H, **factory)))
                per_dir.append(tuple(names))
            self._param_names.append(per_dir)
            if proj_size:
                self._proj_names.append([f"weight_hr_l{layer}" + ("_reverse" if d else "")
                                         for d in range(self.num_directions)])
        # The variant and highway flag travel in the state dict's metadata (_save_to_state_dict),
        # so that a state saved from one variant is refused by another with the same shapes
        # (ran / identity_ran) while an `lstm` state dict has nn.LSTM's keys only.  No buffer:
        # OpenNMT-py's loader wants every buffer in a checkpoint and makes it persistent.
        self._register_load_state_dict_pre_hook(self._check_variant_state)
        self._register_load_state_dict_pre_hook(self._merge_rnn_biases)
        self.reset_parameters()

    # ------------------------------------------------------------------ dropout settings
    # (the forward reads ``_dropout_on`` / ``_dropout_ratio``: :class:`Probability` says why)
    dropout = Probability(
        "The dropout on the outputs of every layer but the last, in training (``nn.LSTM``'s).")
    recurrent_dropout = Probability(
        "The variational dropout on ``h_{t-1}`` where it enters the recurrent product.")

    # ------------------------------------------------------------------ parameters and init
    def reset_parameters(self) -> None:
        """The documented initialisation: ``nn.LSTM``'s rule (every weight and bias
        ``U(−1/√H, 1/√H)``) for every variant, then ``forget_bias`` when it was given."""
        stdv = 1.0 / math.sqrt(self.hidden_size)
        for layer in self._param_names:
            for names in layer:
                for name in names:
                    if name is not None:  # no weight_hh in a cell that reads no h_{t-1}
                        nn.init.uniform_(getattr(self, name), -stdv, stdv)
        for layer in self._proj_names:
            for name in layer:
                nn.init.uniform_(getattr(self, name), -stdv, stdv)
        if self.forget_bias is not None:
            self.set_forget_bias_(self.forget_bias)

    def set_forget_bias_(self, value: float) -> None:
        """Set the forget-gate slice of every layer's bias to ``value`` (in place); for ``lstm``
        ``bias_ih``'s slice is set to ``value`` and ``bias_hh``'s to 0 (their sum is what the
        cell adds).  Other bias entries are left as they are; a no-op for ``srnn`` (no forget
        gate) and without biases."""
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise ValueError(f"the forget-gate bias must be a finite number, got {value!r}")
        H = self.hidden_size
        rec_names = self.variant.biased_blocks(self.highway)
        if "f" not in rec_names:
            return
        f = rec_names.index("f")
        with torch.no_grad():
            for layer in self._param_names:
                for names in layer:
                    if len(names) < 3:
                        continue
                    getattr(self, names[2])[f * H:(f + 1) * H] = float(value)
                    if len(names) == 4:
                        getattr(self, names[3])[f * H:(f + 1) * H] = 0.0

    @staticmethod
    def _describe(code: int, highway: bool) -> str:
        names = {v.code: v.name for v in map(get_variant, VARIANTS)}
        name = repr(names[code]) if code in names else f"<unknown variant code {code}>"
        return name + (" with highway" if highway else "")

    def shape_twins(self) -> List[str]:
        """The other variants (with their highway setting) whose parameters have exactly this
        module's names and shapes (``ran`` and ``identity_ran``): a state dict without a variant
        record cannot be told apart between them."""
        def signature(v: Variant, highway: bool):
            return (v.num_recurrent(highway), v.num_input_only(highway), v.num_biased(highway),
                    v.uses_lstm_bias_names(highway), v.reads_hidden)

        mine = signature(self.variant, self.highway)
        return [self._describe(v.code, hw) for v in map(get_variant, VARIANTS)
                for hw in (False, True)
                if (v.name, hw) != (self.variant.name, self.highway) and signature(v, hw) == mine
                and not (self.proj_size and not _has_output_gate(v))]

    @property
    def variant_state(self) -> torch.Tensor:
        """``[Variant.code, highway]`` (CPU int64): the entry earlier versions saved in the
        state dict, against which such a state dict is checked."""
        return torch.tensor([self.variant.code, int(self.highway)], dtype=torch.int64)

    #: the state dict's metadata entries that record the variant and the highway flag
    METADATA_VARIANT, METADATA_HIGHWAY = "rnn_ablations.variant", "rnn_ablations.highway"

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        metadata = getattr(destination, "_metadata", None)
        if metadata is not None:
            local = metadata.setdefault(prefix[:-1], {})
            local[self.METADATA_VARIANT] = self.variant.name
            local[self.METADATA_HIGHWAY] = self.highway

    def _check_variant_state(self, state_dict, prefix, local_metadata, strict, missing_keys,
                             unexpected_keys, error_msgs):
        """Refuse a state_dict saved from another variant (or highway setting), as its metadata
        records it, or as the ``variant_state`` key of earlier versions records it (the key is
        then dropped); a state_dict with neither (``nn.LSTM``, ``nn.RNN``, a plain ``dict``
        copy) loads, its shapes being the only check."""
        key = prefix + "variant_state"
        mine = self._describe(self.variant.code, self.highway)
        recorded = key in state_dict
        if recorded:
            saved = state_dict.pop(key)
            if (not isinstance(saved, torch.Tensor) or saved.numel() != 2
                    or saved.is_floating_point() or saved.is_complex()):
                raise ValueError(f"{key} in the state_dict must be an integer tensor [variant "
                                 f"code, highway] as AblatedRNN saved it, got "
                                 f"{getattr(saved, 'shape', type(saved).__name__)}")
            code, highway = (int(v) for v in saved.reshape(-1).tolist())
            if (code, bool(highway)) != (self.variant.code, self.highway):
                raise ValueError(
                    f"cannot load a state_dict saved from an AblatedRNN of variant "
                    f"{self._describe(code, bool(highway))} into one of variant {mine} (the "
                    f"shapes may match, the equations do not); build the module with the saved "
                    f"variant and highway setting")
        name = (local_metadata or {}).get(self.METADATA_VARIANT)
        if name is None:
            twins = self.shape_twins()
            if twins and not recorded and any(k.startswith(prefix) for k in state_dict):
                warnings.warn(
                    f"loading a state_dict without a variant record into an AblatedRNN of variant "
                    f"{mine}: its parameter shapes fit {', '.join(twins)} as well, so the variant "
                    f"cannot be checked (the record travels in the state dict's metadata, which "
                    f"dict(sd) and safetensors drop). To keep the check in such formats, store "
                    f"the tensor rnn.variant_state under the key '{key}' before saving: it is "
                    f"checked and dropped on load", stacklevel=3)
            return
        highway = bool((local_metadata or {}).get(self.METADATA_HIGHWAY, False))
        try:
            saved_variant = get_variant(name).name
        except ValueError:
            saved_variant = None
        if (saved_variant, highway) != (self.variant.name, self.highway):
            described = repr(name) + (" with highway" if highway else "")
            raise ValueError(
                f"cannot load a state_dict saved from an AblatedRNN of variant {described} into "
                f"one of variant {mine} (the shapes may match, the equations do not); build the "
                f"module with the saved variant and highway setting")

    def _merge_rnn_biases(self, state_dict, prefix, local_metadata, strict, missing_keys,
                          unexpected_keys, error_msgs):
        """Accept ``nn.RNN``/``nn.LSTM``-style ``bias_ih``/``bias_hh`` pairs for single-bias cells."""
        if self.variant.uses_lstm_bias_names(self.highway):
            return
        for layer in self._param_names:
            for names in layer:
                if len(names) < 3:
                    continue
                sfx = names[2][len("bias"):]
                k_ih, k_hh, k_b = prefix + "bias_ih" + sfx, prefix + "bias_hh" + sfx, prefix + names[2]
                if k_b not in state_dict and k_ih in state_dict and k_hh in state_dict:
                    state_dict[k_b] = state_dict.pop(k_ih) + state_dict.pop(k_hh)

    def parameter_names(self, layer: int, direction: int = 0) -> Tuple[Optional[str], ...]:
        """The parameter names of one layer/direction: ``(weight_ih, weight_hh or None, *biases)``
        (no bias with ``bias=False``; ``bias_ih``, ``bias_hh`` for the plain LSTM, else one
        ``bias``); ``weight_hh`` is ``None`` for a cell that reads no h_{t-1}."""
        if not 0 <= layer < self.num_layers:
            raise ValueError(f"layer must be in [0, {self.num_layers}), got {layer}")
        if not 0 <= direction < self.num_directions:
            raise ValueError(f"direction must be in [0, {self.num_directions}), got {direction}")
        return self._param_names[layer][direction]

    def layer_parameters(self, layer: int, direction: int = 0):
        """``(weight_ih, weight_hh, bias or None)`` of one layer/direction; bias = the sum of
        ``bias_ih`` and ``bias_hh`` for the plain LSTM; ``weight_hh`` is ``None`` for a cell that
        reads no h_{t-1}."""
        names = self.parameter_names(layer, direction)
        w_ih = getattr(self, names[0])
        w_hh = getattr(self, names[1]) if names[1] is not None else None
        if len(names) == 4:
            b = getattr(self, names[2]) + getattr(self, names[3])
        elif len(names) == 3:
            b = getattr(self, names[2])
        else:
            b = None
        return w_ih, w_hh, b

    def projection_parameters(self, layer: int, direction: int = 0):
        """``(weight_ih, weight_hh, bias of the whole input projection or None)``: the bias of
        :meth:`layer_parameters` followed by zeros for the input-only blocks (which have none)."""
        w_ih, w_hh, b = self.layer_parameters(layer, direction)
        return w_ih, w_hh, projection_bias(b, w_ih.shape[0])

    # ------------------------------------------------------------------ nn.LSTM's surface
    # Code written for nn.LSTM touches these; the names follow self._param_names (a plain LSTM
    # has nn.LSTM's four per layer/direction, the other variants their own, see the docstring).
    def flatten_parameters(self) -> None:
        """A no-op, kept for code written for ``nn.LSTM`` (e.g. after ``.to()`` or in
        ``DataParallel``): the kernels read the parameters as they are; there is no cuDNN flat
        weight buffer to compact."""

    @property
    def _all_weights(self) -> List[List[str]]:
        """Parameter names per layer and direction, in ``nn.LSTM``'s order (``weight_hr`` last,
        with ``proj_size``)."""
        return [list(names) + ([self._proj_names[k][d]] if self._proj_names else [])
                for k, layer in enumerate(self._param_names) for d, names in enumerate(layer)]

    @property
    def _flat_weights_names(self) -> List[str]:
        """All parameter names, flat, in ``nn.LSTM``'s order (a variant without ``weight_hh`` or
        a bias has no name for it)."""
        return [n for names in self._all_weights for n in names if n is not None]

    @property
    def _flat_weights(self) -> List[torch.Tensor]:
        return [getattr(self, n) for n in self._flat_weights_names]

    @property
    def all_weights(self) -> List[List[nn.Parameter]]:
        """The parameters per layer and direction (``nn.LSTM.all_weights``)."""
        return [[getattr(self, n) for n in names if n is not None] for names in self._all_weights]

    def extra_repr(self) -> str:
        s = f"{self.variant.name!r}, {self.input_size}, {self.hidden_size}"
        if self.num_layers != 1:
            s += f", num_layers={self.num_layers}"
        for name, default in (("bias", True), ("batch_first", False), ("dropout", 0.0),
                              ("bidirectional", False), ("proj_size", 0), ("recurrent_dropout", 0.0),
                              ("highway", False), ("forget_bias", None)):
            if getattr(self, name) != default:
                s += f", {name}={getattr(self, name)}"
        return s

    # ------------------------------------------------------------------ input checking
    def check_input(self, x: torch.Tensor) -> None:
        """Check a time-major (T, B, input_size) input against the module: its feature size,
        a floating-point dtype equal to the parameters', their device, and at least one step.
        Raises ``ValueError`` saying what to change (used by :meth:`forward` and
        :func:`rnn_ablations.weighted_sum`)."""
        with shape_checks():
            wrong_size = bool(x.shape[-1] != self.input_size)
        if wrong_size:
            raise ValueError(f"input.size(-1) must be equal to input_size. Expected "
                             f"{self.input_size}, got {x.shape[-1]}")
        if not x.is_floating_point():
            raise ValueError(f"input must be a floating-point tensor, got {x.dtype}")
        weight = self.weight_ih_l0
        if x.dtype != weight.dtype:
            raise ValueError(f"input dtype ({x.dtype}) does not match the module's parameter dtype "
                             f"({weight.dtype}). Convert the input: input.to({weight.dtype}), or "
                             f"the module: model.to({x.dtype})")
        if not (x.is_cpu and weight.is_cpu) and x.device != weight.device:
            raise ValueError(f"input is on {x.device} but the module's parameters are on "
                             f"{weight.device}; move one of them: input.to({str(weight.device)!r}) "
                             f"or model.to({str(x.device)!r})")
        if not torch.jit.is_tracing() and x.shape[0] == 0:
            raise ValueError("input has seq_len 0; every sequence needs at least one token")

    def normalize_lengths(self, batch: int, seq_len: int, mask=None,
                          lengths=None) -> Optional[torch.Tensor]:
        """The sequence lengths of a batch as a CPU int64 tensor (B,), from either a (B, T)
        left-aligned boolean ``mask`` or ``lengths`` (any integer sequence), checked against the
        input's ``batch`` and ``seq_len``; ``None`` when neither is given (every row is full)."""
        if mask is not None and lengths is not None:
            raise ValueError("give either mask or lengths, not both")
        if mask is not None:
            if not isinstance(mask, torch.Tensor) or mask.dim() != 2:
                raise ValueError(f"mask must be a (batch, seq_len) boolean tensor, got "
                                 f"{getattr(mask, 'shape', type(mask).__name__)}")
            if tuple(mask.shape) != (batch, seq_len):
                raise ValueError(f"mask has shape {tuple(mask.shape)} but the input has batch "
                                 f"{batch} and seq_len {seq_len}: it must be (batch, seq_len)")
            traced = torch.compiler.is_compiling()
            if mask.dtype != torch.bool and mask.is_floating_point():
                raise ValueError(f"mask must be boolean (or 0/1 integers), got {mask.dtype}")
            if mask.is_meta:  # no values: the shapes are those of full rows (as nn.LSTM's)
                return None
            if mask.dtype != torch.bool:
                if traced:
                    torch._assert_async(((mask == 0) | (mask == 1)).all(),
                                        "mask must be boolean (or 0/1 integers)")
                elif not ((mask == 0) | (mask == 1)).all():
                    raise ValueError(f"mask must be boolean (or 0/1 integers), got {mask.dtype}")
                mask = mask.bool()
            lengths = mask.sum(dim=1)
            positions = torch.arange(seq_len, device=mask.device).unsqueeze(0)
            aligned = mask == (positions < lengths.unsqueeze(1))
            message = ("mask must be left-aligned (True for the first n tokens of a row, then "
                       "False); right-pad your sequences")
            if traced:
                torch._assert_async(aligned.all(), message)
            elif not bool(aligned.all()):
                raise ValueError(message)
        elif lengths is None:
            return None
        else:
            if not isinstance(lengths, torch.Tensor):
                lengths = torch.as_tensor(lengths)
            if lengths.dim() != 1 or lengths.shape[0] != batch:
                raise ValueError(f"lengths must have shape ({batch},) to match the batch, got "
                                 f"{tuple(lengths.shape)}")
            if lengths.is_floating_point() or lengths.dtype == torch.bool:
                raise ValueError(f"lengths must be integers, got {lengths.dtype}")
            if lengths.is_meta:  # no values: the shapes are those of full rows
                return None
        lengths = lengths.to("cpu", torch.int64)
        if torch.compiler.is_compiling():
            # a traced graph cannot branch on the values: it checks them when it runs
            if batch:
                torch._assert_async(lengths.min() >= 1, "every sequence needs at least one token "
                                    "(drop empty rows before the RNN)")
                torch._assert_async(lengths.max() <= seq_len,
                                    "a length exceeds the input's seq_len")
            return lengths
        if batch and int(lengths.min()) < 1:
            raise ValueError(f"every sequence needs at least one token; got a length of "
                             f"{int(lengths.min())} (drop empty rows before the RNN)")
        if batch and int(lengths.max()) > seq_len:
            raise ValueError(f"a length of {int(lengths.max())} exceeds the input's seq_len "
                             f"{seq_len}")
        return lengths

    def _initial_state(self, hx, batch: int, ref: torch.Tensor):
        shape = (self.num_layers * self.num_directions, batch, self.hidden_size)
        h_shape = shape[:2] + (self.proj_size or self.hidden_size,)
        if hx is None:
            return ref.new_zeros(h_shape), ref.new_zeros(shape)
        if isinstance(hx, torch.Tensor):
            if not self.variant.accepts_single_h0:
                single = [v for v in VARIANTS if get_variant(v).accepts_single_h0]
                raise ValueError(f"hx for {self.variant.name!r} must be a tuple (h_0, c_0); only "
                                 f"{', '.join(repr(v) for v in single)} accept a single h_0 "
                                 "tensor")
            h0, c0 = hx, hx
        elif isinstance(hx, (tuple, list)) and len(hx) == 2:
            h0, c0 = hx
        else:
            raise ValueError("hx must be a tuple (h_0, c_0) of tensors")
        for name, t, want, size in (("h_0", h0, h_shape, "proj_size" if self.proj_size
                                     else "hidden_size"), ("c_0", c0, shape, "hidden_size")):
            with shape_checks():
                wrong_shape = not isinstance(t, torch.Tensor) or bool(tuple(t.shape) != want)
            if wrong_shape:
                raise ValueError(f"{name} must have shape {want} (num_layers*num_directions, "
                                 f"batch, {size}), got {tuple(getattr(t, 'shape', ()))}")
            # under torch.autocast the states may be in the autocast dtype (e.g. h_n of the
            # previous batch, carried by a language model), as nn.LSTM accepts; they are cast
            if (t.dtype != ref.dtype and not (t.is_floating_point() and
                                              _autocast_on(ref.device.type))) \
                    or t.device != ref.device:
                raise ValueError(f"{name} must have the input's dtype and device ({ref.dtype}, "
                                 f"{ref.device}), got ({t.dtype}, {t.device})")
        return h0, c0

    # ------------------------------------------------------------------ forward
    def __prepare_scriptable__(self):
        # torch.jit.script calls this on every module it is asked to compile, submodules included
        example = "(1, 2, {0})" if self.batch_first else "(2, 1, {0})"
        example = example.format(self.input_size)
        raise RuntimeError(
            "torch.jit.script cannot compile AblatedRNN (its forward takes a tensor or a "
            "PackedSequence and chooses its kernel in Python). Trace it, then script the model "
            "around it: model.rnn = torch.jit.trace(model.rnn, (torch.randn" + example + ",)); "
            "torch.jit.script(model). The traced module holds the recurrence as a scripted loop "
            "and runs every sequence length and batch size with the eager numbers. "
            "torch.compile / torch.export.export keep the kernels; torch.onnx.export works too.")

    def forward(self, input, hx: Optional[HiddenState] = None, mask=None, lengths=None):
        r"""Run the layers over ``input``; ``torch.nn.LSTM.forward``'s inputs and outputs.

        Args:
            input: ``(T, B, input_size)`` (``(B, T, input_size)`` with ``batch_first=True``),
                ``(T, input_size)`` for one unbatched sequence, or a
                :class:`~torch.nn.utils.rnn.PackedSequence`.
            hx: ``(h_0, c_0)``, each ``(num_layers * num_directions, B, hidden_size)``
                (``(num_layers * num_directions, hidden_size)`` for unbatched input), in the
                input's batch order; zeros when ``None``.  ``srnn`` (no memory) also takes
                ``h_0`` alone.
            mask: ``(B, T)`` boolean, True for the real tokens of a row (left-aligned), for a
                padded batch; or
            lengths: ``(B,)`` integers, the number of real tokens of each row.  A row's reverse
                direction starts at its last real token, outputs at padded positions are zero
                and ``h_n``, ``c_n`` are taken at each row's last real token.  Give at most one
                of ``mask`` and ``lengths``, and neither with a ``PackedSequence``.

        Returns:
            ``output, (h_n, c_n)``: ``output`` ``(T, B, num_directions * hidden_size)``
            (batch first with ``batch_first=True``; a ``PackedSequence`` for packed input),
            ``h_n`` and ``c_n`` ``(num_layers * num_directions, B, hidden_size)``: the final
            states of every layer and direction.  For ``srnn``, ``c_n`` is a copy of ``h_n``.

        Bad input (a wrong size, dtype or device, a length of 0 or beyond ``T``, a mask that
        is not left-aligned) raises ``ValueError`` saying what to change.
        """
        packed = isinstance(input, PackedSequence)
        unbatched = False
        if packed:
            if mask is not None or lengths is not None:
                raise ValueError("a PackedSequence carries its own lengths: do not pass mask or lengths")
            # nn.LSTM takes hx in the original batch order, as we do
            if input.data.is_meta:
                return self._forward_meta_packed(input, hx)
            if not torch.compiler.is_compiling() and stack_runner() == "layers":
                return self._forward_packed(input, hx)
            x, lengths = pad_packed_sequence(input, batch_first=False)
        else:
            if not isinstance(input, torch.Tensor):
                raise ValueError(f"input must be a tensor or a PackedSequence, got {type(input).__name__}")
            if input.dim() == 2:
                unbatched = True
                if mask is not None or lengths is not None:
                    raise ValueError("mask/lengths need batched (3-D) input")
                x = input.unsqueeze(1)
                if hx is not None:
                    hx = (hx.unsqueeze(1) if isinstance(hx, torch.Tensor)
                          else tuple(h.unsqueeze(1) if isinstance(h, torch.Tensor) else h for h in hx))
            elif input.dim() == 3:
                x = input.transpose(0, 1) if self.batch_first else input
            else:
                raise ValueError(f"input must be 2-D (unbatched) or 3-D, got {input.dim()}-D "
                                 f"with shape {tuple(input.shape)}")
        self.check_input(x)
        seq_len, batch = x.shape[0], x.shape[1]
        lengths = self.normalize_lengths(batch, seq_len, mask=mask, lengths=lengths)
        h0, c0 = self._initial_state(hx, batch, x)
        output, h_n, c_n = self._run(x, lengths, h0, c0)
        cast = _autocast_output_dtype(x)
        if cast is not None:  # nn.LSTM's autocast policy: the outputs in the autocast dtype
            output, h_n, c_n = output.to(cast), h_n.to(cast), c_n.to(cast)
        if packed:
            output = pack_padded_sequence(output, lengths, enforce_sorted=False)
        elif unbatched:
            output, h_n, c_n = output.squeeze(1), h_n.squeeze(1), c_n.squeeze(1)
        elif self.batch_first:
            output = output.transpose(0, 1)
        return output, (h_n, c_n)

    def _forward_packed(self, input: PackedSequence, hx):
        """A PackedSequence, eagerly: its rows are already sorted by length (the packing's
        order), so they are padded in that order (one copy of the input, not a second one to
        reorder it), run as an ordered batch, and the output packed from that order (no sort);
        only the states are reordered (hx into the sorted order, h_n and c_n back)."""
        bs = input.batch_sizes
        x, lengths = torch._pad_packed_sequence(input.data, bs, False, 0.0, int(bs.numel()))
        self.check_input(x)
        batch = x.shape[1]
        h0, c0 = self._initial_state(hx, batch, x)
        if input.sorted_indices is not None:
            h0 = h0.index_select(1, input.sorted_indices)
            c0 = c0.index_select(1, input.sorted_indices)
        lengths = self.normalize_lengths(batch, x.shape[0], lengths=lengths)
        output, h_n, c_n = self._run(x, lengths, h0, c0)
        del x
        cast = _autocast_output_dtype(output)
        if cast is not None:
            output, h_n, c_n = output.to(cast), h_n.to(cast), c_n.to(cast)
        data, _ = torch._pack_padded_sequence(output, lengths, False)
        if input.unsorted_indices is not None:
            h_n = h_n.index_select(1, input.unsorted_indices)
            c_n = c_n.index_select(1, input.unsorted_indices)
        return (PackedSequence(data, bs, input.sorted_indices, input.unsorted_indices),
                (h_n, c_n))

    def _forward_meta_packed(self, input: PackedSequence, hx):
        """A PackedSequence on the meta device (no values: its batch order cannot be read):
        the outputs' shapes, as nn.LSTM gives them, from the padded shape its batch sizes say,
        the output packed with the input's batch sizes and orders."""
        bs = input.batch_sizes
        seq_len, batch = int(bs.numel()), int(bs[0]) if bs.numel() else 0
        x = input.data.new_empty((seq_len, batch, input.data.shape[-1]))
        self.check_input(x)
        h0, c0 = self._initial_state(hx, batch, x)
        output, h_n, c_n = self._run(x, None, h0, c0)
        cast = _autocast_output_dtype(x)
        if cast is not None:
            output, h_n, c_n = output.to(cast), h_n.to(cast), c_n.to(cast)
        data = output.new_empty((input.data.shape[0], output.shape[-1]))
        return (PackedSequence(data, bs, input.sorted_indices, input.unsorted_indices),
                (h_n, c_n))

    def layer_input(self, x: torch.Tensor, layer: int,
                    lengths: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The input of layer ``layer`` (time-major (T, B, ·)) for the time-major input ``x``:
        ``x`` itself for layer 0, else the output of the layers below from a zero state, in the
        module's current mode (dropout in training).  ``lengths``: as from
        :meth:`normalize_lengths`."""
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < self.num_layers:
            raise ValueError(f"layer must be in [0, {self.num_layers}), got {layer!r}")
        if layer == 0:
            return x
        h0, c0 = self._initial_state(None, x.shape[1], x)
        return self._run(x, lengths, h0, c0, num_layers=layer)[0]

    def _run(self, x, lengths, h0, c0, num_layers: Optional[int] = None):
        """Time-major core: x (T, B, d_in), original batch order; ``num_layers`` stops early
        (:meth:`layer_input`)."""
        runner = stack_runner()
        if runner != "layers":
            # torch.jit.trace / ONNX export: the recurrence as a loop in the graph (export.py)
            return run_stack(self, x, lengths, h0, c0, num_layers, runner)
        seq_len, batch = x.shape[0], x.shape[1]
        order = None
        # traced (torch.compile / torch.export) nothing here reads the lengths' values: the batch
        # is always reordered and every step runs (trailing steps with no active row output
        # zeros), which gives the eager numbers; eagerly, a full batch or an ordered one skips
        # the reordering and the steps no row reaches are trimmed
        traced = torch.compiler.is_compiling()
        if lengths is None or (not traced and bool((lengths == seq_len).all())):
            batch_sizes = torch.full((seq_len,), batch, dtype=torch.int64)
            rev_index = None
            t_eff = seq_len
        else:
            sorted_len, order = torch.sort(lengths, descending=True, stable=True)
            if not traced and torch.equal(order, torch.arange(batch)):
                order = None
            else:
                dev_order = order.to(x.device)
                x = x.index_select(1, dev_order)
                h0, c0 = h0.index_select(1, dev_order), c0.index_select(1, dev_order)
            t_eff = seq_len if traced else int(sorted_len[0])
            x = x[:t_eff]
            steps = torch.arange(t_eff).unsqueeze(1)
            batch_sizes = (steps < sorted_len.unsqueeze(0)).sum(1)
            rev_index = reversal_index(sorted_len, t_eff).to(x.device)

        reverse = Reversal(rev_index)

        layer_input = x
        h_finals, c_finals = [], []
        # the size of h_t: what the next step reads (proj_size's W_hr projects it)
        H, dirs = self.proj_size or self.hidden_size, self.num_directions
        for layer in range(self.num_layers if num_layers is None else num_layers):
            params = [self.layer_parameters(layer, d) for d in range(dirs)]
            if self.proj_size:  # h_t = W_hr (o_t * tanh(c_t)): the plan's generic_projected
                params = [p + (getattr(self, self._proj_names[layer][d]),)
                          for d, p in enumerate(params)]
            # variational recurrent dropout: one mask per direction, drawn in direction order
            masks = [None] * dirs
            if self.training and self._recurrent_dropout_on and self.variant.reads_hidden:
                num, den = self._recurrent_dropout_ratio
                keep = 1.0 - num / den
                masks = [torch.empty(batch, H, dtype=x.dtype, device=x.device).bernoulli_(keep)
                         / keep for _ in range(dirs)]
            first = layer * dirs
            layer_input, h_n, c_n = run_layer_call(
                self.variant, self.highway, layer_input, params, h0[first:first + dirs],
                c0[first:first + dirs], batch_sizes, masks, reverse)
            h_finals.extend(h_n)
            c_finals.extend(c_n)
            if self._dropout_on and self.training and layer < self.num_layers - 1:
                num, den = self._dropout_ratio
                layer_input = F.dropout(layer_input, num / den, True)
        output = layer_input
        if len(h_finals) == 1:  # one layer, one direction: a view instead of a copy
            h_n, c_n = h_finals[0].unsqueeze(0), c_finals[0].unsqueeze(0)
        else:
            h_n, c_n = torch.stack(h_finals), torch.stack(c_finals)
        if t_eff < seq_len:
            output = torch.cat([output, output.new_zeros(seq_len - t_eff, *output.shape[1:])])
        if order is not None:
            inverse = torch.empty_like(order)
            inverse[order] = torch.arange(batch)
            inverse = inverse.to(x.device)
            output = output.index_select(1, inverse)
            h_n, c_n = h_n.index_select(1, inverse), c_n.index_select(1, inverse)
        return output, h_n, c_n
