"""``rnn-ablations reproduce ptb``: the papers' PTB language-model table, every run trained
concurrently on one device, beside the papers' numbers.

A run is a (variant, learning rate, seed): the papers' settings (:mod:`rnn_ablations.lm.configs`,
with the RAN code's per-variant learning rates) unless ``--lr VARIANT=LR`` (repeatable) gives
the variant's learning rates; one run per given lr and seed.  Each run is one process (at most
``max_parallel`` at a time; :mod:`rnn_ablations.lm.reproduce_child`) that trains in
``OUT/<run>/`` with checkpoints (:mod:`rnn_ablations.lm.checkpoints`): a run that is cut off
(killed, or stopped by ``--time-budget``) continues bit-identically with ``--resume``.  On CUDA
each process replays its training step as a CUDA graph (:mod:`rnn_ablations.lm.graph_step`):
the step is launch-bound, so several processes share the GPU.

``--time-budget S``: the command ends within S seconds.  At ``min(10 s, 10 %)`` before the end
(kept for the tables) every run still going (an evaluation that does not fit, a validation at an
epoch's end) is stopped: SIGTERM, then SIGKILL after a few seconds.  Training stops
``min(30 s, 10 %)`` before that (the reserve for the evaluations of the cut runs); a run is
started only while at least that reserve of training time is left, so runs that cannot start
within the budget are not started and are listed as *not run*.  A cut run is reported with
the epochs it did and the perplexities it had time to evaluate (``None`` for the others); its
row says ``"cut": true``.  When the command still ends after S seconds, the results state by
how much.

When the runs end, ``OUT/results.{json,md,csv,png}`` get every run and, per variant, the mean ±
std over seeds beside the papers' test perplexities (:mod:`rnn_ablations.lm.reproduce_report`).
"""
from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from ..variants import get_variant
from .checkpoints import RUN_FILES, load_checkpoint
from .configs import get_config
from .corpora import corpus_fingerprint
from .data import batchify, load_corpus
from .distributed import resolve_device
from .graph_step import check_mode
from .reproduce_child import OUTCOME, RUN_LOG, device_name
from .reproduce_report import OUTPUTS, format_results, format_summary, write_results
from .rundir import prepare_out
from .trainer import MAX_SEED

__all__ = ["DEFAULT_VARIANTS", "REPRO_CONFIGS", "reproduce_ptb", "parse_lrs", "run_name"]

#: The five variants of the papers' tables.
DEFAULT_VARIANTS = ("lstm", "srnn", "lstm_minus_srnn", "ran", "identity_ran")
REPRO_CONFIGS = ("tiny", "small", "medium", "large")
MANIFEST = "reproduce.json"


def run_name(variant: str, seed: int, lr: Optional[float] = None) -> str:
    """``<variant>_s<seed>``, or ``<variant>_lr<lr>_s<seed>`` for a learning rate from ``--lr``."""
    return f"{variant}_s{seed}" if lr is None else f"{variant}_lr{lr:g}_s{seed}"


# ---------------------------------------------------------------------------- validation
def parse_lrs(items: Optional[Sequence[str]]) -> Dict[str, List[float]]:
    """``--lr VARIANT=LR`` (repeatable; a variant may be given several learning rates)."""
    out: Dict[str, List[float]] = {}
    for item in items or []:
        if "=" not in str(item):
            raise ValueError(f"--lr {item!r}: expected VARIANT=LR, e.g. --lr srnn=0.25")
        name, val = str(item).split("=", 1)
        variant = get_variant(name.strip()).name
        try:
            lr = float(val)
        except ValueError:
            raise ValueError(f"--lr {item!r}: {val!r} is not a number") from None
        if not (math.isfinite(lr) and lr > 0):
            raise ValueError(f"--lr {item!r}: the learning rate must be a finite number > 0")
        lrs = out.setdefault(variant, [])
        if lr in lrs:
            raise ValueError(f"--lr {item!r}: {variant} already has learning rate {lr:g}")
        lrs.append(lr)
    return out


