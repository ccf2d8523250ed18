#!/usr/bin/env python
"""The input projection of a layer call (all steps at once) on MKL (``F.linear``) against
oneDNN, per layer of the experiments' shapes: the measurement behind
``plan.POLICY.onednn_min_weight`` (see :class:`rnn_ablations.plan.Policy`).

    python benchmarks/projection_library.py                     # every shape, lstm and -HIDDEN
    python benchmarks/projection_library.py --variants lstm_minus_srnn_minus_hidden \\
        --shape-names DrQA --threads 2

Each distinct layer of a shape (``benchmarks/speed.py --shapes experiments``: the first layer
reads ``d_in``, the layers above it the output of the one below) runs as a one-layer model, in
training (forward + backward of the output's sum) and inference (``torch.no_grad()``),
float32, with the plan's projection on MKL and on oneDNN (the policy's threshold set past or
below the layer's weight), the two called alternately in every round (median of
``--repeats`` rounds), at ``--threads`` threads.  The weight a threshold compares is that of
one projection GEMM: a direction's ``w_ih`` for a cell that reads h_{t-1}, every direction's
together for a scan cell (one GEMM for both).  A ratio MKL/oneDNN above 1 means oneDNN is
faster.  The output ends with the threshold the numbers support: the smallest weight from
which oneDNN was at least as fast (ratio >= 1 - ``--tolerance``) in both modes on every
measured layer at least that large.  Writes ``OUT/projection_library_<cpu-name>.{json,md}``.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _alternating import (add_arguments, checked_shapes, pair_fields,  # noqa: E402
                          time_policies, write_results)

#: a threshold no weight reaches (the MKL side of the comparison)
NEVER = 1 << 62


def suggest(rows, tolerance: float) -> int:
    """The smallest projection weight (entries) from which oneDNN was at least as fast as MKL
    (``mkl_over_onednn >= 1 - tolerance``) in every measured row at least that large, both
    modes; ``NEVER`` when no such weight was measured."""
    pts = sorted((r["weight"], r["mkl_over_onednn"]) for r in rows)
    for i, (weight, _) in enumerate(pts):
        if all(ratio >= 1.0 - tolerance for _, ratio in pts[i:]):
            return weight
    return NEVER


def layers_of(shape):
    """The distinct layers of an experiments' shape: ``(label, d_in)``."""
    label, layers, d_in, hidden, bi, _, _ = shape
    out = [(f"{label} layer 1", d_in)]
    if layers > 1:
        above = "layer 2" if layers == 2 else f"layers 2-{layers}"
        out.append((f"{label} {above}", hidden * (2 if bi else 1)))
    return out


def main(argv=None) -> int:
    from rnn_ablations import AblatedRNN
    from rnn_ablations import plan as run_plan
    from rnn_ablations.commands.machine import cpu_file_name, describe
    from rnn_ablations.kernels import registry
    from rnn_ablations.variants import get_variant
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(p, ["lstm", "lstm_minus_srnn_minus_hidden"])
    p.add_argument("--tolerance", type=float, default=0.02,
                   help="oneDNN counts as at least as fast within this fraction (noise)")
    args = p.parse_args(argv)
    shapes = checked_shapes(p, args)
    if not 0 <= args.tolerance < 1:
        p.error("--tolerance must be in [0, 1)")
    for v in args.variants:
        get_variant(v)  # a ValueError naming the known variants
    if registry.cpu_kernel() is None:
        print("projection_library: the CPU kernel is not built (bash scripts/setup.sh)")
        return 2
    if not registry.onednn_usable():
        print("projection_library: oneDNN's linear does not run in this torch build")
        return 2
    torch.set_num_threads(args.threads)
    base = run_plan.POLICY
    policies = {"mkl": dataclasses.replace(base, onednn_min_weight=NEVER),
                "onednn": dataclasses.replace(base, onednn_min_weight=0)}
    rows = []
    try:
        for shape in shapes:
            _, _, _, hidden, bi, batch, seq_len = shape
            for label, d_in in layers_of(shape):
                torch.manual_seed(0)
                x = torch.randn(batch, seq_len, d_in, requires_grad=True)
                for v in args.variants:
                    model = AblatedRNN(v, d_in, hidden, bidirectional=bi, batch_first=True)
                    variant = get_variant(v)
                    w = model.weight_ih_l0.numel()
                    weight = w if variant.reads_hidden else w * (2 if bi else 1)
                    for mode in ("train", "inference"):
                        med = time_policies(model, x, mode, policies, args.repeats, args.warmup)
                        row = {"layer": label, "d_in": d_in, "hidden": hidden,
                               "bidirectional": bi, "batch": batch, "steps": seq_len,
                               "variant": v, "mode": mode, "weight": weight,
                               **pair_fields(med, "mkl", "onednn")}
                        rows.append(row)
                        print(f"{label:28s} {v:30s} {mode:9s} weight {weight:8d}  MKL "
                              f"{row['mkl_ms']:9.2f} ms  oneDNN {row['onednn_ms']:9.2f} ms  "
                              f"MKL/oneDNN {row['mkl_over_onednn']:.2f}", flush=True)
    finally:
        run_plan.POLICY = base
    threshold = suggest(rows, args.tolerance)
    shown = "none measured" if threshold == NEVER else f"{threshold:,}"
    print(f"supported Policy.onednn_min_weight: {shown} (in use: {base.onednn_min_weight:,})")
    machine = describe()
    name = args.name or f"projection_library_{cpu_file_name()}"
    meta = {"command": "python benchmarks/projection_library.py "
                       + " ".join(argv if argv is not None else sys.argv[1:]),
            "machine": machine, "threads": args.threads, "repeats": args.repeats,
            "tolerance": args.tolerance, "supported_onednn_min_weight": threshold,
            "onednn_min_weight_in_use": base.onednn_min_weight}
    lines = [f"# Input projection: MKL vs oneDNN per layer ({machine})", "",
             f"Command: `{meta['command']}`. float32, {args.threads} thread(s), median of "
             f"{args.repeats} interleaved rounds; MKL/oneDNN > 1: oneDNN faster; weight: the "
             "entries of one projection GEMM (a scan cell's directions together).", "",
             "| layer | variant | mode | weight | MKL ms | oneDNN ms | MKL/oneDNN |",
             "|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["weight"], r["layer"], r["variant"], r["mode"])):
        lines.append(f"| {r['layer']} | {r['variant']} | {r['mode']} | {r['weight']:,} | "
                     f"{r['mkl_ms']:.2f} | {r['onednn_ms']:.2f} | {r['mkl_over_onednn']:.2f} |")
    lines += ["", f"Supported `Policy.onednn_min_weight` (oneDNN at least as fast, within "
                  f"{args.tolerance:.0%}, on every layer from this weight up): {shown}; in use: "
                  f"{base.onednn_min_weight:,}"]
    write_results(args.out, name, meta, rows, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
