"""Training and evaluation of the language model: truncated BPTT, checkpoints, multi-process.

The procedure is the TF PTB tutorial's (Zaremba et al. 2014):

* the training stream is cut into ``batch_size`` contiguous rows; an epoch walks through them in
  windows of ``num_steps`` tokens; the recurrent state is carried from one window to the next
  (detached: gradients stop at the window boundary) and reset to zero at every epoch start;
* the training objective of a window is the *sum over time steps* of the batch-mean
  cross-entropy (the tutorial's ``reduce_sum(sequence_loss(..., average_across_batch=True))``),
  so with ``lr = 1`` a step moves by ``num_steps`` times the gradient of the per-token mean;
* the global gradient norm is clipped to ``max_grad_norm``; plain SGD; the learning rate of
  epoch ``e`` is ``lr · decay^max(e − decay_after, 0)``;
* perplexity = exp(mean cross-entropy per token) over the whole split, the state carried through
  each of ``eval_batch_size`` rows.

Checkpoints (``RUN_DIR/checkpoint.pt``) hold the parameters, the position (epoch and window), the
carried state of the whole batch, the dropout generator and torch's RNG, the partial epoch
statistics and the log: a resumed run continues bit-identically.  A checkpoint is written to a
temporary file in the run directory, flushed to disk and renamed over the old one (an interrupted
write leaves the previous checkpoint intact), and it carries a SHA-256 checksum of its contents
(every tensor's bytes, shapes and dtypes and every other value), which :func:`load_checkpoint`
verifies: a damaged file is refused instead of silently giving other numbers.

Ctrl-C (SIGINT) during a single-process run with a run directory does not stop in the middle of
an update: the run finishes the current window, writes a checkpoint and raises
:class:`TrainingInterrupted` (a ``KeyboardInterrupt``), which the command turns into a message
with the ``--resume`` command.  A second Ctrl-C stops at once (the last checkpoint stays valid).

Multi-process (``torchrun --nproc-per-node N rnn-ablations lm train …``; gloo on CPU, NCCL on
GPU): process ``r`` takes the rows ``r·B/N … (r+1)·B/N − 1`` of every batch, and
``DistributedDataParallel`` averages the gradients, which is then exactly the gradient of the
single-process batch (the loss is a mean over rows, all processes hold as many rows).  Dropout
masks are drawn for the whole batch from a generator seeded alike in every process and cut to the
process's rows, so even with dropout the processes together compute what one process would.
``batch_size`` must be divisible by the number of processes.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..variants import get_variant
from .configs import LMConfig
from .data import Corpus, batchify, load_corpus
from .model import LanguageModel

__all__ = ["train_lm", "evaluate", "load_checkpoint", "verify_checkpoint", "model_from_checkpoint",
           "corpus_from_spec", "truncate_train", "TrainingInterrupted",
           "corpus_fingerprint", "DistContext", "init_distributed", "CHECKPOINT", "RESULT", "LOG"]

_logger = logging.getLogger(__name__)

CHECKPOINT = "checkpoint.pt"
RESULT = "result.json"
LOG = "train.log"
LOSSES = "losses.json"
RUN_FILES = (CHECKPOINT, RESULT, LOG, LOSSES)
FORMAT = "rnn_ablations.lm/1"
#: key of the checksum in a checkpoint dict (SHA-256 of everything else, see :func:`_digest`)
CHECKSUM = "sha256"


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped :func:`train_lm` between two windows, after writing a checkpoint.

    ``run_dir``: the run directory; ``position``: ``(completed epochs, window, windows per
    epoch)`` of the checkpoint."""

    def __init__(self, run_dir: Path, position):
        self.run_dir = Path(run_dir)
        self.position = tuple(position)
        epoch, step, size = self.position
        super().__init__(f"interrupted: checkpoint {self.run_dir / CHECKPOINT} written at epoch "
                         f"{epoch + 1}, window {step}/{size}")


