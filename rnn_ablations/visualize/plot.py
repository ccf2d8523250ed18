"""Matplotlib drawings of a :class:`~rnn_ablations.visualize.core.WeightMap` (Agg backend).

* :func:`plot_heatmap` — the ACL paper's Table 5: ``‖w_j^t‖₂`` with column = current word ``t``
  and row = context word ``j``.  The forward direction fills the upper-right triangle
  (``j ≤ t``), the backward direction the lower-left one (``j ≥ t``); with both directions each
  diagonal cell is split along its diagonal (upper-right half forward, lower-left half backward).
* :func:`plot_arrows` — the RAN paper's Figure 1: for every word ``t`` an arrow to
  ``v_t = argmax_j max_m w_j^t(m)``; forward arrows (to earlier words) above the sentence,
  backward arrows (to later words) below it; the darker, the larger ``max_m w_{v_t}^t(m)``.
* :func:`plot_weight_map` — both, one above the other, optionally saved to a file.

Colour scales (``scale``): the diagonal ``‖w_t^t‖₂`` is usually several times larger than every
other weight, so on a linear scale the long-range weights all look alike.  ``"log"`` (default)
colours ``log ‖w_j^t‖₂`` over :data:`LOG_DECADES` decades below the largest value; ``"row"``
divides each row (context word ``j``) by its largest value, showing how long each word is kept;
``"column"`` divides each column (current word ``t``) by its largest value, showing which words
each memory holds; ``"linear"`` is the raw norm.  The JSON always has the raw norms.

The figure's size is bounded whatever the text's length: the heat map's side is at most
:data:`MAX_HEATMAP_INCHES`, the arrow panel at most :data:`MAX_ARROW_INCHES` wide, labels are
thinned when the cells get smaller than the font, and the resolution is lowered so that a raster
figure has at most :data:`MAX_FIGURE_PIXELS` pixels.  Beyond about :data:`READABLE_WORDS` words
a figure is no longer readable: draw a span (:meth:`WeightMap.window`).

matplotlib is imported when a function is called, so importing this package needs only torch.
"""
from __future__ import annotations

import logging
import math
from typing import Optional

from ..variants import get_variant
from .core import WeightMap

__all__ = ["plot_heatmap", "plot_arrows", "plot_weight_map", "heatmap_matrix", "HEATMAP_CMAP",
           "SCALES", "DEFAULT_SCALE", "MAX_FIGURE_PIXELS", "READABLE_WORDS"]

_logger = logging.getLogger(__name__)

#: colour scales of the heat map (see the module docstring)
SCALES = ("log", "row", "column", "linear")
DEFAULT_SCALE = "log"
#: decades below the largest weight that the log scale shows (smaller ones get its lowest colour)
LOG_DECADES = 4
#: the most pixels a raster figure gets (the resolution is lowered to stay below)
MAX_FIGURE_PIXELS = 40_000_000
MAX_HEATMAP_INCHES = 24.0
MAX_ARROW_INCHES = 30.0
#: longest label (longer words are cut with "…" in the figure; the JSON keeps them whole)
MAX_LABEL_CHARS = 24
#: above this many words the command asks for a span (the figure would be unreadable)
READABLE_WORDS = 150

HEATMAP_CMAP = "viridis"
_ARROW_CMAPS = {"forward": "Blues", "backward": "Oranges"}
_NORM = r"$\Vert w_j^t \Vert_2$"


def _content_note(wm: WeightMap) -> str:
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
    return min(max(0.28, min(0.42, 12.0 / max(n, 1))), MAX_HEATMAP_INCHES / max(n, 1))


def _label(word: str) -> str:
    return word if len(word) <= MAX_LABEL_CHARS else word[:MAX_LABEL_CHARS - 1] + "…"


def _label_step(n: int) -> int:
    """Every how many cells a tick label fits (1 until the cells get smaller than the font)."""
    need = _font_size(n) / 72 * 1.25
    return max(1, math.ceil(need / _cell_inches(n)))


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


def _check_scale(scale: str) -> None:
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {', '.join(SCALES)}, got {scale!r}")


