"""``rnn-ablations reproduce ptb``: the papers' PTB language-model table, every variant trained
concurrently on one device, beside the papers' numbers.

Each (variant, seed) is one process (at most ``max_parallel`` at a time) that trains with the
papers' settings (:mod:`rnn_ablations.lm.configs`, the RAN code's per-variant learning rates) in
``OUT/<variant>_s<seed>/`` with the trainer's checkpoints (:mod:`rnn_ablations.lm.trainer`): a
run that is cut off (killed, or stopped by ``--time-budget``) continues bit-identically with
``--resume``.  On CUDA each process replays its training step as a CUDA graph
(:mod:`rnn_ablations.lm.graph_step`): the step is launch-bound, so several processes share
the GPU.

When the runs end, each is evaluated on valid and **test**, and ``OUT/results.{json,md,csv,png}``
get one row per run: epochs done, valid and test perplexity, seconds, device, and the papers'
test perplexities beside ours (ACL 2018 Table 1; the RAN paper).  A run whose perplexity is not
finite or worse than a uniform guess over the vocabulary is reported as *diverged*; a run
stopped by the time budget is reported with the epochs it did and its perplexities at that point,
marked *incomplete*.

``--timing STEPS`` measures instead of training: every process captures its step, waits for the
others, then times STEPS steps and one valid evaluation, all at once; the table gives steps/s per
run and the projected wall time of the full schedule (``OUT/timing.{json,md}``).
"""
from __future__ import annotations

import csv
import json
import math
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from ..variants import get_variant

__all__ = ["PAPER_TEST_PPL", "DEFAULT_VARIANTS", "reproduce_ptb", "run_timing",
           "format_results", "write_results"]

#: The five variants of the papers' tables.
DEFAULT_VARIANTS = ("lstm", "srnn", "lstm_minus_srnn", "ran", "identity_ran")
REPRO_CONFIGS = ("tiny", "small", "medium", "large")
MANIFEST = "reproduce.json"
OUTCOME = "outcome.json"
RUN_LOG = "run.log"
OUTPUTS = ("results.json", "results.md", "results.csv", "results.png")

#: Test perplexities of the papers (PTB): ``acl`` = Levy et al. (ACL 2018) Table 1 (``acl_std``
#: its ± over seeds where given), ``ran`` = Lee et al. (2017), the RAN paper.
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


def _run_name(variant: str, seed: int) -> str:
    return f"{variant}_s{seed}"


def _paper(config: str, variant: str, key: str) -> Optional[float]:
    return PAPER_TEST_PPL.get(config, {}).get(variant, {}).get(key)


def _fmt_paper(config: str, variant: str, key: str) -> str:
    v = _paper(config, variant, key)
    if v is None:
        return "—"
    std = _paper(config, variant, key + "_std")
    return f"{v:.1f} ± {std:.1f}" if std is not None else f"{v:.1f}"


def device_name(device: str) -> str:
    import torch
    d = torch.device(device)
    if d.type == "cuda":
        return torch.cuda.get_device_name(d)
    return f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"


# ---------------------------------------------------------------------------- validation
def _check_args(config: str, variants, seeds, max_parallel, time_budget, cuda_graph):
    from .graph_step import check_mode
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
        if isinstance(s, bool) or not isinstance(s, int) or s < 0:
            raise ValueError(f"--seeds must be integers >= 0, got {s!r}")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds has repeats: {seeds}")
    if max_parallel is not None and (isinstance(max_parallel, bool) or not isinstance(max_parallel, int)
                                     or max_parallel < 1):
        raise ValueError(f"--max-parallel must be a positive integer, got {max_parallel!r}")
    if time_budget is not None and (not isinstance(time_budget, (int, float)) or not time_budget > 0):
        raise ValueError(f"--time-budget must be a positive number of seconds, got {time_budget!r}")
    check_mode(cuda_graph)
    return names, seeds


def _resolve_device(device: Optional[str]) -> str:
    from .trainer import _resolve_device as rd
    return str(rd(device))


