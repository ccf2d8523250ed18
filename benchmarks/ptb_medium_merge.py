"""Merge the rows of one device call of `reproduce ptb` into a results file of the PTB table
(benchmarks/results/ptb_medium_gpu.{json,md,png}), so that the table grows as calls come in.

    python benchmarks/ptb_medium_merge.py TARGET.json CALL.json [--device-time S] [--call N]

CALL.json is the ``ptb_<config>_gpu_call.json`` that benchmarks/gpu_reproduce.sh writes (device,
command, one row per run), whether its runs completed or were cut by the time budget: a cut run's
row is merged with its status (``incomplete``: the perplexities after the epochs shown) and the
call is marked ``cut``; a later call that resumes it (``RESUME=1``) replaces the row.  A row of the
same run (variant, seed, learning rate) replaces the old one; the call is appended to ``calls``
(command, device, runs at once, wall time, seconds of the command, set-up seconds, whether the
package's CUDA kernels were in use, complete or cut, resumed or not).  TARGET.md and TARGET.png
are written again from the merged rows: per variant the mean ± std over the seeds at the chosen
learning rate beside the papers, every run with its GPU and seconds, and the calls.  A variant run
at several learning rates is reported at the one with the best final validation perplexity (the
papers do not state the lr of −GATES).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rnn_ablations.lm.reproduce_report import (LR_LOWERED_NOTE, PAPER_SOURCE,  # noqa: E402
                                               paper_ppl, results_figure, summarize)
from rnn_ablations.variants import get_variant  # noqa: E402

ORDER = ["lstm", "srnn", "lstm_minus_srnn", "ran", "identity_ran", "lstm_minus_srnn_minus_hidden"]
ROW_KEYS = ("variant", "seed", "valid_ppl", "test_ppl", "status")


def _key(row):
    return (row["variant"], row["seed"], row.get("learning_rate"))


def _check_call(call: dict) -> None:
    """Refuse a file that is not a call's rows, saying what is missing."""
    missing = [k for k in ("config", "device", "rows") if k not in call]
    if missing:
        raise ValueError(f"the call file lacks {missing}: give the ptb_<config>_gpu_call.json "
                         "that benchmarks/gpu_reproduce.sh writes")
    if not call["rows"]:
        raise ValueError("the call has no rows (no run was started): nothing to merge")
    for r in call["rows"]:
        bad = [k for k in ROW_KEYS if k not in r]
        if bad:
            raise ValueError(f"a row of the call lacks {bad}: {r}")
        for k in ("valid_ppl", "test_ppl"):
            v = r[k]
            if v is not None and not (isinstance(v, (int, float)) and math.isfinite(v)) \
                    and r["status"] != "diverged":
                raise ValueError(f"row {_key(r)}: {k} = {v!r} is not a finite number but the "
                                 f"status is {r['status']!r}")


def merge(target: dict, call: dict, seconds=None, call_name=None) -> dict:
    _check_call(call)
    if target.get("config", call["config"]) != call["config"]:
        raise ValueError(f"the call is config {call['config']!r}, the target {target['config']!r}")
    rows = {_key(r): r for r in target.get("rows", [])}
    names = []
    for r in call["rows"]:
        r = dict(r, device=call["device"])
        r.setdefault("paper_name", get_variant(r["variant"]).paper_name)
        rows[_key(r)] = r
        lr = r.get("learning_rate")
        names.append(f"{r['variant']} seed {r['seed']}" + (f" lr {lr:g}" if lr is not None else "")
                     + ("" if r["status"] == "complete" else f" ({r['status']})"))
    order = {v: i for i, v in enumerate(ORDER)}
    merged = dict(target)
    merged.update(config=call["config"], epochs_planned=call["rows"][0].get("epochs_planned")
                  or target.get("epochs_planned"))
    merged["rows"] = sorted(rows.values(), key=lambda r: (order.get(r["variant"], 99), r["seed"],
                                                          -(r.get("learning_rate") or 0)))
    cut = [n for n, r in zip(names, call["rows"]) if r["status"] != "complete"]
    merged["calls"] = list(target.get("calls", [])) + [{
        "call": call_name, "command": call.get("command"), "device": call["device"],
        "runs_at_once": call.get("runs_at_once"), "wall_seconds": call.get("wall_seconds"),
        "time_budget_s": call.get("time_budget_s"), "over_budget_s": call.get("over_budget_s"),
        "command_seconds": seconds, "setup_seconds": call.get("setup_seconds"),
        "cuda_kernels": call.get("cuda_kernels"), "resumed": bool(call.get("resumed")),
        "status": "complete" if not cut else "cut", "runs": names}]
    merged["summary"] = _summary(merged)
    return merged