def check_args(config: str, variants, seeds, max_parallel, time_budget, cuda_graph):
    if config not in REPRO_CONFIGS:
        raise ValueError(f"--config must be one of {', '.join(REPRO_CONFIGS)} (the papers' "
                         f"medium and large, small, or tiny for a quick look), got {config!r}")
    names = []
    for v in variants or DEFAULT_VARIANTS:
        for part in str(v).split(","):
            if part.strip():
                n = get_variant(part.strip()).name
                if n not in names:
                    names.append(n)
    if not names:
        raise ValueError("--variants is empty; give one or more of " + ", ".join(DEFAULT_VARIANTS))
    seeds = list(seeds) if seeds else [0]
    for s in seeds:
        if isinstance(s, bool) or not isinstance(s, int) or not 0 <= s <= MAX_SEED:
            raise ValueError(f"--seeds must be integers from 0 to {MAX_SEED}, got {s!r}")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds has repeats: {seeds}")
    if max_parallel is not None and (isinstance(max_parallel, bool) or not isinstance(max_parallel, int)
                                     or max_parallel < 1):
        raise ValueError(f"--max-parallel must be a positive integer, got {max_parallel!r}")
    if time_budget is not None and (isinstance(time_budget, bool)
                                    or not isinstance(time_budget, (int, float))
                                    or not (math.isfinite(time_budget) and time_budget > 0)):
        raise ValueError(f"--time-budget must be a positive number of seconds, got {time_budget!r}")
    check_mode(cuda_graph)
    return names, seeds


def check_per_process(n) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"--runs-per-process must be a positive integer, got {n!r}")


def plan_runs(names: Sequence[str], seeds: Sequence[int],
              lrs: Dict[str, List[float]]) -> List[Tuple[str, Optional[float], int]]:
    """(variant, lr or ``None`` for the papers', seed) of every run; ``--lr`` must name
    variants that are run."""
    stray = [v for v in lrs if v not in names]
    if stray:
        raise ValueError(f"--lr names {', '.join(stray)}, which is not among the variants run "
                         f"({', '.join(names)}); add it to --variants")
    return [(v, lr, s) for v in names for lr in (lrs.get(v) or [None]) for s in seeds]


# ---------------------------------------------------------------------------- processes
def _child_cmd(runs: List[Dict]) -> List[str]:
    return [sys.executable, "-m", "rnn_ablations.lm.reproduce_child", "--child",
            json.dumps({"runs": runs})]


def group_runs(specs: List[Dict], per_process: int, logs: Path) -> List[Dict]:
    """Processes of ``per_process`` runs each: ``{"name", "runs", "log"}``."""
    procs = []
    for i in range(0, len(specs), per_process):
        runs = specs[i:i + per_process]
        name = runs[0]["run"] if len(runs) == 1 else "+".join(r["run"] for r in runs)
        log = str(logs / f"{name}.log")
        for r in runs:
            r["process_log"] = log
        procs.append({"name": name, "runs": runs, "log": log})
    return procs