# ---------------------------------------------------------------------------- the parent
def _prepare_out(out: Path, manifest: Dict, runs: List[str], resume: bool, overwrite: bool) -> None:
    from .trainer import RUN_FILES
    if resume and overwrite:
        raise ValueError("give either --resume or --overwrite, not both")
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"--out {str(out)!r} exists and is not a directory")
    ours = [p for p in [out / MANIFEST] + [out / o for o in OUTPUTS] if p.exists()]
    run_files = [out / r / f for r in runs for f in RUN_FILES + (OUTCOME, RUN_LOG)
                 if (out / r / f).exists()]
    if (ours or run_files) and not (resume or overwrite):
        raise FileExistsError(
            f"--out {str(out)!r} already holds a reproduction "
            f"({', '.join(sorted({p.relative_to(out).parts[0] for p in ours + run_files})[:6])}); "
            "pass --resume to continue it (finished runs are reused) or --overwrite to discard it")
    if resume and (out / MANIFEST).exists():
        old = json.loads((out / MANIFEST).read_text())
        for key in ("config", "corpus_fingerprint", "paper_lr", "epochs"):
            if old.get(key) != manifest.get(key):
                raise ValueError(
                    f"--resume: {str(out)!r} was run with a different {key.replace('_', ' ')} "
                    f"({old.get(key)!r} there, {manifest.get(key)!r} now); use the same settings "
                    "or --overwrite")
    if overwrite:
        for p in ours + run_files:
            p.unlink()
    out.mkdir(parents=True, exist_ok=True)


def _child_cmd(runs: List[Dict]) -> List[str]:
    return [sys.executable, "-m", "rnn_ablations.lm.reproduce", "--child",
            json.dumps({"runs": runs})]


def _group(specs: List[Dict], per_process: int, logs: Path) -> List[Dict]:
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


def _run_children(procs: List[Dict], max_parallel: int, threads: int,
                  say, poll: float = 0.2) -> Dict[str, int]:
    """Start the processes (at most ``max_parallel`` at once); returns each run's exit code
    (a process's, or what its thread reported in ``OUT/<run>/exit``)."""
    pending = list(procs)
    running: Dict[str, subprocess.Popen] = {}
    by_name = {p["name"]: p for p in procs}
    logs = {}
    codes: Dict[str, int] = {}
    env = _child_env(threads)
    try:
        while pending or running:
            while pending and len(running) < max_parallel:
                proc = pending.pop(0)
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
    return codes


def _default_parallel(n_runs: int, device: str) -> int:
    if device.startswith("cuda"):
        return n_runs
    return max(1, min(n_runs, os.cpu_count() or 1))


