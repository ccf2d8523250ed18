"""The training and evaluation step of the language model on static buffers, replayable as a
CUDA graph.

A PTB window has one fixed shape (``num_steps`` × ``batch_size``), so a whole training step —
forward, loss, backward, global-norm clip, SGD update, the carried state copied forward — can be
captured once with :class:`torch.cuda.CUDAGraph` and replayed: one launch per step instead of
the hundreds of small launches of the recurrence (2 layers × 35 time steps, forward and
backward), which bound the eager step on a GPU.

Everything that changes between steps lives in tensors that the step reads and writes in place
(:class:`StaticTrainStep`):

* ``x``, ``y`` — the window's tokens (copied in before each step);
* ``h``, ``c`` — the carried state (the step writes the new state back into them);
* ``lr`` — the learning rate, a 0-d tensor on the device (set once per epoch, no re-capture);
* ``loss_sum`` — this epoch's sum of token losses (float64; the trainer's ``partial[0]``),
  accumulated on the device so that no step waits for the host.

The same :meth:`StaticTrainStep._step` runs eagerly on the CPU (and on CUDA when graphs are off
or capture failed), so the CPU tests cover the arithmetic of the graphed step: it is the
trainer's eager step (``loss.backward()``, :func:`torch.nn.utils.clip_grad_norm_`, and the SGD
update written as ``p.addcmul_(grad, lr, value=-1)``, which is what :class:`torch.optim.SGD`
does with a tensor learning rate and equals its ``p.add_(grad, alpha=-lr)`` bit for bit).

Dropout masks are drawn, as in the eager trainer, from the trainer's own generator; under capture
that generator is registered with the graph (``CUDAGraph.register_generator_state``), so each
replay draws fresh masks and advances the generator's offset on the host, which the checkpoint
saves (``gen.get_state()``): a resumed run that captures its graph again continues with the
same masks.  The warm-up and the check of a freshly captured graph run real steps; the
parameters, state, accumulators and generator are restored afterwards, so capturing changes
nothing.

Modes (``cuda_graph``): ``"off"`` — the trainer's own eager loop; ``"auto"`` — a graph on CUDA,
the eager loop on the CPU, and on CUDA a logged fall-back to the eager static step when capture
raises or the first replay disagrees with an eager step; ``"on"`` — a graph on CUDA (an error if
it cannot be captured), the static step run eagerly on the CPU (what the CPU tests use).
"""
from __future__ import annotations

import math
import threading
from typing import Callable, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F

from ..aliases import get_cuda_graphs, set_cuda_graphs
from .data import batchify
from .evaluation import evaluate

__all__ = ["CUDA_GRAPH_MODES", "StaticTrainStep", "StaticEvaluator", "make_stepper"]

CUDA_GRAPH_MODES = ("auto", "on", "off")
#: Eager steps run on a side stream before capture (the PyTorch docs ask for a few).
WARMUP_STEPS = 3
#: Runs trained in threads of one process (each on its own CUDA stream) capture one at a time.
_CAPTURE_LOCK = threading.RLock()


def check_mode(mode: str) -> str:
    if mode not in CUDA_GRAPH_MODES:
        raise ValueError(f"--cuda-graph must be one of {', '.join(CUDA_GRAPH_MODES)}, got {mode!r}")
    return mode


def _window_buffers(model, T: int, B: int):
    """The static inputs of one window, on the model's device: tokens ``x`` and targets ``y``
    (T, B) int64, carried state ``h`` and ``c`` (layers, B, H) in the parameters' dtype."""
    p0 = model.decoder.weight
    L, H = model.num_layers, model.hidden_size
    tokens = dict(dtype=torch.int64, device=p0.device)
    state = dict(dtype=p0.dtype, device=p0.device)
    return (torch.zeros(T, B, **tokens), torch.zeros(T, B, **tokens),
            torch.zeros(L, B, H, **state), torch.zeros(L, B, H, **state))


def _capture_whole(owner) -> None:
    """Run ``owner._capture_locked()`` (which records the whole step or evaluation window as one
    CUDA graph) with the kernel's own per-layer graphs (:mod:`rnn_ablations.kernels.cuda.graphs`) off:
    inside one graph they would only add copies into their static buffers, and a layer graph
    recorded during the warm-up must not be replayed around this capture.  When the capture is
    given up (``owner.graph`` stays ``None``) the eager steps that follow get them back."""
    before = get_cuda_graphs()
    set_cuda_graphs(False)
    with _CAPTURE_LOCK:
        owner._capture_locked()
    if owner.graph is None:
        set_cuda_graphs(before)


