"""Training of the language model: truncated BPTT, as in the TF PTB tutorial (Zaremba et al. 2014).

* the training stream is cut into ``batch_size`` contiguous rows; an epoch walks through them in
  windows of ``num_steps`` tokens; the recurrent state is carried from one window to the next
  (detached: gradients stop at the window boundary) and reset to zero at every epoch start;
* the training objective of a window is the *sum over time steps* of the batch-mean
  cross-entropy (the tutorial's ``reduce_sum(sequence_loss(..., average_across_batch=True))``),
  so with ``lr = 1`` a step moves by ``num_steps`` times the gradient of the per-token mean;
* the global gradient norm is clipped to ``max_grad_norm``; plain SGD; the learning rate of
  epoch ``e`` is ``lr · decay^max(e − decay_after, 0)``;
* after every epoch the validation perplexity (:mod:`rnn_ablations.lm.evaluation`), at the end
  valid and test.

The run directory and its checkpoints: :mod:`rnn_ablations.lm.checkpoints` (a resumed run
continues bit-identically; a run that has nothing left to train, because it is complete or
already at its ``max_steps``, resumes to itself and leaves its files as they are).  Ctrl-C:
:mod:`rnn_ablations.lm.interrupt`.  Several processes (``torchrun``):
:mod:`rnn_ablations.lm.distributed`; dropout masks are drawn for the whole batch from a
generator seeded alike in every process and cut to the process's rows, so even with dropout the
processes together compute what one process would.  ``batch_size`` must be divisible by the
number of processes.
"""
from __future__ import annotations

import logging
import math
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

import torch
import torch.nn.functional as F

from ..variants import get_variant
from .checkpoints import (CHECKPOINT, FORMAT, LOG, LOSSES, RESULT, RUN_FILES, check_resume,
                          load_checkpoint, save_checkpoint, write_json)
from .configs import LMConfig
from .corpora import corpus_fingerprint
from .data import Corpus, batchify
from .distributed import DistContext
from .evaluation import evaluate, long_range_positions
from .graph_step import make_stepper
from .interrupt import DeferredInterrupt, TrainingInterrupted
from .model import LanguageModel
from .rundir import prepare_out

__all__ = ["train_lm", "TrainingInterrupted"]

_logger = logging.getLogger(__name__)

#: torch's global RNG: runs trained in threads of one process take turns initialising
_INIT_LOCK = threading.Lock()


def _default_log(line: str) -> None:
    _logger.info(line)


def _ppl(loss_sum_and_count: torch.Tensor) -> float:
    return math.exp(min(float(loss_sum_and_count[0] / loss_sum_and_count[1]), 700.0))