def reproduce_ptb(config: str, data, out, *, variants: Optional[Sequence[str]] = None,
                  seeds: Optional[Sequence[int]] = None, device: Optional[str] = None,
                  max_parallel: Optional[int] = None, resume: bool = False,
                  overwrite: bool = False, time_budget: Optional[float] = None,
                  cuda_graph: str = "auto", checkpoint_every: int = 0,
                  epochs: Optional[int] = None, max_steps: Optional[int] = None,
                  threads: Optional[int] = None, paper_lr: bool = True,
                  runs_per_process: int = 1, log=print) -> Dict:
    """Train every (variant, seed) concurrently, evaluate, write ``OUT/results.*``; returns the
    results dict (also ``OUT/results.json``)."""
    from .configs import get_config
    from .data import load_corpus
    from .trainer import corpus_fingerprint
    t0 = time.time()
    say = log or (lambda s: None)
    names, seeds = _check_args(config, variants, seeds, max_parallel, time_budget, cuda_graph)
    _check_per_process(runs_per_process)
    if data is None:
        raise ValueError("reproduce ptb needs --data DIR: a PTB directory with ptb.train.txt, "
                         "ptb.valid.txt and ptb.test.txt")
    corpus = load_corpus(data)
    if corpus.test is None:
        raise ValueError(f"{data} has no test file (ptb.test.txt or test.txt): the papers' table "
                         "is test perplexity")
    cfg = get_config(config, epochs=epochs)
    dev = _resolve_device(device)
    out = Path(out)
    runs = [(v, s) for v in names for s in seeds]
    run_names = [_run_name(v, s) for v, s in runs]
    data_path = str(Path(data).resolve())
    manifest = {"config": cfg.name, "epochs": cfg.epochs, "paper_lr": paper_lr,
                "data": data_path, "corpus_fingerprint": corpus_fingerprint(corpus),
                "variants": names, "seeds": seeds}
    _prepare_out(out, manifest, run_names, resume, overwrite)
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    parallel = max_parallel or _default_parallel(len(runs), dev)
    nthreads = threads or max(1, (os.cpu_count() or 1) // min(parallel * runs_per_process, len(runs)))
    deadline = None
    if time_budget is not None:
        # leave time for the final evaluation of every run and the tables
        reserve = min(30.0, 0.1 * time_budget)
        deadline = t0 + time_budget - reserve
    specs = [{"run": _run_name(v, s), "variant": v, "seed": s, "config": cfg.name,
              "epochs": epochs, "data": data_path, "out": str(out / _run_name(v, s)),
              "device": dev, "resume": resume, "overwrite": overwrite, "deadline": deadline,
              "cuda_graph": cuda_graph, "checkpoint_every": checkpoint_every,
              "max_steps": max_steps, "threads": nthreads, "paper_lr": paper_lr}
             for v, s in runs]
    procs = _group(specs, runs_per_process, out / "logs")
    parallel = min(parallel, len(procs)) if max_parallel is None else parallel
    say(f"reproduce ptb: config {cfg.name} ({cfg.num_layers} × {cfg.hidden_size}, {cfg.epochs} "
        f"epochs), {len(runs)} run(s) ({', '.join(run_names)}) in {len(procs)} process(es) "
        f"({runs_per_process} run(s) each), {parallel} process(es) at a time on {dev}"
        + (f", time budget {time_budget:g} s" if time_budget else "") + f"; logs in {out}/*/{RUN_LOG}")
    codes = _run_children(procs, parallel, nthreads, say)
    rows = [_row(out, spec, codes.get(spec["run"])) for spec in specs]
    wall = time.time() - t0
    results = {
        "device": device_name(dev), "config": cfg.name, "epochs_planned": cfg.epochs,
        "data": str(data), "max_parallel": min(parallel * runs_per_process, len(runs)),
        "processes": len(procs), "runs_per_process": runs_per_process, "runs": len(runs),
        "time_budget_s": time_budget, "wall_seconds": round(wall, 1), "cuda_graph": cuda_graph,
        "rows": rows,
    }
    paths = write_results(results, out)
    say("")
    say(format_results(results))
    say("wrote " + ", ".join(str(p) for p in paths))
    return results


def _row(out: Path, spec: Dict, code: Optional[int]) -> Dict:
    """One row of the table from a run's outcome (or its failure)."""
    p = out / spec["run"] / OUTCOME
    base = {"variant": spec["variant"], "seed": spec["seed"],
            "paper_name": get_variant(spec["variant"]).paper_name}
    if p.exists() and code == 0:
        o = json.loads(p.read_text())
        return dict(base, **o)
    tail = ""
    log = Path(spec.get("process_log") or out / spec["run"] / RUN_LOG)
    if log.exists():
        tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-5:]).strip()
    return dict(base, epochs=None, valid_ppl=None, test_ppl=None, seconds=None,
                status="failed", error=f"exit {code}: {tail}")


# ---------------------------------------------------------------------------- tables
def _fmt_ppl(r: Dict, key: str) -> str:
    if r.get("status") == "diverged":
        return "diverged"
    v = r.get(key)
    return "n/a" if v is None else f"{v:.2f}"


def _fmt_epochs(r: Dict) -> str:
    e = r.get("epochs")
    if e is None:
        return "n/a"
    s = f"{e:g}" if isinstance(e, int) or float(e).is_integer() else f"{e:.2f}"
    planned = r.get("epochs_planned")
    cut = r.get("status") == "incomplete" or (planned is not None and e < planned)
    return s + (f" of {planned}" if cut else "")


def _table_rows(results: Dict):
    cfg = results["config"]
    head = ["variant", "paper name", "seed", "lr", "epochs", "valid ppl", "test ppl",
            "ACL'18 test", "RAN paper test", "status", "seconds", "step"]
    body = []
    for r in results["rows"]:
        body.append([r["variant"], r["paper_name"], str(r["seed"]),
                     f"{r['learning_rate']:g}" if r.get("learning_rate") is not None else "",
                     _fmt_epochs(r), _fmt_ppl(r, "valid_ppl"), _fmt_ppl(r, "test_ppl"),
                     _fmt_paper(cfg, r["variant"], "acl"), _fmt_paper(cfg, r["variant"], "ran"),
                     r.get("status", ""),
                     f"{r['seconds']:.0f}" if r.get("seconds") is not None else "n/a",
                     r.get("step_mode", "")])
    return head, body


