"""Finding the recurrent encoder to visualise inside a trained model, and what it reads.

Every model kind this package trains (AllenNLP encoders, OpenNMT-py encoders, the language model)
contains :class:`~rnn_ablations.AblatedRNN` submodules; a plain :class:`torch.nn.LSTM` is accepted
too (it is converted to an ``AblatedRNN('lstm')``, whose parameters have the same names).  They are
found with ``model.named_modules()`` and picked by name; what they read for a sentence is captured
with a forward pre-hook while the model's own embedding path runs.
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Dict, List, Optional, Tuple

import torch
from torch import nn
from torch.nn.utils.rnn import PackedSequence, pad_packed_sequence

from ..rnn import AblatedRNN

__all__ = ["recurrent_modules", "select_encoder", "EncoderStack", "as_ablated", "capture_inputs", "captured_sequence"]


def recurrent_modules(model: nn.Module) -> Dict[str, nn.Module]:
    """``{name: module}`` of every :class:`AblatedRNN` and :class:`torch.nn.LSTM` in ``model``
    (in ``named_modules`` order)."""
    return {name: m for name, m in model.named_modules() if isinstance(m, (AblatedRNN, nn.LSTM))}


def _describe(name: str, m: nn.Module) -> str:
    variant = m.variant.name if isinstance(m, AblatedRNN) else "lstm (torch.nn.LSTM)"
    bi = "bidirectional" if m.bidirectional else "unidirectional"
    return f"{name or '<model>'} ({variant}, {m.num_layers} layer(s), {bi}, {m.input_size}→{m.hidden_size})"


def describe_candidates(cands: Dict[str, nn.Module]) -> str:
    text = "; ".join(_describe(n, m) for n, m in cands.items())
    short = _short_names(cands)
    if short and set(short) != set(cands):
        text += f" (--encoder accepts the shorter names {', '.join(short)})"
    return text


def _short_names(cands: Dict[str, nn.Module]) -> List[str]:
    """Top-level module names that pick one module or one stack of single-layer modules."""
    groups: Dict[str, Dict[str, nn.Module]] = {}
    for n, m in cands.items():
        groups.setdefault(n.split(".")[0], {})[n] = m
    return [top.lstrip("_") or top for top, members in groups.items()
            if len(members) == 1 or _as_stack(members) is not None]


def _norm_parts(name: str) -> List[str]:
    return [p.lstrip("_") for p in name.split(".") if p]


@dataclasses.dataclass
class EncoderStack:
    """The recurrent module(s) that ``--encoder`` names: one module, or single-module layers kept
    in a list (``layers.0``, ``layers.1``, … as the language model and ``concat_layers`` do),
    whose layers are then numbered across the modules."""

    names: List[str]
    modules: List[nn.Module]

    @property
    def num_layers(self) -> int:
        return sum(m.num_layers for m in self.modules)

    @property
    def label(self) -> str:
        return self.names[0] if len(self.names) == 1 else f"{', '.join(self.names)}"

    def locate(self, layer) -> Tuple[str, nn.Module, int]:
        """``(module name, module, layer within it)`` of layer ``layer`` of the stack."""
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < self.num_layers:
            raise ValueError(f"layer must be an integer in [0, {self.num_layers - 1}] (the encoder "
                             f"{self.label} has {self.num_layers} layer(s)), got {layer!r}")
        for name, m in zip(self.names, self.modules):
            if layer < m.num_layers:
                return name, m, layer
            layer -= m.num_layers
        raise AssertionError("unreachable")


def _as_stack(matches: Dict[str, nn.Module]) -> Optional[EncoderStack]:
    """Names that differ only in one integer part (``x.layers.0.m``, ``x.layers.1.m``)."""
    parts = [n.split(".") for n in matches]
    if len({len(p) for p in parts}) != 1:
        return None
    diff = [k for k in range(len(parts[0])) if len({p[k] for p in parts}) > 1]
    if len(diff) != 1 or not all(p[diff[0]].isdigit() for p in parts):
        return None
    order = sorted(matches, key=lambda n: int(n.split(".")[diff[0]]))
    return EncoderStack(order, [matches[n] for n in order])


def select_encoder(model: nn.Module, name: Optional[str] = None) -> EncoderStack:
    """Pick the recurrent module called ``name`` (or the only one).

    ``name`` may be a module's full name (``encoder._module``), or the name of a module that
    contains one recurrent module (``phrase_layer`` for ``_phrase_layer._module``; leading
    underscores of each part may be left out) or a list of single-module layers (``layers`` for
    ``layers.0``, ``layers.1``).  Raises ``ValueError`` listing the candidates when the name
    matches none or several unrelated ones, or when no name is given and there are several.
    """
    cands = recurrent_modules(model)
    if not cands:
        raise ValueError("the model contains no AblatedRNN (nor torch.nn.LSTM) to visualise; it was "
                         "not built with rnn_ablations' encoders")
    if name is None or name == "":
        if len(cands) == 1:
            return EncoderStack(list(cands), list(cands.values()))
        stack = _as_stack(cands)
        if stack is not None:
            return stack
        raise ValueError(f"the model has {len(cands)} recurrent encoders; choose one with --encoder "
                         f"NAME: {describe_candidates(cands)}")
    if name in cands:
        return EncoderStack([name], [cands[name]])
    want = _norm_parts(name)
    matches = {n: m for n, m in cands.items() if _norm_parts(n)[:len(want)] == want}
    if len(matches) == 1:
        return EncoderStack(list(matches), list(matches.values()))
    if not matches:
        raise ValueError(f"no encoder called {name!r} in the model; the recurrent encoders are: "
                         f"{describe_candidates(cands)}")
    stack = _as_stack(matches)
    if stack is not None:
        return stack
    raise ValueError(f"{name!r} contains {len(matches)} recurrent encoders; choose one of: "
                     f"{describe_candidates(matches)}")


def as_ablated(module: nn.Module) -> AblatedRNN:
    """``module`` itself if it is an :class:`AblatedRNN`; a plain ``nn.LSTM`` becomes an
    ``AblatedRNN('lstm')`` with the same parameters (same names, same equations)."""
    if isinstance(module, AblatedRNN):
        return module
    if isinstance(module, nn.LSTM):
        if getattr(module, "proj_size", 0):
            raise ValueError("an nn.LSTM with proj_size has no weighted-sum form in this package")
        p = next(module.parameters())
        rnn = AblatedRNN("lstm", module.input_size, module.hidden_size, num_layers=module.num_layers,
                         bias=module.bias, batch_first=module.batch_first,
                         bidirectional=module.bidirectional, device=p.device, dtype=p.dtype)
        rnn.load_state_dict(module.state_dict())
        return rnn.eval()
    raise ValueError(f"expected an AblatedRNN or torch.nn.LSTM, got {type(module).__name__}")


@contextlib.contextmanager
def capture_inputs(modules: Dict[str, nn.Module]):
    """While active, records the first call of each module: ``calls[name] = (input, kwargs)``."""
    calls: Dict[str, tuple] = {}
    handles = []

    def make(name):
        def hook(module, args, kwargs):
            if name not in calls and args:
                calls[name] = (args[0], dict(kwargs))
        return hook

    try:
        for name, m in modules.items():
            handles.append(m.register_forward_pre_hook(make(name), with_kwargs=True))
        yield calls
    finally:
        for h in handles:
            h.remove()


def captured_sequence(module: nn.Module, call) -> torch.Tensor:
    """The ``(T, d)`` input of the first sequence of a captured call (padding removed)."""
    inp, kwargs = call
    length = None
    if isinstance(inp, PackedSequence):
        padded, lengths = pad_packed_sequence(inp, batch_first=True)
        return padded[0, : int(lengths[0])]
    if not isinstance(inp, torch.Tensor):
        raise ValueError(f"the encoder was called with {type(inp).__name__}, not a tensor")
    if inp.dim() == 2:
        return inp
    x = inp if module.batch_first else inp.transpose(0, 1)    # (B, T, d)
    mask, lengths = kwargs.get("mask"), kwargs.get("lengths")
    if mask is not None:
        length = int(mask[0].sum())
    elif lengths is not None:
        length = int(torch.as_tensor(lengths).reshape(-1)[0])
    return x[0] if length is None else x[0, :length]
