"""Matplotlib drawings of a :class:`~rnn_ablations.visualize.core.WeightMap` (Agg backend).

* :func:`plot_heatmap` — the ACL paper's Table 5: ``‖w_j^t‖₂`` with column = current word ``t``
  and row = context word ``j``.  The forward direction fills the upper-right triangle
  (``j ≤ t``), the backward direction the lower-left one (``j ≥ t``); with both directions each
  diagonal cell is split along its diagonal (upper-right half forward, lower-left half backward).
* :func:`plot_arrows` — the RAN paper's Figure 1: for every word ``t`` an arrow to
  ``v_t = argmax_j max_m w_j^t(m)``; forward arrows (to earlier words) above the sentence,
  backward arrows (to later words) below it; the darker, the larger ``max_m w_{v_t}^t(m)``.
* :func:`plot_weight_map` — both, one above the other, optionally saved to a file.

matplotlib is imported when a function is called, so importing this package needs only torch.
"""
from __future__ import annotations

from typing import Optional

from .core import WeightMap

__all__ = ["plot_heatmap", "plot_arrows", "plot_weight_map", "HEATMAP_CMAP"]

HEATMAP_CMAP = "viridis"
_ARROW_CMAPS = {"forward": "Blues", "backward": "Oranges"}
_NORM = r"$\Vert w_j^t \Vert_2$"


def _content_note(wm: WeightMap) -> str:
    from ..variants import get_variant

    if get_variant(wm.variant).context_independent_content:
        return r"content $\tilde c_j = W_{cx} x_j$ depends on word $j$ only"
    return r"content $\tilde c_j = \tanh(W_c [x_j; h_{j-1}] + b_c)$ (the LSTM's S-RNN state)"


def _mpl():
    try:
        import matplotlib
    except ImportError as exc:  # pragma: no cover - matplotlib is in requirements/core.txt
        raise ValueError("plotting needs matplotlib: pip install matplotlib") from exc
    if matplotlib.get_backend().lower() not in ("agg", "pdf", "svg", "ps", "cairo", "pgf") and \
            not matplotlib.is_interactive():
        matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    return matplotlib, plt


def _check(wm: WeightMap) -> None:
    if not isinstance(wm, WeightMap):
        raise ValueError(f"expected a WeightMap (from weight_map), got {type(wm).__name__}")
    if not wm.directions:
        raise ValueError("the WeightMap has no direction to draw")


def _cell_inches(n: int) -> float:
    return max(0.28, min(0.42, 12.0 / max(n, 1)))


def _font_size(n: int) -> float:
    return max(6.5, min(10.0, 240.0 / max(n, 1)))


_CHAR_INCHES = 0.095     # horizontal room per character of the sentence in the arrow panel


def heatmap_matrix(wm: WeightMap):
    """``(matrix, diagonal)``: the ``T × T`` array drawn by :func:`plot_heatmap` (NaN = not
    reached; row = context word ``j``, column = current word ``t``, diagonal excluded when both
    directions are shown) and ``{direction: [‖w_t^t‖₂ for each t]}`` for the diagonal."""
    import numpy as np

    T = len(wm.words)
    mat = np.full((T, T), np.nan)
    rows, cols = np.indices((T, T))
    for name, d in wm.directions.items():
        norms = np.asarray(d.norms, dtype=float)
        reach = rows <= cols if name == "forward" else rows >= cols
        mat[reach] = norms[reach]
    diag = {name: [d.norms[t][t] for t in range(T)] for name, d in wm.directions.items()}
    if len(wm.directions) == 2:
        mat[np.arange(T), np.arange(T)] = np.nan   # drawn as two half cells
    return mat, diag