def format_results(results: Dict, markdown: bool = False) -> str:
    head, body = _table_rows(results)
    if markdown:
        lines = ["| " + " | ".join(head) + " |",
                 "|" + "|".join("---" if i < 2 or i in (9, 11) else "---:" for i in range(len(head))) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in body]
        return "\n".join(lines)
    table = [head] + body
    widths = [max(len(r[i]) for r in table) for i in range(len(head))]
    def line(r):
        return "  ".join(s.ljust(w) if i < 2 or i in (9, 11) else s.rjust(w)
                         for i, (s, w) in enumerate(zip(r, widths)))
    return "\n".join([line(head), "  ".join("-" * w for w in widths)] + [line(r) for r in body])


def _title(results: Dict) -> str:
    return (f"PTB language model, config {results['config']} ({results['epochs_planned']} epochs): "
            f"test perplexity beside the papers'")


def _note(results: Dict) -> str:
    n_inc = sum(r.get("status") == "incomplete" for r in results["rows"])
    parts = [f"Device: {results['device']}; {results['runs']} run(s), {results['max_parallel']} at "
             f"a time; wall time {results['wall_seconds']:.0f} s"
             + (f" (time budget {results['time_budget_s']:g} s)" if results.get("time_budget_s") else "")
             + f"; CUDA graph: {results['cuda_graph']} (step column: what each run used)."]
    parts.append("ACL'18 test: Levy et al. (2018) Table 1 (LSTM, −GATES, −S-RNN, −S-RNN−OUT = "
                 "tanh RAN); RAN paper test: Lee et al. (2017).")
    parts.append("seconds: wall time of the run's training and evaluations (all resumes "
                 "together). diverged: perplexity not finite or worse than a uniform guess.")
    if n_inc:
        parts.append(f"{n_inc} run(s) were cut by the time budget: their perplexities are those "
                     "of the model at that point, after the epochs shown (continue with --resume).")
    return " ".join(parts)


