"""Training speed on variable-length batches, as BiDAF and DrQA train: a new sequence length T
every batch, forward + backward + optimizer step, every variant against ``torch.nn.LSTM`` (cuDNN
on a GPU) in the same loop.

    python3 benchmarks/speed_variable_length.py --device cuda
        # the BiDAF phrase, BiDAF modeling and DrQA layers; ran, lstm, lstm_minus_srnn and
        # lstm_minus_srnn_minus_hidden against nn.LSTM; float32 and bfloat16; writes
        # benchmarks/results/speed_cuda_variable_length_<gpu>.{json,md}
    python3 benchmarks/speed_variable_length.py --device cpu --shape-spec tiny:1:8:8:bi:4 \\
        --median-length 12 --max-length 30 --batches 3 --out /tmp/x     # a check without a GPU

The lengths: SQuAD-like paragraph lengths in tokens (the passages BiDAF and DrQA read), drawn
from a log-normal distribution (median --median-length 124, sigma --sigma 0.45: mean about 137,
95th percentile about 260), cut to [--min-length, --max-length] (400: BiDAF's training limit on
passage length).  They are bucketed as AllenNLP's bucket iterator and DrQA's sorted sampler do:
the drawn lengths sorted (with 10 % padding noise), cut into batches, the batches shuffled.  So a
batch holds similar lengths, padded to its longest (T), and T changes from batch to batch: a
step the package's CUDA graphs capture only on a shape's second sighting runs eagerly almost
always, which is what this benchmark measures.

Every batch is a PackedSequence (as AllenNLP's encoders wrap them) of a fresh input that requires
a gradient (the layer sits inside a model); the loss is the mean square of the output; each model
has its own Adam optimizer (lr 1e-3; BiDAF trains with Adadelta and DrQA with Adamax, steps of
the same cost).  Within a batch the models run one after the other, in an order that rotates
from batch to batch, each timed on its own (the GPU synchronised before and after); a model's
time is the sum over the timed batches, and ``ratio_vs_nn_lstm = time(nn.LSTM) / time(model)``
(> 1: faster than nn.LSTM).

The JSON records the GPU, torch, CUDA and cuDNN versions, the command, the lengths, and for
every model the package's operators that a probe step (outside the timing) called: on CUDA,
``cuda_kernels_in_use`` is true only when every variant ran the package's CUDA kernels (not its
generic PyTorch path).  ``--require-cuda-kernels`` stops before timing when they are not.
The files are rewritten after each (shape, dtype) cell; a run cut by --time-budget says which
cells are done.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import re
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch.nn.utils.rnn import pack_padded_sequence
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import rnn_ablations as ra  # noqa: E402
from rnn_ablations.commands.speed import EXPERIMENT_SHAPES  # noqa: E402
from rnn_ablations.variants import get_variant  # noqa: E402

#: the recurrent layers of the experiments that read paragraphs (name, layers, input size,
#: hidden, bidirectional, batch), from rnn_ablations.commands.speed.EXPERIMENT_SHAPES
SHAPE_NAMES = ("BiDAF phrase", "BiDAF modeling", "DrQA")
SHAPES = {s[0]: s[1:6] for s in EXPERIMENT_SHAPES if s[0] in SHAPE_NAMES}
DEFAULT_VARIANTS = ("ran", "lstm", "lstm_minus_srnn", "lstm_minus_srnn_minus_hidden")
DTYPES = ("float32", "bfloat16", "float16", "float64")
BASELINE = "nn.LSTM"
RESULTS = Path(__file__).resolve().parent / "results"


# ------------------------------------------------------------------------------ lengths
def batch_lengths(n_batches: int, batch: int, median: float, sigma: float, lo: int, hi: int,
                  seed: int) -> List[List[int]]:
    """``n_batches`` lists of ``batch`` lengths: log-normal draws cut to [lo, hi], bucketed (sorted
    with 10 % noise, cut into batches, the batches shuffled)."""
    rng = random.Random(seed)
    pool = [min(hi, max(lo, round(rng.lognormvariate(math.log(median), sigma))))
            for _ in range(n_batches * batch)]
    noisy = sorted(pool, key=lambda n: n * (1 + rng.uniform(-0.1, 0.1)))
    batches = [noisy[i * batch:(i + 1) * batch] for i in range(n_batches)]
    rng.shuffle(batches)
    return batches


# ------------------------------------------------------------------------------ which code ran
class _PackageOps(TorchDispatchMode):
    """Records the package's own operators (namespace ``rnn_ablations``) that run inside it."""

    def __init__(self):
        super().__init__()
        self.ops = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if getattr(func, "namespace", None) == "rnn_ablations":
            self.ops.add(func.__name__.split(".")[0])
        return func(*args, **(kwargs or {}))


