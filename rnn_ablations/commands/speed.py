"""``rnn-ablations speed``: throughput of every variant as a ratio to ``torch.nn.LSTM``.

All models are timed in the same process, in interleaved rounds (every model once per round, so
that a change in machine load hits all of them alike); the reported time is the median over
rounds and the ratio is ``time(nn.LSTM) / time(variant)`` (> 1 = faster than nn.LSTM).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Dict, List, Sequence

import torch

from ..dispatch import get_backend, kernel_available
from ..rnn import AblatedRNN
from ..variants import VARIANTS, get_variant

__all__ = ["measure", "format_table", "add_subparser"]


def _machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return (f"{cpu}, {os.cpu_count()} cores, torch {torch.__version__} "
            f"({torch.get_num_threads()} threads, CPU capability {torch.backends.cpu.get_cpu_capability()})")


def measure(hidden_sizes: Sequence[int] = (256, 650), batch: int = 32, seq_len: int = 64,
            repeats: int = 7, variants: Sequence[str] = VARIANTS, warmup: int = 2,
            device: str = "cpu", clock: str = "wall") -> List[Dict]:
    """Rows ``{hidden, model, mode, median_ms, ratio_vs_nn_lstm}`` for mode in {train, inference}.

    train = forward + backward of ``output.sum()``; inference = forward under ``no_grad``.
    Shapes: input (batch, seq_len, hidden), ``batch_first=True``, one layer, float32.
    ``clock="cpu"`` times with the process's CPU time instead of the wall clock: with one thread
    (``torch.set_num_threads(1)``) that is the work done, whatever else loads the machine.
    """
    if clock not in ("wall", "cpu"):
        raise ValueError(f"clock must be 'wall' or 'cpu', got {clock!r}")
    if clock == "cpu" and torch.get_num_threads() != 1:
        raise ValueError("clock='cpu' measures work only with one thread: use --threads 1")
    timer = time.perf_counter if clock == "wall" else time.process_time
    for name, v in (("batch", batch), ("seq_len", seq_len), ("repeats", repeats)):
        if v < 1:
            raise ValueError(f"{name} must be >= 1, got {v}")
    if any(h < 1 for h in hidden_sizes):
        raise ValueError(f"hidden sizes must be >= 1, got {list(hidden_sizes)}")
    variants = [get_variant(v).name for v in variants]
    rows = []
    for hidden in hidden_sizes:
        torch.manual_seed(0)
        models = {"nn.LSTM": torch.nn.LSTM(hidden, hidden, batch_first=True)}
        for v in variants:
            models[v] = AblatedRNN(v, hidden, hidden, batch_first=True)
        models = {k: m.to(device) for k, m in models.items()}
        x = torch.randn(batch, seq_len, hidden, device=device, requires_grad=True)
        times = {(k, mode): [] for k in models for mode in ("train", "inference")}

        def train_step(m):
            out, _ = m(x)
            out.sum().backward()

        def infer_step(m):
            with torch.no_grad():
                m(x)

        for r in range(warmup + repeats):
            for k, m in models.items():
                for mode, fn in (("train", train_step), ("inference", infer_step)):
                    if device != "cpu":
                        torch.cuda.synchronize()
                    t0 = timer()
                    fn(m)
                    if device != "cpu":
                        torch.cuda.synchronize()
                    if r >= warmup:
                        times[(k, mode)].append(timer() - t0)
                m.zero_grad(set_to_none=True)
                x.grad = None
        for mode in ("train", "inference"):
            base = statistics.median(times[("nn.LSTM", mode)])
            for k in models:
                med = statistics.median(times[(k, mode)])
                rows.append({"hidden": hidden, "batch": batch, "seq_len": seq_len, "model": k,
                             "mode": mode, "median_ms": round(med * 1e3, 2),
                             "ratio_vs_nn_lstm": round(base / med, 3), "repeats": repeats})
    return rows


def format_table(rows: List[Dict]) -> str:
    lines = ["| hidden | model | train (fwd+bwd) ms | train ratio | inference ms | inference ratio |",
             "|---|---|---|---|---|---|"]
    by = {}
    for r in rows:
        by.setdefault((r["hidden"], r["model"]), {})[r["mode"]] = r
    for (hidden, model), d in by.items():
        tr, inf = d["train"], d["inference"]
        lines.append(f"| {hidden} | {model} | {tr['median_ms']:.1f} | {tr['ratio_vs_nn_lstm']:.2f}× | "
                     f"{inf['median_ms']:.1f} | {inf['ratio_vs_nn_lstm']:.2f}× |")
    return "\n".join(lines)


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
    rows = measure(args.hidden, args.batch, args.seq_len, args.repeats, args.variants,
                   device=args.device, clock=args.clock)
    machine = _machine()
    if args.device != "cpu":
        machine = f"{torch.cuda.get_device_name(torch.device(args.device))}; host {machine}"
    meta = {"machine": machine, "device": args.device, "kernel": kernel_available(),
            "backend": get_backend(),
            "clock": args.clock, "threads": torch.get_num_threads(),
            "shapes": f"batch {args.batch}, seq_len {args.seq_len}, input = hidden, batch_first, "
                      "1 layer, float32", "repeats": args.repeats, "rows": rows}
    table = format_table(rows)
    print(f"# speed vs torch.nn.LSTM ({meta['shapes']}; median of {args.repeats} interleaved rounds; "
          f"{args.clock} clock, {meta['threads']} thread(s))")
    print(f"# machine: {meta['machine']}; fused kernel: {meta['kernel']}")
    print(table)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        stem = (f"speed_{args.clock}_{meta['threads']}t" if args.device == "cpu"
                else f"speed_{args.device.replace(':', '')}")
        (out / f"{stem}.json").write_text(json.dumps(meta, indent=2))
        (out / f"{stem}.md").write_text(
            f"machine: {meta['machine']}\n\nshapes: {meta['shapes']}; median of {args.repeats} "
            f"interleaved rounds; {args.clock} clock, {meta['threads']} thread(s)\n\n{table}\n")
        print(f"# wrote {out / (stem + '.json')} and {out / (stem + '.md')}")
    return 0


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
    p.add_argument("--out", default=None,
                   help="folder for speed_<clock>_<threads>t.{json,md} (speed_cuda.* on CUDA)")
    p.set_defaults(func=run)