def _summary(merged: dict) -> list:
    """summarize()'s rows, in the table's order, with the lr choice said as the table says it."""
    out = []
    for s in summarize(merged):
        lrs = [c["learning_rate"] for c in s["candidates"] if c["learning_rate"] is not None]
        if len(lrs) > 1:
            lowered = LR_LOWERED_NOTE in s["note"]
            s["note"] = (f"lr chosen by validation among {', '.join(f'{x:g}' for x in lrs)}; "
                         + (LR_LOWERED_NOTE if lowered else "the papers do not state it"))
        runs = [r for r in merged["rows"] if r["variant"] == s["variant"]
                and r.get("learning_rate") == s["learning_rate"] and r.get("seed") in s["seeds"]]
        s["gpus"] = sorted({r["device"] for r in runs if r.get("device")})
        secs = [r["seconds"] for r in runs if r.get("seconds") is not None]
        s["seconds_mean"] = sum(secs) / len(secs) if secs else None
        out.append(s)
    order = {v: i for i, v in enumerate(ORDER)}
    return sorted(out, key=lambda s: order.get(s["variant"], 99))


def _num(v, fmt="{:.2f}"):
    return "n/a" if v is None else fmt.format(v)


def _mean(m, sd, n):
    if m is None:
        return "n/a"
    return f"{m:.2f}" + (f" ± {sd:.2f}" if sd is not None else "") + (f" (n={n})" if n > 1 else "")


def _epochs(e, planned, status):
    if e is None:
        return "n/a"
    s = f"{e:g}" if float(e).is_integer() else f"{e:.2f}"
    cut = status in ("incomplete", "not run") or (planned is not None and e < planned)
    return s + (f" of {planned}" if cut else "")


def _paper(config, variant, key):
    v = paper_ppl(config, variant, key)
    if v is None:
        return "—"
    sd = paper_ppl(config, variant, key + "_std")
    return f"{v:.1f}" + (f" ± {sd:.1f}" if sd is not None else "")


def _lr(x):
    return "" if x is None else f"{x:g}"


def _table(head, body, left):
    return "\n".join(["| " + " | ".join(head) + " |",
                      "|" + "|".join("---" if i in left else "---:" for i in range(len(head))) + "|"]
                     + ["| " + " | ".join(r) + " |" for r in body])


def summary_table(merged: dict) -> str:
    cfg = merged["config"]
    head = ["variant", "paper name", "lr", "epochs", "valid ppl", "test ppl", "Levy'18 test",
            "RAN paper test", "test − paper", "status", "GPU", "seconds (mean)", "note"]
    body = []
    for s in merged["summary"]:
        d = s["test_minus_paper"]
        body.append([s["variant"], s["paper_name"], _lr(s["learning_rate"]),
                     _epochs(s["epochs"], s["epochs_planned"], s["status"]),
                     _mean(s["valid_ppl_mean"], s["valid_ppl_std"], s["n"]) if s["n"] else s["status"],
                     _mean(s["test_ppl_mean"], s["test_ppl_std"], s["n"]) if s["n"] else s["status"],
                     _paper(cfg, s["variant"], "acl"), _paper(cfg, s["variant"], "ran"),
                     f"{d:+.2f}" if d is not None else "—", s["status"],
                     ", ".join(s.get("gpus", [])), _num(s.get("seconds_mean"), "{:.0f}"), s["note"]])
    return _table(head, body, {0, 1, 9, 10, 12})


