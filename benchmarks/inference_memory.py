#!/usr/bin/env python
"""Peak memory of a no-gradient forward (inference) on the CPU: every model against
``torch.nn.LSTM`` of the same configuration, each call measured in a fresh process.

    python benchmarks/inference_memory.py        # the shapes below; lstm, ran and -HIDDEN; float32, bfloat16
    python benchmarks/inference_memory.py --models lstm --shapes 1000,1000,64,64,1,uni --dtypes float32

What one measurement is: a child process builds the model and the input (time-major, in the
row's dtype: a bfloat16 row compares with ``nn.LSTM`` in bfloat16),
runs one untimed forward on a small slice (so that lazy set-up such as the kernel's load is not
counted), then runs the forward under ``torch.no_grad()`` through
:func:`rnn_ablations.commands.machine.call_peak_memory`: the process's peak resident size during
the call (Linux's ``VmHWM``, reset just before it) minus its resident size before it, the
call's peak memory (its output included).
The median over ``--repeats`` processes is reported.

Prints a table and writes ``OUT/inference_memory_<cpu-name>.{json,md}`` (``--out``, default
``benchmarks/results``), the CPU name from :func:`rnn_ablations.commands.machine.describe`.
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _alternating import write_results  # noqa: E402

#: (T, B, d_in, H, layers, "uni"|"bi")
SHAPES = [(1000, 1000, 64, 64, 1, "uni"), (16, 100_000, 64, 64, 1, "uni"),
          (200, 64, 512, 512, 2, "bi")]

_CHILD = r"""
import sys, torch
from rnn_ablations import AblatedRNN
from rnn_ablations.commands.machine import call_peak_memory
T, B, D, H, L, bi, model, threads, dtype = sys.argv[1:10]
T, B, D, H, L, threads = int(T), int(B), int(D), int(H), int(L), int(threads)
dtype = getattr(torch, dtype)
torch.set_num_threads(threads)
torch.manual_seed(0)
cfg = dict(num_layers=L, bidirectional=bi == "bi")
if model == "nn.LSTM":
    m = torch.nn.LSTM(D, H, **cfg)
else:
    m = AblatedRNN(model, D, H, **cfg)
m = m.to(dtype)
x = torch.randn(T, B, D).to(dtype)
with torch.no_grad():
    m(x[:2, :2])
with torch.no_grad():
    print("PEAK_BYTES", call_peak_memory(lambda: m(x)))
"""


def measure(shape, model: str, threads: int, repeats: int, dtype: str = "float32") -> dict:
    """Median peak bytes of ``repeats`` child processes (see the module docstring)."""
    T, B, D, H, L, bi = shape
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    values = []
    for _ in range(repeats):
        res = subprocess.run([sys.executable, "-c", _CHILD, str(T), str(B), str(D), str(H),
                              str(L), bi, model, str(threads), dtype], capture_output=True,
                             text=True,
                             env=env, cwd=str(ROOT))
        found = re.search(r"PEAK_BYTES (\d+)", res.stdout)
        if res.returncode != 0 or not found:
            raise RuntimeError(f"inference_memory: the child for {model} {shape} {dtype} failed:\n"
                               f"{res.stdout}\n{res.stderr}")
        values.append(int(found.group(1)))
    return {"median_mb": round(statistics.median(values) / 2**20, 1),
            "min_mb": round(min(values) / 2**20, 1), "max_mb": round(max(values) / 2**20, 1)}


def _shape(text: str):
    parts = text.split(",")
    if len(parts) != 6 or parts[5] not in ("uni", "bi"):
        raise argparse.ArgumentTypeError(f"--shapes {text!r}: give T,B,d_in,H,layers,uni|bi, "
                                         "e.g. 1000,1000,64,64,1,uni")
    try:
        nums = [int(p) for p in parts[:5]]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shapes {text!r}: T, B, d_in, H and layers must be "
                                         "integers") from None
    if min(nums) < 1:
        raise argparse.ArgumentTypeError(f"--shapes {text!r}: every size must be >= 1")
    return (*nums, parts[5])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+",
                   default=["lstm", "ran", "lstm_minus_srnn_minus_hidden"],
                   help="variants of rnn_ablations (nn.LSTM is always measured)")
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"],
                   choices=["float32", "float64", "bfloat16"],
                   help="dtypes of the model and input (nn.LSTM in the same dtype)")
    p.add_argument("--shapes", nargs="+", type=_shape, default=SHAPES,
                   help="T,B,d_in,H,layers,uni|bi (default: the three shapes of the module)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    p.add_argument("--name", default=None, help="file name stem (default: "
                   "inference_memory_<cpu-name>)")
    args = p.parse_args(argv)
    if args.threads < 1 or args.repeats < 1:
        p.error("--threads and --repeats must be >= 1")
    from rnn_ablations.variants import VARIANTS
    for m in args.models:
        if m not in VARIANTS:
            p.error(f"--models {m!r}: not a variant; choose from {', '.join(VARIANTS)}")
    rows = []
    for shape in args.shapes:
        for dtype in args.dtypes:
            base = measure(shape, "nn.LSTM", args.threads, args.repeats, dtype)
            rows.append({"shape": list(shape), "dtype": dtype, "model": "nn.LSTM", **base,
                         "ratio_vs_nn_lstm": 1.0})
            print(f"{shape}  {dtype}  nn.LSTM  {base['median_mb']:.1f} MB", flush=True)
            for m in args.models:
                r = measure(shape, m, args.threads, args.repeats, dtype)
                ratio = round(r["median_mb"] / max(base["median_mb"], 1e-9), 3)
                rows.append({"shape": list(shape), "dtype": dtype, "model": m, **r,
                             "ratio_vs_nn_lstm": ratio})
                print(f"{shape}  {dtype}  {m}  {r['median_mb']:.1f} MB  ({ratio:.2f}x nn.LSTM)",
                      flush=True)
    from rnn_ablations.commands.machine import cpu_file_name, describe
    name = args.name or f"inference_memory_{cpu_file_name()}"
    meta = {"command": "python benchmarks/inference_memory.py " + " ".join(argv or sys.argv[1:]),
            "machine": describe(), "threads": args.threads, "repeats": args.repeats,
            "measure": "peak RSS of the no-grad forward (VmHWM after a reset) minus RSS before "
                       "it, one process per measurement, median of the repeats",
            "shape_fields": ["T", "B", "d_in", "H", "layers", "directions"]}
    lines = [f"# Inference peak memory (no_grad forward), {args.threads} thread(s), median of "
             f"{args.repeats} processes", "", f"Machine: {meta['machine']}. Command: "
             f"`{meta['command']}`. Peak: the high-water mark of the process during the call "
             "minus its resident size before it.", "",
             "| T, B, d_in, H, layers, dirs | dtype | model | peak MB | × nn.LSTM |",
             "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {', '.join(map(str, r['shape']))} | {r['dtype']} | {r['model']} | "
                     f"{r['median_mb']:.1f} | {r['ratio_vs_nn_lstm']:.2f} |")
    write_results(args.out, name, meta, rows, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