class _Training:
    """One call of :func:`train_lm`: the model, the optimiser and the position of the run, with
    the steps of the loop as methods."""

    def __init__(self, v, cfg: LMConfig, corpus: Corpus, out: Optional[Path], *, corpus_spec,
                 seed: int, ctx: DistContext, say, checkpoint_every: int,
                 max_steps: Optional[int], deadline: Optional[float],
                 stop_above_ppl: Optional[float], record_losses: bool, evaluate_test: bool,
                 fingerprint: str):
        self.v, self.cfg, self.corpus, self.out = v, cfg, corpus, out
        self.corpus_spec, self.seed, self.ctx, self.say = corpus_spec, seed, ctx, say
        self.checkpoint_every, self.max_steps, self.deadline = checkpoint_every, max_steps, deadline
        self.stop_above_ppl, self.record_losses = stop_above_ppl, record_losses
        self.evaluate_test, self.fingerprint = evaluate_test, fingerprint
        self.device = ctx.device
        self.T, self.B = cfg.num_steps, cfg.batch_size
        self.b_local = self.B // ctx.world_size
        self.lo, self.hi = ctx.rank * self.b_local, (ctx.rank + 1) * self.b_local
        rows_all = batchify(corpus.train, self.B)
        self.epoch_size = (rows_all.shape[1] - 1) // self.T
        if self.epoch_size < 1:
            raise ValueError(f"the training split ({corpus.train.numel()} tokens) is too short for "
                             f"batch size {self.B} × {self.T} steps: use a smaller config or more "
                             "data")
        self.rows = rows_all[self.lo:self.hi].to(self.device)
        with _INIT_LOCK:
            torch.manual_seed(seed)
            self.model = LanguageModel(v.name, len(corpus.vocab), cfg.hidden_size,
                                       cfg.num_layers, cfg.dropout, cfg.init_scale,
                                       cfg.forget_bias).to(self.device)
        self.gen = torch.Generator(device=self.device)
        self.gen.manual_seed(seed + 1)
        self.epoch, self.step, self.global_step = 0, 0, 0  # completed epochs; next window
        self.state = None
        self.history: List[Dict] = []
        self.losses: List[float] = []
        self.partial = torch.zeros(2, dtype=torch.float64)  # (sum of token losses, tokens)
        self.train_time, self.train_words, self.wall_before = 0.0, 0, 0.0
        self.bar = None
        self.stepper = None
        self.interrupt: Optional[DeferredInterrupt] = None

    # ---------------------------------------------------------------- set-up
    def restore(self, ckpt: Dict) -> None:
        self.model.load_state_dict(ckpt["model"])
        self.gen.set_state(ckpt["generator"].to(self.gen.get_state().device))
        torch.set_rng_state(ckpt["torch_rng"])
        self.epoch, self.step, self.global_step = ckpt["epoch"], ckpt["step"], ckpt["global_step"]
        self.history, self.losses = list(ckpt["history"]), list(ckpt["losses"])
        self.train_time, self.train_words = ckpt["train_time"], ckpt["train_words"]
        self.wall_before = ckpt["wall_time"]
        if ckpt["state"] is not None:
            h, c = ckpt["state"]
            self.state = (h[:, self.lo:self.hi].to(self.device),
                          c[:, self.lo:self.hi].to(self.device))
        if self.ctx.is_main:
            self.partial = ckpt["partial"].clone()

    def build_optimiser(self, cuda_graph: str) -> None:
        self.net = self.model
        if self.ctx.distributed:
            self.net = torch.nn.parallel.DistributedDataParallel(
                self.model, device_ids=[self.device.index] if self.device.type == "cuda" else None)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=self.cfg.learning_rate)
        self.params = list(self.model.parameters())
        self.stepper = make_stepper(self.model, self.cfg, self.b_local, self.gen,
                                    (self.lo, self.hi, self.B), self.device, cuda_graph,
                                    self.ctx.distributed, self.say)
        self.eval_fn = self.stepper.evaluate if self.stepper is not None else evaluate
        self.wall_start = time.perf_counter()
        self.n_rec = self.model.recurrent_parameters()
        self.n_all = sum(p.numel() for p in self.params)

    # ---------------------------------------------------------------- output
    def log(self, line: str) -> None:
        if self.bar is not None:
            self.bar.clear()
        self.say(line)
        if self.bar is not None:
            self.bar.refresh()
        if self.out is not None and self.ctx.is_main:
            with open(self.out / LOG, "a") as f:
                f.write(line + "\n")

    def wall_time(self) -> float:
        return self.wall_before + time.perf_counter() - self.wall_start

    def checkpoint(self, done: bool = False, result: Optional[Dict] = None) -> None:
        st = None
        if self.state is not None and self.step > 0:
            st = (self.ctx.gather_rows(self.state[0]).cpu(),
                  self.ctx.gather_rows(self.state[1]).cpu())
        part = self.ctx.all_sum(self.partial)
        if self.out is None or not self.ctx.is_main:
            return
        corpus = self.corpus
        save_checkpoint({
            "format": FORMAT, "variant": self.v.name, "config": self.cfg.to_dict(),
            "seed": self.seed,
            "corpus": {"fingerprint": self.fingerprint, "source": corpus.source,
                       "spec": self.corpus_spec, "vocab_size": len(corpus.vocab)},
            "vocab": corpus.vocab.words,
            "model": _cpu_state_dict(self.model),
            "epoch": self.epoch, "step": self.step, "global_step": self.global_step,
            "state": st, "generator": self.gen.get_state().cpu(),
            "torch_rng": torch.get_rng_state(), "partial": part, "history": self.history,
            "losses": self.losses, "train_time": self.train_time,
            "train_words": self.train_words, "wall_time": self.wall_time(),
            "world_size": self.ctx.world_size, "done": done, "result": result,
        }, self.out / CHECKPOINT)
        if self.record_losses:
            write_json(self.losses, self.out / LOSSES)

    def sync_partial(self) -> None:
        """The static step keeps this epoch's loss sum on the device: bring it to ``partial``."""
        if self.stepper is not None:
            self.partial = self.stepper.partial()

    def stop_if_interrupted(self) -> None:
        if self.interrupt is not None and self.interrupt.requested:
            self.sync_partial()
            self.checkpoint()
            if self.bar is not None:
                self.bar.close()
            self.log(f"{self.v.name}: interrupted ({self.interrupt.signal_name}) at epoch "
                     f"{self.epoch + 1}, window "
                     f"{self.step}/{self.epoch_size}; checkpoint written")
            raise TrainingInterrupted(self.out, (self.epoch, self.step, self.epoch_size),
                                      self.interrupt.signal_name)

    # ---------------------------------------------------------------- limits
    def diverged(self, ppl) -> bool:
        return (self.stop_above_ppl is not None and ppl is not None
                and not (math.isfinite(ppl) and ppl <= self.stop_above_ppl))

    def at_limit(self) -> bool:
        return ((self.max_steps is not None and self.global_step >= self.max_steps)
                or (self.deadline is not None and time.time() >= self.deadline))

    def stop_reason(self) -> Optional[str]:
        """Why nothing is left to train before the loop starts (``None``: train)."""
        if self.epoch >= self.cfg.epochs:
            return None
        if self.history and self.diverged(self.history[-1].get("valid_ppl")):
            return "diverged"
        if self.max_steps is not None and self.global_step >= self.max_steps:
            return "max_steps"
        if self.deadline is not None and time.time() >= self.deadline:
            return "deadline"
        return None

    # ---------------------------------------------------------------- the loop
    def open_bar(self, progress: bool) -> None:
        """One progress bar for the whole run (or up to max_steps): its ETA is the run's."""
        total = self.cfg.epochs * self.epoch_size
        if self.max_steps is not None:
            total = min(total, self.max_steps)
        if progress and self.ctx.is_main and self.global_step < total:
            from tqdm import tqdm   # optional: only for the progress bar
            self.bar = tqdm(total=total, initial=self.global_step, unit="win", leave=False,
                            disable=None, file=sys.stderr, dynamic_ncols=True,
                            desc=f"{self.v.name} epoch {self.epoch + 1}/{self.cfg.epochs}")

    def close_bar(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def eager_window(self, x, y) -> torch.Tensor:
        T, b = self.T, self.b_local
        logits, new_state = self.net(x, self.state, generator=self.gen,
                                     rows=(self.lo, self.hi, self.B))
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1),
                             reduction="none").view(T, b)
        loss = ce.mean(dim=1).sum()
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params, self.cfg.max_grad_norm)
        self.opt.step()
        self.state = (new_state[0].detach(), new_state[1].detach())
        tok_loss = loss.detach().double() / T
        self.partial += torch.stack([tok_loss.cpu() * (T * b),
                                     torch.tensor(float(T * b), dtype=torch.float64)])
        return tok_loss

    def train_epoch(self) -> bool:
        """The rest of the current epoch; ``True`` when a limit stopped it before its end."""
        cfg, T = self.cfg, self.T
        lr = cfg.lr_at_epoch(self.epoch + 1)
        for g in self.opt.param_groups:
            g["lr"] = lr
        self.lr = lr
        self.model.train()
        if self.step == 0:
            self.state = self.model.init_state(self.b_local)
            self.partial = torch.zeros(2, dtype=torch.float64)
        if self.stepper is not None:
            self.stepper.begin(self.state, self.partial, lr)
            self.state = self.stepper.state
        if self.bar is not None:
            self.bar.set_description(f"{self.v.name} epoch {self.epoch + 1}/{cfg.epochs}",
                                     refresh=False)
        self.t_epoch = time.perf_counter()
        self.words_epoch = 0
        while self.step < self.epoch_size:
            self.stop_if_interrupted()
            t0 = time.perf_counter()
            s = self.step
            x = self.rows[:, s * T:(s + 1) * T].t()
            y = self.rows[:, s * T + 1:(s + 1) * T + 1].t()
            if self.stepper is not None:   # the same step on static buffers (a CUDA graph)
                tok_loss = self.stepper.step(x, y)
            else:
                tok_loss = self.eager_window(x, y)
            if self.record_losses:
                self.losses.append(float(self.ctx.all_sum(tok_loss.cpu())) / self.ctx.world_size)
            self.step += 1
            self.global_step += 1
            self.train_time += time.perf_counter() - t0
            self.train_words += T * self.B
            self.words_epoch += T * self.B
            if self.bar is not None:
                self.bar.update(1)
                if self.stepper is None and (self.step % 10 == 0 or self.step == self.epoch_size):
                    self.bar.set_postfix(
                        ppl=f"{_ppl(self.partial):.2f}",
                        wps=f"{self.train_words / max(self.train_time, 1e-9):,.0f}")
            limit = self.at_limit()
            if self.step < self.epoch_size:
                if limit or (self.checkpoint_every
                             and self.global_step % self.checkpoint_every == 0):
                    self.sync_partial()
                    self.checkpoint()
                if limit:
                    return True
        return False

    def end_epoch(self) -> Optional[str]:
        """Validation, the epoch's line and checkpoint; why to stop now (``None``: go on)."""
        ctx, cfg = self.ctx, self.cfg
        self.sync_partial()
        self.epoch += 1
        self.step = 0
        train_ppl = _ppl(ctx.all_sum(self.partial))
        valid = None
        if ctx.is_main:
            valid = self.eval_fn(self.model, self.corpus.valid, cfg.eval_batch_size, self.T,
                                 self.device)
        ctx.barrier()
        rec = {"epoch": self.epoch, "lr": self.lr, "train_ppl": train_ppl,
               "valid_ppl": valid["ppl"] if valid else None,
               "words_per_sec": self.words_epoch / max(time.perf_counter() - self.t_epoch, 1e-9),
               "train_words_per_sec": self.train_words / max(self.train_time, 1e-9)}
        self.history.append(rec)
        if ctx.is_main:
            self.log(f"{self.v.name} epoch {self.epoch}/{cfg.epochs}  lr {self.lr:.4g}  train ppl "
                     f"{train_ppl:.2f}  valid ppl {valid['ppl']:.2f}  "
                     f"{rec['train_words_per_sec']:,.0f} words/s")
        self.state = None
        self.checkpoint()
        if self.epoch >= cfg.epochs:
            return None
        flag = torch.tensor([1.0 if (ctx.is_main and self.diverged(rec["valid_ppl"])) else 0.0],
                            dtype=torch.float64)
        if float(ctx.all_sum(flag)[0]) > 0:
            if ctx.is_main:
                self.log(f"{self.v.name}: validation perplexity {rec['valid_ppl']:.4g} after "
                         f"epoch {self.epoch} is not finite or above {self.stop_above_ppl:g}: "
                         "diverged, training stopped")
            return "diverged"
        if self.at_limit():
            return "max_steps" if (self.max_steps is not None
                                   and self.global_step >= self.max_steps) else "deadline"
        self.stop_if_interrupted()
        return None

    def run(self, progress: bool) -> Optional[str]:
        """Train until the end or a limit; the reason of a stop (``None``: complete)."""
        self.open_bar(progress)
        why = None
        self.interrupt = DeferredInterrupt(enabled=self.out is not None
                                           and not self.ctx.distributed)
        with self.interrupt:
            while self.epoch < self.cfg.epochs:
                if self.train_epoch():
                    why = ("max_steps" if (self.max_steps is not None
                                           and self.global_step >= self.max_steps)
                           else "deadline")
                    break
                why = self.end_epoch()
                if why is not None:
                    break
        self.close_bar()
        return why

    # ---------------------------------------------------------------- results
    def _base_result(self) -> Dict:
        v, cfg, corpus = self.v, self.cfg, self.corpus
        return {"variant": v.name, "paper_name": v.paper_name, "config": cfg.name,
                "hyper_parameters": cfg.to_dict(), "seed": self.seed,
                "recurrent_params": self.n_rec, "total_params": self.n_all,
                "epochs": cfg.epochs,
                "train_words_per_sec": self.train_words / max(self.train_time, 1e-9),
                "train_time_s": self.train_time, "wall_time_s": self.wall_time(),
                "corpus": corpus.source, "vocab_size": len(corpus.vocab),
                "processes": self.ctx.world_size, "device": str(self.device)}

    def stopped_result(self, why: str) -> None:
        """The run stopped before its end: ``result.json`` with ``"complete": false``."""
        ctx, cfg = self.ctx, self.cfg
        tot = ctx.all_sum(self.partial) if self.step > 0 else None
        if ctx.is_main:
            valid = self.eval_fn(self.model, self.corpus.valid, cfg.eval_batch_size, self.T,
                                 self.device)
            result = dict(self._base_result(), complete=False, stopped_by=why,
                          max_steps=self.max_steps, global_step=self.global_step,
                          epochs_completed=self.epoch, window_in_epoch=self.step,
                          windows_per_epoch=self.epoch_size,
                          train_ppl_this_epoch=_ppl(tot) if tot is not None else None,
                          valid_ppl=valid["ppl"], test_ppl=None, history=self.history)
            self.log(f"{self.v.name}: stopped after {self.global_step} windows ({why}; epoch "
                     f"{self.epoch + 1 if self.step else self.epoch}, window "
                     f"{self.step or self.epoch_size}/{self.epoch_size}), valid ppl now "
                     f"{valid['ppl']:.2f}" + ("" if why == "diverged" else "; continue with --resume"))
            if self.out is not None:
                write_json(result, self.out / RESULT)
        ctx.barrier()

    def final_result(self) -> Optional[Dict]:
        ctx, cfg, corpus = self.ctx, self.cfg, self.corpus
        result = None
        if ctx.is_main:
            positions = long_range_positions(corpus, "valid")
            if positions is None and self.history and self.history[-1]["valid_ppl"] is not None:
                valid = {"ppl": self.history[-1]["valid_ppl"]}   # the model has not changed since
            else:
                valid = self.eval_fn(self.model, corpus.valid, cfg.eval_batch_size, self.T,
                                     self.device, positions)
            test = None
            if self.evaluate_test and corpus.test is not None:
                test = self.eval_fn(self.model, corpus.test, cfg.eval_batch_size, self.T,
                                    self.device, long_range_positions(corpus, "test"))
            result = dict(
                {"complete": True}, **self._base_result(),
                train_ppl=self.history[-1]["train_ppl"] if self.history else None,
                valid_ppl=valid["ppl"], test_ppl=test["ppl"] if test else None,
                valid_long_range_acc=valid.get("long_range_acc"),
                test_long_range_acc=test.get("long_range_acc") if test else None,
                has_test=corpus.test is not None, threads=torch.get_num_threads(),
                history=self.history)
            test_s = f"{test['ppl']:.2f}" if test else "n/a (no test split)"
            self.log(f"{self.v.name}: valid ppl {valid['ppl']:.2f}, test ppl {test_s}, "
                     f"{result['train_words_per_sec']:,.0f} training words/s")
        self.checkpoint(done=True, result=result)
        if self.out is not None and ctx.is_main:
            write_json(result, self.out / RESULT)
        ctx.barrier()
        return result


