#!/usr/bin/env python
"""MKL (``torch.mm``) against oneDNN (``mkldnn._linear_pointwise``) on the all-steps products a
layer computes besides its recurrence: the input projection x W^T, the input gradient g W and the
weight gradient g^T x, at the experiments' sizes (rows = T·B), 2 threads, median of 21 calls
each, the two libraries called alternately.

    python benchmarks/gemm_libraries.py --out benchmarks/results

These are the products that ``nn.LSTM`` computes too (``benchmarks/profile_cpu.py`` measures
their share of a layer's CPU time); ``rnn_ablations/kernels/projection.py`` takes oneDNN for the projection
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
#: (32 × 25), NMT encoder (64 × 30), DrQA (32 × 200), BiDAF modeling (40 × 200)
SHAPES = [(256, 256, 2048), (650, 650, 2048), (650, 650, 700), (400, 200, 800), (250, 500, 1920),
          (128, 400, 6400), (100, 800, 8000)]


def _pair_ms(fa, fb, n: int = 21):
    """Median ms of ``fa`` and of ``fb``, called alternately (``n`` times each, after 3 untimed
    calls each) so that machine load hits both alike."""
    for _ in range(3):
        fa()
        fb()
    ta, tb = [], []
    for i in range(n):
        for f, ts in (((fa, ta), (fb, tb)) if i % 2 == 0 else ((fb, tb), (fa, ta))):
            t0 = time.perf_counter()
            f()
            ts.append(time.perf_counter() - t0)
    return statistics.median(ta) * 1e3, statistics.median(tb) * 1e3


def main(argv=None) -> int:
    from rnn_ablations.kernels import registry
    from rnn_ablations.commands.machine import describe
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    if not hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        print("gemm_libraries: this torch has no oneDNN linear (torch.ops.mkldnn._linear_pointwise)")
        return 2
    if registry.cpu_kernel() is None:
        print("gemm_libraries: the CPU kernel is not built (run `bash scripts/setup.sh`)")
        return 2
    torch.set_num_threads(args.threads)
    lin = lambda a, w: torch.ops.mkldnn._linear_pointwise(a, w, None, "none", [], "")  # noqa: E731
    machine = describe()
    print(f"# {machine}; {args.threads} thread(s); median ms of 21 alternating calls")
    rows = []
    with torch.no_grad():
        for H, din, n in SHAPES:
            x, w, g = torch.randn(n, din), torch.randn(4 * H, din), torch.randn(n, 4 * H)
            wt, xt, gt = w.t().contiguous(), x.t().contiguous(), g.t().contiguous()
            pairs = {
                "projection": (lambda: torch.mm(x, w.t()), lambda: lin(x, w)),
                "input_grad": (lambda: torch.mm(g, w), lambda: lin(g, wt)),
                "weight_grad": (lambda: torch.mm(g.t(), x), lambda: lin(gt, xt)),
                # what a layer would pay: our weight_grad (MKL, the product the kernels call)
                # against oneDNN including the two transposed copies it needs
                "weight_grad_in_layer": (lambda: registry.cpu_kernel().weight_grad(g, x),
                                         lambda: lin(g.t().contiguous(), x.t().contiguous())),
            }
            r = {"H": H, "d_in": din, "rows": n}
            for k, (fa, fb) in pairs.items():
                a, b = _pair_ms(fa, fb)
                r[k] = {"mkl": a, "onednn": b}
            rows.append(r)
            print(f"H={H} d_in={din} rows={n}: " + ", ".join(
                f"{k} mkl {r[k]['mkl']:.2f} / onednn {r[k]['onednn']:.2f} ms" for k in pairs))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gemm_libraries.json").write_text(json.dumps(
            {"machine": machine, "threads": args.threads, "rows": rows}, indent=2) + "\n")
        lines = [f"MKL vs oneDNN, median ms of 21 alternating calls — {machine}; {args.threads} "
                 "thread(s); `python benchmarks/gemm_libraries.py`. The weight-gradient columns: "
                 "the libraries on ready operands (oneDNN from pre-transposed copies), then what a "
                 "layer would pay (`_C.weight_grad`, MKL, against oneDNN including the two "
                 "transposed copies it needs)", "",
                 "| H | d_in | rows | projection MKL / oneDNN | input grad MKL / oneDNN | "
                 "weight grad MKL / oneDNN | weight grad in a layer: ours (MKL) / oneDNN + copies |",
                 "|---|---|---|---|---|---|---|"]
        for r in rows:
            lines.append(f"| {r['H']} | {r['d_in']} | {r['rows']} | " + " | ".join(
                f"{r[k]['mkl']:.2f} / {r[k]['onednn']:.2f}"
                for k in ("projection", "input_grad", "weight_grad", "weight_grad_in_layer"))
                + " |")
        (args.out / "gemm_libraries.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