def scaled_heatmap(wm: WeightMap, scale: str = DEFAULT_SCALE):
    """``(matrix, diagonal, norm, label)``: the values drawn for ``scale`` (the raw norms of
    :func:`heatmap_matrix` for ``log`` and ``linear``; divided by the row's or column's largest
    value, both directions and the diagonal included, for ``row`` and ``column``), the matplotlib
    norm that maps them to colours and the colour bar's label."""
    _check_scale(scale)
    import numpy as np
    from matplotlib.colors import LogNorm, Normalize

    mat, diag = heatmap_matrix(wm)
    T = len(wm.words)
    if scale in ("row", "column"):
        full = np.where(np.isfinite(mat), mat, 0.0)
        for vals in diag.values():
            idx = np.arange(T)
            full[idx, idx] = np.maximum(full[idx, idx], np.asarray(vals, dtype=float))
        axis = 1 if scale == "row" else 0
        peak = full.max(axis=axis)
        peak = np.where(peak > 0, peak, 1.0)
        mat = mat / (peak[:, None] if axis == 1 else peak[None, :])
        diag = {k: [v / peak[t] for t, v in enumerate(vals)] for k, vals in diag.items()}
        who = "context word j (row)" if scale == "row" else "current word t (column)"
        return mat, diag, Normalize(0.0, 1.0), f"{_NORM} / largest of its {who}"
    values = np.concatenate([mat[np.isfinite(mat)]] + [np.asarray(v, dtype=float)
                                                       for v in diag.values()])
    vmax = float(values.max()) if values.size and values.max() > 0 else 1.0
    if scale == "linear":
        return mat, diag, Normalize(vmin=0.0, vmax=vmax), _NORM
    positive = values[values > 0]
    vmin = max(vmax * 10.0 ** -LOG_DECADES, float(positive.min()) if positive.size else vmax)
    vmin = min(vmin, vmax / 10.0)
    return mat, diag, LogNorm(vmin=vmin, vmax=vmax, clip=True), f"{_NORM} (log scale)"