def _train_step(model, opt, x, lengths):
    packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
    out, _ = model(packed)
    loss = out.data.float().square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    x.grad = None


def _graph_stats() -> Optional[Dict[str, int]]:
    try:
        from rnn_ablations.kernels.cuda.graphs import graph_stats
    except ImportError:
        try:
            from rnn_ablations.kernels.cuda.graphs import graph_stats
        except ImportError:
            return None
    return graph_stats()


# ------------------------------------------------------------------------------ one cell
class KernelsNotInUse(RuntimeError):
    """A variant ran none of the package's operators (the generic path) where they were required."""


def measure_cell(name: str, shape: Tuple, dtype: str, variants: Sequence[str], device: str,
                 lengths: List[List[int]], warmup: int, seed: int = 0,
                 require_kernels: bool = False) -> Tuple[List[Dict], Dict]:
    """Rows of one (shape, dtype) cell and what each model's probe step called (the package's
    operators).  ``require_kernels``: raise :class:`KernelsNotInUse` before timing when a variant
    called none."""
    layers, d_in, hidden, bidirectional, batch = shape
    dt = getattr(torch, dtype)
    cfg = dict(num_layers=layers, bidirectional=bidirectional, batch_first=True)
    torch.manual_seed(seed)
    models = {BASELINE: torch.nn.LSTM(d_in, hidden, **cfg)}
    for v in variants:
        models[v] = ra.AblatedRNN(v, d_in, hidden, **cfg)
    models = {k: m.to(device=device, dtype=dt) for k, m in models.items()}
    opts = {k: torch.optim.Adam(m.parameters(), lr=1e-3) for k, m in models.items()}
    gen = torch.Generator().manual_seed(seed + 1)
    inputs = []
    for lens in lengths:
        x = torch.randn(len(lens), max(lens), d_in, generator=gen).to(device=device, dtype=dt)
        inputs.append((x.requires_grad_(), torch.tensor(lens)))

    def sync():
        if device != "cpu":
            torch.cuda.synchronize()

    # the probe: one step of each model (untimed) under the recording mode
    probe = {}
    for k, m in models.items():
        rec = _PackageOps()
        with rec:
            _train_step(m, opts[k], *inputs[0])
        probe[k] = sorted(rec.ops)
    sync()
    missing = [v for v in variants if not probe[v]]
    if require_kernels and missing:
        raise KernelsNotInUse(f"{name} {dtype}: {missing} ran no operator of the package (the "
                              "generic PyTorch path)")
    names = list(models)
    times = {k: [] for k in names}
    graph_calls = {k: {"replays": 0, "eager": 0} for k in names}
    tokens = 0
    for i, (x, lens) in enumerate(inputs):
        timed = i >= warmup
        tokens += int(lens.sum()) if timed else 0
        order = names[i % len(names):] + names[:i % len(names)]
        for k in order:
            before = _graph_stats() if device != "cpu" else None
            sync()
            t0 = time.perf_counter()
            _train_step(models[k], opts[k], x, lens)
            sync()
            elapsed = time.perf_counter() - t0
            if timed:
                times[k].append(elapsed)
                if before is not None:
                    after = _graph_stats()
                    for key in ("replays", "eager"):
                        graph_calls[k][key] += after.get(key, 0) - before.get(key, 0)
    timed_t = [max(lens) for lens in lengths[warmup:]]
    base = sum(times[BASELINE])
    rows = []
    for k in names:
        total = sum(times[k])
        row = {"shape": name, "layers": layers, "input_size": d_in, "hidden": hidden,
               "bidirectional": bidirectional, "batch": batch, "model": k, "dtype": dtype,
               "ratio_vs_nn_lstm": round(base / total, 3), "seconds": round(total, 6),
               "ms_per_batch": round(1e3 * total / len(times[k]), 3),
               "median_ms": round(1e3 * statistics.median(times[k]), 3),
               "tokens_per_s": round(tokens / total, 1), "batches": len(times[k]),
               "T_min": min(timed_t), "T_max": max(timed_t),
               "distinct_T": len(set(timed_t)), "package_ops": probe[k]}
        if device != "cpu" and k != BASELINE:
            row["cuda_graph_calls"] = graph_calls[k]
        rows.append(row)
    return rows, probe


