"""The tables and the figure of ``rnn-ablations reproduce ptb``: every run, and per variant the
mean ± std over seeds beside the papers' test perplexities.

``results["rows"]`` holds one row per run (variant, seed, lr, epochs, valid and test perplexity,
seconds, status).  :func:`summarize` turns them into one row per variant:

* a variant trained at several learning rates (``--lr VARIANT=LR``, repeatable) is reported at
  the one with the best final **validation** perplexity (mean over its complete seeds) — a rule
  fixed before the runs, which never looks at test perplexity; every run stays in the JSON/CSV;
* over the seeds of that learning rate: n, mean and (n > 1) sample standard deviation of valid
  and test perplexity, and the difference of the mean test perplexity to the papers' number;
* a learning rate below the papers' for that variant is labelled :data:`LR_LOWERED_NOTE`.

Status of a run: ``complete``; ``incomplete`` (cut by ``--time-budget`` or ``--max-steps``: its
perplexities are those of the model after the epochs shown); ``diverged`` (perplexity not finite
or worse than a uniform guess over the vocabulary); ``failed`` (the process did not finish);
``not run`` (not started: it could not start within the time budget).
"""
from __future__ import annotations

import csv
import json
import os
import statistics
from pathlib import Path
from typing import Dict, List, Optional

__all__ = ["PAPER_TEST_PPL", "PAPER_SOURCE", "LR_LOWERED_NOTE", "summarize", "format_results",
           "format_summary", "write_results", "results_figure"]

#: Test perplexities of the papers (PTB).  ``acl``: Levy, Lee, FitzGerald & Zettlemoyer (2018),
#: "Long Short-Term Memory as a Dynamically Computed Element-wise Weighted Sum", Table 1 as
#: printed in the arXiv text (arXiv:1805.03716, the text also submitted to ICLR 2018), ``acl_std``
#: its ± over seeds where given; ``ran``: Lee, Levy & Zettlemoyer (2017), "Recurrent Additive
#: Networks" (arXiv:1705.07393), Table 2.
PAPER_TEST_PPL: Dict[str, Dict[str, Dict[str, float]]] = {
    "medium": {
        "lstm": {"acl": 83.9, "acl_std": 0.3, "ran": 82.7},
        "srnn": {"acl": 140.9},
        "lstm_minus_srnn": {"acl": 80.5},
        "ran": {"acl": 81.6, "ran": 81.9},
        "identity_ran": {"ran": 85.5},
    },
    "large": {
        "lstm": {"acl": 78.8, "acl_std": 0.2, "ran": 78.4},
        "srnn": {"acl": 126.1},
        "lstm_minus_srnn": {"acl": 76.0},
        "ran": {"acl": 78.5, "ran": 78.5},
        "identity_ran": {"ran": 83.2},
    },
}

PAPER_SOURCE = ("Levy'18: Levy et al. (2018), Table 1, as printed in the arXiv text "
                "(arXiv:1805.03716, also the ICLR 2018 submission; not checked against the ACL "
                "2018 proceedings version); RAN paper: Lee et al. (2017), arXiv:1705.07393.")

LR_LOWERED_NOTE = "lr lowered for stability; the papers do not state it"

OUTPUTS = ("results.json", "results.md", "results.csv", "results.png")

_SHORT = {"lstm": "LSTM", "srnn": "−GATES\n(S-RNN)", "lstm_minus_srnn": "−S-RNN",
          "ran": "−S-RNN−OUT\n(tanh RAN)", "identity_ran": "identity\nRAN",
          "lstm_minus_srnn_minus_hidden": "−S-RNN\n−HIDDEN"}


def paper_ppl(config: str, variant: str, key: str) -> Optional[float]:
    return PAPER_TEST_PPL.get(config, {}).get(variant, {}).get(key)


def _fmt_paper(config: str, variant: str, key: str) -> str:
    v = paper_ppl(config, variant, key)
    if v is None:
        return "—"
    std = paper_ppl(config, variant, key + "_std")
    return f"{v:.1f} ± {std:.1f}" if std is not None else f"{v:.1f}"


# ---------------------------------------------------------------------------- per variant
def _mean_std(values: List[float]):
    if not values:
        return None, None
    m = statistics.fmean(values)
    return m, (statistics.stdev(values) if len(values) > 1 else None)


def _usable(rows: List[Dict]) -> List[Dict]:
    """The runs whose perplexities count: complete ones, else (none complete) the cut ones."""
    done = [r for r in rows if r.get("status") == "complete"]
    return done or [r for r in rows if r.get("status") == "incomplete"]


