"""``rnn-ablations reproduce ptb --timing STEPS``: measure instead of training.

Every run's process captures its step, waits for the others, then times STEPS steps and one valid
evaluation, all at once (:func:`rnn_ablations.lm.reproduce_child.child_timing`); the table gives
steps/s per run and the projected wall time of the full schedule (``OUT/timing.{json,md}``).
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Dict, Optional

from .configs import get_config
from .data import find_split_files
from .distributed import resolve_device
from .reproduce import (check_args, check_per_process, group_runs, parse_lrs, plan_runs,
                        run_children, run_name)
from .reproduce_child import device_name

__all__ = ["run_timing"]


def run_timing(config: str, data, out, *, variants=None, seeds=None, lrs=None, device=None,
               max_parallel=None, cuda_graph: str = "auto", steps: int = 300,
               epochs: Optional[int] = None, threads: Optional[int] = None,
               paper_lr: bool = True, runs_per_process: int = 1, log=print) -> Dict:
    """Time ``steps`` steps of every run at once; print steps/s and the projected wall time of
    the full schedule; write ``OUT/timing.{json,md}``.  ``lrs``: as for
    :func:`~rnn_ablations.lm.reproduce.reproduce_ptb`."""
    t0 = time.time()
    say = log or (lambda s: None)
    names, seeds = check_args(config, variants, seeds, max_parallel, None, cuda_graph)
    check_per_process(runs_per_process)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"--timing must be a positive number of steps, got {steps!r}")
    if data is None:
        raise ValueError("reproduce ptb --timing needs --data DIR (a PTB directory)")
    find_split_files(data)
    cfg = get_config(config, epochs=epochs)
    dev = str(resolve_device(device))
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    runs = plan_runs(names, seeds, parse_lrs(lrs))
    n_procs = -(-len(runs) // runs_per_process)
    parallel = max_parallel or n_procs
    if parallel < n_procs:
        raise ValueError(f"--timing runs every run at once ({n_procs} process(es)); "
                         f"--max-parallel {parallel} is smaller")
    nthreads = threads or max(1, (os.cpu_count() or 1) // len(runs))
    run_dirs = [str(out / "timing" / run_name(v, s, lr)) for v, lr, s in runs]
    for d in run_dirs:
        Path(d).mkdir(parents=True, exist_ok=True)
        for f in ("ready", "timing.json"):
            if (Path(d) / f).exists():
                (Path(d) / f).unlink()
    specs = [{"run": run_name(v, s, lr), "variant": v, "seed": s, "learning_rate": lr,
              "config": cfg.name,
              "epochs": epochs, "data": str(Path(data).resolve()), "out": d, "device": dev,
              "cuda_graph": cuda_graph, "threads": nthreads, "steps": steps,
              "all_runs": run_dirs, "t_start": time.time(), "timing": True, "paper_lr": paper_lr}
             for (v, lr, s), d in zip(runs, run_dirs)]
    procs = group_runs(specs, runs_per_process, out / "timing" / "logs")
    say(f"timing: config {cfg.name}, {len(runs)} run(s) at once on {dev} in {len(procs)} "
        f"process(es), {steps} steps each")
    codes = run_children(procs, len(procs), nthreads, say)
    rows = []
    for spec in specs:
        p = Path(spec["out"]) / "timing.json"
        if codes.get(spec["run"]) == 0 and p.exists():
            rows.append(json.loads(p.read_text()))
        else:
            rows.append({"run": spec["run"], "variant": spec["variant"], "failed": True})
    ok = [r for r in rows if not r.get("failed")]
    res = {"config": cfg.name, "device": device_name(dev), "runs_at_once": len(runs),
           "processes": len(procs), "runs_per_process": runs_per_process,
           "steps": steps, "cuda_graph": cuda_graph, "rows": rows,
           "projected_wall_s": max((r["projected_s"] for r in ok), default=None),
           "wall_s": round(time.time() - t0, 1)}
    head = ["run", "step", "steps/s", "s/epoch", "valid eval s", "startup s", "projected s"]
    body = [[r["run"], r.get("step_mode", "FAILED"), f"{r['steps_per_s']:.1f}" if "steps_per_s" in r else "",
             f"{r['seconds_per_epoch']:.1f}" if "seconds_per_epoch" in r else "",
             f"{r['valid_eval_s']:.2f}" if "valid_eval_s" in r else "",
             f"{r['startup_s']:.1f}" if "startup_s" in r else "",
             f"{r['projected_s']:.0f}" if "projected_s" in r else ""] for r in rows]
    widths = [max(len(x[i]) for x in [head] + body) for i in range(len(head))]
    table = "\n".join("  ".join(s.rjust(w) if i > 1 else s.ljust(w) for i, (s, w) in
                                enumerate(zip(x, widths))) for x in [head] + body)
    summary = (f"{len(runs)} run(s) at once in {len(procs)} process(es) on {res['device']}; "
               f"config {cfg.name}: "
               f"{ok[0]['epoch_size'] if ok else '?'} windows/epoch × {cfg.epochs} epochs; "
               f"projected wall time of the full run: "
               + (f"{res['projected_wall_s']:.0f} s ({res['projected_wall_s'] / 60:.1f} min)"
                  if res["projected_wall_s"] is not None else "n/a (a run failed)"))
    (out / "timing.json").write_text(json.dumps(res, indent=2) + "\n")
    (out / "timing.md").write_text(f"{table}\n\n{summary}\n")
    say(table)
    say(summary)
    return res
