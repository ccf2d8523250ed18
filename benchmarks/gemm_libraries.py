#!/usr/bin/env python
"""MKL (``torch.mm``) against oneDNN (``mkldnn._linear_pointwise``) on the all-steps products a
layer computes besides its recurrence: the input projection x W^T, the input gradient g W and the
weight gradient g^T x, at the experiments' sizes (rows = T·B), 2 threads, median of 21 calls.

    python benchmarks/gemm_libraries.py --out benchmarks/results

These are the products that ``nn.LSTM`` computes too (``benchmarks/profile_cpu.py`` puts them at
36–72 % of a layer's CPU time); ``rnn_ablations/projection.py`` takes oneDNN for the projection
above a weight size.  Prints and writes ``OUT/gemm_libraries.{json,md}``.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

#: (H, d_in, rows): single layer 256 / 650 (B = 32, T = 64), PTB medium (20 × 35), parser
#: (32 × 25), NMT encoder (64 × 30)
SHAPES = [(256, 256, 2048), (650, 650, 2048), (650, 650, 700), (400, 200, 800), (250, 500, 1920)]


def _median_ms(f, n: int = 21) -> float:
    for _ in range(3):
        f()
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


def main(argv=None) -> int:
    from rnn_ablations.commands.speed import _machine, cpu_info
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    if not hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        print("gemm_libraries: this torch has no oneDNN linear (torch.ops.mkldnn._linear_pointwise)")
        return 2
    torch.set_num_threads(args.threads)
    lin = lambda a, w: torch.ops.mkldnn._linear_pointwise(a, w, None, "none", [], "")  # noqa: E731
    machine = _machine(cpu_info())
    print(f"# {machine}; {args.threads} thread(s); median ms of 21 calls")
    rows = []
    with torch.no_grad():
        for H, din, n in SHAPES:
            x, w, g = torch.randn(n, din), torch.randn(4 * H, din), torch.randn(n, 4 * H)
            wt, xt, gt = w.t().contiguous(), x.t().contiguous(), g.t().contiguous()
            r = {"H": H, "d_in": din, "rows": n,
                 "projection": {"mkl": _median_ms(lambda: torch.mm(x, w.t())),
                                "onednn": _median_ms(lambda: lin(x, w))},
                 "input_grad": {"mkl": _median_ms(lambda: torch.mm(g, w)),
                                "onednn": _median_ms(lambda: lin(g, wt))},
                 "weight_grad": {"mkl": _median_ms(lambda: torch.mm(g.t(), x)),
                                 "onednn": _median_ms(lambda: lin(gt, xt))}}
            rows.append(r)
            print(f"H={H} d_in={din} rows={n}: " + ", ".join(
                f"{k} mkl {r[k]['mkl']:.2f} / onednn {r[k]['onednn']:.2f} ms"
                for k in ("projection", "input_grad", "weight_grad")))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gemm_libraries.json").write_text(json.dumps(
            {"machine": machine, "threads": args.threads, "rows": rows}, indent=2) + "\n")
        lines = [f"MKL vs oneDNN, median ms of 21 calls — {machine}; {args.threads} thread(s); "
                 "`python benchmarks/gemm_libraries.py` (oneDNN's weight gradient from "
                 "pre-transposed copies)", "",
                 "| H | d_in | rows | projection MKL / oneDNN | input grad MKL / oneDNN | "
                 "weight grad MKL / oneDNN |", "|---|---|---|---|---|---|"]
        for r in rows:
            lines.append(f"| {r['H']} | {r['d_in']} | {r['rows']} | " + " | ".join(
                f"{r[k]['mkl']:.2f} / {r[k]['onednn']:.2f}"
                for k in ("projection", "input_grad", "weight_grad")) + " |")
        (args.out / "gemm_libraries.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