class _Snapshot:
    """Parameters, carried state, accumulators and generator state, to undo warm-up steps."""

    def __init__(self, step: "StaticTrainStep"):
        self.step = step
        with torch.no_grad():
            self.params = [p.detach().clone() for p in step.params]
            self.bufs = [b.clone() for b in step._buffers()]
        self.gen = step.gen.get_state() if step.gen is not None else None

    def restore(self) -> None:
        with torch.no_grad():
            for p, s in zip(self.step.params, self.params):
                p.copy_(s)
            for b, s in zip(self.step._buffers(), self.bufs):
                b.copy_(s)
        if self.gen is not None:
            self.step.gen.set_state(self.gen)
        for p in self.step.params:
            p.grad = None


class StaticTrainStep:
    """One training window on static buffers; a CUDA graph of it when ``use_graph``.

    ``model`` is trained in place; ``batch_rows`` rows per step (the process's share of the
    batch), ``rows = (lo, hi, total)`` as :meth:`LanguageModel.forward`; ``gen`` draws the
    dropout masks."""

    def __init__(self, model, num_steps: int, batch_rows: int, max_grad_norm: float,
                 gen: Optional[torch.Generator], rows: Optional[Tuple[int, int, int]] = None,
                 use_graph: bool = False, strict: bool = False,
                 log: Callable[[str], None] = print, verify: bool = True):
        p0 = model.decoder.weight
        self.device = p0.device
        if use_graph and self.device.type != "cuda":
            raise ValueError("a CUDA graph needs the model on a CUDA device")
        self.model, self.gen, self.rows = model, gen, rows
        self.T, self.B = int(num_steps), int(batch_rows)
        self.max_grad_norm = float(max_grad_norm)
        self.params = [p for p in model.parameters()]
        dev = self.device
        self.x, self.y, self.h, self.c = _window_buffers(model, self.T, self.B)
        self.lr = torch.zeros((), dtype=p0.dtype, device=dev)
        self.loss_sum = torch.zeros((), dtype=torch.float64, device=dev)
        self.tok_loss = torch.zeros((), dtype=torch.float64, device=dev)
        self.tokens = 0.0   # the trainer's partial[1]: a count, kept on the host
        self.want_graph, self.strict, self.verify = use_graph, strict, verify
        self.log = log
        self.graph: Optional[torch.cuda.CUDAGraph] = None
        self.failed: Optional[str] = None    # why capture was given up (auto mode)
        self._evaluators: Dict[int, "StaticEvaluator"] = {}

    # ----------------------------------------------------------------- state in and out
    def _buffers(self) -> List[torch.Tensor]:
        return [self.h, self.c, self.lr, self.loss_sum, self.tok_loss]

    @property
    def state(self) -> Tuple[torch.Tensor, torch.Tensor]:
        return self.h, self.c

    @property
    def mode(self) -> str:
        """``"graph"`` or ``"eager"`` (before the first step: what will be tried)."""
        if self.graph is not None or (self.want_graph and self.failed is None):
            return "graph"
        return "eager"

    def begin(self, state: Optional[Tuple[torch.Tensor, torch.Tensor]], partial: torch.Tensor,
              lr: float) -> None:
        """Start (or resume) an epoch: carried ``state`` (None: zeros), the epoch's partial
        statistics ``(loss sum, tokens)`` so far, this epoch's learning rate."""
        with torch.no_grad():
            if state is None:
                self.h.zero_()
                self.c.zero_()
            else:
                self.h.copy_(state[0])
                self.c.copy_(state[1])
            self.loss_sum.fill_(float(partial[0]))
            self.lr.fill_(lr)
        self.tokens = float(partial[1])

    def partial(self) -> torch.Tensor:
        """``(sum of token losses, tokens)`` of this epoch so far, float64 on the CPU (a sync)."""
        return torch.stack([self.loss_sum.detach().cpu(),
                            torch.tensor(self.tokens, dtype=torch.float64)])

    # ----------------------------------------------------------------- the step
    def _step(self) -> None:
        """Forward, loss, backward, clip, SGD update, state carried — on the static buffers,
        with no host synchronisation (this is what a graph captures)."""
        model, T, B = self.model, self.T, self.B
        for p in self.params:
            p.grad = None
        logits, (h, c) = model(self.x, (self.h, self.c), generator=self.gen, rows=self.rows)
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), self.y.reshape(-1),
                             reduction="none").view(T, B)
        loss = ce.mean(dim=1).sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm)
        with torch.no_grad():
            for p in self.params:
                if p.grad is not None:   # as torch.optim.SGD: a parameter without gradient stays
                    p.addcmul_(p.grad, self.lr, value=-1)
            self.h.copy_(h)
            self.c.copy_(c)
            tok = loss.detach().double() / T
            self.tok_loss.copy_(tok)
            self.loss_sum.add_(tok * (T * B))

    def step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Train on window ``x`` → ``y`` (each (T, B)); returns the window's mean token loss as
        a 0-d float64 device tensor (overwritten by the next step)."""
        with torch.no_grad():
            self.x.copy_(x)
            self.y.copy_(y)
        if self.graph is None and self.want_graph and self.failed is None:
            self._capture()
        if self.graph is not None:
            self.graph.replay()
        else:
            self.model.train()
            self._step()
        self.tokens += float(self.T * self.B)
        return self.tok_loss

    # ----------------------------------------------------------------- capture
    def _capture(self) -> None:
        _capture_whole(self)

    def _capture_locked(self) -> None:
        model = self.model
        model.train()
        snap = _Snapshot(self)
        try:
            stream = torch.cuda.Stream(device=self.device)
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):
                for _ in range(WARMUP_STEPS):
                    self._step()
            torch.cuda.current_stream(self.device).wait_stream(stream)
            torch.cuda.synchronize(self.device)
            snap.restore()
            graph = torch.cuda.CUDAGraph()
            if self.gen is not None:
                graph.register_generator_state(self.gen)
            for p in self.params:
                p.grad = None
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                self._step()
            torch.cuda.synchronize(self.device)
            snap.restore()
            if self.verify:
                self._check(graph, snap)
            self.graph = graph
        except Exception as exc:  # noqa: BLE001 - any capture failure: fall back or report
            snap.restore()
            torch.cuda.synchronize(self.device)
            if self.strict:
                raise RuntimeError(f"CUDA graph capture of the training step failed: {exc}; "
                                   "use --cuda-graph auto (falls back to eager) or off") from exc
            self.failed = f"{type(exc).__name__}: {exc}"
            self.log(f"warning: CUDA graph of the training step not used ({self.failed}); "
                     "training eagerly (same arithmetic, slower)")

    def _check(self, graph, snap: _Snapshot) -> None:
        """One eager step and one replay from the same start must agree (the dropout masks are
        the generator's in both); then everything is restored."""
        self._step()
        eager = [p.detach().clone() for p in self.params] + [self.h.clone(), self.loss_sum.clone()]
        snap.restore()
        graph.replay()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        # copies: the live tensors are about to be restored to the snapshot
        replayed = ([p.detach().clone() for p in self.params]
                    + [self.h.clone(), self.loss_sum.clone()])
        snap.restore()
        names = [n for n, _ in self.model.named_parameters()] + ["h", "loss_sum"]
        worst, report = 0.0, []
        for name, a, b, s in zip(names, eager, replayed,
                                 snap.params + [snap.bufs[0], snap.bufs[3]]):
            moved = (a.double() - s.double()).norm().item()
            moved_graph = (b.detach().double() - s.double()).norm().item()
            diff = (a.double() - b.detach().double()).norm().item()
            if not math.isfinite(diff):
                raise RuntimeError(f"the replayed step produced non-finite values in {name}")
            rel = diff / max(moved, 1e-12) if moved > 0 else diff
            report.append((rel, name, moved, moved_graph))
            worst = max(worst, rel)
        if worst > 1e-3:
            report.sort(reverse=True)
            detail = "; ".join(f"{n}: rel {r:.3g} (eager moved {m:.3g}, graph moved {g:.3g})"
                               for r, n, m, g in report[:4])
            raise RuntimeError(f"the replayed graph disagrees with the eager step (relative "
                               f"difference {worst:.3g} of the update; worst: {detail})")

    # ----------------------------------------------------------------- evaluation
    def evaluate(self, model, data, batch_size: int, num_steps: int, device=None,
                 positions=None) -> Dict:
        """:func:`rnn_ablations.lm.evaluation.evaluate`, with the full windows replayed from a CUDA
        graph when this step uses one (same numbers: same kernels, same summation order)."""
        if positions is not None or self.graph is None or model is not self.model:
            return evaluate(model, data, batch_size, num_steps, device, positions)
        bs = max(1, min(batch_size, data.numel() // 2))
        ev = self._evaluators.get(bs)
        if ev is None or ev.T != num_steps:
            ev = StaticEvaluator(model, num_steps, bs, use_graph=True, log=self.log)
            self._evaluators[bs] = ev
        return ev.evaluate(data)


class StaticEvaluator:
    """:func:`rnn_ablations.lm.evaluation.evaluate` with the full windows on static buffers (a CUDA
    graph when ``use_graph``), the last partial window eager.  Falls back to eager windows if
    capture raises."""

    def __init__(self, model, num_steps: int, batch_rows: int, use_graph: bool = False,
                 log: Callable[[str], None] = print):
        p0 = model.decoder.weight
        self.model, self.device = model, p0.device
        self.T, self.B = int(num_steps), int(batch_rows)
        dev = self.device
        self.x, self.y, self.h, self.c = _window_buffers(model, self.T, self.B)
        self.total = torch.zeros((), dtype=torch.float64, device=dev)
        self.want_graph, self.log = use_graph and dev.type == "cuda", log
        self.graph = None
        self.failed: Optional[str] = None

    @torch.no_grad()
    def _window(self) -> None:
        logits, (h, c) = self.model(self.x, (self.h, self.c))
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), self.y.reshape(-1),
                             reduction="sum")
        self.total.add_(ce.double())
        self.h.copy_(h)
        self.c.copy_(c)

    def _capture(self) -> None:
        _capture_whole(self)

    def _capture_locked(self) -> None:
        saved = [self.h.clone(), self.c.clone(), self.total.clone()]
        try:
            stream = torch.cuda.Stream(device=self.device)
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):
                for _ in range(2):
                    self._window()
            torch.cuda.current_stream(self.device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                self._window()
            self.graph = graph
        except Exception as exc:  # noqa: BLE001
            self.failed = f"{type(exc).__name__}: {exc}"
            self.log(f"warning: CUDA graph of the evaluation step not used ({self.failed})")
        torch.cuda.synchronize(self.device)
        for b, s in zip((self.h, self.c, self.total), saved):
            b.copy_(s)

    @torch.no_grad()
    def evaluate(self, data: torch.Tensor) -> Dict:
        if data is None or data.numel() < 2:
            raise ValueError("cannot evaluate on an empty split")
        rows = batchify(data, self.B).to(self.device)
        was_training = self.model.training
        self.model.eval()
        self.h.zero_()
        self.c.zero_()
        self.total.zero_()
        n_tok = 0
        n = rows.shape[1] - 1
        T = self.T
        for i in range(0, n, T):
            t = min(T, n - i)
            x = rows[:, i:i + t].t()
            y = rows[:, i + 1:i + 1 + t].t()
            if t == T:
                self.x.copy_(x)
                self.y.copy_(y)
                if self.graph is None and self.want_graph and self.failed is None:
                    self._capture()
                if self.graph is not None:
                    self.graph.replay()
                else:
                    self._window()
            else:   # the last, partial window: eager, same arithmetic
                logits, (h, c) = self.model(x, (self.h, self.c))
                ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1),
                                     reduction="sum")
                self.total.add_(ce.double())
                self.h.copy_(h)
                self.c.copy_(c)
            n_tok += y.numel()
        self.model.train(was_training)
        loss = float(self.total) / n_tok
        return {"loss": loss, "ppl": math.exp(min(loss, 700.0)), "tokens": n_tok}


def make_stepper(model, cfg, batch_rows: int, gen, rows, device: torch.device, mode: str,
                 distributed: bool, log: Callable[[str], None]) -> Optional[StaticTrainStep]:
    """The static step the trainer should use, or ``None`` for its own eager loop."""
    check_mode(mode)
    if mode == "off":
        return None
    if distributed:
        if mode == "on":
            raise ValueError("--cuda-graph on is not supported with several processes (torchrun); "
                             "use --cuda-graph off or auto")
        return None
    if device.type == "cuda":
        return StaticTrainStep(model, cfg.num_steps, batch_rows, cfg.max_grad_norm, gen, rows,
                               use_graph=True, strict=(mode == "on"), log=log)
    if mode == "on":   # the static step, run eagerly: the arithmetic the graph captures
        return StaticTrainStep(model, cfg.num_steps, batch_rows, cfg.max_grad_norm, gen, rows,
                               use_graph=False, log=log)
    return None
