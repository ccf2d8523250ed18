"""The process body of ``rnn-ablations reproduce ptb``: one run (or several, one thread each),
started by :mod:`rnn_ablations.lm.reproduce` as ``python -m rnn_ablations.lm.reproduce_child
--child JSON``.

A training run (:func:`child_train`) trains with :func:`~rnn_ablations.lm.trainer.train_lm` in
``OUT/<run>/``, evaluates the model on valid and test (also when the run was cut) and writes
``OUT/<run>/outcome.json`` (epochs, perplexities, seconds, status; a cut run's outcome is
written before each of its evaluations too, with what is known so far, so that a process stopped
at the time budget still leaves its row); a timing run
(:func:`child_timing`) captures its step, waits for the other runs, and times ``steps`` steps and
one valid evaluation, all runs at once.  Each run writes its exit code to ``OUT/<run>/exit``.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Dict, List, Optional

import torch

from .checkpoints import RESULT, load_checkpoint, model_from_checkpoint
from .configs import LMConfig, get_config
from .data import batchify, load_corpus
from .distributed import DistContext, resolve_device
from .evaluation import evaluate
from .graph_step import StaticEvaluator, StaticTrainStep
from .interrupt import TrainingInterrupted, exit_on_sigterm
from .model import LanguageModel
from .trainer import train_lm

__all__ = ["OUTCOME", "RUN_LOG", "device_name", "run_config", "child_train", "child_timing",
           "child_main"]

OUTCOME = "outcome.json"
RUN_LOG = "run.log"


def device_name(device: str) -> str:
    d = torch.device(device)
    if d.type == "cuda":
        return torch.cuda.get_device_name(d)
    return f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"


def run_config(spec: Dict) -> LMConfig:
    """The run's config: the papers' (with the RAN code's per-variant lr unless ``paper_lr`` is
    false), with ``learning_rate`` replaced when the spec gives one (``--lr VARIANT=LR``)."""
    cfg = get_config(spec["config"], epochs=spec.get("epochs"))
    cfg = cfg.for_variant(spec["variant"], paper_lr=spec.get("paper_lr", True))
    if spec.get("learning_rate") is not None:
        cfg = cfg.replace(learning_rate=float(spec["learning_rate"]))
    return cfg


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


def child_train(spec: Dict) -> int:
    """Train one run, evaluate it, write ``OUT/<run>/outcome.json``."""
    torch.set_num_threads(spec["threads"])
    dev = resolve_device(spec["device"])
    corpus = load_corpus(spec["data"])
    cfg = run_config(spec)
    paper_cfg = get_config(spec["config"], epochs=spec.get("epochs")).for_variant(
        spec["variant"], paper_lr=True)
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
    epoch_size = (batchify(corpus.train, cfg.batch_size).shape[1] - 1) // cfg.num_steps
    step_mode = "graph" if (dev.type == "cuda" and spec["cuda_graph"] != "off") else "eager"
    if any("CUDA graph of the training step not used" in line for line in lines):
        step_mode = "eager (capture failed)"
    finite = (lambda v: v if (v is not None and math.isfinite(v)) else None)

    def write_outcome(valid, test, evaluated: bool) -> str:
        diverged = (_diverged(valid, vocab) or _diverged(test, vocab)) if evaluated else any(
            v is not None and _diverged(v, vocab) for v in (valid, test))
        status = "diverged" if diverged else ("complete" if complete else "incomplete")
        outcome = {"epochs": epochs_done, "epochs_planned": cfg.epochs,
                   "valid_ppl": None if diverged else valid,
                   "test_ppl": None if diverged else test,
                   "valid_ppl_raw": finite(valid), "test_ppl_raw": finite(test),
                   "seconds": round(seconds, 1), "status": status, "complete": complete,
                   "device": device_name(str(dev)), "learning_rate": cfg.learning_rate,
                   "paper_learning_rate": paper_cfg.learning_rate,
                   "steps": ckpt["global_step"], "step_mode": step_mode}
        if not evaluated:
            outcome["note"] = "cut by the time budget before its " + (
                "test evaluation" if valid is not None else "evaluation")
        tmp = out / (OUTCOME + ".tmp")
        tmp.write_text(json.dumps(outcome, indent=2) + "\n")
        os.replace(tmp, out / OUTCOME)
        return status

    if result is not None:
        valid, test = result["valid_ppl"], result["test_ppl"]
        epochs_done, complete, seconds = cfg.epochs, True, result["wall_time_s"]
    else:   # cut by the deadline (or max_steps): evaluate the model as it is now, writing the
        # outcome before each evaluation (the time budget may stop this process in one)
        epochs_done = round(ckpt["epoch"] + ckpt["step"] / epoch_size, 3)
        complete, seconds = False, ckpt["wall_time"]
        valid = _stopped_valid(out, ckpt)   # the trainer evaluated valid when it stopped
        write_outcome(valid, None, evaluated=False)
        model = model_from_checkpoint(ckpt, dev)
        if valid is None:
            valid = evaluate(model, corpus.valid, cfg.eval_batch_size, cfg.num_steps, dev)["ppl"]
            write_outcome(valid, None, evaluated=False)
        test = evaluate(model, corpus.test, cfg.eval_batch_size, cfg.num_steps, dev)["ppl"]
    status = write_outcome(valid, test, evaluated=True)
    log(f"{spec['run']}: {status}, {epochs_done} epochs, valid {valid:.2f}, test {test:.2f}, "
        f"{seconds:.0f} s")
    return 0


def _stopped_valid(out: Path, ckpt: Dict) -> Optional[float]:
    """The validation perplexity the trainer wrote into ``OUT/<run>/result.json`` when it
    stopped the run at the checkpoint ``ckpt`` (the same model), else ``None``."""
    try:
        r = json.loads((out / RESULT).read_text())
    except (OSError, ValueError):
        return None
    if (r.get("complete") is False and r.get("global_step") == ckpt["global_step"]
            and isinstance(r.get("valid_ppl"), (int, float))):
        return float(r["valid_ppl"])
    return None


def child_timing(spec: Dict) -> int:
    """Capture the step, wait for the other runs, time ``steps`` steps and one valid evaluation."""
    t_start = spec["t_start"]
    torch.set_num_threads(spec["threads"])
    dev = resolve_device(spec["device"])
    corpus = load_corpus(spec["data"])
    cfg = run_config(spec)
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


def _run_one(spec: Dict, stream_device: Optional[str]) -> int:
    """One run in this thread (on its own CUDA stream when ``stream_device``); writes its exit
    code to ``OUT/<run>/exit``."""
    code = 1
    try:
        ctx = contextlib.nullcontext()
        if stream_device is not None:
            ctx = torch.cuda.stream(torch.cuda.Stream(device=torch.device(stream_device)))
        with ctx:
            code = child_timing(spec) if spec.get("timing") else child_train(spec)
    except TrainingInterrupted as exc:  # SIGTERM (or Ctrl-C) while training: checkpointed
        print(f"[{spec['run']}] {exc}; `rnn-ablations reproduce ptb ... --resume` continues it",
              flush=True)
        code = 143 if exc.signal_name == "SIGTERM" else 130
    except BaseException:  # noqa: BLE001 - reported in the log and the exit file
        traceback.print_exc()
        sys.stdout.flush()
        code = 1
    (Path(spec["out"]) / "exit").write_text(str(code))
    return code


def child_main(argv: List[str]) -> int:
    if len(argv) != 2 or argv[0] != "--child":
        print("usage: python -m rnn_ablations.lm.reproduce_child --child JSON (started by "
              "`rnn-ablations reproduce ptb`)", file=sys.stderr)
        return 2
    runs = json.loads(argv[1])["runs"]
    # the parent stops its children with SIGTERM: exit through Python (checkpoints are atomic);
    # while a run trains in the main thread, SIGTERM checkpoints it first (DeferredInterrupt)
    signal.signal(signal.SIGTERM, exit_on_sigterm)
    if len(runs) == 1:
        return _run_one(runs[0], None)
    # several runs in this process: one thread each, each on its own CUDA stream, so that the
    # GPU runs their (graphed) steps at the same time
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
    sys.exit(child_main(sys.argv[1:]))