def plot_heatmap(wm: WeightMap, ax=None, cmap: str = HEATMAP_CMAP, colorbar: bool = True,
                 cax=None):
    """Draw the Table 5 heat map of ``wm`` on ``ax`` (a new figure when ``None``); returns ``ax``.
    The colour bar goes into ``cax`` when given, else it takes room from ``ax``.

    The drawn values are ``‖w_j^t‖₂`` themselves (no normalisation), on one colour scale shared
    by both directions.
    """
    _check(wm)
    matplotlib, plt = _mpl()
    import numpy as np
    from matplotlib.colors import Normalize
    from matplotlib.patches import Polygon

    T = len(wm.words)
    fs = _font_size(T)
    if ax is None:
        side = T * _cell_inches(T) + 2.5
        _, ax = plt.subplots(figsize=(side + 1.2, side))
    mat, diag = heatmap_matrix(wm)
    values = [v for v in mat[np.isfinite(mat)]] + [v for vals in diag.values() for v in vals]
    vmax = max(values) if values and max(values) > 0 else 1.0
    norm = Normalize(vmin=0.0, vmax=vmax)
    colormap = matplotlib.colormaps[cmap].copy()
    colormap.set_bad("white")
    image = ax.imshow(np.ma.masked_invalid(mat), cmap=colormap, norm=norm, origin="upper",
                      interpolation="nearest", extent=(-0.5, T - 0.5, T - 0.5, -0.5))
    if len(wm.directions) == 2:
        for t in range(T):
            upper_right = [(t - 0.5, t - 0.5), (t + 0.5, t - 0.5), (t + 0.5, t + 0.5)]
            lower_left = [(t - 0.5, t - 0.5), (t - 0.5, t + 0.5), (t + 0.5, t + 0.5)]
            for name, corners in (("forward", upper_right), ("backward", lower_left)):
                ax.add_patch(Polygon(corners, closed=True, linewidth=0,
                                     facecolor=colormap(norm(diag[name][t])),
                                     gid=f"diag-{name}-{t}"))
    # thin separators between cells
    for k in range(T + 1):
        ax.axhline(k - 0.5, color="white", linewidth=0.4)
        ax.axvline(k - 0.5, color="white", linewidth=0.4)
    ax.set_xlim(-0.5, T - 0.5)
    ax.set_ylim(T - 0.5, -0.5)
    ax.set_xticks(range(T))
    ax.set_yticks(range(T))
    ax.xaxis.tick_top()
    ax.xaxis.set_label_position("top")
    ax.set_xticklabels(wm.words, rotation=60, ha="left", rotation_mode="anchor", fontsize=fs)
    ax.set_yticklabels(wm.words, fontsize=fs)
    ax.tick_params(length=0)
    ax.set_xlabel("current word t", fontsize=fs + 1)
    ax.set_ylabel("context word j", fontsize=fs + 1)
    if len(wm.directions) == 2:
        where = "upper right: forward ($j \\leq t$), lower left: backward ($j \\geq t$)"
    elif "forward" in wm.directions:
        where = "forward direction ($j \\leq t$)"
    else:
        where = "backward direction ($j \\geq t$)"
    caption = f"{_NORM} — {wm.variant}, layer {wm.layer}; {where}\n{_content_note(wm)}"
    label = _source_label(wm)
    if label:
        caption = label + "\n" + caption
    ax.set_title(caption, fontsize=fs + 1, pad=10)
    if colorbar:
        if cax is not None:
            cb = ax.figure.colorbar(image, cax=cax)
        else:
            cb = ax.figure.colorbar(image, ax=ax, fraction=0.046, pad=0.03)
        cb.ax.tick_params(labelsize=fs)
        cb.set_label(_NORM, fontsize=fs + 1)
    return ax


def _source_label(wm: WeightMap) -> str:
    src = wm.source
    parts = []
    if src.get("kind"):
        parts.append(src["kind"])
    if src.get("encoder"):
        parts.append(f"encoder {src['encoder']}")
    return ", ".join(parts)


def _word_positions(words):
    """x centre of each word, spaced by its length (in character units)."""
    xs, x = [], 0.0
    for w in words:
        width = max(len(w), 3) + 2.0
        xs.append(x + width / 2)
        x += width
    return xs, x


