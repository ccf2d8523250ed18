"""The ablation study: every variant under the same config and seed, one table.

``OUT/`` receives one run directory per variant (``OUT/<variant>/``, see
:mod:`rnn_ablations.lm.checkpoints`) and ``ablation.json`` (what was asked: config, seed, data),
``results.csv``, ``results.json``, ``results.md`` and ``results.png`` (bar chart).

A run whose final validation perplexity is not finite or worse than a uniform guess over the
vocabulary (:func:`diverged`) has no perplexity to compare: the table shows ``diverged (epoch
N)`` in its valid column, N the epoch from which it stayed diverged, and the note under the table
gives the value and any earlier epoch that was over the limit.  Every variant still trains under
the same config and seed; nothing is retuned for a variant that diverges.
"""
from __future__ import annotations

import csv
import math
import textwrap
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

from ..variants import VARIANTS, get_variant
from .configs import LMConfig
from .data import Corpus
from .checkpoints import RUN_FILES, write_json
from .corpora import corpus_fingerprint
from .distributed import DistContext
from .rundir import prepare_out
from .trainer import _default_log, train_lm

__all__ = ["run_ablation", "format_table", "write_results", "parse_variants", "diverged",
           "diverged_epochs", "diverged_since", "divergence_note", "ablation_figure"]

MANIFEST = "ablation.json"
OUTPUTS = ("results.csv", "results.json", "results.md", "results.png")


def parse_variants(names: Optional[Sequence[str]]) -> List[str]:
    """Canonical names (aliases accepted, comma- or space-separated), papers' order, no repeats."""
    if not names:
        return list(VARIANTS)
    out: List[str] = []
    for item in names:
        for name in str(item).split(","):
            if name.strip():
                canon = get_variant(name.strip()).name
                if canon not in out:
                    out.append(canon)
    if not out:
        raise ValueError("--variants is empty; give one or more of " + ", ".join(VARIANTS))
    return out


def _fmt(x, spec=".2f", missing="n/a") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return missing
    return format(x, spec)


def _fmt_ppl(x) -> str:
    """Perplexity with 2 decimals; a diverged model's astronomic value in scientific notation."""
    if x is not None and not (isinstance(x, float) and math.isnan(x)) and x >= 1e5:
        return f"{x:.3g}"
    return _fmt(x)


def _columns(results: List[Dict]):
    cols = [("variant", lambda r: r["variant"]),
            ("paper name", lambda r: r["paper_name"]),
            ("recurrent params", lambda r: f"{r['recurrent_params'] / 1e6:.3f}M"),
            ("lr", lambda r: f"{r['hyper_parameters']['learning_rate']:g}"),
            ("valid ppl", _valid_cell),
            ("test ppl", lambda r: _fmt_ppl(r["test_ppl"]))]
    if any(r.get("valid_long_range_acc") is not None for r in results):
        cols.append(("agreement acc (valid)", lambda r: _fmt(r.get("valid_long_range_acc"), ".1%")))
    cols.append(("train words/s", lambda r: f"{r['train_words_per_sec']:,.0f}"))
    return cols


def format_table(results: List[Dict], markdown: bool = False) -> str:
    cols = _columns(results)
    rows = [[c[0] for c in cols]] + [[f(r) for _, f in cols] for r in results]
    if markdown:
        lines = ["| " + " | ".join(rows[0]) + " |",
                 "|" + "|".join("---" if i < 2 else "---:" for i in range(len(cols))) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in rows[1:]]
        return "\n".join(lines)
    widths = [max(len(r[i]) for r in rows) for i in range(len(cols))]
    def line(r):
        return "  ".join(s.ljust(w) if i < 2 else s.rjust(w) for i, (s, w) in enumerate(zip(r, widths)))
    return "\n".join([line(rows[0]), "  ".join("-" * w for w in widths)] + [line(r) for r in rows[1:]])


#: a perplexity above this counts as diverged when the vocabulary size is unknown
DIVERGED_PPL = 1e5