def plot_heatmap(wm: WeightMap, ax=None, cmap: str = HEATMAP_CMAP, colorbar: bool = True,
                 cax=None, scale: str = DEFAULT_SCALE):
    """Draw the Table 5 heat map of ``wm`` on ``ax`` (a new figure when ``None``); returns ``ax``.
    The colour bar goes into ``cax`` when given, else it takes room from ``ax``.

    ``scale`` (:data:`SCALES`): ``"log"`` (default) and ``"linear"`` draw ``‖w_j^t‖₂`` itself
    on a logarithmic or linear colour scale shared by both directions; ``"row"`` and
    ``"column"`` draw it divided by the largest value of its row or column.
    """
    _check(wm)
    _check_scale(scale)
    matplotlib, plt = _mpl()
    import numpy as np
    from matplotlib.patches import Polygon

    T = len(wm.words)
    fs = _font_size(T)
    if ax is None:
        side = T * _cell_inches(T) + 2.5
        _, ax = plt.subplots(figsize=(side + 1.2, side))
    mat, diag, norm, bar_label = scaled_heatmap(wm, scale)
    colormap = matplotlib.colormaps[cmap].copy()
    colormap.set_bad("white")
    image = ax.imshow(np.ma.masked_invalid(mat), cmap=colormap, norm=norm, origin="upper",
                      interpolation="nearest", extent=(-0.5, T - 0.5, T - 0.5, -0.5))
    if len(wm.directions) == 2:
        colours = {name: colormap(norm(np.asarray(diag[name], dtype=float)))
                   for name in ("forward", "backward")}
        for t in range(T):
            upper_right = [(t - 0.5, t - 0.5), (t + 0.5, t - 0.5), (t + 0.5, t + 0.5)]
            lower_left = [(t - 0.5, t - 0.5), (t - 0.5, t + 0.5), (t + 0.5, t + 0.5)]
            for name, corners in (("forward", upper_right), ("backward", lower_left)):
                # add_artist: the limits are set below, no need to update them per patch
                ax.add_artist(Polygon(corners, closed=True, linewidth=0,
                                      facecolor=colours[name][t], gid=f"diag-{name}-{t}"))
    # thin separators between cells (left out when the cells are a few pixels wide)
    if _cell_inches(T) >= 0.1:
        for k in range(T + 1):
            ax.axhline(k - 0.5, color="white", linewidth=0.4)
            ax.axvline(k - 0.5, color="white", linewidth=0.4)
    ax.set_xlim(-0.5, T - 0.5)
    ax.set_ylim(T - 0.5, -0.5)
    step = _label_step(T)
    ticks = list(range(0, T, step))
    labels = [_label(wm.words[t]) if step == 1 else f"{t} {_label(wm.words[t])}" for t in ticks]
    ax.set_xticks(ticks)
    ax.set_yticks(ticks)
    ax.xaxis.tick_top()
    ax.xaxis.set_label_position("top")
    ax.set_xticklabels(labels, rotation=60, ha="left", rotation_mode="anchor", fontsize=fs)
    ax.set_yticklabels(labels, fontsize=fs)
    ax.tick_params(length=0 if step == 1 else 2)
    every = "" if step == 1 else f" (every {step}th labelled)"
    ax.set_xlabel("current word t" + every, fontsize=fs + 1)
    ax.set_ylabel("context word j" + every, fontsize=fs + 1)
    if len(wm.directions) == 2:
        where = "upper right: forward ($j \\leq t$), lower left: backward ($j \\geq t$)"
    elif "forward" in wm.directions:
        where = "forward direction ($j \\leq t$)"
    else:
        where = "backward direction ($j \\geq t$)"
    scale_note = {"log": "log colour scale", "linear": "linear colour scale",
                  "row": "each row divided by its largest value",
                  "column": "each column divided by its largest value"}[scale]
    caption = (f"{_NORM} — {wm.variant}, layer {wm.layer}; {where}; {scale_note}\n"
               f"{_content_note(wm)}")
    label = _source_label(wm)
    if label:
        caption = label + "\n" + caption
    ax.set_title(caption, fontsize=fs + 1, pad=10)
    if colorbar:
        if cax is not None:
            cb = ax.figure.colorbar(image, cax=cax)
        else:
            cb = ax.figure.colorbar(image, ax=ax, fraction=0.046, pad=0.03)
        if scale == "log":   # labelled 1-2-5 ticks (matplotlib labels only whole decades)
            lo, hi = norm.vmin, norm.vmax
            ticks = [m * 10.0 ** e for e in range(math.floor(math.log10(lo)) - 1,
                                                   math.ceil(math.log10(hi)) + 1)
                     for m in (1, 2, 5) if lo <= m * 10.0 ** e <= hi]
            if len(ticks) > 9:
                ticks = [t for t in ticks if abs(math.log10(t) - round(math.log10(t))) < 1e-9]
            cb.set_ticks(ticks)
            cb.set_ticklabels([f"{t:g}" for t in ticks])
            cb.ax.minorticks_off()
        cb.ax.tick_params(labelsize=fs)
        cb.set_label(bar_label, fontsize=fs + 1)
    return ax


def _source_label(wm: WeightMap) -> str:
    src = wm.source
    parts = []
    if src.get("kind"):
        parts.append(src["kind"])
    if src.get("encoder"):
        parts.append(f"encoder {src['encoder']}")
    if src.get("span"):
        parts.append(src["span"])
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
    words = [_label(w) for w in wm.words]
    xs, total = _word_positions(words)
    fs = min(_font_size(T) + 1, 10.0)
    if ax is None:
        _, ax = plt.subplots(figsize=(max(4.0, _arrow_inches(words) + 1.0), 3.0))
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
            colour = colormap(0.35 + 0.65 * float(norm(weights[t])))
            ax.add_artist(FancyArrowPatch(path=path, arrowstyle="-|>", mutation_scale=9,
                                         linewidth=1.2, color=colour, gid=f"arrow-{name}-{t}-{v}"))
    # words, thinned where they would overlap (a dot marks each word's place)
    fig_w = ax.get_position().width * ax.figure.get_figwidth()
    char = fs / 72 * 0.62 * total / max(fig_w, 1e-6)      # one character, in data units
    right = -math.inf
    drawn = 0
    for t, (x, w) in enumerate(zip(xs, words)):
        half = len(w) * char / 2
        if x - half > right + char:
            ax.text(x, 0.0, w, ha="center", va="center", fontsize=fs)
            right = x + half
            drawn += 1
        else:
            ax.plot([x], [0.0], ".", color="#888888", ms=2)
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
    if drawn < T:
        notes.append(f"{drawn} of {T} words labelled")
    ax.set_title(r"$v_t = \mathrm{argmax}_j\,\mathrm{max}_m\,w_j^t(m)$" + f" — {wm.variant}, layer {wm.layer}\n"
                 + "; ".join(notes) + " (darker = larger weight)", fontsize=fs)
    return ax