def _child_env(threads: int) -> Dict[str, str]:
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["OMP_NUM_THREADS"] = str(threads)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _stop(procs: Dict[str, subprocess.Popen], grace: float) -> None:
    """SIGTERM to each process (by its pid), SIGKILL to those still there after ``grace`` s."""
    for p in procs.values():
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    end = time.time() + grace
    for p in procs.values():
        try:
            p.wait(timeout=max(0.0, end - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def run_children(procs: List[Dict], max_parallel: int, threads: int, say,
                 start_by: Optional[float] = None, poll: float = 0.2,
                 stop_at: Optional[float] = None, cut: Optional[set] = None,
                 grace: float = 3.0) -> Dict[str, Optional[int]]:
    """Start the processes (at most ``max_parallel`` at once); returns each run's exit code
    (a process's, or what its thread reported in ``OUT/<run>/exit``).  After ``start_by`` (a
    ``time.time()``) no process is started: its runs get the code ``None`` (not run).  At
    ``stop_at`` the processes still running are stopped (SIGTERM, SIGKILL after ``grace`` s)
    and their runs' names are added to ``cut``."""
    pending = list(procs)
    running: Dict[str, subprocess.Popen] = {}
    by_name = {p["name"]: p for p in procs}
    logs = {}
    codes: Dict[str, Optional[int]] = {}
    env = _child_env(threads)
    # SIGTERM to this process (a batch scheduler, `docker stop`) stops it as Ctrl-C does: the
    # `finally` below passes SIGTERM on to the children, which checkpoint their runs first
    term = None
    if (threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL):
        term = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        while pending or running:
            while pending and len(running) < max_parallel:
                proc = pending.pop(0)
                if start_by is not None and time.time() >= start_by:
                    for r in proc["runs"]:
                        codes[r["run"]] = None
                    say(f"{proc['name']} not started: too little of the time budget is left")
                    continue
                Path(proc["log"]).parent.mkdir(parents=True, exist_ok=True)
                for r in proc["runs"]:
                    Path(r["out"]).mkdir(parents=True, exist_ok=True)
                    if (Path(r["out"]) / "exit").exists():
                        (Path(r["out"]) / "exit").unlink()
                f = open(proc["log"], "a")
                logs[proc["name"]] = f
                running[proc["name"]] = subprocess.Popen(_child_cmd(proc["runs"]), stdout=f,
                                                         stderr=subprocess.STDOUT, env=env)
                say(f"started {proc['name']} (pid {running[proc['name']].pid})")
            if not running:
                continue
            if stop_at is not None and time.time() >= stop_at:
                names = [r["run"] for n in running for r in by_name[n]["runs"]
                         if codes.get(r["run"]) is None]
                say(f"time budget: stopping {', '.join(sorted(running))} (cut: "
                    f"{', '.join(names)})")
                _stop(running, grace)
                for name, p in running.items():
                    logs.pop(name).close()
                    for r in by_name[name]["runs"]:
                        e = Path(r["out"]) / "exit"
                        codes[r["run"]] = int(e.read_text()) if e.exists() else (p.returncode or 1)
                        if cut is not None and codes[r["run"]] != 0:
                            cut.add(r["run"])
                running.clear()
                for proc in pending:
                    for r in proc["runs"]:
                        codes[r["run"]] = None
                    say(f"{proc['name']} not started: too little of the time budget is left")
                pending.clear()
                break
            time.sleep(poll)
            for name, p in list(running.items()):
                rc = p.poll()
                if rc is not None:
                    logs.pop(name).close()
                    del running[name]
                    for r in by_name[name]["runs"]:
                        e = Path(r["out"]) / "exit"
                        # a run's own exit code (it may have ended before its process did)
                        codes[r["run"]] = int(e.read_text()) if e.exists() else (rc or 1)
                    bad = [r["run"] for r in by_name[name]["runs"] if codes[r["run"]] != 0]
                    say(f"{name} finished" if not bad else
                        f"{name} FAILED ({', '.join(bad)}; exit {rc}); see {by_name[name]['log']}")
    finally:
        for name, p in running.items():   # interrupted: stop our children, by their pid
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for name, p in running.items():
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        for f in logs.values():
            f.close()
        if term is not None:
            signal.signal(signal.SIGTERM, term)
    return codes


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def _default_parallel(n_runs: int, device: str) -> int:
    if device.startswith("cuda"):
        return n_runs
    return max(1, min(n_runs, os.cpu_count() or 1))


def _cut_row(out: Path, spec: Dict, base: Dict, epoch_size: int) -> Optional[Dict]:
    """The row of a run stopped at the time budget: its outcome as far as it got (the child
    writes one before its evaluations), else its last checkpoint's epochs, unevaluated."""
    p = out / spec["run"] / OUTCOME
    if p.exists():
        try:
            return dict(base, **json.loads(p.read_text()), cut=True)
        except ValueError:
            pass
    try:
        ckpt = load_checkpoint(out / spec["run"])
    except (OSError, ValueError):
        return None
    return dict(base, epochs=round(ckpt["epoch"] + ckpt["step"] / max(epoch_size, 1), 3),
                epochs_planned=spec.get("epochs_planned"), valid_ppl=None, test_ppl=None,
                seconds=round(float(ckpt.get("wall_time") or 0.0), 1), status="incomplete",
                complete=False, steps=ckpt.get("global_step"), cut=True,
                note="cut by the time budget before its evaluation")


def row_of(out: Path, spec: Dict, code: Optional[int], not_run: bool = False,
           cut: bool = False, epoch_size: int = 1) -> Dict:
    """One row of the table from a run's outcome (or its failure, or its not being started,
    or, ``cut``, its being stopped at the time budget)."""
    p = out / spec["run"] / OUTCOME
    base = {"variant": spec["variant"], "seed": spec["seed"], "run": spec["run"],
            "paper_name": get_variant(spec["variant"]).paper_name,
            "learning_rate": spec.get("learning_rate_resolved"),
            "paper_learning_rate": spec.get("paper_learning_rate")}
    if not_run:
        return dict(base, epochs=0, epochs_planned=spec.get("epochs_planned"), valid_ppl=None,
                    test_ppl=None, seconds=0.0, status="not run")
    if p.exists() and code == 0:
        return dict(base, **json.loads(p.read_text()))
    if cut:
        row = _cut_row(out, spec, base, epoch_size)
        if row is not None:
            return row
    tail = ""
    log = Path(spec.get("process_log") or out / spec["run"] / RUN_LOG)
    if log.exists():
        tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-5:]).strip()
    return dict(base, epochs=None, epochs_planned=spec.get("epochs_planned"), valid_ppl=None,
                test_ppl=None, seconds=None, status="failed", error=f"exit {code}: {tail}")


