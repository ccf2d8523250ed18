"""The ablation study: every variant under the same config and seed, one table.

``OUT/`` receives one run directory per variant (``OUT/<variant>/``, see
:mod:`rnn_ablations.lm.trainer`) and ``ablation.json`` (what was asked: config, seed, data),
``results.csv``, ``results.json``, ``results.md`` and ``results.png`` (bar chart).
"""
from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

from ..variants import VARIANTS, get_variant
from .configs import LMConfig
from .data import Corpus
from .trainer import RUN_FILES, DistContext, _write_json, corpus_fingerprint, train_lm

__all__ = ["run_ablation", "format_table", "write_results", "parse_variants"]

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
            ("valid ppl", lambda r: _fmt_ppl(r["valid_ppl"])),
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


def _plot(results: List[Dict], path: Path, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    short = {"lstm": "LSTM", "srnn": "−GATES\n(S-RNN)", "lstm_minus_srnn": "−S-RNN",
             "ran": "−S-RNN−OUT\n(tanh RAN)", "identity_ran": "identity\nRAN",
             "lstm_minus_srnn_minus_hidden": "−S-RNN\n−HIDDEN"}
    labels = [short.get(r["variant"], r["variant"]) for r in results]
    xs = list(range(len(results)))
    has_test = any(r["test_ppl"] is not None for r in results)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    w = 0.38 if has_test else 0.6
    ax1.bar([x - (w / 2 if has_test else 0) for x in xs], [r["valid_ppl"] for r in results], w,
            label="valid", color="#4878a8")
    if has_test:
        ax1.bar([x + w / 2 for x in xs], [r["test_ppl"] or 0 for r in results], w, label="test",
                color="#e0a040")
    for x, r in zip(xs, results):
        ax1.text(x - (w / 2 if has_test else 0), r["valid_ppl"], _fmt_ppl(r["valid_ppl"]),
                 ha="center", va="bottom", fontsize=8)
    ppls = [p for r in results for p in (r["valid_ppl"], r["test_ppl"]) if p]
    log_scale = max(ppls) / min(ppls) > 20
    if log_scale:  # a diverged variant would flatten the others' bars
        ax1.set_yscale("log")
    ax1.set_ylabel("perplexity (lower is better)" + (", log scale" if log_scale else ""))
    ax1.set_xticks(xs, labels, fontsize=8)
    ax1.legend()
    ax1.set_title("perplexity")
    ax2.bar(xs, [r["train_words_per_sec"] for r in results], 0.6, color="#60a060")
    ax2.set_ylabel("training words / s")
    ax2.set_xticks(xs, labels, fontsize=8)
    ax2.set_title("training speed")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_results(results: List[Dict], out: Path, title: str, note: str = "") -> Dict[str, Path]:
    out = Path(out)
    paths = {name: out / name for name in OUTPUTS}
    cols = _columns(results)
    with open(paths["results.csv"], "w", newline="") as f:
        w = csv.writer(f)
        keys = ["variant", "paper_name", "recurrent_params", "learning_rate", "valid_ppl",
                "test_ppl", "valid_long_range_acc", "test_long_range_acc", "train_words_per_sec",
                "train_time_s", "epochs", "config", "seed", "corpus"]
        w.writerow(keys)
        for r in results:
            row = dict(r, learning_rate=r["hyper_parameters"]["learning_rate"])
            w.writerow(["" if row.get(k) is None else row.get(k) for k in keys])
    _write_json({"title": title, "note": note, "results": results}, paths["results.json"])
    paths["results.md"].write_text(f"{title}\n\n{format_table(results, markdown=True)}\n"
                                   + (f"\n{note}\n" if note else ""))
    _plot(results, paths["results.png"], title)
    return paths


def _prepare_out(out: Path, manifest: Dict, variants: List[str], resume: bool,
                 overwrite: bool) -> None:
    if resume and overwrite:
        raise ValueError("give either --resume or --overwrite, not both")
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"--out {str(out)!r} exists and is not a directory")
    ours = [p for p in [out / MANIFEST] + [out / o for o in OUTPUTS] if p.exists()]
    runs = [out / v for v in VARIANTS if any((out / v / f).exists() for f in RUN_FILES)]
    if (ours or runs) and not (resume or overwrite):
        raise FileExistsError(
            f"--out {str(out)!r} already holds ablation results "
            f"({', '.join(p.name for p in (ours + runs)[:6])}); pass --resume to continue "
            "(finished variants are reused) or --overwrite to discard them and start again")
    if resume and (out / MANIFEST).exists():
        old = json.loads((out / MANIFEST).read_text())
        for key in ("config", "seed", "corpus_fingerprint", "paper_lr"):
            if old.get(key) != manifest.get(key):
                raise ValueError(
                    f"--resume: {str(out)!r} was run with a different {key.replace('_', ' ')} "
                    f"({old.get(key)!r} there, {manifest.get(key)!r} now); use the same settings "
                    "or --overwrite")
    if overwrite:
        for p in ours:
            p.unlink()
        for r in runs:
            for f in RUN_FILES:
                if (r / f).exists():
                    (r / f).unlink()
    out.mkdir(parents=True, exist_ok=True)


def run_ablation(config: LMConfig, corpus: Corpus, out, *, variants: Optional[Sequence[str]] = None,
                 corpus_spec: Optional[Dict] = None, seed: int = 0, paper_lr: bool = True,
                 resume: bool = False, overwrite: bool = False, ctx: Optional[DistContext] = None,
                 progress: bool = False, log: Optional[Callable[[str], None]] = print,
                 title: Optional[str] = None) -> List[Dict]:
    """Train every variant (same config, seed and data); write and return the results."""
    ctx = ctx or DistContext()
    names = parse_variants(variants)
    out = Path(out)
    manifest = {"config": config.to_dict(), "seed": seed, "paper_lr": paper_lr,
                "corpus": corpus.source, "corpus_spec": corpus_spec,
                "corpus_fingerprint": corpus_fingerprint(corpus), "variants": names}
    if ctx.is_main:
        _prepare_out(out, manifest, names, resume, overwrite)
        _write_json(manifest, out / MANIFEST)
    ctx.barrier()
    say = log if (log is not None and ctx.is_main) else (lambda s: None)
    results = []
    for name in names:
        cfg = config.for_variant(name, paper_lr=paper_lr)
        r = train_lm(name, cfg, corpus, out / name, corpus_spec=corpus_spec, seed=seed, ctx=ctx,
                     resume=resume, overwrite=overwrite, progress=progress, log=log)
        results.append(r)
    if not ctx.is_main:
        return []
    note = ""
    if corpus.test is None:
        note = (f"The data ({corpus.source}) has no test file: only valid perplexity is reported.")
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