def _arrow_inches(words) -> float:
    """Width of the arrow panel: room for the words, at most :data:`MAX_ARROW_INCHES`."""
    _, total = _word_positions(words)
    return min(max(total * _CHAR_INCHES, 4.0), MAX_ARROW_INCHES)


def figure_dpi(width: float, height: float, dpi: float) -> float:
    """``dpi``, lowered so that a ``width × height``-inch figure has at most
    :data:`MAX_FIGURE_PIXELS` pixels."""
    limit = math.sqrt(MAX_FIGURE_PIXELS / (width * height))
    return min(float(dpi), math.floor(limit))


def plot_weight_map(wm: WeightMap, path: Optional[str] = None, dpi: int = 150,
                    scale: str = DEFAULT_SCALE):
    """Heat map above, arrows below, in one figure; saved to ``path`` when given.  Returns the
    figure (closed after saving, so many calls do not accumulate memory).

    The figure is at most about 32 × 36 inches and a raster file at most
    :data:`MAX_FIGURE_PIXELS` pixels whatever the text's length (``dpi`` is lowered, with a
    warning, when it would exceed that); beyond :data:`READABLE_WORDS` words it is not readable,
    draw a span instead (``wm.window(start, end)``)."""
    _check(wm)
    _check_scale(scale)
    if isinstance(dpi, bool) or not isinstance(dpi, (int, float)) or not dpi > 0:
        raise ValueError(f"dpi must be a positive number, got {dpi!r}")
    _, plt = _mpl()
    T = len(wm.words)
    side = T * _cell_inches(T)                      # the heat map's square, in inches
    words = [_label(w) for w in wm.words]
    arrow_w = _arrow_inches(words)
    arrow_h = 0.9 + 1.1 * len(wm.directions)
    chars = max(len(w) for w in words) + (0 if _label_step(T) == 1 else len(str(T)) + 1)
    label_w = chars * _font_size(T) / 72 * 0.62 + 0.5
    width = max(label_w + side + 1.4, arrow_w + 0.4, 5.0)
    gap = 1.3                                       # arrow title between the panels
    top = label_w * 0.87 + 1.3                      # rotated column labels and the caption
    height = arrow_h + gap + side + top
    if T > READABLE_WORDS:
        _logger.warning("%d words is more than a figure can show readably (%d): labels are "
                        "thinned; draw a span of the text instead (WeightMap.window, or --span "
                        "START:END on the command line)", T, READABLE_WORDS)
    fig = plt.figure(figsize=(width, height))
    # explicit placement (inches → figure fractions), heat map centred, colour bar beside it
    left = (width - side) / 2 + (label_w - 1.0) / 2
    bottom = arrow_h + gap
    ax_heat = fig.add_axes((left / width, bottom / height, side / width, side / height))
    cax = fig.add_axes(((left + side + 0.15) / width, bottom / height, 0.18 / width, side / height))
    plot_heatmap(wm, ax=ax_heat, cax=cax, scale=scale)
    ax_arrows = fig.add_axes(((width - arrow_w) / 2 / width, 0.05 / height, arrow_w / width,
                              arrow_h / height))
    plot_arrows(wm, ax=ax_arrows)
    if path is not None:
        use = figure_dpi(width, height, dpi)
        if use < dpi:
            _logger.warning("the figure is %.1f × %.1f inches: drawn at %d dpi instead of %g to "
                            "stay within %d megapixels", width, height, use, dpi,
                            MAX_FIGURE_PIXELS // 1_000_000)
        fig.savefig(path, dpi=use, bbox_inches="tight")
        plt.close(fig)
    return fig