def reproduce_ptb(config: str, data, out, *, variants: Optional[Sequence[str]] = None,
                  seeds: Optional[Sequence[int]] = None, lrs: Optional[Sequence[str]] = None,
                  device: Optional[str] = None, max_parallel: Optional[int] = None,
                  resume: bool = False, overwrite: bool = False,
                  time_budget: Optional[float] = None, cuda_graph: str = "auto",
                  checkpoint_every: int = 0, epochs: Optional[int] = None,
                  max_steps: Optional[int] = None, threads: Optional[int] = None,
                  paper_lr: bool = True, runs_per_process: int = 1, log=print) -> Dict:
    """Train every (variant, lr, seed) concurrently, evaluate, write ``OUT/results.*``; returns
    the results dict (also ``OUT/results.json``).  ``lrs``: ``["VARIANT=LR", …]``."""
    t0 = time.time()
    say = log or (lambda s: None)
    names, seeds = check_args(config, variants, seeds, max_parallel, time_budget, cuda_graph)
    check_per_process(runs_per_process)
    lr_map = parse_lrs(lrs)
    planned = plan_runs(names, seeds, lr_map)
    if data is None:
        raise ValueError("reproduce ptb needs --data DIR: a PTB directory with ptb.train.txt, "
                         "ptb.valid.txt and ptb.test.txt")
    corpus = load_corpus(data)
    if corpus.test is None:
        raise ValueError(f"{data} has no test file (ptb.test.txt or test.txt): the papers' table "
                         "is test perplexity")
    cfg = get_config(config, epochs=epochs)
    dev = str(resolve_device(device))
    out = Path(out)
    run_names = [run_name(v, s, lr) for v, lr, s in planned]
    data_path = str(Path(data).resolve())
    manifest = {"config": cfg.name, "epochs": cfg.epochs, "paper_lr": paper_lr,
                "data": data_path, "corpus_fingerprint": corpus_fingerprint(corpus),
                "variants": names, "seeds": seeds, "lr": lr_map}
    prepare_out(out, resume=resume, overwrite=overwrite, what="a reproduction",
                files=list(OUTPUTS) + [f"{r}/{f}" for r in run_names
                                       for f in RUN_FILES + (OUTCOME, RUN_LOG)],
                manifest=MANIFEST, new_manifest=manifest,
                same_keys=("config", "corpus_fingerprint", "paper_lr", "epochs"))
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    parallel = max_parallel or _default_parallel(len(planned), dev)
    nthreads = threads or max(1, (os.cpu_count() or 1) // min(parallel * runs_per_process,
                                                               len(planned)))
    deadline = start_by = stop_at = None
    if time_budget is not None:
        # keep time for the final evaluation of every run and the tables; start no run that
        # would have less than that left to train; stop what still runs when only the time
        # for the tables is left
        reserve, tables = min(30.0, 0.1 * time_budget), min(10.0, 0.1 * time_budget)
        stop_at = t0 + time_budget - tables
        deadline = stop_at - reserve
        start_by = deadline - reserve
    specs = []
    for v, lr, s in planned:
        paper = cfg.for_variant(v, paper_lr=True).learning_rate
        specs.append({
            "run": run_name(v, s, lr), "variant": v, "seed": s, "config": cfg.name,
            "epochs": epochs, "epochs_planned": cfg.epochs, "data": data_path,
            "out": str(out / run_name(v, s, lr)), "device": dev, "resume": resume,
            "overwrite": overwrite, "deadline": deadline, "cuda_graph": cuda_graph,
            "checkpoint_every": checkpoint_every, "max_steps": max_steps, "threads": nthreads,
            "paper_lr": paper_lr, "learning_rate": lr, "paper_learning_rate": paper,
            "learning_rate_resolved": lr if lr is not None
            else cfg.for_variant(v, paper_lr=paper_lr).learning_rate})
    procs = group_runs(specs, runs_per_process, out / "logs")
    parallel = min(parallel, len(procs)) if max_parallel is None else parallel
    say(f"reproduce ptb: config {cfg.name} ({cfg.num_layers} × {cfg.hidden_size}, {cfg.epochs} "
        f"epochs), {len(planned)} run(s) ({', '.join(run_names)}) in {len(procs)} process(es) "
        f"({runs_per_process} run(s) each), {parallel} process(es) at a time on {dev}"
        + (f", time budget {time_budget:g} s" if time_budget else "") + f"; logs in {out}/*/{RUN_LOG}")
    cut: set = set()
    codes = run_children(procs, parallel, nthreads, say, start_by=start_by, stop_at=stop_at,
                         cut=cut)
    epoch_size = (batchify(corpus.train, cfg.batch_size).shape[1] - 1) // cfg.num_steps
    rows = [row_of(out, spec, codes.get(spec["run"]),
                   not_run=spec["run"] in codes and codes[spec["run"]] is None,
                   cut=spec["run"] in cut, epoch_size=epoch_size) for spec in specs]
    wall = round(time.time() - t0, 1)
    results = {
        "device": device_name(dev), "config": cfg.name, "epochs_planned": cfg.epochs,
        "data": str(data), "max_parallel": min(parallel * runs_per_process, len(planned)),
        "processes": len(procs), "runs_per_process": runs_per_process, "runs": len(planned),
        "time_budget_s": time_budget, "wall_seconds": wall,
        "over_budget_s": (round(wall - time_budget, 1)
                          if time_budget is not None and wall > time_budget else None),
        "cuda_graph": cuda_graph, "rows": rows,
    }
    paths = write_results(results, out)
    results = json.loads((out / "results.json").read_text())
    say("")
    say(format_summary(results))
    say("")
    say(format_results(results))
    cut_rows = [r["run"] for r in results["rows"]
                if r.get("cut") or r.get("status") == "incomplete"]
    if cut_rows:
        say("cut by the time budget (continue with --resume): " + ", ".join(cut_rows))
    if results["over_budget_s"]:
        say(f"the command took {results['over_budget_s']:.0f} s more than its time budget")
    say("wrote " + ", ".join(str(p) for p in paths))
    return results
