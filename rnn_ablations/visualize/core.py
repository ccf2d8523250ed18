"""The data behind the pictures: which earlier (and later) words a memory cell still holds.

For a cell with memory, ``c_t = Σ_j w_j^t ∘ c̃_j`` with ``w_j^t = i_j ∘ Π_{k=j+1..t} f_k``
(:func:`rnn_ablations.weighted_sum`).  For one sentence this module derives

* the heat map of the ACL paper's Table 5: ``‖w_j^t‖₂`` for every current word ``t`` and
  context word ``j`` (the forward direction reaches ``j ≤ t``, the backward one ``j ≥ t``);
* the arrows of the RAN paper's Figure 1: ``v_t = argmax_j max_m w_j^t(m)`` over the earlier
  words ``j < t`` (for the backward direction: the later words ``j > t``).

For ``lstm`` the weights are over the LSTM's own content ``c̃_j = tanh(W_c [x_j; h_{j-1}] + b_c)``,
an S-RNN state, as the ACL paper notes; ``srnn`` has no memory cell and is refused.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Sequence

import torch
import torch.nn.functional as F

from ..functional import generic_layer
from ..rnn import AblatedRNN
from ..variants import VARIANTS, get_variant

__all__ = ["DirectionWeights", "WeightMap", "weight_map", "resolve_directions", "DIRECTIONS"]

DIRECTIONS = ("forward", "backward", "both")


@dataclasses.dataclass
class DirectionWeights:
    """One direction of one layer, for one sentence of ``T`` words."""

    #: ``"forward"`` or ``"backward"``.
    direction: str
    #: ``norms[j][t] = ‖w_j^t‖₂`` (row = context word ``j``, column = current word ``t``);
    #: 0 where the direction does not reach (``j > t`` forward, ``j < t`` backward).
    norms: List[List[float]]
    #: ``max_weights[j][t] = max_m w_j^t(m)`` (same layout).
    max_weights: List[List[float]]
    #: ``arrows[t] = v_t``: the index of the most influential earlier word (later word for the
    #: backward direction), ``None`` for the first (last) word, which has none.
    arrows: List[Optional[int]]

    def arrow_weight(self, t: int) -> Optional[float]:
        v = self.arrows[t]
        return None if v is None else self.max_weights[v][t]


@dataclasses.dataclass
class WeightMap:
    """Everything the heat map and the arrows show, for one layer of one encoder."""

    words: List[str]
    variant: str
    layer: int
    #: ``{"forward": ..., "backward": ...}`` (only the directions asked for), in that order.
    directions: Dict[str, DirectionWeights]
    #: where the numbers come from (model kind, path, encoder name), for titles and JSON.
    source: Dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def content_note(self) -> str:
        if get_variant(self.variant).context_independent_content:
            return "content c̃_j = W_cx x_j depends on word j only"
        return "content c̃_j is the LSTM's S-RNN state tanh(W_c[x_j; h_(j-1)] + b_c)"

    def to_dict(self) -> dict:
        """A JSON-serialisable dict (what ``rnn-ablations visualize --json`` writes)."""
        out = {
            "words": list(self.words),
            "variant": self.variant,
            "layer": self.layer,
            "source": dict(self.source),
            "content": self.content_note,
            "layout": "norms[j][t] = ||w_j^t||_2 and max_weights[j][t] = max_m w_j^t(m), "
                      "row j = context word, column t = current word; "
                      "arrows[t] = v_t = argmax over j<t (forward) or j>t (backward) of "
                      "max_m w_j^t(m), null when there is no such word",
            "directions": {},
        }
        for name, d in self.directions.items():
            out["directions"][name] = {
                "norms": d.norms,
                "max_weights": d.max_weights,
                "arrows": d.arrows,
                "arrow_weights": [d.arrow_weight(t) for t in range(len(self.words))],
            }
        return out

    def window(self, start: int, end: int) -> "WeightMap":
        """The positions ``start … end − 1`` only, for the figure of a span of a long text.  The
        weights and arrows are those of the whole text (the model read all of it); an arrow
        whose target lies outside the span is left out of the window (``source["span"]`` says
        how many)."""
        T = len(self.words)
        for name, v in (("start", start), ("end", end)):
            if isinstance(v, bool) or not isinstance(v, int):
                raise ValueError(f"span {name} must be an integer, got {v!r}")
        if not 0 <= start < end <= T:
            raise ValueError(f"span {start}:{end} is not within the text's {T} positions; give "
                             f"START:END with 0 <= START < END <= {T} (END excluded)")
        dirs: Dict[str, DirectionWeights] = {}
        outside = 0
        for name, d in self.directions.items():
            arrows: List[Optional[int]] = []
            for v in d.arrows[start:end]:
                if v is not None and not start <= v < end:
                    outside += 1
                    v = None
                arrows.append(None if v is None else v - start)
            dirs[name] = DirectionWeights(
                name, [row[start:end] for row in d.norms[start:end]],
                [row[start:end] for row in d.max_weights[start:end]], arrows)
        source = dict(self.source)
        source["span"] = (f"positions {start}-{end - 1} of 0-{T - 1}"
                          + (f"; {outside} arrow(s) to words outside the span not drawn"
                             if outside else ""))
        return WeightMap(list(self.words[start:end]), self.variant, self.layer, dirs, source)

    def arrows_text(self) -> str:
        """The arrows of Figure 1 as text, one line per word."""
        width = max(len(w) for w in self.words)
        lines = []
        for name, d in self.directions.items():
            rel = "earlier" if name == "forward" else "later"
            cmp = "j<t" if name == "forward" else "j>t"
            lines.append(f"{name} (layer {self.layer}, {self.variant}): most influential {rel} word "
                         f"v_t = argmax_{{{cmp}}} max_m w_j^t(m)")
            for t, word in enumerate(self.words):
                v = d.arrows[t]
                if v is None:
                    target = f"(no {rel} word)"
                else:
                    target = f"{v:>3} {self.words[v]}  (max weight {d.arrow_weight(t):.3f})"
                lines.append(f"  {t:>3} {word:<{width}} -> {target}")
        return "\n".join(lines)


def resolve_directions(rnn: AblatedRNN, direction: Optional[str]) -> List[int]:
    """``None`` = every direction of ``rnn``; else ``forward``, ``backward`` or ``both``."""
    if direction is None:
        return list(range(rnn.num_directions))
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {', '.join(DIRECTIONS)}, got {direction!r}")
    if direction == "forward":
        return [0]
    if rnn.num_directions == 1:
        raise ValueError(f"direction {direction!r} needs a bidirectional encoder; this one is "
                         "unidirectional: use direction 'forward'")
    return [1] if direction == "backward" else [0, 1]


def _check_memory(rnn: AblatedRNN) -> None:
    variant = rnn.variant
    if not variant.has_memory:
        with_memory = [v for v in VARIANTS if get_variant(v).has_memory]
        raise ValueError(
            f"variant {variant.name!r} ({variant.paper_name}) has no memory cell: its state is not a "
            f"weighted sum of earlier words, so there are no weights to show; visualise a model "
            f"built with one of {', '.join(with_memory)}")



def _gates(rnn: AblatedRNN, x: torch.Tensor, layer: int, direction: int):
    """The input and forget gates ``(T, H)`` of one layer/direction for one sentence ``x``
    ``(T, d)``, in processing order (reversed positions for the backward direction), from a zero
    state, without dropout: the gates of :func:`rnn_ablations.weighted_sum`."""
    xb = x.unsqueeze(1)                                           # (T, 1, d), time-major
    w_ih, w_hh, b = rnn.projection_parameters(layer, direction)
    was_training = rnn.training
    rnn.eval()
    try:
        layer_input = rnn.layer_input(xb, layer)
    finally:
        rnn.train(was_training)
    if direction == 1:
        layer_input = layer_input.flip(0)
    proj = F.linear(layer_input, w_ih, b)
    rh = 0 if w_hh is None else w_hh.shape[0]                     # no weight_hh: no h_{t-1}
    zero = xb.new_zeros(1, rnn.hidden_size)
    _, _, _, steps = generic_layer(rnn.variant, rnn.highway, proj[..., :rh],
                                   proj[..., rh:] if proj.shape[-1] > rh else None, w_hh, zero,
                                   zero, [1] * x.shape[0], keep_steps=True)
    i = torch.stack([r.input_gate[0] for r in steps])
    f = torch.stack([r.forget_gate[0] for r in steps])
    return i, f


def _reduced_weights(rnn: AblatedRNN, x: torch.Tensor, layer: int, direction: int):
    """``(norms, max_weights)``, each ``(T, T)`` float64 indexed ``[j, t]`` by input positions:
    ``‖w_j^t‖₂`` and ``max_m w_j^t(m)``.

    The weights are built one step at a time, ``w^s = (w^{s-1} ∘ f_s, i_s)`` over the context
    steps ``j ≤ s`` (the products of :func:`rnn_ablations.weighted_sum`, in the same order), and
    each step's row is reduced over the H units at once: the working memory is one ``(T, H)``
    row, never the ``(T, T, H)`` weights (hidden 650, 600 words: 1.5 MB instead of 0.9 GB)."""
    i, f = _gates(rnn, x, layer, direction)
    T = i.shape[0]
    norms = torch.zeros(T, T, dtype=torch.float64)   # [s, j]: step s, context step j
    maxw = torch.zeros(T, T, dtype=torch.float64)
    row = torch.zeros_like(i)                        # row[j] = w_j^s, zero for j > s
    for s in range(T):
        if s > 0:
            row[:s] *= f[s]
        row[s] = i[s]
        reached = row[:s + 1].double().cpu()
        norms[s, :s + 1] = reached.norm(dim=-1)
        maxw[s, :s + 1] = reached.max(dim=-1).values
    if direction == 1:                               # processing steps -> input positions
        norms, maxw = norms.flip(0, 1), maxw.flip(0, 1)
    return norms.t().contiguous(), maxw.t().contiguous()


@torch.no_grad()
def weight_map(rnn: AblatedRNN, inputs: torch.Tensor, words: Sequence[str], layer: int = 0,
               direction: Optional[str] = None, source: Optional[Dict[str, str]] = None) -> WeightMap:
    """The heat-map matrix and the arrows of one layer of ``rnn`` for one sentence.

    Args:
        rnn: the :class:`~rnn_ablations.AblatedRNN` (any variant with a memory cell).
        inputs: what ``rnn`` reads for the sentence (its token embeddings for the first layer of
            an encoder): ``(T, d)`` or a batch of one ``(1, T, d)``, whatever ``rnn.batch_first``.
        words: the ``T`` words, for the labels.
        layer: which layer of ``rnn`` (``0``-based).
        direction: ``"forward"``, ``"backward"``, ``"both"``, or ``None`` for every direction
            ``rnn`` has.
        source: free-form description of the model (kept in the result and its JSON).
    """
    if not isinstance(rnn, AblatedRNN):
        raise ValueError(f"weight_map needs an AblatedRNN, got {type(rnn).__name__}")
    _check_memory(rnn)
    if isinstance(words, str):
        raise ValueError("words must be a list of strings (one per position), not a single string")
    words = [str(w) for w in words]
    if not words:
        raise ValueError("the text is empty: give at least one word")
    if not isinstance(inputs, torch.Tensor) or not inputs.is_floating_point():
        raise ValueError("inputs must be a floating-point tensor of shape (T, d) or (1, T, d)")
    if inputs.dim() == 3:
        if inputs.shape[0] != 1:
            raise ValueError(f"inputs must be one sentence, (1, T, d) or (T, d); got shape "
                             f"{tuple(inputs.shape)} (for a batch, call weight_map per sentence)")
        inputs = inputs[0]
    if inputs.dim() != 2:
        raise ValueError(f"inputs must have shape (T, d) or (1, T, d), got {tuple(inputs.shape)}")
    if inputs.shape[0] != len(words):
        raise ValueError(f"got {len(words)} words but {inputs.shape[0]} input vectors; give one word "
                         "per position")
    if inputs.shape[1] != rnn.input_size:
        raise ValueError(f"the inputs have {inputs.shape[1]} features but the RNN reads "
                         f"{rnn.input_size}")
    if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < rnn.num_layers:
        raise ValueError(f"layer must be an integer in [0, {rnn.num_layers - 1}] (the encoder has "
                         f"{rnn.num_layers} layer(s)), got {layer!r}")
    dirs = resolve_directions(rnn, direction)
    param = next(rnn.parameters())
    x = inputs.detach().to(param.device, param.dtype)
    T = len(words)
    result: Dict[str, DirectionWeights] = {}
    for d in dirs:
        norms, maxw = _reduced_weights(rnn, x, layer, d)   # [j, t], float64, input positions
        arrows: List[Optional[int]] = []
        for t in range(T):
            cand = list(range(t) if d == 0 else range(t + 1, T))
            if not cand:
                arrows.append(None)
                continue
            col = maxw[cand, t]
            arrows.append(cand[int(torch.argmax(col))])
        name = "forward" if d == 0 else "backward"
        for m in (norms, maxw):
            if not bool(torch.isfinite(m).all()):
                raise ValueError(f"the {name} weights contain NaN or inf: the model's parameters or "
                                 "inputs are not finite")
        result[name] = DirectionWeights(name, norms.tolist(), maxw.tolist(), arrows)
    return WeightMap(words=words, variant=rnn.variant.name, layer=layer, directions=result,
                     source=dict(source or {}))