def summarize(results: Dict) -> List[Dict]:
    """One row per variant, in the order of first appearance (see the module docstring)."""
    cfg = results["config"]
    order: List[str] = []
    for r in results["rows"]:
        if r["variant"] not in order:
            order.append(r["variant"])
    out = []
    for variant in order:
        runs = [r for r in results["rows"] if r["variant"] == variant]
        lrs: List = []
        for r in runs:
            if r.get("learning_rate") not in lrs:
                lrs.append(r.get("learning_rate"))
        candidates = []
        for lr in lrs:
            at = [r for r in runs if r.get("learning_rate") == lr]
            use = _usable(at)
            valid = [r["valid_ppl"] for r in use if r.get("valid_ppl") is not None]
            candidates.append({"learning_rate": lr, "runs": len(at), "counted": len(valid),
                               "valid_ppl_mean": _mean_std(valid)[0],
                               "complete": all(r.get("status") == "complete" for r in use) and bool(use),
                               "statuses": sorted({r.get("status") for r in at})})
        ranked = sorted((c for c in candidates if c["valid_ppl_mean"] is not None),
                        key=lambda c: (not c["complete"], c["valid_ppl_mean"]))
        chosen = ranked[0] if ranked else candidates[0]
        lr = chosen["learning_rate"]
        at = [r for r in runs if r.get("learning_rate") == lr]
        use = [r for r in _usable(at) if r.get("valid_ppl") is not None]
        valid_m, valid_s = _mean_std([r["valid_ppl"] for r in use])
        tests = [r["test_ppl"] for r in use if r.get("test_ppl") is not None]
        test_m, test_s = _mean_std(tests)
        if use:
            status = "complete" if all(r["status"] == "complete" for r in use) else "incomplete"
        else:
            statuses = [r.get("status") for r in at]
            status = next((s for s in ("diverged", "failed", "not run") if s in statuses),
                          statuses[0] if statuses else "not run")
        paper_lr = next((r.get("paper_learning_rate") for r in at
                         if r.get("paper_learning_rate") is not None), None)
        notes = []
        if lr is not None and paper_lr is not None and lr < paper_lr:
            notes.append(LR_LOWERED_NOTE)
        if len(candidates) > 1:
            notes.append("lr chosen by the best final validation perplexity among "
                         + ", ".join(f"{c['learning_rate']:g}" for c in candidates
                                     if c["learning_rate"] is not None))
        ref_key = "acl" if paper_ppl(cfg, variant, "acl") is not None else "ran"
        ref = paper_ppl(cfg, variant, ref_key)
        epochs = [r.get("epochs") for r in (use or at) if r.get("epochs") is not None]
        out.append({
            "variant": variant, "paper_name": runs[0].get("paper_name", variant),
            "learning_rate": lr, "paper_learning_rate": paper_lr, "note": "; ".join(notes),
            "n": len(use), "seeds": [r.get("seed") for r in use],
            "epochs": min(epochs) if epochs else None,
            "epochs_planned": runs[0].get("epochs_planned"),
            "valid_ppl_mean": valid_m, "valid_ppl_std": valid_s,
            "test_ppl_mean": test_m, "test_ppl_std": test_s,
            "paper": ref_key if ref is not None else None, "paper_test_ppl": ref,
            "paper_test_ppl_std": paper_ppl(cfg, variant, ref_key + "_std"),
            "test_minus_paper": (test_m - ref) if (test_m is not None and ref is not None) else None,
            "status": status, "candidates": candidates,
        })
    return out


# ---------------------------------------------------------------------------- tables
def _fmt_ppl(r: Dict, key: str) -> str:
    if r.get("status") in ("diverged", "not run"):
        return r["status"]
    v = r.get(key)
    return "n/a" if v is None else f"{v:.2f}"


def _fmt_epochs(r: Dict) -> str:
    e = r.get("epochs")
    if e is None:
        return "n/a"
    s = f"{e:g}" if isinstance(e, int) or float(e).is_integer() else f"{e:.2f}"
    planned = r.get("epochs_planned")
    cut = r.get("status") in ("incomplete", "not run") or (planned is not None and e < planned)
    return s + (f" of {planned}" if cut else "")


def _fmt_mean(m, s, n) -> str:
    if m is None:
        return "n/a"
    return f"{m:.2f}" + (f" ± {s:.2f}" if s is not None else "") + (f" (n={n})" if n > 1 else "")


