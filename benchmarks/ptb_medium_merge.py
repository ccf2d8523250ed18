"""Merge the rows of one device call of `reproduce ptb` into a results file of the PTB table
(benchmarks/results/ptb_medium_gpu.{json,md,png}), so that the table grows as calls come in.

    python benchmarks/ptb_medium_merge.py TARGET.json CALL.json [--device-time S]

CALL.json is the ``ptb_<config>_gpu_call.json`` that benchmarks/gpu_reproduce.sh writes (device,
command, one row per run).  A row of the same run (variant, seed, learning rate) replaces the old
one; the call is appended to ``calls`` (command, device, runs at once, wall time, seconds of the
command).  TARGET.md and TARGET.png are written again from the merged rows: per variant the mean
± std over seeds at the chosen learning rate beside the papers, every run, and the calls.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rnn_ablations.lm.reproduce_report import (PAPER_SOURCE, format_results,  # noqa: E402
                                               format_summary, results_figure, summarize)
from rnn_ablations.variants import get_variant  # noqa: E402


def _key(row):
    return (row["variant"], row["seed"], row.get("learning_rate"))


def merge(target: dict, call: dict, seconds=None) -> dict:
    if target.get("config", call["config"]) != call["config"]:
        raise ValueError(f"the call is config {call['config']!r}, the target {target['config']!r}")
    rows = {_key(r): r for r in target.get("rows", [])}
    names = []
    for r in call["rows"]:
        r = dict(r, device=call["device"])
        r.setdefault("paper_name", get_variant(r["variant"]).paper_name)
        rows[_key(r)] = r
        lr = r.get("learning_rate")
        names.append(f"{r['variant']} seed {r['seed']}" + (f" lr {lr:g}" if lr is not None else ""))
    order = {v: i for i, v in enumerate(["lstm", "srnn", "lstm_minus_srnn", "ran", "identity_ran",
                                          "lstm_minus_srnn_minus_hidden"])}
    merged = dict(target)
    merged.update(config=call["config"], epochs_planned=call["rows"][0].get("epochs_planned")
                  or target.get("epochs_planned"))
    merged["rows"] = sorted(rows.values(), key=lambda r: (order.get(r["variant"], 99), r["seed"],
                                                          -(r.get("learning_rate") or 0)))
    merged["calls"] = list(target.get("calls", [])) + [{
        "command": call.get("command"), "device": call["device"],
        "runs_at_once": call.get("runs_at_once"), "wall_seconds": call.get("wall_seconds"),
        "time_budget_s": call.get("time_budget_s"), "over_budget_s": call.get("over_budget_s"),
        "command_seconds": seconds, "runs": names}]
    merged["summary"] = summarize(merged)
    return merged


def render(merged: dict, target: Path) -> None:
    title = (f"PTB language model, config {merged['config']} ({merged['epochs_planned']} epochs): "
             "test perplexity beside the papers'")
    calls = []
    for c in merged["calls"]:
        line = f"- {', '.join(c['runs'])}: {c['runs_at_once']} run(s) at once on {c['device']}"
        if c.get("wall_seconds") is not None:
            line += f", {c['wall_seconds']:.0f} s for the runs"
        if c.get("command_seconds") is not None:
            line += f", {c['command_seconds']:.0f} s for the command"
        if c.get("over_budget_s"):
            line += f" ({c['over_budget_s']:.0f} s over its time budget)"
        if c.get("command"):
            line += f"; `{c['command']}`"
        calls.append(line)
    text = (f"{title}\n\nPer variant (mean ± std over seeds, n seeds; a variant run at several "
            f"learning rates is reported at the one with the best final validation "
            f"perplexity):\n\n{format_summary(merged, True)}\n\nEvery run:\n\n"
            f"{format_results(merged, True)}\n\n{PAPER_SOURCE}\n\nCalls (every run one "
            "process, the training step replayed from a CUDA graph where the step column says "
            "graph):\n\n" + "\n".join(calls) + "\n")
    if merged.get("notes"):
        text += f"\n{merged['notes']}\n"
    target.with_suffix(".md").write_text(text)
    fig = results_figure(dict(merged, wall_seconds=0, runs=len(merged["rows"]), max_parallel=0))
    fig.savefig(target.with_suffix(".png"), dpi=110)
    import matplotlib.pyplot as plt
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("target", type=Path)
    ap.add_argument("call", type=Path)
    ap.add_argument("--device-time", type=float, default=None,
                    help="seconds the command took on the device (recorded with the call)")
    args = ap.parse_args(argv)
    target = json.loads(args.target.read_text()) if args.target.exists() else {}
    call = json.loads(args.call.read_text())
    merged = merge(target, call, args.device_time)
    tmp = args.target.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(merged, indent=2, allow_nan=False) + "\n")
    tmp.replace(args.target)
    render(merged, args.target)
    print(format_summary(merged))
    return 0


if __name__ == "__main__":
    sys.exit(main())