# ------------------------------------------------------------------------------ files
def _gpu_slug(gpu: str) -> str:
    m = re.search(r"\b([A-Z]{1,2}\d{2,4}[A-Z]?)\b", gpu.replace("NVIDIA", ""))
    return (m.group(1) if m else re.sub(r"[^a-z0-9]+", "_", gpu.lower()).strip("_")).lower()


def format_table(rows: List[Dict]) -> str:
    lines = ["| shape (layers, d_in, H, bi, B) | T (min-max, distinct) | model | dtype | "
             "ratio_vs_nn_lstm | ms / batch | tokens / s |",
             "|---|---|---|---|---:|---:|---:|"]
    for r in rows:
        shape = (f"{r['shape']}: {r['layers']}, {r['input_size']}, {r['hidden']}, "
                 f"{'bi' if r['bidirectional'] else 'uni'}, {r['batch']}")
        lines.append(f"| {shape} | {r['T_min']}-{r['T_max']}, {r['distinct_T']} | {r['model']} | "
                     f"{r['dtype']} | {r['ratio_vs_nn_lstm']:.2f}× | {r['ms_per_batch']:.2f} | "
                     f"{r['tokens_per_s']:.0f} |")
    return "\n".join(lines)


def _write(out: Path, stem: str, meta: Dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f"{stem}.json.tmp"
    tmp.write_text(json.dumps(meta, indent=2, allow_nan=False) + "\n")
    tmp.replace(out / f"{stem}.json")
    dev = meta["device_info"]
    where = (f"{dev['gpu']}, torch {dev['torch']}, CUDA {dev['cuda']}, cuDNN {dev['cudnn']}"
             if dev.get("gpu") else f"CPU: {dev['cpu']}")
    used = meta["cuda_kernels_in_use"]
    kernels = ("the package's CUDA kernels in use for every variant" if used else
               "the package's CUDA kernels NOT in use for every variant (see package_ops in the "
               "JSON)" if used is False else "CPU run (the package's CPU kernel where it applies)")
    lengths = meta["lengths"]
    done = meta["cells_done"]
    text = (f"Training speed on variable-length batches (forward + backward + Adam step, a new T "
            f"every batch) against torch.nn.LSTM in the same loop: {where}; {kernels}.\n\n"
            f"Lengths: log-normal, median {lengths['median']:g}, sigma {lengths['sigma']:g}, cut "
            f"to [{lengths['min']}, {lengths['max']}], bucketed (sorted with 10 % noise, batches "
            f"shuffled); {meta['batches']} timed batches after {meta['warmup']} untimed, the "
            f"models in a rotating order; ratio_vs_nn_lstm = time(nn.LSTM) / time(model), summed "
            f"over the timed batches (> 1: faster).\n\n"
            + ("" if meta["complete"] else
               f"INCOMPLETE (cut by --time-budget): cells done: "
               f"{', '.join(f'{s} {d}' for s, d in done) or 'none'}\n\n")
            + f"Command: `{meta['command']}`\n\n{format_table(meta['rows'])}\n")
    (out / f"{stem}.md").write_text(text)


# ------------------------------------------------------------------------------ command line
def _parse_spec(spec: str) -> Tuple[str, Tuple]:
    parts = spec.split(":")
    if len(parts) != 6 or parts[4] not in ("bi", "uni"):
        raise ValueError(f"--shape-spec {spec!r}: give NAME:LAYERS:INPUT:HIDDEN:bi|uni:BATCH, "
                         "e.g. tiny:1:8:8:bi:4")
    try:
        layers, d_in, hidden, batch = (int(parts[i]) for i in (1, 2, 3, 5))
    except ValueError:
        raise ValueError(f"--shape-spec {spec!r}: LAYERS, INPUT, HIDDEN and BATCH must be "
                         "whole numbers") from None
    if min(layers, d_in, hidden, batch) < 1:
        raise ValueError(f"--shape-spec {spec!r}: LAYERS, INPUT, HIDDEN and BATCH must be >= 1")
    return parts[0], (layers, d_in, hidden, parts[4] == "bi", batch)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu (a check)")
    ap.add_argument("--shapes", nargs="+", default=list(SHAPE_NAMES), metavar="NAME",
                    help=f"layers to time, of {', '.join(SHAPE_NAMES)}")
    ap.add_argument("--shape-spec", action="append", default=None, metavar="SPEC",
                    help="a layer of your own, NAME:LAYERS:INPUT:HIDDEN:bi|uni:BATCH (repeatable; "
                         "replaces --shapes)")
    ap.add_argument("--variants", nargs="+", default=list(DEFAULT_VARIANTS))
    ap.add_argument("--dtype", nargs="+", default=["float32", "bfloat16"], choices=DTYPES)
    ap.add_argument("--batches", type=int, default=30, help="timed batches per cell (30)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed batches first (3)")
    ap.add_argument("--median-length", type=float, default=124.0)
    ap.add_argument("--sigma", type=float, default=0.45)
    ap.add_argument("--min-length", type=int, default=20)
    ap.add_argument("--max-length", type=int, default=400)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--time-budget", type=float, default=None, metavar="SECONDS",
                    help="start no new cell after this many seconds (the files say which are done)")
    ap.add_argument("--require-cuda-kernels", action="store_true",
                    help="on CUDA, stop (exit 3) before timing when a variant does not run the "
                         "package's CUDA kernels")
    ap.add_argument("--out", type=Path, default=RESULTS, help="folder of the results")
    ap.add_argument("--name", default=None, help="file stem (default "
                    "speed_cuda_variable_length_<gpu>, or speed_cpu_variable_length)")
    args = ap.parse_args(argv)

    if args.device != "cpu" and not (args.device.startswith("cuda") and torch.cuda.is_available()):
        ap.error(f"--device {args.device}: torch {torch.__version__} sees no CUDA device; use "
                 "--device cpu for a check")
    for opt in ("batches", "min_length"):
        if getattr(args, opt) < 1:
            ap.error(f"--{opt.replace('_', '-')} must be >= 1, got {getattr(args, opt)}")
    if args.device == "cpu" and "float16" in args.dtype:
        ap.error("--dtype float16 is timed on CUDA only (nn.LSTM has no float16 CPU kernel)")
    if args.warmup < 0:
        ap.error(f"--warmup must be >= 0, got {args.warmup}")
    if args.max_length < args.min_length:
        ap.error(f"--max-length {args.max_length} is below --min-length {args.min_length}")
    if not (args.median_length > 0 and args.sigma >= 0):
        ap.error("--median-length must be > 0 and --sigma >= 0")
    try:
        variants = [get_variant(v).name for v in args.variants]
        if args.shape_spec:
            shapes = dict(_parse_spec(s) for s in args.shape_spec)
        else:
            bad = [s for s in args.shapes if s not in SHAPES]
            if bad:
                raise ValueError(f"unknown shape(s) {bad}; choose from {list(SHAPES)} or give "
                                 "--shape-spec")
            shapes = {s: SHAPES[s] for s in args.shapes}
    except ValueError as exc:
        ap.error(str(exc))

    from rnn_ablations.commands.machine import cpu_info, describe, gpu_info
    cuda = args.device != "cpu"
    info = dict(gpu_info(args.device)) if cuda else {"torch": torch.__version__}
    info["cpu"] = describe(cpu_info())
    stem = args.name or (f"speed_cuda_variable_length_{_gpu_slug(info['gpu'])}" if cuda
                         else "speed_cpu_variable_length")
    meta = {"command": "python3 benchmarks/speed_variable_length.py " + shlex.join(
                sys.argv[1:] if argv is None else list(argv)),
            "device": args.device, "device_info": info,
            "cuda_kernel_available": bool(ra.cuda_kernel_available()) if cuda else None,
            "cuda_kernels_in_use": None, "package_ops": {},
            "lengths": {"distribution": "log-normal, bucketed", "median": args.median_length,
                        "sigma": args.sigma, "min": args.min_length, "max": args.max_length,
                        "seed": args.seed},
            "batches": args.batches, "warmup": args.warmup, "optimizer": "Adam(lr=1e-3)",
            "loss": "mean square of the packed output", "dtypes": list(args.dtype),
            "variants": variants, "cells_done": [], "complete": False, "rows": []}
    print(f"# {meta['command']}\n# {info}")
    t_start = time.perf_counter()
    cells = [(s, d) for d in args.dtype for s in shapes]
    for ci, (sname, dtype) in enumerate(cells):
        if args.time_budget is not None and time.perf_counter() - t_start > args.time_budget:
            print(f"# time budget of {args.time_budget:g} s spent: {len(cells) - ci} cell(s) not run")
            break
        shape = shapes[sname]
        lengths = batch_lengths(args.warmup + args.batches, shape[4], args.median_length,
                                args.sigma, args.min_length, args.max_length, args.seed)
        try:
            rows, probe = measure_cell(sname, shape, dtype, variants, args.device, lengths,
                                       args.warmup, args.seed, cuda and args.require_cuda_kernels)
        except KernelsNotInUse as exc:
            print(f"# --require-cuda-kernels: {exc}; stopping before the timings")
            return 3
        meta["package_ops"][f"{sname} {dtype}"] = probe
        if cuda:
            # the package's CUDA kernels ran when every variant called an operator of the package
            used = all(probe[v] for v in variants)
            meta["cuda_kernels_in_use"] = used and meta["cuda_kernels_in_use"] is not False
            if not used:
                missing = [v for v in variants if not probe[v]]
                print(f"# WARNING: {sname} {dtype}: {missing} ran no operator of the package: "
                      "the generic PyTorch path, not the package's CUDA kernels")
        meta["rows"] += rows
        meta["cells_done"].append([sname, dtype])
        meta["complete"] = len(meta["cells_done"]) == len(cells)
        _write(args.out, stem, meta)
        for r in rows:
            print(f"{sname:15s} {dtype:9s} {r['model']:30s} {r['ratio_vs_nn_lstm']:6.2f}x "
                  f"{r['ms_per_batch']:9.2f} ms/batch  T {r['T_min']}-{r['T_max']}", flush=True)
    if not meta["cells_done"]:
        print("# no cell was measured: nothing written")
        return 1
    print(f"# wrote {args.out / (stem + '.json')} and .md in {time.perf_counter() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