def _lr(x) -> str:
    return f"{x:g}" if x is not None else ""


def _table(head: List[str], body: List[List[str]], left: set, markdown: bool) -> str:
    if markdown:
        lines = ["| " + " | ".join(head) + " |",
                 "|" + "|".join("---" if i in left else "---:" for i in range(len(head))) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in body]
        return "\n".join(lines)
    rows = [head] + body
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]

    def line(r):
        return "  ".join(s.ljust(w) if i in left else s.rjust(w)
                         for i, (s, w) in enumerate(zip(r, widths)))
    return "\n".join([line(head), "  ".join("-" * w for w in widths)] + [line(r) for r in body])


def format_results(results: Dict, markdown: bool = False) -> str:
    """Every run, one row each."""
    cfg = results["config"]
    head = ["variant", "paper name", "seed", "lr", "epochs", "valid ppl", "test ppl",
            "Levy'18 test", "RAN paper test", "status", "seconds", "step"]
    body = [[r["variant"], r["paper_name"], str(r["seed"]), _lr(r.get("learning_rate")),
             _fmt_epochs(r), _fmt_ppl(r, "valid_ppl"), _fmt_ppl(r, "test_ppl"),
             _fmt_paper(cfg, r["variant"], "acl"), _fmt_paper(cfg, r["variant"], "ran"),
             r.get("status", ""),
             f"{r['seconds']:.0f}" if r.get("seconds") is not None else "n/a",
             r.get("step_mode", "")] for r in results["rows"]]
    return _table(head, body, {0, 1, 9, 11}, markdown)


def format_summary(results: Dict, markdown: bool = False) -> str:
    """One row per variant: mean ± std over seeds (n) beside the papers."""
    cfg = results["config"]
    head = ["variant", "paper name", "lr", "epochs", "valid ppl", "test ppl", "Levy'18 test",
            "RAN paper test", "test − paper", "status", "note"]
    body = []
    for s in summarize(results):
        d = s["test_minus_paper"]
        body.append([s["variant"], s["paper_name"], _lr(s["learning_rate"]), _fmt_epochs(s),
                     _fmt_mean(s["valid_ppl_mean"], s["valid_ppl_std"], s["n"])
                     if s["n"] else s["status"],
                     _fmt_mean(s["test_ppl_mean"], s["test_ppl_std"], s["n"])
                     if s["n"] else s["status"],
                     _fmt_paper(cfg, s["variant"], "acl"), _fmt_paper(cfg, s["variant"], "ran"),
                     f"{d:+.2f}" if d is not None else "—", s["status"], s["note"]])
    return _table(head, body, {0, 1, 9, 10}, markdown)


def _title(results: Dict) -> str:
    return (f"PTB language model, config {results['config']} ({results['epochs_planned']} epochs): "
            f"test perplexity beside the papers'")


def _note(results: Dict) -> str:
    rows = results["rows"]
    n_inc = sum(r.get("status") == "incomplete" for r in rows)
    n_not = sum(r.get("status") == "not run" for r in rows)
    budget = results.get("time_budget_s")
    parts = [f"Device: {results['device']}; {results['runs']} run(s), {results['max_parallel']} at "
             f"a time; wall time {results['wall_seconds']:.0f} s"
             + (f" (time budget {budget:g} s)" if budget else "")
             + f"; CUDA graph: {results['cuda_graph']} (step column: what each run used)."]
    over = results.get("over_budget_s")
    if budget and over:
        parts.append(f"The command took {over:.0f} s longer than its time budget (the final "
                     "evaluations and the processes' start-up).")
    parts.append(PAPER_SOURCE)
    parts.append("Per variant: mean ± sample std over the seeds of the chosen lr (n = seeds); "
                 "a variant run at several lrs is reported at the lr with the best final "
                 "validation perplexity. seconds: wall time of the run's training and "
                 "evaluations (all resumes together). diverged: perplexity not finite or worse "
                 "than a uniform guess.")
    if n_inc:
        parts.append(f"{n_inc} run(s) were cut by the time budget or --max-steps: their "
                     "perplexities are those of the model at that point, after the epochs "
                     "shown (continue with --resume).")
    if n_not:
        parts.append(f"{n_not} run(s) were not run: they could not start within the time "
                     "budget (--resume starts them).")
    return " ".join(parts)