_SHORT = {"lstm": "LSTM", "srnn": "−GATES\n(S-RNN)", "lstm_minus_srnn": "−S-RNN",
          "ran": "−S-RNN−OUT\n(tanh RAN)", "identity_ran": "identity\nRAN",
          "lstm_minus_srnn_minus_hidden": "−S-RNN\n−HIDDEN"}


def _limit(r: Dict) -> float:
    return r.get("vocab_size") or DIVERGED_PPL


def _over(p, limit: float) -> bool:
    return p is None or not math.isfinite(p) or p > limit


def diverged(r: Dict) -> bool:
    """A run whose validation perplexity is not finite or worse than guessing uniformly over the
    vocabulary (above :data:`DIVERGED_PPL` when the result does not give the vocabulary size)."""
    return _over(r.get("valid_ppl"), _limit(r))


def diverged_epochs(r: Dict) -> List[int]:
    """The epochs of ``r["history"]`` whose validation perplexity counts as diverged (the rule of
    :func:`diverged`)."""
    limit = _limit(r)
    return [h["epoch"] for h in r.get("history") or ()
            if h.get("valid_ppl") is not None and _over(h["valid_ppl"], limit)]


def diverged_since(r: Dict) -> Optional[int]:
    """For a diverged run, the first epoch of the stretch of diverged epochs that lasts to the end
    of its history; ``None`` for a run that did not diverge or whose last epoch was not over the
    limit (then only the final evaluation was)."""
    if not diverged(r):
        return None
    bad = set(diverged_epochs(r))
    since = None
    for h in reversed(r.get("history") or ()):
        if h.get("epoch") not in bad:
            break
        since = h["epoch"]
    return since


def _epochs_text(epochs: List[int]) -> str:
    """``[2, 4, 5, 6]`` → ``"2, 4–6"``."""
    spans: List[List[int]] = []
    for e in epochs:
        if spans and e == spans[-1][1] + 1:
            spans[-1][1] = e
        else:
            spans.append([e, e])
    return ", ".join(f"{a}" if a == b else f"{a}–{b}" for a, b in spans)


def _valid_cell(r: Dict) -> str:
    if not diverged(r):
        return _fmt_ppl(r["valid_ppl"])
    since = diverged_since(r)
    return "diverged" + (f" (epoch {since})" if since is not None else "")


def divergence_note(results: List[Dict]) -> str:
    """The lines under the table: each diverged run (from which epoch, its final validation
    perplexity) and each run that was over the limit at some epoch but not at the end."""
    lines = []
    for r in results:
        limit = _limit(r)
        what = (f"the vocabulary size ({limit:g}, a uniform guess)" if r.get("vocab_size")
                else f"{limit:g}")
        epochs = diverged_epochs(r)
        if diverged(r):
            since = diverged_since(r)
            earlier = [e for e in epochs if since is None or e < since]
            when = (f"from epoch {since} to the end" if since is not None
                    else "at the final evaluation")
            final = r.get("valid_ppl")
            how = (f"above {what}" if final is not None and math.isfinite(final)
                   else "not finite")
            lines.append(
                f"{r['variant']} diverged: its validation perplexity was {how} {when} "
                f"({_fmt_ppl(final)} after training"
                + (f"; also at epoch {_epochs_text(earlier)}" if earlier else "")
                + "), so it has no validation perplexity to compare; its other columns are "
                  "as measured. Every epoch's value: results.json (history).")
        elif epochs:
            lines.append(f"{r['variant']}: validation perplexity above {what} at epoch "
                         f"{_epochs_text(epochs)}, not at the end; the row is the final model's.")
    if any(diverged(r) for r in results):
        lines.append("Every variant ran under the same config and seed; none was retuned.")
    return "\n".join(lines)


def _annotate(r: Dict) -> Dict:
    """``r`` with ``diverged``, ``diverged_from_epoch`` and ``diverged_epochs``."""
    return dict(r, diverged=diverged(r), diverged_from_epoch=diverged_since(r),
                diverged_epochs=diverged_epochs(r))