def write_results(results: Dict, out: Path) -> List[Path]:
    out = Path(out)
    paths = [out / o for o in OUTPUTS]
    tmp = out / "results.json.tmp"
    tmp.write_text(json.dumps(results, indent=2, allow_nan=False) + "\n")
    os.replace(tmp, out / "results.json")
    (out / "results.md").write_text(f"{_title(results)}\n\n{format_results(results, True)}\n\n"
                                    f"{_note(results)}\n")
    keys = ["variant", "paper_name", "seed", "learning_rate", "epochs", "epochs_planned",
            "valid_ppl", "test_ppl", "acl_test_ppl", "ran_paper_test_ppl", "status", "seconds",
            "device", "step_mode"]
    with open(out / "results.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(keys)
        for r in results["rows"]:
            row = dict(r, acl_test_ppl=_paper(results["config"], r["variant"], "acl"),
                       ran_paper_test_ppl=_paper(results["config"], r["variant"], "ran"))
            w.writerow(["" if row.get(k) is None else row.get(k) for k in keys])
    _plot(results, out / "results.png")
    return paths


def _plot(results: Dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    rows = results["rows"]
    cfg = results["config"]
    xs = list(range(len(rows)))
    w = 0.27
    fig, ax = plt.subplots(figsize=(max(6, 1.8 * len(rows)), 4.5))
    ours = [r.get("test_ppl") if r.get("status") in ("complete", "incomplete") else None
            for r in rows]
    acl = [_paper(cfg, r["variant"], "acl") for r in rows]
    ran = [_paper(cfg, r["variant"], "ran") for r in rows]
    for off, vals, label, color in ((-w, ours, "ours (test)", "#4878a8"),
                                    (0, acl, "ACL'18 Table 1", "#e0a040"),
                                    (w, ran, "RAN paper", "#60a060")):
        pts = [(x + off, v) for x, v in zip(xs, vals) if v is not None]
        if pts:
            ax.bar([p[0] for p in pts], [p[1] for p in pts], w, label=label, color=color)
            for x, v in pts:
                ax.text(x, v, f"{v:.1f}", ha="center", va="bottom", fontsize=7)
    for x, r in zip(xs, rows):
        st = r.get("status")
        if st in ("diverged", "failed"):
            ax.text(x - w, 1, st, ha="center", va="bottom", rotation=90, fontsize=8, color="#a03030")
        elif st == "incomplete":
            ax.text(x - w, 1, f"{_fmt_epochs(r)} ep.", ha="center", va="bottom", rotation=90,
                    fontsize=7, color="white")
    ax.set_xticks(xs, [f"{r['variant']}\ns{r['seed']}" for r in rows], fontsize=8)
    ax.set_ylabel("test perplexity (lower is better)")
    ax.legend(fontsize=8)
    ax.set_title(_title(results), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------------------- a child
def _diverged(ppl: Optional[float], vocab: int) -> bool:
    return ppl is None or not math.isfinite(ppl) or ppl > vocab


def _run_logger(spec: Dict):
    """The trainer's lines go to OUT/<run>/run.log (and, prefixed, to the process's output)."""
    path = Path(spec["out"]) / RUN_LOG
    path.parent.mkdir(parents=True, exist_ok=True)
    lines: List[str] = []

    def log(line: str) -> None:
        lines.append(line)
        with open(path, "a") as f:
            f.write(line + "\n")
        print(f"[{spec['run']}] {line}", flush=True)
    return log, lines


def _child_train(spec: Dict) -> int:
    import torch
    from .configs import get_config
    from .data import load_corpus
    from .trainer import (DistContext, _resolve_device as rd, evaluate, load_checkpoint,
                          model_from_checkpoint, train_lm)
    torch.set_num_threads(spec["threads"])
    dev = rd(spec["device"])
    corpus = load_corpus(spec["data"])
    cfg = get_config(spec["config"], epochs=spec.get("epochs"))
    cfg = cfg.for_variant(spec["variant"], paper_lr=spec.get("paper_lr", True))
    out = Path(spec["out"])
    if spec["overwrite"] and (out / RUN_LOG).exists():
        (out / RUN_LOG).unlink()
    log, lines = _run_logger(spec)
    if (out / OUTCOME).exists():
        (out / OUTCOME).unlink()
    result = train_lm(spec["variant"], cfg, corpus, out,
                      corpus_spec={"kind": "dir", "path": spec["data"]}, seed=spec["seed"],
                      ctx=DistContext(device=dev), resume=spec["resume"],
                      overwrite=spec["overwrite"], checkpoint_every=spec["checkpoint_every"],
                      max_steps=spec.get("max_steps"), progress=False,
                      cuda_graph=spec["cuda_graph"], deadline=spec.get("deadline"), log=log,
                      stop_above_ppl=float(len(corpus.vocab)))
    ckpt = load_checkpoint(out)
    vocab = len(corpus.vocab)
    from .data import batchify
    epoch_size = (batchify(corpus.train, cfg.batch_size).shape[1] - 1) // cfg.num_steps
    step_mode = "graph" if (dev.type == "cuda" and spec["cuda_graph"] != "off") else "eager"
    if any("CUDA graph of the training step not used" in line for line in lines):
        step_mode = "eager (capture failed)"
    if result is not None:
        valid, test = result["valid_ppl"], result["test_ppl"]
        epochs_done, complete, seconds = cfg.epochs, True, result["wall_time_s"]
    else:   # cut by the deadline (or max_steps): evaluate the model as it is now
        model = model_from_checkpoint(ckpt, dev)
        valid = evaluate(model, corpus.valid, cfg.eval_batch_size, cfg.num_steps, dev)["ppl"]
        test = evaluate(model, corpus.test, cfg.eval_batch_size, cfg.num_steps, dev)["ppl"]
        epochs_done = round(ckpt["epoch"] + ckpt["step"] / epoch_size, 3)
        complete, seconds = False, ckpt["wall_time"]
    diverged = _diverged(valid, vocab) or _diverged(test, vocab)
    status = "diverged" if diverged else ("complete" if complete else "incomplete")
    finite = (lambda v: v if (v is not None and math.isfinite(v)) else None)
    outcome = {"epochs": epochs_done, "epochs_planned": cfg.epochs,
               "valid_ppl": None if diverged else valid, "test_ppl": None if diverged else test,
               "valid_ppl_raw": finite(valid), "test_ppl_raw": finite(test),
               "seconds": round(seconds, 1), "status": status, "complete": complete,
               "device": device_name(str(dev)), "learning_rate": cfg.learning_rate,
               "steps": ckpt["global_step"], "step_mode": step_mode}
    tmp = out / (OUTCOME + ".tmp")
    tmp.write_text(json.dumps(outcome, indent=2) + "\n")
    os.replace(tmp, out / OUTCOME)
    log(f"{spec['run']}: {status}, {epochs_done} epochs, valid {valid:.2f}, test {test:.2f}, "
        f"{seconds:.0f} s")
    return 0


# ---------------------------------------------------------------------------- timing
def _check_per_process(n) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"--runs-per-process must be a positive integer, got {n!r}")


def _child_timing(spec: Dict) -> int:
    """Capture the step, wait for the other runs, time ``steps`` steps and one valid evaluation."""
    import torch
    from .configs import get_config
    from .data import batchify, load_corpus
    from .graph_step import StaticEvaluator, StaticTrainStep
    from .model import LanguageModel
    from .trainer import _resolve_device as rd, evaluate
    t_start = spec["t_start"]
    torch.set_num_threads(spec["threads"])
    dev = rd(spec["device"])
    corpus = load_corpus(spec["data"])
    cfg = get_config(spec["config"], epochs=spec.get("epochs"))
    cfg = cfg.for_variant(spec["variant"], paper_lr=spec.get("paper_lr", True))
    torch.manual_seed(spec["seed"])
    model = LanguageModel(spec["variant"], len(corpus.vocab), cfg.hidden_size, cfg.num_layers,
                          cfg.dropout, cfg.init_scale, cfg.forget_bias).to(dev)
    gen = torch.Generator(device=dev)
    gen.manual_seed(spec["seed"] + 1)
    T, B = cfg.num_steps, cfg.batch_size
    rows = batchify(corpus.train, B).to(dev)
    epoch_size = (rows.shape[1] - 1) // T
    graph = dev.type == "cuda" and spec["cuda_graph"] != "off"
    stepper = StaticTrainStep(model, T, B, cfg.max_grad_norm, gen, (0, B, B), use_graph=graph,
                              strict=spec["cuda_graph"] == "on")
    stepper.begin(None, torch.zeros(2, dtype=torch.float64), cfg.learning_rate)

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    def window(i):
        i = i % epoch_size
        return rows[:, i * T:(i + 1) * T].t(), rows[:, i * T + 1:(i + 1) * T + 1].t()

    t_cap = time.perf_counter()
    for i in range(5):   # capture (first step) and a few replays
        stepper.step(*window(i))
    sync()
    capture_s = time.perf_counter() - t_cap
    ready = Path(spec["out"]) / "ready"
    ready.write_text("1")
    others = [Path(p) / "ready" for p in spec["all_runs"]]
    t_wait = time.time()
    while not all(p.exists() for p in others):
        if time.time() - t_wait > 300:
            raise RuntimeError("the other timing runs did not get ready within 300 s")
        time.sleep(0.01)
    steps = spec["steps"]
    sync()
    t0 = time.perf_counter()
    for i in range(steps):
        stepper.step(*window(5 + i))
    sync()
    train_s = time.perf_counter() - t0
    loss = float(stepper.tok_loss)
    t1 = time.perf_counter()
    if graph and stepper.graph is not None:
        ev = StaticEvaluator(model, T, cfg.eval_batch_size, use_graph=True)
        ev.evaluate(corpus.valid)      # capture
        sync()
        t1 = time.perf_counter()
        valid = ev.evaluate(corpus.valid)
    else:
        valid = evaluate(model, corpus.valid, cfg.eval_batch_size, T, dev)
    sync()
    eval_s = time.perf_counter() - t1
    rate = steps / train_s
    total_steps = epoch_size * cfg.epochs
    # valid after every epoch, valid + test at the end (test is about as long as valid)
    n_evals = cfg.epochs + 1 + corpus.test.numel() / corpus.valid.numel()
    projected = total_steps / rate + n_evals * eval_s + (time.time() - t_start - train_s - eval_s)
    res = {"run": spec["run"], "variant": spec["variant"], "device": device_name(str(dev)),
           "step_mode": stepper.mode if stepper.failed is None else "eager (capture failed)",
           "steps": steps, "train_s": round(train_s, 3), "steps_per_s": round(rate, 1),
           "epoch_size": epoch_size, "epochs": cfg.epochs, "total_steps": total_steps,
           "seconds_per_epoch": round(epoch_size / rate, 2), "valid_eval_s": round(eval_s, 3),
           "startup_s": round(time.time() - t_start - train_s - eval_s, 1),
           "capture_s": round(capture_s, 2), "loss_after": round(loss, 4),
           "valid_ppl_after": round(valid["ppl"], 2), "projected_s": round(projected, 1)}
    (Path(spec["out"]) / "timing.json").write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps(res), flush=True)
    return 0


def run_timing(config: str, data, out, *, variants=None, seeds=None, device=None,
               max_parallel=None, cuda_graph: str = "auto", steps: int = 300,
               epochs: Optional[int] = None, threads: Optional[int] = None,
               paper_lr: bool = True, runs_per_process: int = 1, log=print) -> Dict:
    """Time ``steps`` steps of every run at once; print steps/s and the projected wall time of
    the full schedule; write ``OUT/timing.{json,md}``."""
    from .configs import get_config
    t0 = time.time()
    say = log or (lambda s: None)
    names, seeds = _check_args(config, variants, seeds, max_parallel, None, cuda_graph)
    _check_per_process(runs_per_process)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"--timing must be a positive number of steps, got {steps!r}")
    if data is None:
        raise ValueError("reproduce ptb --timing needs --data DIR (a PTB directory)")
    from .data import find_split_files
    find_split_files(data)
    cfg = get_config(config, epochs=epochs)
    dev = _resolve_device(device)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    runs = [(v, s) for v in names for s in seeds]
    n_procs = -(-len(runs) // runs_per_process)
    parallel = max_parallel or n_procs
    if parallel < n_procs:
        raise ValueError(f"--timing runs every run at once ({n_procs} process(es)); "
                         f"--max-parallel {parallel} is smaller")
    nthreads = threads or max(1, (os.cpu_count() or 1) // len(runs))
    run_dirs = [str(out / "timing" / _run_name(v, s)) for v, s in runs]
    for d in run_dirs:
        Path(d).mkdir(parents=True, exist_ok=True)
        for f in ("ready", "timing.json"):
            if (Path(d) / f).exists():
                (Path(d) / f).unlink()
    specs = [{"run": _run_name(v, s), "variant": v, "seed": s, "config": cfg.name,
              "epochs": epochs, "data": str(Path(data).resolve()), "out": d, "device": dev,
              "cuda_graph": cuda_graph, "threads": nthreads, "steps": steps,
              "all_runs": run_dirs, "t_start": time.time(), "timing": True, "paper_lr": paper_lr}
             for (v, s), d in zip(runs, run_dirs)]
    procs = _group(specs, runs_per_process, out / "timing" / "logs")
    say(f"timing: config {cfg.name}, {len(runs)} run(s) at once on {dev} in {len(procs)} "
        f"process(es), {steps} steps each")
    codes = _run_children(procs, len(procs), nthreads, say)
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


def _run_one(spec: Dict, stream_device: Optional[str]) -> int:
    """One run in this thread (on its own CUDA stream when ``stream_device``); writes its exit
    code to ``OUT/<run>/exit``."""
    import traceback
    import contextlib
    import torch
    code = 1
    try:
        ctx = contextlib.nullcontext()
        if stream_device is not None:
            ctx = torch.cuda.stream(torch.cuda.Stream(device=torch.device(stream_device)))
        with ctx:
            code = _child_timing(spec) if spec.get("timing") else _child_train(spec)
    except BaseException:  # noqa: BLE001 - reported in the log and the exit file
        traceback.print_exc()
        sys.stdout.flush()
        code = 1
    (Path(spec["out"]) / "exit").write_text(str(code))
    return code


def _child_main(argv: List[str]) -> int:
    if len(argv) != 2 or argv[0] != "--child":
        print("usage: python -m rnn_ablations.lm.reproduce --child JSON (started by "
              "`rnn-ablations reproduce ptb`)", file=sys.stderr)
        return 2
    runs = json.loads(argv[1])["runs"]
    # the parent stops its children with SIGTERM: exit through Python (checkpoints are atomic)
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))
    if len(runs) == 1:
        return _run_one(runs[0], None)
    # several runs in this process: one thread each, each on its own CUDA stream, so that the
    # GPU runs their (graphed) steps at the same time
    import threading
    dev = runs[0]["device"]
    stream_dev = dev if dev.startswith("cuda") else None
    codes: List[int] = []
    threads = [threading.Thread(target=lambda s=s: codes.append(_run_one(s, stream_dev)),
                                daemon=True, name=s["run"]) for s in runs]
    for t in threads:
        t.start()
    for t in threads:
        while t.is_alive():
            t.join(0.5)
    return 0 if all(c == 0 for c in codes) and len(codes) == len(runs) else 1


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1:]))