#: the seeds a run takes: torch.manual_seed's range, less one at the top (the dropout generator
#: is seeded with seed + 1)
MIN_SEED, MAX_SEED = -(2 ** 63), 2 ** 64 - 2


def _check_args(cfg: LMConfig, corpus: Corpus, ctx: DistContext, *, seed, checkpoint_every,
                max_steps, stop_above_ppl, resume, out_dir) -> None:
    if stop_above_ppl is not None and (isinstance(stop_above_ppl, bool)
                                       or not isinstance(stop_above_ppl, (int, float))
                                       or not stop_above_ppl > 1):
        raise ValueError(f"stop_above_ppl must be a perplexity > 1 (e.g. the vocabulary size), "
                         f"got {stop_above_ppl!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or not MIN_SEED <= seed <= MAX_SEED:
        raise ValueError(f"seed must be an integer from {MIN_SEED} to {MAX_SEED} (what torch's "
                         f"generators take; the dropout generator gets seed + 1), got {seed!r}")
    if isinstance(checkpoint_every, bool) or not isinstance(checkpoint_every, int) \
            or checkpoint_every < 0:
        raise ValueError(f"checkpoint_every must be an integer >= 0, got {checkpoint_every!r}")
    if max_steps is not None and (isinstance(max_steps, bool) or not isinstance(max_steps, int)
                                  or max_steps <= 0):
        raise ValueError(f"max_steps must be a positive integer, got {max_steps!r}")
    if cfg.batch_size % ctx.world_size:
        raise ValueError(f"batch size {cfg.batch_size} is not divisible by the {ctx.world_size} "
                         "processes; every process must hold as many rows")
    if corpus.valid is None:
        raise ValueError("the corpus has no valid split")
    if resume and out_dir is None:
        raise ValueError("resume needs the run directory (out_dir) to continue")


def train_lm(variant: str, config: LMConfig, corpus: Corpus, out_dir=None, *,
             corpus_spec: Optional[Dict] = None, seed: int = 0, ctx: Optional[DistContext] = None,
             resume: bool = False, overwrite: bool = False, checkpoint_every: int = 0,
             max_steps: Optional[int] = None, progress: bool = False,
             log: Optional[Callable[[str], None]] = _default_log, record_losses: bool = False,
             evaluate_test: bool = True, cuda_graph: str = "auto",
             deadline: Optional[float] = None,
             stop_above_ppl: Optional[float] = None) -> Optional[Dict]:
    """Train one model; returns its result dict (``None`` when stopped before its end, and on
    processes other than rank 0).  ``config`` is used as given (apply
    :meth:`LMConfig.for_variant` beforehand for the papers' per-variant learning rates).

    ``out_dir`` receives ``checkpoint.pt``, ``train.log`` and ``result.json`` (also when stopped
    by ``max_steps``: then ``"complete": false`` and the validation perplexity at that point);
    ``resume`` continues the run there (the directory must exist); a run with nothing left to
    train (complete, or already at ``max_steps``) is left as it is.  ``log`` receives the
    progress lines (default: the ``rnn_ablations.lm.trainer`` logger at INFO level; ``None``:
    nothing).  Ctrl-C in a single process with ``out_dir`` raises :class:`TrainingInterrupted`
    after checkpointing.  ``cuda_graph``: ``auto``/``on``/``off``, see
    :mod:`rnn_ablations.lm.graph_step`; ``deadline``: a ``time.time()`` after which training
    stops with a checkpoint, as ``max_steps`` does (checked after every window, and before the
    first: a run whose deadline has passed trains nothing).  ``stop_above_ppl``: stop
    (checkpointed, ``"stopped_by": "diverged"``) at the end of an epoch whose validation
    perplexity is not finite or above this value (``reproduce`` passes the vocabulary size:
    worse than a uniform guess), and do not train a resumed run that stopped so; SGD on exploded
    weights does not come back, and the device time goes to the runs that train."""
    v = get_variant(variant)
    cfg = config
    ctx = ctx or DistContext()
    _check_args(cfg, corpus, ctx, seed=seed, checkpoint_every=checkpoint_every,
                max_steps=max_steps, stop_above_ppl=stop_above_ppl, resume=resume,
                out_dir=out_dir)
    say = (log if (log is not None and ctx.is_main) else (lambda s: None))
    out = Path(out_dir) if out_dir is not None else None
    fingerprint = corpus_fingerprint(corpus)
    ckpt = None
    if out is not None:
        if ctx.is_main:
            prepare_out(out, resume=resume, overwrite=overwrite, files=RUN_FILES, what="a run")
        ctx.barrier()
        if resume and (out / CHECKPOINT).exists():
            ckpt = load_checkpoint(out / CHECKPOINT)
            check_resume(ckpt, v.name, cfg, seed, fingerprint, out)
            if ckpt.get("done"):
                say(f"{v.name}: {out} is complete; using its result")
                return ckpt["result"] if ctx.is_main else None
        elif resume:
            say(f"{v.name}: {out} holds no checkpoint yet; starting from the beginning")

    run = _Training(v, cfg, corpus, out, corpus_spec=corpus_spec, seed=seed, ctx=ctx, say=say,
                    checkpoint_every=checkpoint_every, max_steps=max_steps, deadline=deadline,
                    stop_above_ppl=stop_above_ppl, record_losses=record_losses,
                    evaluate_test=evaluate_test, fingerprint=fingerprint)
    if ckpt is not None:
        run.restore(ckpt)
    run.build_optimiser(cuda_graph)

    already = run.stop_reason()
    if already is not None:   # nothing left to train: the run stays as it is
        if ckpt is not None and (out / RESULT).exists():
            say(f"{v.name}: {out} stopped at {run.global_step} windows ({already}); nothing "
                "left to train, its files are left as they are")
            ctx.barrier()
            return None
        if out is not None and ctx.is_main and not (out / CHECKPOINT).exists():
            run.checkpoint()
        run.stopped_result(already)
        return None

    if ckpt is None:
        run.log(f"{v.name} ({v.paper_name}): config {cfg.name} — {cfg.num_layers} × "
                f"{cfg.hidden_size}, {run.n_rec:,} recurrent / {run.n_all:,} parameters; "
                f"{corpus.summary()}; {run.epoch_size} windows of {run.B} × {run.T} per epoch"
                + (f"; {ctx.world_size} processes" if ctx.distributed else ""))
    else:
        run.log(f"{v.name}: resuming {out} at epoch {run.epoch + 1}, window "
                f"{run.step}/{run.epoch_size}")
    why = run.run(progress)
    if why is not None:
        run.stopped_result(why)
        return None
    return run.final_result()


def _cpu_state_dict(model: torch.nn.Module):
    """``model.state_dict()`` with every tensor on the CPU, and its metadata kept (the layers'
    variant and highway records: without them loading a variant whose shapes fit another one,
    ran or identity_ran, warns that the variant cannot be told apart)."""
    sd = model.state_dict()
    out = type(sd)((k, t.cpu()) for k, t in sd.items())
    meta = getattr(sd, "_metadata", None)
    if meta is not None:
        out._metadata = meta
    return out