def _split_axis(values: List[float]):
    """``None``, or the ``(low, high)`` groups of ``values`` when one gap dominates their range
    (e.g. −GATES far above the gated cells): the figure then breaks its axis between them."""
    v = sorted(values)
    if len(v) < 3:
        return None
    gaps = [(v[k + 1] - v[k], k) for k in range(len(v) - 1)]
    gap, k = max(gaps)
    full = v[-1] - v[0]
    low, high = v[:k + 1], v[k + 1:]
    spans = max(low[-1] - low[0], high[-1] - high[0], 1e-12)
    if len(low) >= 2 and gap > 0.5 * full and full > 6 * spans:
        return low, high
    return None


def _limits(group: List[float]):
    lo, hi = min(group), max(group)
    pad = max((hi - lo) * 0.35, 0.004 * hi, 1e-3)
    return max(lo - pad, 1.0 if lo >= 1.0 else 0.0), hi + pad


def _plot(results: List[Dict], path: Path, title: str) -> None:
    fig = ablation_figure(results, title)
    import matplotlib.pyplot as plt
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _ok(p, limit: float) -> bool:
    return p is not None and math.isfinite(p) and p <= limit


def _divergence_line(results: List[Dict]) -> str:
    """The figure's line under the panels for the diverged runs: what the red marks mean, with
    each run's final validation perplexity and the epoch from which it stayed diverged."""
    parts = []
    for r in results:
        if not diverged(r):
            continue
        since = diverged_since(r)
        final = r.get("valid_ppl")
        value = _fmt_ppl(final) if final is not None else "n/a"
        parts.append(f"{_SHORT.get(r['variant'], r['variant']).replace(chr(10), ' ')} "
                     f"{value}" + (f" from epoch {since}" if since is not None else ""))
    if not parts:
        return ""
    limit = {_limit(r) for r in results if diverged(r)}
    what = (f"the vocabulary size ({next(iter(limit)):g})" if len(limit) == 1
            and all(r.get("vocab_size") for r in results if diverged(r)) else "the limit")
    return (f"red: diverged, the validation perplexity not finite or above {what} at the end "
            f"({'; '.join(parts)}); the run's other numbers are as measured")