# ---------------------------------------------------------------------------- processes
class DistContext:
    """Rank, world size and device of this process (a single process when not under torchrun)."""

    def __init__(self, rank: int = 0, world_size: int = 1, local_rank: int = 0,
                 device: Optional[torch.device] = None):
        self.rank, self.world_size, self.local_rank = rank, world_size, local_rank
        self.device = device or torch.device("cpu")

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()

    def all_sum(self, t: torch.Tensor) -> torch.Tensor:
        if self.distributed:
            t = t.clone()
            dist.all_reduce(t)
        return t

    def gather_rows(self, t: torch.Tensor) -> torch.Tensor:
        """Concatenate every process's rows along dim 1 (the batch) — in rank order."""
        if not self.distributed:
            return t
        parts = [torch.empty_like(t) for _ in range(self.world_size)]
        dist.all_gather(parts, t.contiguous())
        return torch.cat(parts, dim=1)


def _resolve_device(device) -> torch.device:
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        d = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"invalid device {device!r}: use cpu, cuda or cuda:N") from exc
    if d.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} was asked for but CUDA is not available; use --device cpu")
    return d


def init_distributed(device=None) -> DistContext:
    """Join the process group when started by ``torchrun`` (``WORLD_SIZE`` > 1), else a single
    process.  Backend: NCCL on CUDA, gloo on CPU."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistContext(device=_resolve_device(device))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    dev = _resolve_device(device)
    if dev.type == "cuda":
        dev = torch.device("cuda", local_rank)
        torch.cuda.set_device(dev)
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo")
    if dev.type == "cpu" and "OMP_NUM_THREADS" not in os.environ:
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))
    return DistContext(rank, world, local_rank, dev)


# ---------------------------------------------------------------------------- corpora
def corpus_fingerprint(corpus: Corpus) -> str:
    h = hashlib.sha256()
    h.update("\n".join(corpus.vocab.words).encode())
    for split in ("train", "valid", "test"):
        t = corpus.split(split)
        h.update(split.encode())
        if t is not None:
            h.update(t.numpy().tobytes())
    return h.hexdigest()[:16]


def corpus_from_spec(spec: Dict) -> Corpus:
    """Rebuild the corpus a run was trained on (``{"kind": "dir", "path": …}`` or
    ``{"kind": "synthetic", "spec": {…}}``)."""
    kind = spec.get("kind")
    if kind == "dir":
        corpus = load_corpus(spec["path"])
    elif kind == "synthetic":
        from .synthetic import SyntheticSpec, synthetic_corpus
        corpus = synthetic_corpus(SyntheticSpec(**spec["spec"]))
    else:
        raise ValueError(f"unknown corpus kind {kind!r} in the checkpoint")
    if spec.get("train_tokens"):
        corpus = truncate_train(corpus, spec["train_tokens"])
    return corpus


def truncate_train(corpus: Corpus, train_tokens: int) -> Corpus:
    """The corpus with only the first ``train_tokens`` tokens of its training split (a CPU-sized
    run on big data); valid and test are kept whole."""
    if isinstance(train_tokens, bool) or not isinstance(train_tokens, int) or train_tokens < 2:
        raise ValueError(f"--train-tokens must be an integer >= 2, got {train_tokens!r}")
    if train_tokens >= corpus.train.numel():
        return corpus
    import dataclasses
    return dataclasses.replace(
        corpus, train=corpus.train[:train_tokens].clone(),
        source=f"{corpus.source} (first {train_tokens:,} of {corpus.train.numel():,} training tokens)")


# ---------------------------------------------------------------------------- evaluation
@torch.no_grad()
def evaluate(model: LanguageModel, data: torch.Tensor, batch_size: int, num_steps: int,
             device=None, positions: Optional[torch.Tensor] = None) -> Dict:
    """Perplexity of ``model`` on a token stream (state carried through each of ``batch_size``
    rows; every window including the last partial one).  ``positions`` (bool, like ``data``)
    marks tokens whose next-token accuracy is also reported (``long_range_acc``): the synthetic
    corpus's agreeing verbs."""
    if data is None or data.numel() < 2:
        raise ValueError("cannot evaluate on an empty split")
    device = device or next(model.parameters()).device
    batch_size = max(1, min(batch_size, data.numel() // 2))
    rows = batchify(data, batch_size).to(device)
    pos = None
    if positions is not None:
        pos = positions[: rows.numel()].view(batch_size, -1).to(device)
    was_training = model.training
    model.eval()
    state = model.init_state(batch_size)
    total = torch.zeros((), dtype=torch.float64, device=device)
    n_tok, hits, n_pos = 0, 0, 0
    n = rows.shape[1] - 1
    for i in range(0, n, num_steps):
        t = min(num_steps, n - i)
        x = rows[:, i:i + t].t()
        y = rows[:, i + 1:i + 1 + t].t()
        logits, state = model(x, state)
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="sum")
        total += ce.double()
        n_tok += y.numel()
        if pos is not None:
            m = pos[:, i + 1:i + 1 + t].t()
            hits += int((logits.argmax(-1) == y)[m].sum())
            n_pos += int(m.sum())
    model.train(was_training)
    loss = float(total) / n_tok
    out = {"loss": loss, "ppl": math.exp(min(loss, 700.0)), "tokens": n_tok}
    if pos is not None:
        out["long_range_acc"] = hits / n_pos if n_pos else float("nan")
    return out


def _long_range_positions(corpus: Corpus, split: str) -> Optional[torch.Tensor]:
    if not corpus.source.startswith("embedded synthetic"):
        return None
    from .synthetic import agreement_positions
    return agreement_positions(corpus, split)


# ---------------------------------------------------------------------------- checkpoints
def _feed(h, obj) -> None:
    """Hash ``obj`` (the checkpoint's value types) into ``h``, with a type tag before each value
    so that different structures never hash alike."""
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
        if t.numel():
            h.update(t.reshape(-1).view(torch.uint8).numpy())
    elif isinstance(obj, dict):
        h.update(f"D{len(obj)}".encode())
        for k in sorted(obj, key=repr):
            _feed(h, k)
            _feed(h, obj[k])
    elif isinstance(obj, (list, tuple)):
        h.update(f"{'L' if isinstance(obj, list) else 'U'}{len(obj)}".encode())
        for x in obj:
            _feed(h, x)
    elif obj is None or isinstance(obj, (bool, int, float, str)):
        h.update(f"{type(obj).__name__}:{obj!r};".encode())
    else:
        raise TypeError(f"cannot checksum a {type(obj).__name__} in a checkpoint")


def _digest(ckpt: Dict) -> str:
    h = hashlib.sha256()
    _feed(h, {k: v for k, v in ckpt.items() if k != CHECKSUM})
    return h.hexdigest()


def verify_checkpoint(ckpt: Dict, path) -> None:
    """Check the checksum of a loaded checkpoint dict; ``ValueError`` when its contents differ
    from what was written.  A checkpoint without a checksum (written by an earlier version) is
    accepted with a warning."""
    stored = ckpt.get(CHECKSUM)
    if stored is None:
        _logger.warning("%s has no checksum (written by an earlier version of rnn_ablations); "
                        "its integrity cannot be verified", path)
        return
    if _digest(ckpt) != stored:
        raise ValueError(
            f"{str(path)!r} is damaged: its contents do not match the SHA-256 checksum stored when "
            "it was written, so the file was changed or corrupted afterwards (disk, copy or "
            "transfer error). It is refused because it would give other numbers; restore the file "
            "from a good copy or train again (--overwrite)")


def load_checkpoint(path) -> Dict:
    """Load and verify (format and checksum) a checkpoint file or a run directory's
    ``checkpoint.pt``."""
    p = Path(path)
    if p.is_dir():
        p = p / CHECKPOINT
    if not p.is_file():
        raise FileNotFoundError(f"no checkpoint at {str(p)!r}; a run directory written by "
                                "`rnn-ablations lm train --out DIR` contains checkpoint.pt")
    try:
        ckpt = torch.load(p, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unpickling failure means "not ours"
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise ValueError(f"{str(p)!r} could not be read as an rnn-ablations checkpoint: it is "
                         f"damaged, truncated or another kind of file ({type(exc).__name__}: "
                         f"{first})") from exc
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        raise ValueError(f"{str(p)!r} is not an rnn-ablations language-model checkpoint "
                         f"(expected format {FORMAT!r})")
    verify_checkpoint(ckpt, p)
    return ckpt


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return   # not supported here (e.g. Windows); the rename itself is atomic
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write_atomic(path: Path, write: Callable) -> None:
    """``write(binary file)`` into a temporary file beside ``path``, flush it to disk, then
    rename it over ``path``: readers see the old file or the new one, never a partial one."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync_dir(path.parent)


def _save_atomic(obj, path: Path) -> None:
    _write_atomic(path, lambda f: torch.save(obj, f))


def _save_checkpoint(ckpt: Dict, path: Path) -> None:
    """Add the checksum and write atomically."""
    ckpt = dict(ckpt)
    ckpt[CHECKSUM] = _digest(ckpt)
    _save_atomic(ckpt, path)


def _write_json(obj, path: Path) -> None:
    _write_atomic(path, lambda f: f.write((json.dumps(obj, indent=2) + "\n").encode()))


def model_from_checkpoint(ckpt: Dict, device=None) -> LanguageModel:
    cfg = LMConfig.from_dict(ckpt["config"])
    model = LanguageModel(ckpt["variant"], len(ckpt["vocab"]), cfg.hidden_size, cfg.num_layers,
                          cfg.dropout, cfg.init_scale, cfg.forget_bias)
    model.load_state_dict(ckpt["model"])
    return model.to(device or "cpu")


def _check_resume(ckpt: Dict, variant: str, cfg: LMConfig, seed: int, fingerprint: str,
                  path: Path) -> None:
    if ckpt["variant"] != variant:
        raise ValueError(
            f"the checkpoint in {str(path)!r} is from variant {ckpt['variant']!r}, not {variant!r}; "
            "resume it with the same --variant, or use another --out (or --overwrite to discard it)")
    if ckpt["config"] != cfg.to_dict():
        diff = sorted(k for k, v in cfg.to_dict().items() if ckpt["config"].get(k) != v)
        raise ValueError(
            f"the checkpoint in {str(path)!r} was trained with config {ckpt['config']['name']!r} "
            f"and different values of {', '.join(diff)}; resume with the same config "
            "(or --overwrite to start again)")
    if ckpt["seed"] != seed:
        raise ValueError(f"the checkpoint in {str(path)!r} was trained with --seed {ckpt['seed']}, "
                         f"not {seed}; resume with the same seed (or --overwrite)")
    if ckpt["corpus"]["fingerprint"] != fingerprint:
        raise ValueError(f"the checkpoint in {str(path)!r} was trained on different data "
                         f"({ckpt['corpus']['source']}); resume with the same --data (or --overwrite)")


def prepare_run_dir(out_dir: Path, resume: bool, overwrite: bool) -> None:
    """Refuse to clobber an existing run unless told to resume or overwrite, and to resume a run
    that does not exist."""
    if resume and overwrite:
        raise ValueError("give either --resume or --overwrite, not both")
    if out_dir.exists() and not out_dir.is_dir():
        raise FileExistsError(f"--out {str(out_dir)!r} exists and is not a directory")
    if resume and not out_dir.exists():
        raise FileNotFoundError(
            f"--resume: the run directory {str(out_dir)!r} does not exist, so there is nothing to "
            "continue; check the path given to --out, or drop --resume to start a new run")
    existing = [f for f in RUN_FILES if (out_dir / f).exists()]
    if existing and not resume and not overwrite:
        raise FileExistsError(
            f"{str(out_dir)!r} already holds a run ({', '.join(existing)}); pass --resume to "
            "continue it or --overwrite to discard it and start again")
    if overwrite:
        for f in existing:
            (out_dir / f).unlink()
    if out_dir.is_dir():   # temporary files of a write that was killed before its rename
        for f in RUN_FILES:
            for tmp in out_dir.glob(f".{f}.*.tmp"):
                tmp.unlink()
    out_dir.mkdir(parents=True, exist_ok=True)


# ---------------------------------------------------------------------------- training
_INIT_LOCK = threading.Lock()


class _DeferredInterrupt:
    """While active, the first SIGINT (Ctrl-C) only sets :attr:`requested` (the training loop
    checks it between windows); a second one raises ``KeyboardInterrupt`` at once.  Installed
    only in the main thread, and only where SIGINT has Python's default handler."""

    def __init__(self, enabled: bool):
        self.enabled = enabled and threading.current_thread() is threading.main_thread()
        self.requested = False
        self._previous = None

    def _handle(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        _logger.warning("Ctrl-C: finishing this window, then writing a checkpoint "
                        "(press Ctrl-C again to stop at once)")

    def __enter__(self):
        if self.enabled and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc):
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None
        return False


def _default_log(line: str) -> None:
    _logger.info(line)


def train_lm(variant: str, config: LMConfig, corpus: Corpus, out_dir=None, *,
             corpus_spec: Optional[Dict] = None, seed: int = 0, ctx: Optional[DistContext] = None,
             resume: bool = False, overwrite: bool = False, checkpoint_every: int = 0,
             max_steps: Optional[int] = None, progress: bool = False,
             log: Optional[Callable[[str], None]] = _default_log, record_losses: bool = False,
             evaluate_test: bool = True, cuda_graph: str = "auto",
             deadline: Optional[float] = None,
             stop_above_ppl: Optional[float] = None) -> Optional[Dict]:
    """Train one model; returns its result dict (``None`` when stopped by ``max_steps``, and on
    processes other than rank 0).  ``config`` is used as given (apply
    :meth:`LMConfig.for_variant` beforehand for the papers' per-variant learning rates).

    ``out_dir`` receives ``checkpoint.pt``, ``train.log`` and ``result.json`` (also when stopped
    by ``max_steps``: then ``"complete": false`` and the validation perplexity at that point);
    ``resume`` continues the run there (the directory must exist).  ``log`` receives the
    progress lines (default: the ``rnn_ablations.lm.trainer`` logger at INFO level; ``None``:
    nothing).  Ctrl-C in a single process with ``out_dir`` raises :class:`TrainingInterrupted`
    after checkpointing.  ``cuda_graph``: ``auto``/``on``/``off``, see
    :mod:`rnn_ablations.lm.graph_step`; ``deadline``: a ``time.time()`` after which training
    stops with a checkpoint, as ``max_steps`` does.  ``stop_above_ppl``: stop (checkpointed,
    ``"stopped_by": "diverged"``) at the end of an epoch whose validation perplexity is not
    finite or above this value (``reproduce`` passes the vocabulary size: worse than a uniform
    guess), and do not train a resumed run that stopped so; SGD on exploded weights does not
    come back, and the device time goes to the runs that train."""
    v = get_variant(variant)
    cfg = config
    ctx = ctx or DistContext()
    if stop_above_ppl is not None and (isinstance(stop_above_ppl, bool)
                                       or not isinstance(stop_above_ppl, (int, float))
                                       or not stop_above_ppl > 1):
        raise ValueError(f"stop_above_ppl must be a perplexity > 1 (e.g. the vocabulary size), "
                         f"got {stop_above_ppl!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an integer, got {seed!r}")
    for name, val in (("checkpoint_every", checkpoint_every),):
        if isinstance(val, bool) or not isinstance(val, int) or val < 0:
            raise ValueError(f"{name} must be an integer >= 0, got {val!r}")
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
    say = (log if (log is not None and ctx.is_main) else (lambda s: None))
    out = Path(out_dir) if out_dir is not None else None
    fingerprint = corpus_fingerprint(corpus)
    ckpt = None
    if out is not None:
        if ctx.is_main:
            prepare_run_dir(out, resume, overwrite)
        ctx.barrier()
        if resume and (out / CHECKPOINT).exists():
            ckpt = load_checkpoint(out / CHECKPOINT)
            _check_resume(ckpt, v.name, cfg, seed, fingerprint, out)
            if ckpt.get("done"):
                say(f"{v.name}: {out} is complete; using its result")
                return ckpt["result"] if ctx.is_main else None
        elif resume:
            say(f"{v.name}: {out} holds no checkpoint yet; starting from the beginning")

    device = ctx.device
    T, B = cfg.num_steps, cfg.batch_size
    b_local = B // ctx.world_size
    lo, hi = ctx.rank * b_local, (ctx.rank + 1) * b_local
    rows_all = batchify(corpus.train, B)
    epoch_size = (rows_all.shape[1] - 1) // T
    if epoch_size < 1:
        raise ValueError(f"the training split ({corpus.train.numel()} tokens) is too short for "
                         f"batch size {B} × {T} steps: use a smaller config or more data")
    rows = rows_all[lo:hi].to(device)

    with _INIT_LOCK:   # torch's global RNG: runs trained in threads of one process take turns
        torch.manual_seed(seed)
        model = LanguageModel(v.name, len(corpus.vocab), cfg.hidden_size, cfg.num_layers,
                              cfg.dropout, cfg.init_scale, cfg.forget_bias).to(device)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed + 1)

    epoch, step, global_step = 0, 0, 0  # completed epochs; next window within epoch
    state = None
    history: List[Dict] = []
    losses: List[float] = []
    partial = torch.zeros(2, dtype=torch.float64)  # (sum of token losses, tokens) this epoch
    train_time, train_words, wall_before = 0.0, 0, 0.0
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
        gen.set_state(ckpt["generator"].to(gen.get_state().device))
        torch.set_rng_state(ckpt["torch_rng"])
        epoch, step, global_step = ckpt["epoch"], ckpt["step"], ckpt["global_step"]
        history, losses = list(ckpt["history"]), list(ckpt["losses"])
        train_time, train_words = ckpt["train_time"], ckpt["train_words"]
        wall_before = ckpt["wall_time"]
        if ckpt["state"] is not None:
            h, c = ckpt["state"]
            state = (h[:, lo:hi].to(device), c[:, lo:hi].to(device))
        if ctx.is_main:
            partial = ckpt["partial"].clone()

    net = model
    if ctx.distributed:
        net = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.learning_rate)
    params = list(model.parameters())
    from .graph_step import make_stepper
    stepper = make_stepper(model, cfg, b_local, gen, (lo, hi, B), device, cuda_graph,
                           ctx.distributed, say)
    _eval = stepper.evaluate if stepper is not None else evaluate
    wall_start = time.perf_counter()
    n_rec = model.recurrent_parameters()
    n_all = sum(p.numel() for p in params)

    bar = None

    def append_log(line: str) -> None:
        if bar is not None:
            bar.clear()
        say(line)
        if bar is not None:
            bar.refresh()
        if out is not None and ctx.is_main:
            with open(out / LOG, "a") as f:
                f.write(line + "\n")

    if ckpt is None:
        append_log(f"{v.name} ({v.paper_name}): config {cfg.name} — {cfg.num_layers} × "
                   f"{cfg.hidden_size}, {n_rec:,} recurrent / {n_all:,} parameters; "
                   f"{corpus.summary()}; {epoch_size} windows of {B} × {T} per epoch"
                   + (f"; {ctx.world_size} processes" if ctx.distributed else ""))
    else:
        append_log(f"{v.name}: resuming {out} at epoch {epoch + 1}, window {step}/{epoch_size}")

    def checkpoint(done: bool = False, result: Optional[Dict] = None) -> None:
        st = None
        if state is not None and step > 0:
            st = (ctx.gather_rows(state[0]).cpu(), ctx.gather_rows(state[1]).cpu())
        part = ctx.all_sum(partial)
        if out is None or not ctx.is_main:
            return
        _save_checkpoint({
            "format": FORMAT, "variant": v.name, "config": cfg.to_dict(), "seed": seed,
            "corpus": {"fingerprint": fingerprint, "source": corpus.source,
                       "spec": corpus_spec, "vocab_size": len(corpus.vocab)},
            "vocab": corpus.vocab.words, "model": {k: t.cpu() for k, t in model.state_dict().items()},
            "epoch": epoch, "step": step, "global_step": global_step, "state": st,
            "generator": gen.get_state().cpu(), "torch_rng": torch.get_rng_state(),
            "partial": part, "history": history, "losses": losses,
            "train_time": train_time, "train_words": train_words,
            "wall_time": wall_before + time.perf_counter() - wall_start,
            "world_size": ctx.world_size, "done": done, "result": result,
        }, out / CHECKPOINT)
        if record_losses:
            _write_json(losses, out / LOSSES)

    interrupt = _DeferredInterrupt(enabled=out is not None and not ctx.distributed)

    def stop_if_interrupted() -> None:
        nonlocal partial
        if interrupt.requested:
            if stepper is not None:
                partial = stepper.partial()
            checkpoint()
            if bar is not None:
                bar.close()
            append_log(f"{v.name}: interrupted (Ctrl-C) at epoch {epoch + 1}, window "
                       f"{step}/{epoch_size}; checkpoint written")
            raise TrainingInterrupted(out, (epoch, step, epoch_size))

    # one progress bar for the whole run (or up to max_steps): its ETA is the run's
    total_windows = cfg.epochs * epoch_size
    if max_steps is not None:
        total_windows = min(total_windows, max_steps)
    if progress and ctx.is_main and global_step < total_windows:
        from tqdm import tqdm
        bar = tqdm(total=total_windows, initial=global_step, unit="win", leave=False,
                   disable=None, file=sys.stderr, dynamic_ncols=True,
                   desc=f"{v.name} epoch {epoch + 1}/{cfg.epochs}")

    def diverged(ppl) -> bool:
        return (stop_above_ppl is not None and ppl is not None
                and not (math.isfinite(ppl) and ppl <= stop_above_ppl))

    stopped = diverged_at = False
    if history and epoch < cfg.epochs and diverged(history[-1].get("valid_ppl")):
        stopped = diverged_at = True   # a resumed run that stopped diverged: nothing to train
    with interrupt:
        while epoch < cfg.epochs and not stopped:
            lr = cfg.lr_at_epoch(epoch + 1)
            for g in opt.param_groups:
                g["lr"] = lr
            model.train()
            if step == 0:
                state = model.init_state(b_local)
                partial = torch.zeros(2, dtype=torch.float64)
            if stepper is not None:
                stepper.begin(state, partial, lr)
                state = stepper.state
            if bar is not None:
                bar.set_description(f"{v.name} epoch {epoch + 1}/{cfg.epochs}", refresh=False)
            t_epoch = time.perf_counter()
            words_epoch = 0
            while step < epoch_size:
                stop_if_interrupted()
                t0 = time.perf_counter()
                x = rows[:, step * T:(step + 1) * T].t()
                y = rows[:, step * T + 1:(step + 1) * T + 1].t()
                if stepper is not None:   # the same step on static buffers (a CUDA graph)
                    tok_loss = stepper.step(x, y)
                else:
                    logits, new_state = net(x, state, generator=gen, rows=(lo, hi, B))
                    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1),
                                         reduction="none").view(T, b_local)
                    loss = ce.mean(dim=1).sum()
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
                    opt.step()
                    state = (new_state[0].detach(), new_state[1].detach())
                    tok_loss = loss.detach().double() / T
                    partial += torch.stack([tok_loss.cpu() * (T * b_local),
                                            torch.tensor(float(T * b_local), dtype=torch.float64)])
                if record_losses:
                    losses.append(float(ctx.all_sum(tok_loss.cpu())) / ctx.world_size)
                step += 1
                global_step += 1
                dt = time.perf_counter() - t0
                train_time += dt
                train_words += T * B
                words_epoch += T * B
                if bar is not None:
                    bar.update(1)
                    if stepper is None and (step % 10 == 0 or step == epoch_size):
                        bar.set_postfix(
                            ppl=f"{math.exp(min(float(partial[0] / partial[1]), 700)):.2f}",
                            wps=f"{train_words / max(train_time, 1e-9):,.0f}")
                at_limit = ((max_steps is not None and global_step >= max_steps)
                            or (deadline is not None and time.time() >= deadline))
                if step < epoch_size and ((checkpoint_every and global_step % checkpoint_every == 0)
                                          or at_limit):
                    if stepper is not None:
                        partial = stepper.partial()
                    checkpoint()
                if at_limit and step < epoch_size:
                    stopped = True
                    break
            if stopped:
                break
            # end of an epoch
            if stepper is not None:
                partial = stepper.partial()
            epoch += 1
            step = 0
            tot = ctx.all_sum(partial)
            train_ppl = math.exp(min(float(tot[0] / tot[1]), 700.0))
            valid = None
            if ctx.is_main:
                valid = _eval(model, corpus.valid, cfg.eval_batch_size, T, device)
            ctx.barrier()
            rec = {"epoch": epoch, "lr": lr, "train_ppl": train_ppl,
                   "valid_ppl": valid["ppl"] if valid else None,
                   "words_per_sec": words_epoch / max(time.perf_counter() - t_epoch, 1e-9),
                   "train_words_per_sec": train_words / max(train_time, 1e-9)}
            history.append(rec)
            if ctx.is_main:
                append_log(f"{v.name} epoch {epoch}/{cfg.epochs}  lr {lr:.4g}  train ppl "
                           f"{train_ppl:.2f}  valid ppl {valid['ppl']:.2f}  "
                           f"{rec['train_words_per_sec']:,.0f} words/s")
            state = None
            checkpoint()
            flag = torch.tensor([1.0 if (ctx.is_main and diverged(rec["valid_ppl"])) else 0.0],
                                dtype=torch.float64)
            if epoch < cfg.epochs and float(ctx.all_sum(flag)[0]) > 0:
                stopped = diverged_at = True
                if ctx.is_main:
                    append_log(f"{v.name}: validation perplexity {rec['valid_ppl']:.4g} after "
                               f"epoch {epoch} is not finite or above {stop_above_ppl:g}: "
                               "diverged, training stopped")
            elif epoch < cfg.epochs and ((max_steps is not None and global_step >= max_steps)
                                       or (deadline is not None and time.time() >= deadline)):
                stopped = True
            elif epoch < cfg.epochs:
                stop_if_interrupted()
    if bar is not None:
        bar.close()
        bar = None

    if stopped:
        why = ("diverged" if diverged_at else
               "max_steps" if max_steps is not None and global_step >= max_steps else "deadline")
        partial_result = None
        tot = ctx.all_sum(partial) if step > 0 else None
        if ctx.is_main:
            valid = _eval(model, corpus.valid, cfg.eval_batch_size, T, device)
            partial_result = {
                "complete": False, "variant": v.name, "paper_name": v.paper_name,
                "config": cfg.name, "hyper_parameters": cfg.to_dict(), "seed": seed,
                "recurrent_params": n_rec, "total_params": n_all, "epochs": cfg.epochs,
                "stopped_by": why, "max_steps": max_steps, "global_step": global_step,
                "epochs_completed": epoch, "window_in_epoch": step, "windows_per_epoch": epoch_size,
                "train_ppl_this_epoch": (math.exp(min(float(tot[0] / tot[1]), 700.0))
                                         if tot is not None else None),
                "valid_ppl": valid["ppl"], "test_ppl": None,
                "train_words_per_sec": train_words / max(train_time, 1e-9),
                "train_time_s": train_time,
                "wall_time_s": wall_before + time.perf_counter() - wall_start,
                "corpus": corpus.source, "vocab_size": len(corpus.vocab),
                "processes": ctx.world_size, "device": str(device), "history": history,
            }
            append_log(f"{v.name}: stopped after {global_step} windows ({why}; epoch "
                       f"{epoch + 1 if step else epoch}, window {step or epoch_size}/{epoch_size}), "
                       f"valid ppl now {valid['ppl']:.2f}"
                       + ("" if why == "diverged" else "; continue with --resume"))
            if out is not None:
                _write_json(partial_result, out / RESULT)
        ctx.barrier()
        return None

    result = None
    if ctx.is_main:
        positions = _long_range_positions(corpus, "valid")
        if positions is None and history and history[-1]["valid_ppl"] is not None:
            valid = {"ppl": history[-1]["valid_ppl"]}   # the model has not changed since
        else:
            valid = _eval(model, corpus.valid, cfg.eval_batch_size, T, device, positions)
        test = None
        if evaluate_test and corpus.test is not None:
            test = _eval(model, corpus.test, cfg.eval_batch_size, T, device,
                            _long_range_positions(corpus, "test"))
        result = {
            "complete": True,
            "variant": v.name, "paper_name": v.paper_name, "config": cfg.name,
            "hyper_parameters": cfg.to_dict(), "seed": seed,
            "recurrent_params": n_rec, "total_params": n_all,
            "epochs": cfg.epochs, "train_ppl": history[-1]["train_ppl"] if history else None,
            "valid_ppl": valid["ppl"], "test_ppl": test["ppl"] if test else None,
            "valid_long_range_acc": valid.get("long_range_acc"),
            "test_long_range_acc": test.get("long_range_acc") if test else None,
            "train_words_per_sec": train_words / max(train_time, 1e-9),
            "train_time_s": train_time,
            "wall_time_s": wall_before + time.perf_counter() - wall_start,
            "corpus": corpus.source, "vocab_size": len(corpus.vocab),
            "has_test": corpus.test is not None,
            "processes": ctx.world_size, "device": str(device),
            "threads": torch.get_num_threads(), "history": history,
        }
        test_s = f"{test['ppl']:.2f}" if test else "n/a (no test split)"
        append_log(f"{v.name}: valid ppl {valid['ppl']:.2f}, test ppl {test_s}, "
                   f"{result['train_words_per_sec']:,.0f} training words/s")
    checkpoint(done=True, result=result)
    if out is not None and ctx.is_main:
        _write_json(result, out / RESULT)
    ctx.barrier()
    return result