def runs_table(merged: dict) -> str:
    cfg = merged["config"]
    head = ["variant", "paper name", "seed", "lr", "epochs", "valid ppl", "test ppl",
            "Levy'18 test", "RAN paper test", "status", "GPU", "seconds", "step"]
    body = []
    for r in merged["rows"]:
        ppl = (lambda k: r["status"] if r["status"] in ("diverged", "not run") else _num(r.get(k)))
        body.append([r["variant"], r["paper_name"], str(r["seed"]), _lr(r.get("learning_rate")),
                     _epochs(r.get("epochs"), r.get("epochs_planned"), r["status"]),
                     ppl("valid_ppl"), ppl("test_ppl"), _paper(cfg, r["variant"], "acl"),
                     _paper(cfg, r["variant"], "ran"), r["status"], r.get("device") or "n/a",
                     _num(r.get("seconds"), "{:.0f}"), r.get("step_mode") or ""])
    return _table(head, body, {0, 1, 9, 10, 12})


def render(merged: dict, target: Path) -> None:
    title = (f"PTB language model, config {merged['config']} ({merged['epochs_planned']} epochs): "
             "test perplexity beside the papers'")
    calls = []
    for c in merged["calls"]:
        line = (f"- {'call ' + str(c['call']) + ': ' if c.get('call') else ''}"
                f"{', '.join(c['runs'])}: {c['runs_at_once']} run(s) at once on {c['device']}")
        if c.get("status") == "cut":
            line += " — CUT by its time budget (the rows marked incomplete; continue with RESUME=1)"
        if c.get("resumed"):
            line += " — resumed from the checkpoints of the call before"
        if c.get("wall_seconds") is not None:
            line += f", {c['wall_seconds']:.0f} s for the runs"
        if c.get("command_seconds") is not None:
            line += f", {c['command_seconds']:.0f} s for the command"
        if c.get("setup_seconds"):
            line += f" ({c['setup_seconds']:.0f} s of set-up)"
        if c.get("cuda_kernels") is False:
            line += " (the package's CUDA kernels were not in use: generic path)"
        if c.get("over_budget_s"):
            line += f" ({c['over_budget_s']:.0f} s over its time budget)"
        if c.get("command"):
            line += f"; `{c['command']}`"
        calls.append(line)
    text = (f"{title}\n\nPer variant (mean ± sample std over seeds, n seeds, at the chosen lr; a "
            "variant run at several learning rates is reported at the one with the best final "
            "validation perplexity, a rule fixed before the runs):\n\n"
            f"{summary_table(merged)}\n\nEvery run (GPU: where it trained; seconds: its wall "
            f"time, all resumes together):\n\n{runs_table(merged)}\n\n{PAPER_SOURCE}\n\n"
            "Calls (every run one process, the training step replayed from a CUDA graph where "
            "the step column says graph):\n\n" + "\n".join(calls) + "\n")
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
    ap.add_argument("--call", dest="call_name", default=None, help="the call's name (e.g. 1-4 of gpu_ptb_call.sh)")
    args = ap.parse_args(argv)
    if not args.call.is_file():
        ap.error(f"no call file {args.call} (the call wrote no rows: see its gpu_reproduce.log)")
    target = json.loads(args.target.read_text()) if args.target.exists() else {}
    call = json.loads(args.call.read_text())
    try:
        merged = merge(target, call, args.device_time, args.call_name)
    except ValueError as exc:
        ap.error(str(exc))
    args.target.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.target.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(merged, indent=2, allow_nan=False) + "\n")
    tmp.replace(args.target)
    render(merged, args.target)
    print(summary_table(merged))
    return 0


if __name__ == "__main__":
    sys.exit(main())