def ablation_figure(results: List[Dict], title: str):
    """The figure of results.png: every number of the table.  Perplexity (valid and test as
    points on an axis fitted to the values, broken when −GATES is far from the rest; each point
    labelled with its value, valid also with its difference to the best), agreement accuracy
    when the corpus has it, training speed with each bar's value and the recurrent parameters
    under each name (the learning rate in the title when every run shares it, else under the
    names).  A diverged run's validation perplexity is a red mark at the top of the panel with its
    value; its other numbers are drawn as measured, and a line under the panels says what red
    means.  Legends sit under the panels, clear of the labels."""
    import matplotlib
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.transforms import blended_transform_factory

    red = "#c03030"
    valid_colour, test_colour = "#4878a8", "#c07820"
    labels = [_SHORT.get(r["variant"], r["variant"]) for r in results]
    xs = list(range(len(results)))
    bad = [diverged(r) for r in results]
    limits = [_limit(r) for r in results]
    has_test = any(r.get("test_ppl") is not None for r in results)
    has_acc = any(r.get("valid_long_range_acc") is not None for r in results)
    lrs = {r["hyper_parameters"]["learning_rate"] for r in results}
    # the points: every valid perplexity of a run that did not diverge, and every test
    # perplexity that is finite and not above the limit (a diverged run's included)
    points = {"valid_ppl": [(x, r["valid_ppl"]) for x, r, b in zip(xs, results, bad) if not b],
              "test_ppl": [(x, r.get("test_ppl")) for x, r, lim in zip(xs, results, limits)
                           if _ok(r.get("test_ppl"), lim)]}
    ok_ppls = [p for pts in points.values() for _, p in pts]
    split = _split_axis(ok_ppls) if ok_ppls else None

    n_panels = 3 if has_acc else 2
    ratios = [1.45] + [1.0] * (n_panels - 1)
    fig = plt.figure(figsize=(5.0 * sum(ratios), 5.8))
    gs = fig.add_gridspec(3, n_panels, height_ratios=[1, 1, 1], width_ratios=ratios,
                          hspace=0.08, wspace=0.22)
    if split:
        ax_hi = fig.add_subplot(gs[0, 0])
        ax_lo = fig.add_subplot(gs[1:, 0], sharex=ax_hi)
        ppl_axes = [ax_hi, ax_lo]
    else:
        ax_lo = fig.add_subplot(gs[:, 0])
        ax_hi = None
        ppl_axes = [ax_lo]

    def axis_of(p):
        return ax_hi if (split and p >= min(split[1])) else ax_lo

    best = min((p for _, p in points["valid_ppl"]), default=None)
    series = [("valid_ppl", "o", valid_colour, -0.12)]
    if has_test:
        series.append(("test_ppl", "D", test_colour, 0.12))
    for key, marker, colour, dx in series:
        for ax in ppl_axes:
            ax.plot([x + dx for x, _ in points[key]], [p for _, p in points[key]], marker,
                    color=colour, ms=6.5, linestyle="none", zorder=3)
        for x, p in points[key]:
            if key == "valid_ppl":   # left of the point: the value and its difference to the best
                text, xy, off, ha = (f"{p:.2f}\n({'best' if p == best else f'+{p - best:.2f}'})",
                                     (x + dx, p), -5, "right")
            else:                    # right of the point: the value
                text, xy, off, ha = f"{p:.2f}", (x + dx, p), 5, "left"
            axis_of(p).annotate(text, xy, xytext=(off, 0), textcoords="offset points", ha=ha,
                                va="center", fontsize=7, color=colour if key == "test_ppl" else "k")
    for ax in ppl_axes:
        ax.grid(axis="y", color="#dddddd", linewidth=0.6, zorder=0)
    if split:
        ax_lo.set_ylim(*_limits(split[0]))
        ax_hi.set_ylim(*_limits(split[1]))
        ax_hi.spines["bottom"].set_visible(False)
        ax_lo.spines["top"].set_visible(False)
        ax_hi.tick_params(axis="x", bottom=False, labelbottom=False)
        kw = dict(marker=[(-1, -0.5), (1, 0.5)], markersize=10, linestyle="none", color="k",
                  mec="k", mew=1, clip_on=False)
        ax_hi.plot([0, 1], [0, 0], transform=ax_hi.transAxes, **kw)
        ax_lo.plot([0, 1], [1, 1], transform=ax_lo.transAxes, **kw)
    elif ok_ppls and max(ok_ppls) / min(ok_ppls) > 3:   # e.g. two runs far apart
        ax_lo.set_yscale("log")
        ax_lo.set_ylim(min(ok_ppls) / 1.3, max(ok_ppls) * 1.3)
    elif ok_ppls:
        ax_lo.set_ylim(*_limits(ok_ppls))
    top_ax = ax_hi if split else ax_lo
    trans = blended_transform_factory(top_ax.transData, top_ax.transAxes)
    for x, r, b, lim in zip(xs, results, bad, limits):
        if not b:
            continue
        p = r.get("valid_ppl")
        val = _fmt_ppl(p) if p is not None else "n/a"
        since = diverged_since(r)
        val += f"\nfrom epoch {since}" if since is not None else ""
        t = r.get("test_ppl")
        if t is not None and not _ok(t, lim):   # not drawn as a point: its value here
            val += f"\ntest ppl {_fmt_ppl(t)}"
        top_ax.plot([x - 0.12], [0.97], marker="^", color=red, ms=9, transform=trans,
                    clip_on=False)
        top_ax.text(x - 0.12, 0.90, f"diverged\nvalid ppl\n{val}", transform=trans,
                    ha="center", va="top", fontsize=7, color=red)
    ax_lo.set_xlim(-0.85, len(xs) - 0.3)
    ax_lo.set_xticks(xs, labels, fontsize=8)
    ax_lo.set_ylabel("perplexity (lower is better)"
                     + (", log scale" if ax_lo.get_yscale() == "log" else ""))
    top_ax.set_title("perplexity" + (" (axis broken)" if split else "") + "\n"
                     "valid: value (difference to the best valid); test: value", fontsize=9)
    handles = [Line2D([], [], marker="o", color=valid_colour, linestyle="none", label="valid")]
    if has_test:
        handles.append(Line2D([], [], marker="D", color=test_colour, linestyle="none",
                              label="test"))
    if any(bad):
        handles.append(Line2D([], [], marker="^", color=red, linestyle="none",
                              label="valid, diverged"))
    under = dict(loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=3, fontsize=8,
                 frameon=False)
    ax_lo.legend(handles=handles, **under)

    col = 1
    if has_acc:
        ax = fig.add_subplot(gs[:, col])
        col += 1
        w = 0.38 if has_test else 0.6
        for k, (name, key, colour) in enumerate((("valid", "valid_long_range_acc", valid_colour),
                                                 ("test", "test_long_range_acc", test_colour))):
            if name == "test" and not has_test:
                continue
            off = (k - 0.5) * w if has_test else 0.0
            vals = [r.get(key) for r in results]
            ax.bar([x + off for x in xs], [100 * v if v is not None else 0 for v in vals], w,
                   color=[red if b else colour for b in bad], label=name, zorder=2)
            for x, v in zip(xs, vals):
                if v is not None:
                    ax.text(x + off, 100 * v + 1, f"{100 * v:.1f}", ha="center", va="bottom",
                            fontsize=6.5, rotation=90 if has_test else 0)
        ax.set_ylim(0, 112)
        ax.set_ylabel("agreement accuracy, % (higher is better)")
        ax.set_xticks(xs, labels, fontsize=8)
        ax.set_title("long-range agreement: next-token accuracy\nat the agreeing verbs", fontsize=9)
        ax.grid(axis="y", color="#dddddd", linewidth=0.6, zorder=0)
        ax.legend(**dict(under, ncol=2))
    ax = fig.add_subplot(gs[:, col])
    speeds = [r["train_words_per_sec"] for r in results]
    ax.bar(xs, speeds, 0.6, color=[red if b else "#60a060" for b in bad], zorder=2)
    for x, v in zip(xs, speeds):
        ax.text(x, v, f"{v:,.0f}", ha="center", va="bottom", fontsize=7)
    ax.set_ylim(0, max(speeds) * 1.1 if max(speeds) > 0 else 1)
    ax.set_ylabel("training words / s")
    names = [f"{lab}\n{r['recurrent_params'] / 1e6:.3f}M"
             + ("" if len(lrs) == 1 else f"\nlr {r['hyper_parameters']['learning_rate']:g}")
             for lab, r in zip(labels, results)]
    ax.set_xticks(xs, names, fontsize=8)
    ax.set_title("training speed (words/s)\nunder each name: its recurrent parameters"
                 + ("" if len(lrs) == 1 else " and lr"), fontsize=9)
    ax.grid(axis="y", color="#dddddd", linewidth=0.6, zorder=0)
    width = fig.get_figwidth()
    note = _divergence_line(results)
    if note:
        fig.text(0.5, 0.008, "\n".join(textwrap.wrap(note, int(width * 15))), ha="center",
                 va="bottom", fontsize=8, color=red)
    if len(lrs) == 1:
        title = f"{title}; lr {next(iter(lrs)):g}"
    lines = textwrap.wrap(title, int(width * 11))
    fig.suptitle("\n".join(lines), fontsize=10)
    top = 1 - (0.6 + 0.17 * len(lines)) / fig.get_figheight()
    fig.subplots_adjust(left=0.8 / width, right=1 - 0.15 / width, top=top, bottom=0.2)
    return fig


