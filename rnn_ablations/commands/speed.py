"""``rnn-ablations speed``: throughput of every variant as a ratio to ``torch.nn.LSTM``.

All models are timed in the same process, in interleaved rounds (every model once per round, so
that a change in machine load hits all of them alike); the reported time is the median over
rounds and the ratio is ``time(nn.LSTM) / time(variant)`` (> 1 = faster than nn.LSTM).

    rnn-ablations speed --shapes experiments --threads 2 --out DIR
        # the experiments' shapes, train and inference, every variant against nn.LSTM of the
        # same configuration; writes DIR/speed_cpu_experiments.{json,md} with the machine (CPU
        # model, AVX-512 or not, the kernel's vector path); without --out it prints the table
    rnn-ablations speed --shapes experiments --threads 2 --directions both
        # also each bidirectional variant with its directions one after the other
        # ("<variant> [sequential directions]"), for an A/B of the concurrent directions
    rnn-ablations speed --shapes experiments --threads 2 --isas avx512 avx2
        # every variant once per CPU kernel vector path ("<variant> [avx2]"), interleaved in the
        # same rounds, for an A/B of the AVX-512 path against the AVX2 one
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import json
import statistics
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from ..aliases import (get_backend, get_cuda_graphs, get_cuda_recurrence, set_cuda_graphs,
                       use_concurrent_directions, use_cuda_recurrence, use_kernel_isa)
from ..kernels.cuda.graphs import clear_graphs, graph_stats
from ..settings import get_options
from ..kernels.registry import cuda_kernel_available, kernel_available, kernel_isa, supported_kernel_isas
from ..rnn import AblatedRNN
from ..variants import VARIANTS, get_variant
from .machine import cpu_info, describe, gpu_info

__all__ = ["measure", "format_table", "add_subparser", "cpu_info", "EXPERIMENT_SHAPES", "DTYPES",
           "DIRECTIONS", "RECURRENCES"]


#: The shapes of the papers' experiments' recurrent layers: (name, layers, input size, hidden,
#: bidirectional, batch, seq_len).
EXPERIMENT_SHAPES = (
    ("single layer 256", 1, 256, 256, False, 32, 64),
    ("single layer 650", 1, 650, 650, False, 32, 64),
    ("PTB small LM", 2, 200, 200, False, 20, 20),
    ("PTB medium LM", 2, 650, 650, False, 20, 35),
    ("BiDAF phrase", 1, 200, 100, True, 40, 200),
    ("BiDAF modeling", 2, 800, 100, True, 40, 200),
    ("parser", 3, 200, 400, True, 32, 25),
    ("NMT encoder", 2, 500, 250, True, 64, 30),
    ("DrQA", 3, 400, 128, True, 32, 200),
)

#: --dtype choices: a storage dtype (model and input cast with .to), or "autocast-<dtype>":
#: float32 model and input under torch.autocast(device, dtype) (mixed precision training)
DTYPES = ("float32", "float64", "bfloat16", "float16", "autocast-bfloat16", "autocast-float16")

#: --directions choices: how bidirectional variants run their two directions
#: (``rnn_ablations.aliases.set_concurrent_directions``): ``auto`` (the default policy:
#: concurrently with 2 threads), ``sequential`` (one after the other), ``both`` (each
#: bidirectional variant timed both ways, the second as ``"<variant> [sequential directions]"``).
DIRECTIONS = ("auto", "sequential", "both")
SEQUENTIAL_SUFFIX = " [sequential directions]"

#: --cuda-recurrence choices (``rnn_ablations.kernels.cuda.recurrence``): the CUDA forward of every
#: variant on the step kernel (``steps``), on the persistent kernel (``persistent``), as the
#: policy picks (``auto``), or ``both``: each variant timed on the step kernel and again as
#: ``"<variant> [persistent]"``, in the same interleaved rounds.  Every row carries its
#: ``recurrence`` (``"persistent"``: the persistent forward and the step kernel's backward;
#: ``"persistent forward and backward"`` with ``RNN_ABLATIONS_PERSISTENT_BACKWARD=1``); a shape
#: the persistent kernel does not apply to gets no persistent row (the reason is printed).
RECURRENCES = ("auto", "steps", "persistent", "both")
PERSISTENT_SUFFIX = " [persistent]"
#: On CUDA, the baseline a performance-minded user would also time: nn.LSTM replayed from CUDA
#: graphs (training: ``torch.cuda.make_graphed_callables``, forward and backward; inference: the
#: no-grad forward captured with ``torch.cuda.graph``), as our kernel's step loops are.  Rows
#: then carry ``ratio_vs_nn_lstm_graphed`` beside ``ratio_vs_nn_lstm`` (eager cuDNN).
GRAPHED_LSTM = "nn.LSTM [CUDA graph]"


class _GraphedLSTM(torch.nn.Module):
    """A copy of ``lstm`` whose training call (forward + backward) and no-grad forward replay
    CUDA graphs captured for input ``x`` (same shape, dtype and ``requires_grad`` at every
    call)."""

    def __init__(self, lstm: torch.nn.LSTM, x: torch.Tensor):
        super().__init__()
        self.train_module = torch.cuda.make_graphed_callables(copy.deepcopy(lstm), (x,))
        self.static_x = x.detach().clone()
        infer = copy.deepcopy(lstm)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), torch.no_grad():
            for _ in range(3):  # warm-up outside the capture (cuDNN picks its algorithms)
                infer(self.static_x)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(self.graph):
            self.static_out = infer(self.static_x)
        self.infer_module = infer

    def forward(self, x):
        if torch.is_grad_enabled():
            return self.train_module(x)
        self.static_x.copy_(x)
        self.graph.replay()
        return self.static_out


def _dtype_setup(name: str, device: str):
    """(storage dtype, context manager factory) for a --dtype choice."""
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; choose from {', '.join(DTYPES)}")
    if name.startswith("autocast-"):
        amp = getattr(torch, name.split("-", 1)[1])
        return torch.float32, lambda: torch.autocast(torch.device(device).type, dtype=amp)
    return getattr(torch, name), contextlib.nullcontext


def measure(hidden_sizes: Sequence[int] = (256, 650), batch: int = 32, seq_len: int = 64,
            repeats: int = 7, variants: Sequence[str] = VARIANTS, warmup: int = 2,
            device: str = "cpu", clock: str = "wall", dtype: str = "float32",
            shapes: Optional[Sequence[Tuple]] = None, directions: str = "auto",
            recurrence: str = "auto", isas: Optional[Sequence[str]] = None) -> List[Dict]:
    """Rows ``{hidden, model, mode, median_ms, ratio_vs_nn_lstm, dtype, ...}`` for mode in
    {train, inference}.

    train = forward + backward of ``output.sum()``; inference = forward under ``no_grad``.
    Shapes: input (batch, seq_len, hidden), ``batch_first=True``, one layer; or, with
    ``shapes`` (e.g. :data:`EXPERIMENT_SHAPES`), each ``(name, layers, input size, hidden,
    bidirectional, batch, seq_len)`` against an nn.LSTM of the same configuration.  ``dtype``:
    one of :data:`DTYPES` (nn.LSTM runs in the same dtype).  ``directions``: one of
    :data:`DIRECTIONS`; ``recurrence``: one of :data:`RECURRENCES` (CUDA).  ``isas``: CPU
    kernel vector paths (:func:`rnn_ablations.kernel_isa`); with several, every variant is timed
    once per path in the same rounds, as ``"<variant> [<isa>]"`` (each row records its
    ``kernel_isa``).
    On CUDA (not under autocast) every shape also times :data:`GRAPHED_LSTM`, nn.LSTM replayed
    from CUDA graphs, and every row carries ``ratio_vs_nn_lstm_graphed`` too.
    ``clock="cpu"`` times with the process's CPU time instead of the wall clock: with one thread
    (``torch.set_num_threads(1)``) that is the work done, whatever else loads the machine.
    """
    if clock not in ("wall", "cpu"):
        raise ValueError(f"clock must be 'wall' or 'cpu', got {clock!r}")
    if directions not in DIRECTIONS:
        raise ValueError(f"directions must be one of {', '.join(DIRECTIONS)}, got {directions!r}")
    if recurrence not in RECURRENCES:
        raise ValueError(f"recurrence must be one of {', '.join(RECURRENCES)}, got {recurrence!r}")
    if clock == "cpu" and torch.get_num_threads() != 1:
        raise ValueError("clock='cpu' measures work only with one thread: use --threads 1")
    for name, v in (("batch", batch), ("seq_len", seq_len), ("repeats", repeats)):
        if v < 1:
            raise ValueError(f"{name} must be >= 1, got {v}")
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    if any(h < 1 for h in hidden_sizes):
        raise ValueError(f"hidden sizes must be >= 1, got {list(hidden_sizes)}")
    variants = [get_variant(v).name for v in variants]
    if isas is not None:
        isas = list(dict.fromkeys(isas))
        if not isas:
            raise ValueError("isas must name at least one kernel vector path")
        supported = supported_kernel_isas()
        supported += ["emulated_avx512"] if "avx2" in supported else []
        bad = [i for i in isas if i not in supported]
        if bad:
            raise ValueError(f"kernel vector path(s) {bad} not available on this CPU/build; "
                             f"choose from {supported}")
        if device != "cpu":
            raise ValueError("isas picks the CPU kernel's vector path: use device='cpu'")
    if shapes is None:
        shapes = [(None, 1, h, h, False, batch, seq_len) for h in hidden_sizes]
    rows = []
    for shape in shapes:
        rows += _measure_shape(shape, repeats, variants, warmup, device, clock, dtype, directions,
                               recurrence, isas)
    return rows


def _measure_shape(shape, repeats, variants, warmup, device, clock, dtype_name,
                   directions="auto", recurrence="auto", isas=None) -> List[Dict]:
    label, layers, d_in, hidden, bidirectional, batch, seq_len = shape
    storage, context = _dtype_setup(dtype_name, device)
    timer = time.perf_counter if clock == "wall" else time.process_time
    torch.manual_seed(0)
    cfg = dict(num_layers=layers, bidirectional=bidirectional, batch_first=True)
    models = {"nn.LSTM": torch.nn.LSTM(d_in, hidden, **cfg)}
    for v in variants:
        models[v] = AblatedRNN(v, d_in, hidden, **cfg)
    models = {k: m.to(device=device, dtype=storage) for k, m in models.items()}
    # how each model runs its directions (nn.LSTM: its own way)
    policy = {k: ("never" if directions == "sequential" else "auto") for k in models}
    if directions == "both" and bidirectional:
        for v in variants:
            models[v + SEQUENTIAL_SUFFIX] = models[v]
            policy[v + SEQUENTIAL_SUFFIX] = "never"
    # the CPU kernel's vector path of each timed model (None: as it is; nn.LSTM: not ours)
    isa_of = {k: None for k in models}
    if isas is not None:
        isa_of = {"nn.LSTM": None}
        timed = {"nn.LSTM": models["nn.LSTM"]}
        for k, m in models.items():
            if k == "nn.LSTM":
                continue
            for isa in isas:
                key = k if len(isas) == 1 else f"{k} [{isa}]"
                timed[key], policy[key], isa_of[key] = m, policy[k], isa
        models = timed
    x = torch.randn(batch, seq_len, d_in, device=device, dtype=storage, requires_grad=True)
    # which CUDA recurrence each model's forward runs (nn.LSTM: cuDNN; the CPU: none)
    base_rec = "steps" if recurrence == "both" else recurrence
    rec = {k: base_rec for k in models}
    if recurrence == "both" and device != "cpu":
        for v in variants:
            models[v + PERSISTENT_SUFFIX] = models[v]
            policy[v + PERSISTENT_SUFFIX] = policy[v]
            rec[v + PERSISTENT_SUFFIX] = "persistent"
    for k in list(models):  # a shape the persistent kernel does not apply to: no row
        if k != "nn.LSTM" and rec[k] == "persistent" and device != "cpu":
            try:
                with torch.no_grad(), context(), use_cuda_recurrence("persistent"):
                    models[k](x)
            except ValueError as exc:
                print(f"# {k}, hidden {hidden}, {dtype_name}: no persistent row ({exc})")
                del models[k]
    if device != "cpu" and not dtype_name.startswith("autocast-"):
        try:
            models[GRAPHED_LSTM] = _GraphedLSTM(models["nn.LSTM"], x)
            policy[GRAPHED_LSTM], rec[GRAPHED_LSTM], isa_of[GRAPHED_LSTM] = "auto", "steps", None
        except RuntimeError as exc:  # a capture failure costs its rows, not the table
            print(f"# {label or hidden}, {dtype_name}: nn.LSTM could not be captured in a CUDA "
                  f"graph ({exc}); no {GRAPHED_LSTM} rows")
    times = {(k, mode): [] for k in models for mode in ("train", "inference")}
    # CUDA: each shape starts with no recorded graphs.  The graph cache is bounded (32 graphs,
    # and after 32 evictions a shape is recorded only on its 8th call), so graphs left by the
    # shapes and dtypes timed before would make the later ones run their steps eagerly for
    # most of their rounds; the rows count the kernel calls replayed vs. run eagerly.
    if device != "cpu":
        clear_graphs()
    graph_calls = {(k, mode): {"replays": 0, "eager": 0} for k in models
                   for mode in ("train", "inference")}

    def train_step(m):
        with context():
            out, _ = m(x)
        out.float().sum().backward()

    def infer_step(m):
        with torch.no_grad(), context():
            m(x)

    for r in range(warmup + repeats):
        for k, m in models.items():
            for mode, fn in (("train", train_step), ("inference", infer_step)):
                if device != "cpu":
                    torch.cuda.synchronize()
                before = graph_stats() if device != "cpu" else None
                isa = use_kernel_isa(isa_of[k]) if isa_of.get(k) else contextlib.nullcontext()
                with use_concurrent_directions(policy[k]), use_cuda_recurrence(rec[k]), isa:
                    t0 = timer()
                    fn(m)
                    if device != "cpu":
                        torch.cuda.synchronize()
                    elapsed = timer() - t0
                if r >= warmup:
                    times[(k, mode)].append(elapsed)
                    if before is not None:
                        after = graph_stats()
                        for key in ("replays", "eager"):
                            graph_calls[(k, mode)][key] += after[key] - before[key]
            m.zero_grad(set_to_none=True)
            x.grad = None
    rows = []
    for mode in ("train", "inference"):
        base = statistics.median(times[("nn.LSTM", mode)])
        graphed = (statistics.median(times[(GRAPHED_LSTM, mode)]) if GRAPHED_LSTM in models
                   else None)
        for k in models:
            med = statistics.median(times[(k, mode)])
            spread = (min(times[(k, mode)]), max(times[(k, mode)]))
            row = {"hidden": hidden, "batch": batch, "seq_len": seq_len, "model": k,
                   "mode": mode, "dtype": dtype_name, "median_ms": round(med * 1e3, 3),
                   "min_ms": round(spread[0] * 1e3, 3), "max_ms": round(spread[1] * 1e3, 3),
                   "ratio_vs_nn_lstm": round(base / med, 3), "repeats": repeats,
                   "directions": ("-" if k in ("nn.LSTM", GRAPHED_LSTM) or not bidirectional else
                                  "sequential" if policy[k] == "never" else "auto"),
                   "recurrence": ("-" if k in ("nn.LSTM", GRAPHED_LSTM) or device == "cpu" else
                                  "persistent forward and backward" if rec[k] == "persistent"
                                  and get_options().persistent_backward else rec[k]),
                   "kernel_isa": ("-" if k == "nn.LSTM" or device != "cpu" else
                                  isa_of.get(k) or kernel_isa())}
            if graphed is not None:
                row["ratio_vs_nn_lstm_graphed"] = round(graphed / med, 3)
            if device != "cpu" and k not in ("nn.LSTM", GRAPHED_LSTM):  # kernel calls, timed rounds
                row["cuda_graph_calls"] = graph_calls[(k, mode)]
            if label is not None:
                row.update(shape=label, layers=layers, input_size=d_in,
                           bidirectional=bidirectional)
            rows.append(row)
    return rows


def format_table(rows: List[Dict]) -> str:
    experiments = any("shape" in r for r in rows)
    head = "| shape (layers, d_in, H, bi, B, T) " if experiments else "| hidden "
    graphed = any("ratio_vs_nn_lstm_graphed" in r for r in rows)
    extra = " train ratio, graphed cuDNN | inference ratio, graphed cuDNN |" if graphed else ""
    lines = [head + "| dtype | model | train (fwd+bwd) ms | train ratio | inference ms | "
             "inference ratio |" + extra, "|---|---|---|---|---|---|---|" + "---|---|" * graphed]
    by = {}
    for r in rows:
        if experiments:
            where = (f"{r['shape']}: {r['layers']}, {r['input_size']}, {r['hidden']}, "
                     f"{'bi' if r['bidirectional'] else 'uni'}, {r['batch']}, {r['seq_len']}")
        else:
            where = str(r["hidden"])
        by.setdefault((where, r.get("dtype", "float32"), r["model"]), {})[r["mode"]] = r
    for (where, dtype, model), d in by.items():
        tr, inf = d["train"], d["inference"]
        lines.append(f"| {where} | {dtype} | {model} | {tr['median_ms']:.2f} | "
                     f"{tr['ratio_vs_nn_lstm']:.2f}× | {inf['median_ms']:.2f} | "
                     f"{inf['ratio_vs_nn_lstm']:.2f}× |"
                     + (f" {tr.get('ratio_vs_nn_lstm_graphed', float('nan')):.2f}× | "
                        f"{inf.get('ratio_vs_nn_lstm_graphed', float('nan')):.2f}× |"
                        if graphed else ""))
    return "\n".join(lines)


def _cuda_machine(device: str) -> Dict:
    return dict(gpu_info(device), cuda_graphs=get_cuda_graphs(),
                cuda_kernel=cuda_kernel_available())


def run(args) -> int:
    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"--threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    if args.device != "cpu":
        if not args.device.startswith("cuda") or not torch.cuda.is_available():
            raise ValueError(f"--device {args.device!r}: use 'cpu', or 'cuda' on a machine with a GPU")
        if args.clock != "wall":
            raise ValueError("--clock cpu measures CPU work; use the wall clock with --device cuda")
    for d in args.dtype:
        _dtype_setup(d, args.device)  # validates
        if args.device == "cpu" and d not in ("float32", "float64", "bfloat16",
                                               "autocast-bfloat16"):
            raise ValueError(f"--dtype {d}: on the CPU choose float32, float64, bfloat16 or "
                             "autocast-bfloat16 (float16 is timed on CUDA only)")
    if args.cuda_graphs is not None:
        set_cuda_graphs(args.cuda_graphs == "on")
    if args.cuda_recurrence is not None and args.device == "cpu":
        raise ValueError("--cuda-recurrence picks the CUDA recurrence; use it with --device cuda")
    shapes = EXPERIMENT_SHAPES if args.shapes == "experiments" else None
    if args.shape_names:
        if shapes is None:
            raise ValueError("--shape-names picks rows of --shapes experiments")
        known = {s[0] for s in EXPERIMENT_SHAPES}
        bad = [n for n in args.shape_names if n not in known]
        if bad:
            raise ValueError(f"unknown shape name(s) {bad}; choose from {sorted(known)}")
        shapes = [s for s in EXPERIMENT_SHAPES if s[0] in args.shape_names]
    cpu = cpu_info()
    machine = describe(cpu)
    cuda_info = None
    if args.device != "cpu":
        cuda_info = _cuda_machine(args.device)
        machine = (f"{cuda_info['gpu']} (CUDA {cuda_info['cuda']}, cuDNN {cuda_info['cudnn']}, "
                   f"CUDA graphs {'on' if cuda_info['cuda_graphs'] else 'off'}); host {machine}")
    if shapes is None:
        shape_text = (f"batch {args.batch}, seq_len {args.seq_len}, input = hidden, batch_first, "
                      f"1 layer, {', '.join(args.dtype)}")
    else:
        shape_text = ("the experiments' shapes (layers, d_in, H, bi, B, T), batch_first, "
                      f"{', '.join(args.dtype)}")
    rows: List[Dict] = []
    meta = {"machine": machine, "cpu": cpu, "device": args.device, "kernel": kernel_available(),
            "backend": get_backend(), "dtypes": list(args.dtype), "directions": args.directions,
            "cuda_recurrence": args.cuda_recurrence or get_cuda_recurrence(),
            "clock": args.clock, "threads": torch.get_num_threads(),
            "shapes": shape_text, "repeats": args.repeats, "rows": rows}
    if cuda_info is not None:
        meta["cuda_machine"] = cuda_info
    print(f"# speed vs torch.nn.LSTM ({meta['shapes']}; median of {args.repeats} interleaved rounds; "
          f"{args.clock} clock, {meta['threads']} thread(s))")
    print(f"# machine: {meta['machine']}; kernel: {meta['kernel']}")
    # one shape at a time, the files rewritten after each (a run cut off by a time limit keeps
    # the rows it measured; the Markdown says which dtypes are complete)
    parts = ([([h], None) for h in args.hidden] if shapes is None
             else [(args.hidden, [s]) for s in shapes])
    for d in args.dtype:
        for i, (hidden, part) in enumerate(parts):
            rows += measure(hidden, args.batch, args.seq_len, args.repeats, args.variants,
                            device=args.device, clock=args.clock, dtype=d, shapes=part,
                            directions=args.directions, warmup=args.warmup,
                            recurrence=args.cuda_recurrence or get_cuda_recurrence(),
                            isas=args.isas)
            if args.out:
                complete = list(args.dtype[:args.dtype.index(d) + (i == len(parts) - 1)])
                _write(args, meta, rows, complete == list(args.dtype), complete)
    print(format_table(rows))
    return 0


def _write(args, meta, rows, last: bool, complete: List[str]) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.name:
        stem = args.name
    elif args.device != "cpu":
        stem = f"speed_{args.device.replace(':', '')}"
    elif args.shapes == "experiments":
        stem = "speed_cpu_experiments"
    else:
        stem = f"speed_{args.clock}_{meta['threads']}t"
    meta = dict(meta, dtypes_done=complete)
    table = format_table(rows)
    (out / f"{stem}.json").write_text(json.dumps(meta, indent=2))
    (out / f"{stem}.md").write_text(
        f"machine: {meta['machine']}\n\nshapes: {meta['shapes']}; median of {args.repeats} "
        f"interleaved rounds (min-max in the JSON); {args.clock} clock, {meta['threads']} "
        f"thread(s); directions of bidirectional variants: {args.directions}"
        + ("" if last else f"; INCOMPLETE (cut off?): complete dtypes so far: "
                                   f"{', '.join(complete) or 'none'}") + f"\n\n{table}\n")
    if last:
        print(f"# wrote {out / (stem + '.json')} and {out / (stem + '.md')}")


def add_subparser(subparsers) -> None:
    p = subparsers.add_parser("speed", help="time every variant against torch.nn.LSTM",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hidden", type=int, nargs="+", default=[256, 650], help="hidden sizes (= input size)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--repeats", type=int, default=7, help="timed rounds (median reported)")
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), help="variants to time")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                   help="wall clock, or the process's CPU time (with --threads 1: robust to "
                        "other load on the machine)")
    p.add_argument("--device", default="cpu",
                   help="cpu (default) or cuda: on CUDA the variants run the CUDA kernel where "
                        "it is built (else the generic path, a Python loop over steps) against "
                        "cuDNN's nn.LSTM")
    p.add_argument("--dtype", nargs="+", default=["float32"], choices=DTYPES,
                   help="storage dtypes (model and input cast with .to; nn.LSTM in the same "
                        "dtype), or autocast-<dtype> (float32 model under torch.autocast); "
                        "half precision on CUDA only")
    p.add_argument("--shapes", choices=["standard", "experiments"], default="standard",
                   help="standard: one layer, input = hidden (--hidden, --batch, --seq-len); "
                        "experiments: the shapes of the experiments (PTB LMs, BiDAF, parser, "
                        "NMT encoder, DrQA)")
    p.add_argument("--shape-names", nargs="+", default=None,
                   help="with --shapes experiments: time only these rows (e.g. 'BiDAF phrase')")
    p.add_argument("--directions", choices=DIRECTIONS, default="auto",
                   help="bidirectional variants: auto (rnn_ablations.dispatch's policy: "
                        "concurrent directions with 2 threads), "
                        "sequential (one after the other), or both (each variant timed both "
                        "ways, in the same interleaved rounds)")
    p.add_argument("--isas", nargs="+", default=None,
                   help="CPU kernel vector paths to time each variant with (e.g. avx512 avx2: an "
                        "A/B in the same rounds, rows '<variant> [avx2]'); default: the one in use "
                        "(rnn_ablations.kernel_isa(); RNN_ABLATIONS_ISA)")
    p.add_argument("--warmup", type=int, default=2, help="untimed rounds first")
    p.add_argument("--cuda-graphs", choices=["on", "off"], default=None,
                   help="CUDA-graph replay of the CUDA kernel's step loop (default: "
                        "RNN_ABLATIONS_CUDA_GRAPHS, on)")
    p.add_argument("--cuda-recurrence", choices=RECURRENCES, default=None,
                   help="CUDA: the variants' forward on the step kernel (steps), the persistent "
                        "kernel (persistent), the policy's choice (auto; default: "
                        "RNN_ABLATIONS_CUDA_RECURRENCE, auto), or both (each variant also "
                        "timed as '<variant> [persistent]')")
    p.add_argument("--name", default=None,
                   help="file stem of the results (default speed_<clock>_<threads>t on the CPU, "
                        "speed_cpu_experiments with --shapes experiments, speed_cuda on CUDA)")
    p.add_argument("--out", default=None,
                   help="folder for <name>.{json,md}")
    p.set_defaults(func=run)