def plot_arrows(wm: WeightMap, ax=None):
    """Draw the Figure 1 arrows of ``wm`` over the sentence on ``ax`` (new figure when ``None``)."""
    _check(wm)
    matplotlib, plt = _mpl()
    from matplotlib.colors import Normalize
    from matplotlib.patches import FancyArrowPatch
    from matplotlib.path import Path

    T = len(wm.words)
    xs, total = _word_positions(wm.words)
    fs = min(_font_size(T) + 1, 10.0)
    if ax is None:
        _, ax = plt.subplots(figsize=(max(4.0, total * _CHAR_INCHES + 1.0), 3.0))
    span = max(xs[-1] - xs[0], 1.0)
    max_h = 0.0
    for name, d in wm.directions.items():
        sign = 1.0 if name == "forward" else -1.0
        colormap = matplotlib.colormaps[_ARROW_CMAPS[name]]
        weights = [d.arrow_weight(t) for t in range(T)]
        known = [w for w in weights if w is not None]
        top = max(known) if known and max(known) > 0 else 1.0
        norm = Normalize(vmin=0.0, vmax=top)
        for t in range(T):
            v = d.arrows[t]
            if v is None:
                continue
            h = 0.6 + 2.4 * abs(xs[t] - xs[v]) / span
            max_h = max(max_h, h)
            y0 = sign * 0.45
            start, end = (xs[t], y0), (xs[v], y0)
            ctrl = ((xs[t] + xs[v]) / 2, y0 + sign * 2 * h)   # quadratic Bézier peaks at h
            path = Path([start, ctrl, end], [Path.MOVETO, Path.CURVE3, Path.CURVE3])
            colour = colormap(0.35 + 0.65 * norm(weights[t]))
            ax.add_patch(FancyArrowPatch(path=path, arrowstyle="-|>", mutation_scale=9,
                                         linewidth=1.2, color=colour, gid=f"arrow-{name}-{t}-{v}"))
    for x, w in zip(xs, wm.words):
        ax.text(x, 0.0, w, ha="center", va="center", fontsize=fs)
    has_fwd, has_bwd = "forward" in wm.directions, "backward" in wm.directions
    top_y = 0.45 + max_h + 0.4 if has_fwd else 0.8
    bottom_y = -(0.45 + max_h + 0.4) if has_bwd else -0.8
    ax.set_xlim(0.0, total)
    ax.set_ylim(bottom_y, top_y)
    ax.axis("off")
    notes = []
    if has_fwd:
        notes.append("above: to the most influential earlier word")
    if has_bwd:
        notes.append("below: to the most influential later word")
    ax.set_title(r"$v_t = \mathrm{argmax}_j\,\mathrm{max}_m\,w_j^t(m)$" + f" — {wm.variant}, layer {wm.layer}\n"
                 + "; ".join(notes) + " (darker = larger weight)", fontsize=fs)
    return ax


def plot_weight_map(wm: WeightMap, path: Optional[str] = None, dpi: int = 150):
    """Heat map above, arrows below, in one figure; saved to ``path`` when given.  Returns the
    figure (closed after saving, so many calls do not accumulate memory)."""
    _check(wm)
    _, plt = _mpl()
    T = len(wm.words)
    side = T * _cell_inches(T)                      # the heat map's square, in inches
    _, total = _word_positions(wm.words)
    arrow_w = max(total * _CHAR_INCHES, 4.0)
    arrow_h = 0.9 + 1.1 * len(wm.directions)
    label_w = max(len(w) for w in wm.words) * _font_size(T) / 72 * 0.62 + 0.5
    width = max(label_w + side + 1.4, arrow_w + 0.4, 5.0)
    gap = 1.3                                       # arrow title between the panels
    top = label_w * 0.87 + 1.3                      # rotated column labels and the caption
    height = arrow_h + gap + side + top
    fig = plt.figure(figsize=(width, height))
    # explicit placement (inches → figure fractions), heat map centred, colour bar beside it
    left = (width - side) / 2 + (label_w - 1.0) / 2
    bottom = arrow_h + gap
    ax_heat = fig.add_axes((left / width, bottom / height, side / width, side / height))
    cax = fig.add_axes(((left + side + 0.15) / width, bottom / height, 0.18 / width, side / height))
    plot_heatmap(wm, ax=ax_heat, cax=cax)
    ax_arrows = fig.add_axes(((width - arrow_w) / 2 / width, 0.05 / height, arrow_w / width,
                              arrow_h / height))
    plot_arrows(wm, ax=ax_arrows)
    if path is not None:
        fig.savefig(path, dpi=dpi, bbox_inches="tight")
        plt.close(fig)
    return fig