def write_results(results: List[Dict], out: Path, title: str, note: str = "") -> Dict[str, Path]:
    out = Path(out)
    results = [_annotate(r) for r in results]
    paths = {name: out / name for name in OUTPUTS}
    with open(paths["results.csv"], "w", newline="") as f:
        w = csv.writer(f)
        keys = ["variant", "paper_name", "recurrent_params", "learning_rate", "valid_ppl",
                "test_ppl", "diverged", "diverged_from_epoch", "valid_long_range_acc",
                "test_long_range_acc", "train_words_per_sec", "train_time_s", "epochs", "config",
                "seed", "corpus"]
        w.writerow(keys)
        for r in results:
            row = dict(r, learning_rate=r["hyper_parameters"]["learning_rate"])
            w.writerow(["" if row.get(k) is None else row.get(k) for k in keys])
    write_json({"title": title, "note": note, "results": results}, paths["results.json"])
    md_note = "".join(f"\n{line}\n" for line in note.splitlines())   # one paragraph each
    paths["results.md"].write_text(f"{title}\n\n{format_table(results, markdown=True)}\n"
                                   + md_note)
    _plot(results, paths["results.png"], title)
    return paths


def run_ablation(config: LMConfig, corpus: Corpus, out, *, variants: Optional[Sequence[str]] = None,
                 corpus_spec: Optional[Dict] = None, seed: int = 0, paper_lr: bool = True,
                 resume: bool = False, overwrite: bool = False, ctx: Optional[DistContext] = None,
                 progress: bool = False, log: Optional[Callable[[str], None]] = _default_log,
                 title: Optional[str] = None) -> List[Dict]:
    """Train every variant (same config, seed and data); write and return the results.
    ``log`` receives the progress lines and the table (default: the ``rnn_ablations.lm.trainer``
    logger at INFO level; ``None``: nothing).  Ctrl-C raises
    :class:`~rnn_ablations.lm.interrupt.TrainingInterrupted` after checkpointing the current
    variant; ``resume=True`` then reuses the finished variants and continues."""
    ctx = ctx or DistContext()
    names = parse_variants(variants)
    out = Path(out)
    manifest = {"config": config.to_dict(), "seed": seed, "paper_lr": paper_lr,
                "corpus": corpus.source, "corpus_spec": corpus_spec,
                "corpus_fingerprint": corpus_fingerprint(corpus), "variants": names}
    if ctx.is_main:
        prepare_out(out, resume=resume, overwrite=overwrite, what="ablation results",
                    files=list(OUTPUTS) + [f"{v}/{f}" for v in VARIANTS for f in RUN_FILES],
                    manifest=MANIFEST, new_manifest=manifest,
                    same_keys=("config", "seed", "corpus_fingerprint", "paper_lr"))
        write_json(manifest, out / MANIFEST)
    ctx.barrier()
    say = log if (log is not None and ctx.is_main) else (lambda s: None)
    results = []
    for name in names:
        cfg = config.for_variant(name, paper_lr=paper_lr)
        run_dir = out / name
        r = train_lm(name, cfg, corpus, run_dir, corpus_spec=corpus_spec, seed=seed, ctx=ctx,
                     resume=resume and run_dir.exists(), overwrite=overwrite, progress=progress,
                     log=log)
        results.append(r)
    if not ctx.is_main:
        return []
    results = [_annotate(r) for r in results]
    notes = []
    if corpus.test is None:
        notes.append(f"The data ({corpus.source}) has no test file: only valid perplexity is "
                     "reported.")
    if divergence_note(results):
        notes.append(divergence_note(results))
    note = "\n".join(notes)
    title = title or (f"LSTM ablations, config {config.name} ({config.num_layers} × "
                      f"{config.hidden_size}, {config.epochs} epoch{'s' if config.epochs != 1 else ''}), "
                      f"seed {seed}, "
                      f"data: {corpus.source}")
    paths = write_results(results, out, title, note)
    say("")
    say(title)
    say(format_table(results))
    if note:
        say(note)
    say("wrote " + ", ".join(str(p) for p in paths.values()))
    return results
