"""CUDA-graph replay of the CUDA kernel's step loop.

At the sizes of the experiments (batch 20-64, hidden 100-650) one step of the CUDA kernel is a
small GEMM and one element-wise kernel: the GPU finishes them faster than the host can launch
them, so the recurrence is bound by launch overhead (2-3 launches per step, forward and
backward).  This module records the whole ``plain_forward`` (or ``plain_backward``) of one layer and
direction — every step's launches, the final states, the weight-gradient GEMM — as one CUDA
graph per shape, and replays it: one launch per layer instead of 2-3 per step.

How: :class:`GraphedKernel` has the step kernel's entry points (``plain_forward`` and
``plain_backward``, same arguments and results).  A call is keyed by everything the recorded launches
depend on: the entry point, the variant code, highway, the shapes and dtype of every argument,
``batch_sizes`` (read on the host: it decides how many rows each step launches), the device and
the cuBLAS math flags.  The first time a key is seen the call runs eagerly; the second time
(:data:`CAPTURE_AFTER`) it is captured into a graph with private static input buffers and the
results of the capture as static outputs; afterwards a call copies its arguments into the static
inputs (``torch._foreach_copy_``: one launch), replays the graph and copies the static outputs
into fresh tensors (the caller keeps them: autograd saves them, and the next call of the same
shape reuses the static outputs).  Shapes seen once (e.g. data with a new padding pattern per
batch) are never captured, so they cost only the dictionary lookup.

At most ``cuda_graphs_max`` graphs are kept (an :func:`rnn_ablations.options` setting, 32 by
default; least recently used first out; each holds its static buffers and the memory pool of its
capture); once as many have been evicted, a shape is recorded only after
:data:`CAPTURE_AFTER_THRASH` calls.  When a capture fails the key is remembered and runs
eagerly.  Inside a caller's own capture (``torch.cuda.graph`` around a whole training step) the
kernel runs eagerly, so its launches go into the caller's graph: the kernel's eager path has no
host synchronisation and no host<->device copy.

Whether a layer's calls go through a :class:`GraphedKernel` is the run plan's decision
(``Plan.graphs``, from the ``cuda_graphs`` setting, on by default), made at the forward: the
backward of that forward replays (or not) the same way.  :func:`graph_stats` counts captures,
replays and fallbacks (the tests use it).  The setting's short forms (``set_cuda_graphs`` /
``use_cuda_graphs`` / ``get_cuda_graphs``) are in :mod:`rnn_ablations.aliases`.
"""
from __future__ import annotations

import collections
import threading
import warnings
from typing import Dict, Optional, Tuple

import torch

from .. import schema
from ...settings import process_options

__all__ = ["graph_stats",
           "clear_graphs", "GraphedKernel", "CAPTURE_AFTER"]


#: A key is captured on its CAPTURE_AFTER-th call (the calls before run eagerly) ...
CAPTURE_AFTER = 2
#: ... or, once ``cuda_graphs_max`` graphs have been evicted (more shapes recur than the cache
#: holds, and recording each costs about three eager calls), on its CAPTURE_AFTER_THRASH-th call.
CAPTURE_AFTER_THRASH = 8
#: Keys whose calls are counted (the counter is cleared when it grows past this).
_MAX_SEEN = 4096

_lock = threading.Lock()
_graphs: "collections.OrderedDict[Tuple, _Entry]" = collections.OrderedDict()
_seen: Dict[Tuple, int] = {}
_failed: Dict[Tuple, str] = {}
_stats = collections.Counter()
_side_streams: Dict[int, torch.cuda.Stream] = {}


def graph_stats() -> Dict[str, int]:
    """Counts since the start (or :func:`clear_graphs`): ``captures``, ``replays``, ``eager``
    (calls before capture, or for keys that failed), ``failed`` (captures that failed),
    ``nested`` (calls inside a caller's capture), ``evicted``; ``graphs`` = graphs held now."""
    out = dict(_stats)
    for k in ("captures", "replays", "eager", "failed", "nested", "evicted"):
        out.setdefault(k, 0)
    out["graphs"] = len(_graphs)
    return out


def clear_graphs() -> None:
    """Drop every recorded graph (and its memory) and reset the counters."""
    with _lock:
        _graphs.clear()
        _seen.clear()
        _failed.clear()
        _stats.clear()


class _Entry:
    __slots__ = ("graph", "static_in", "static_out")

    def __init__(self, graph, static_in, static_out):
        self.graph, self.static_in, self.static_out = graph, static_in, static_out


def _side_stream(device: torch.device) -> torch.cuda.Stream:
    idx = device.index if device.index is not None else torch.cuda.current_device()
    s = _side_streams.get(idx)
    if s is None:
        s = _side_streams[idx] = torch.cuda.Stream(device=idx)
    return s


def _math_flags() -> Tuple:
    m = torch.backends.cuda.matmul
    return (m.allow_tf32, getattr(m, "allow_fp16_reduced_precision_reduction", None),
            getattr(m, "allow_bf16_reduced_precision_reduction", None))


def _copy_all(dst, src) -> None:
    pairs = [(d, s) for d, s in zip(dst, src) if d.numel() > 0]
    if not pairs:
        return
    dst_, src_ = [p[0] for p in pairs], [p[1] for p in pairs]
    if hasattr(torch, "_foreach_copy_"):
        torch._foreach_copy_(dst_, src_)
    else:  # pragma: no cover - old torch
        for d, s in pairs:
            d.copy_(s)