def write_results(results: Dict, out: Path) -> List[Path]:
    """``OUT/results.{json,md,csv,png}``: the summary per variant and every run."""
    out = Path(out)
    results = dict(results, summary=summarize(results))
    tmp = out / "results.json.tmp"
    tmp.write_text(json.dumps(results, indent=2, allow_nan=False) + "\n")
    os.replace(tmp, out / "results.json")
    (out / "results.md").write_text(
        f"{_title(results)}\n\nPer variant:\n\n{format_summary(results, True)}\n\n"
        f"Every run:\n\n{format_results(results, True)}\n\n{_note(results)}\n")
    keys = ["variant", "paper_name", "seed", "learning_rate", "paper_learning_rate", "epochs",
            "epochs_planned", "valid_ppl", "test_ppl", "acl_test_ppl", "ran_paper_test_ppl",
            "status", "seconds", "device", "step_mode"]
    with open(out / "results.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(keys)
        for r in results["rows"]:
            row = dict(r, acl_test_ppl=paper_ppl(results["config"], r["variant"], "acl"),
                       ran_paper_test_ppl=paper_ppl(results["config"], r["variant"], "ran"))
            w.writerow(["" if row.get(k) is None else row.get(k) for k in keys])
    fig = results_figure(results)
    import matplotlib.pyplot as plt
    fig.savefig(out / "results.png", dpi=110)
    plt.close(fig)
    return [out / o for o in OUTPUTS]


# ---------------------------------------------------------------------------- the figure
def results_figure(results: Dict):
    """Per variant, our mean test perplexity minus the papers' (a dot; its bar: ± our std over
    seeds; grey: ± the papers' std where given); each dot labelled with ours, the paper's and n.
    Variants without a number (diverged, failed, not run) or without a paper number are named
    in place."""
    import matplotlib
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    summary = results.get("summary") or summarize(results)
    red = "#c03030"
    xs = list(range(len(summary)))
    fig, ax = plt.subplots(figsize=(max(6.5, 1.6 * len(summary)), 4.8))
    ax.axhline(0, color="#888888", linewidth=1, zorder=1)
    spreads = [abs(s["test_minus_paper"]) + (s["test_ppl_std"] or 0) + (s["paper_test_ppl_std"] or 0)
               for s in summary if s["test_minus_paper"] is not None]
    lim = max(spreads + [1.0]) * 1.5
    for x, s in zip(xs, summary):
        d = s["test_minus_paper"]
        if d is None:
            if s["n"] and s["paper_test_ppl"] is None:
                what = f"ours {_fmt_mean(s['test_ppl_mean'], s['test_ppl_std'], s['n'])}\nno paper number"
                colour = "#444444"
            else:
                what = s["status"]
                colour = red
            ax.text(x, 0.45 * lim, what, ha="center", va="center", fontsize=8, color=colour)
            continue
        ps = s["paper_test_ppl_std"]
        if ps:
            ax.bar([x], [2 * ps], 0.35, bottom=[-ps], color="#dddddd", zorder=0)
        colour = "#4878a8" if s["status"] == "complete" else "#e0a040"
        ax.errorbar([x], [d], yerr=[[s["test_ppl_std"] or 0], [s["test_ppl_std"] or 0]],
                    fmt="o", color=colour, ms=7, capsize=4, zorder=3)
        paper = ("Levy'18" if s["paper"] == "acl" else "RAN paper")
        label = (f"{d:+.2f}\nours {_fmt_mean(s['test_ppl_mean'], s['test_ppl_std'], s['n'])}\n"
                 f"{paper} {s['paper_test_ppl']:.1f}"
                 + (f" ± {ps:.1f}" if ps else ""))
        if s["status"] != "complete":
            label += f"\n{_fmt_epochs(s)} epochs"
        if s["learning_rate"] is not None:
            label += f"\nlr {s['learning_rate']:g}"
            if LR_LOWERED_NOTE in s["note"]:
                label += " (lowered; not in the papers)"
        ax.annotate(label, (x, d), xytext=(10, 0), textcoords="offset points", ha="left",
                    va="center", fontsize=7)
    ax.set_ylim(-lim, lim)
    ax.set_xlim(-0.6, len(xs) - 0.1)
    ax.set_xticks(xs, [_SHORT.get(s["variant"], s["variant"]) for s in summary], fontsize=8)
    ax.set_ylabel("test perplexity: ours − paper's (lower is better)")
    ax.grid(axis="y", color="#eeeeee", linewidth=0.6, zorder=0)
    ax.set_title(_title(results) + "\ndot: mean over seeds, bar: ± std (n > 1); grey: the "
                 "paper's ± std; orange: cut runs", fontsize=9)
    fig.tight_layout()
    return fig
