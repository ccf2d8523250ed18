"""Speed of LSTM − S-RNN − HIDDEN (one input projection + element-wise scan) against
``torch.nn.LSTM`` of the same configuration, on the experiments' shapes (issue 11's table),
training (forward + backward of ``output.sum()``) and inference (``no_grad``), float32.

Every model is timed in interleaved rounds (each model once per round, so that a change in machine
load hits all alike); the table shows the median time and the ratio time(nn.LSTM) / time(model)
(> 1 = faster than nn.LSTM), with the spread of the per-round ratios.  Needs a quiet machine.

    .venv/bin/python benchmarks/speed_minus_hidden.py --threads 2
    .venv/bin/python benchmarks/speed_minus_hidden.py --threads 2 --variants lstm_minus_srnn_minus_hidden lstm_minus_srnn
    .venv/bin/python benchmarks/speed_minus_hidden.py --device cuda --shapes gpu

writes ``benchmarks/results/speed_minus_hidden[_<device>].{json,md}``.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from rnn_ablations import AblatedRNN, get_variant
from rnn_ablations.commands import speed as speed_cmd
from rnn_ablations.scan import scan_kernel_available

#: (name, layers, d_in, H, bidirectional, batch, seq_len): issue 11's experiment shapes, the same
#: table as ``rnn-ablations speed --shapes experiments``
EXPERIMENT_SHAPES = list(speed_cmd.EXPERIMENT_SHAPES)
#: issue 18's GPU target shapes (B = 32, T = 64, H = 256/650)
GPU_SHAPES = [
    ("single layer 256", 1, 256, 256, False, 32, 64),
    ("single layer 650", 1, 650, 650, False, 32, 64),
]
TINY_SHAPES = [("tiny", 2, 8, 6, True, 3, 5)]
SHAPES = {"experiments": EXPERIMENT_SHAPES, "gpu": GPU_SHAPES, "tiny": TINY_SHAPES}


def _machine(device: str) -> str:
    if device == "cuda":
        return f"{torch.cuda.get_device_name()}, torch {torch.__version__}"
    return speed_cmd._machine()


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def measure(shapes, variants, repeats: int, warmup: int, device: str):
    rows = []
    for name, layers, d_in, H, bi, B, T in shapes:
        torch.manual_seed(0)
        models = {"nn.LSTM": torch.nn.LSTM(d_in, H, num_layers=layers, bidirectional=bi,
                                           batch_first=True)}
        for v in variants:
            models[v] = AblatedRNN(v, d_in, H, num_layers=layers, bidirectional=bi,
                                   batch_first=True)
        models = {k: m.to(device) for k, m in models.items()}
        x = torch.randn(B, T, d_in, device=device, requires_grad=True)
        times = {(k, mode): [] for k in models for mode in ("train", "inference")}

        def train(m):
            m(x)[0].sum().backward()

        def infer(m):
            with torch.no_grad():
                m(x)

        for r in range(warmup + repeats):
            for k, m in models.items():
                for mode, step in (("train", train), ("inference", infer)):
                    _sync(device)
                    t0 = time.perf_counter()
                    step(m)
                    _sync(device)
                    if r >= warmup:
                        times[(k, mode)].append(time.perf_counter() - t0)
        for mode in ("train", "inference"):
            ref = times[("nn.LSTM", mode)]
            for k in models:
                ts = times[(k, mode)]
                ratios = [a / b for a, b in zip(ref, ts)]
                rows.append({"shape": name, "layers": layers, "d_in": d_in, "hidden": H,
                             "bidirectional": bi, "batch": B, "seq_len": T, "model": k,
                             "mode": mode, "median_ms": 1e3 * statistics.median(ts),
                             "ratio_vs_nn_lstm": statistics.median(ref) / statistics.median(ts),
                             "ratio_min": min(ratios), "ratio_max": max(ratios)})
        print(f"  done: {name}", file=sys.stderr, flush=True)
    return rows


def format_table(rows, variants) -> str:
    head = ["shape (layers, d_in, H, bi, B, T)"]
    for v in variants:
        head += [f"{v} train", f"{v} infer"]
    head += ["nn.LSTM train ms", "nn.LSTM infer ms"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    by = {(r["shape"], r["model"], r["mode"]): r for r in rows}
    for shape in dict.fromkeys(r["shape"] for r in rows):
        r0 = by[(shape, "nn.LSTM", "train")]
        cells = [f"{shape}: {r0['layers']}, {r0['d_in']}, {r0['hidden']}, "
                 f"{'bi' if r0['bidirectional'] else 'uni'}, {r0['batch']}, {r0['seq_len']}"]
        for v in variants:
            for mode in ("train", "inference"):
                r = by[(shape, v, mode)]
                cells.append(f"{r['ratio_vs_nn_lstm']:.2f}× ({r['ratio_min']:.2f}–{r['ratio_max']:.2f})")
        cells += [f"{by[(shape, 'nn.LSTM', m)]['median_ms']:.1f}" for m in ("train", "inference")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", choices=sorted(SHAPES), default="experiments")
    p.add_argument("--variants", nargs="+", default=["lstm_minus_srnn_minus_hidden"])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    args = p.parse_args(argv)
    if args.threads < 1 or args.repeats < 1 or args.warmup < 0:
        p.error("--threads and --repeats must be >= 1, --warmup >= 0")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device is visible")
    variants = [get_variant(v).name for v in args.variants]
    torch.set_num_threads(args.threads)
    machine = _machine(args.device)
    kernel = scan_kernel_available(args.device)
    print(f"{machine}; scan kernel {'compiled' if kernel else 'NOT available (generic path)'}",
          flush=True)
    rows = measure(SHAPES[args.shapes], variants, args.repeats, args.warmup, args.device)
    table = format_table(rows, variants)
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = "speed_minus_hidden" + ("" if args.device == "cpu" else f"_{args.device}")
    if args.shapes == "tiny":
        stem += "_tiny"
    meta = {"machine": machine, "scan_kernel": kernel, "threads": args.threads,
            "repeats": args.repeats, "shapes": args.shapes, "rows": rows}
    (args.out / f"{stem}.json").write_text(json.dumps(meta, indent=1))
    (args.out / f"{stem}.md").write_text(f"{machine}; ratio = time(nn.LSTM) / time(model), "
                                         f"median of {args.repeats} interleaved rounds "
                                         f"(min–max of the per-round ratios)\n\n{table}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