def _fresh_copies(static_out, n_out=None):
    """Copies of the static outputs (the first ``n_out``; the others as empty tensors)."""
    n = len(static_out) if n_out is None else n_out
    fresh = [torch.empty(s.shape, dtype=s.dtype, device=s.device) for s in static_out[:n]]
    _copy_all(fresh, static_out[:n])
    return fresh + [s.new_empty(0) for s in static_out[n:]]


def _replayed(name: str):
    """A kernel method's implementation: ``name`` of ``self.ext`` through :func:`_run`.  The
    key's head holds the entry and its non-tensor arguments (spec, highway, train); the
    tensors but ``batch_sizes`` (read on the host) go through the static buffers."""
    args_of = schema.arguments(name)
    n = len(args_of)
    at = [i for i, a in enumerate(args_of) if a.tensor and a.name != "batch_sizes"]
    flags = [i for i, a in enumerate(args_of) if not a.tensor]
    bs = schema.positions(name)["batch_sizes"]
    # the inference forward (train=False: nothing saved for a backward): only out, h_n, c_n
    # are copied out of a replayed graph; gates, cs, hin come back empty
    train = schema.positions(name).get("train")

    def replay(self, args):
        args = args[:n]  # (plain_forward's in_place: the gates come back in their own tensors)
        head = (self.tag, name) + tuple(args[i] for i in flags)

        def call(*tensors):
            full = list(args)
            for i, t in zip(at, tensors):
                full[i] = t
            return getattr(self.ext, name)(*full)

        n_out = 3 if train is not None and not args[train] else None
        return _run(head, tuple(args[i] for i in at), args[bs], call, n_out)
    return replay


class GraphedKernel:
    """Drop-in for the CUDA step kernel ``ext`` (``plain_forward`` / ``plain_backward``, the
    ``StepKernel`` of ``kernels/interface.py``) that replays CUDA graphs of repeated shapes (see
    the module docstring)."""

    #: capabilities (``kernels/interface.py``): a step kernel only, gates in tensors of its own
    in_place_gates = False
    scan = False
    persistent = False

    def __init__(self, ext, tag: str = "steps"):
        self.ext = ext
        self.tag = tag  # in every key: kernels behind one entry-point name record apart

    plain_forward = schema.entry("plain_forward", _replayed("plain_forward"))
    plain_backward = schema.entry("plain_backward", _replayed("plain_backward"))


def _run(head, tensors, batch_sizes, call, n_out=None):
    if torch.cuda.is_current_stream_capturing():
        # a caller records its own graph: launch eagerly into it (a nested capture would fail)
        _stats["nested"] += 1
        return call(*tensors)
    device = tensors[0].device
    if device.index is not None and device.index != torch.cuda.current_device():
        with torch.cuda.device(device):  # graphs are recorded and replayed on the current device
            return _run(head, tensors, batch_sizes, call, n_out)
    key = head + (device.index, _math_flags(), tuple(batch_sizes.tolist()),
                  tuple((t.dtype, tuple(t.shape)) for t in tensors))
    entry = _graphs.get(key)
    if entry is not None:
        _graphs.move_to_end(key)
        _copy_all(entry.static_in, tensors)
        entry.graph.replay()
        _stats["replays"] += 1
        return _fresh_copies(entry.static_out, n_out)
    if key in _failed:
        _stats["eager"] += 1
        return call(*tensors)
    with _lock:
        if len(_seen) >= _MAX_SEEN:
            _seen.clear()
        count = _seen.get(key, 0) + 1
        _seen[key] = count
    max_graphs = process_options().cuda_graphs_max
    needed = CAPTURE_AFTER if _stats["evicted"] < max_graphs else CAPTURE_AFTER_THRASH
    if count < needed or max_graphs <= 0:
        _stats["eager"] += 1
        return call(*tensors)
    entry = _capture(key, tensors, call)
    if entry is None:
        _stats["eager"] += 1
        return call(*tensors)
    _copy_all(entry.static_in, tensors)
    entry.graph.replay()
    _stats["replays"] += 1
    return _fresh_copies(entry.static_out, n_out)


def _capture(key, tensors, call) -> Optional[_Entry]:
    """Record ``call`` on static copies of ``tensors`` (their values are not needed: the graph
    is replayed after the copy-in); ``None`` when the capture fails."""
    device = tensors[0].device
    current = torch.cuda.current_stream(device)
    side = _side_stream(device)
    static_in = [torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in tensors]
    _copy_all(static_in, tensors)  # real values: the warm-up below computes on them
    graph = torch.cuda.CUDAGraph()
    side.wait_stream(current)
    try:
        with torch.cuda.stream(side):
            # warm-up on the capture stream: cuBLAS sets up its workspace for this stream
            # outside the capture
            call(*static_in)
            graph.capture_begin(capture_error_mode="thread_local")
            try:
                static_out = call(*static_in)
            finally:
                graph.capture_end()
        static_out = [t for t in static_out]
    except Exception as exc:  # capture unsupported here: remember and run eagerly
        current.wait_stream(side)
        _failed[key] = f"{type(exc).__name__}: {exc}"
        _stats["failed"] += 1
        warnings.warn(f"rnn_ablations: CUDA graph capture failed ({_failed[key]}); this shape "
                      "runs without graphs (rnn_ablations.options(cuda_graphs=False) or "
                      "RNN_ABLATIONS_CUDA_GRAPHS=0 turns them off)")
        return None
    current.wait_stream(side)
    for t in static_in:  # the static buffers were made on `current`, used on `side` too
        t.record_stream(side)
    entry = _Entry(graph, static_in, static_out)
    _stats["captures"] += 1
    with _lock:
        _graphs[key] = entry
        while len(_graphs) > process_options().cuda_graphs_max:
            _graphs.popitem(last=False)
            _stats["evicted"] += 1
    return entry
