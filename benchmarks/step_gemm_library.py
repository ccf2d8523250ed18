#!/usr/bin/env python
"""The CPU kernel's step GEMM on its own packed kernel against MKL's packed GEMM
(``cblas_sgemm_pack`` / ``cblas_sgemm_compute``, which picks its code per CPU), per shape: the
measurement behind ``plan.POLICY.library_step_gemm`` (see :class:`rnn_ablations.plan.Policy`).

    python benchmarks/step_gemm_library.py                     # experiments' shapes, lstm and ran
    python benchmarks/step_gemm_library.py --variants lstm --shape-names "PTB medium LM"

Each shape (``benchmarks/speed.py --shapes experiments``) and variant is timed in training
(forward + backward) and inference (``torch.no_grad()``), float32, with the step GEMM on the
kernel's own GEMM and on MKL's, the two called alternately in every round (median of
``--repeats`` rounds), at ``--threads`` threads, on the vector path in use.  A ratio own/MKL
above 1 means MKL is faster.  The output ends with the ``Policy.library_step_gemm`` entry for
this vector path that the numbers support: per mode, the smallest step size (B x R*H x H
multiply-adds) from which MKL was faster on every measured shape at least that large, or -1.
Writes ``OUT/step_gemm_library_<cpu-name>.{json,md}``.
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


def suggest(rows, mode: str) -> int:
    """The smallest step size (multiply-adds) from which MKL beat the own GEMM (ratio > 1) on
    every measured row of ``mode`` at least that large; -1 when none."""
    pts = sorted((r["step_macs"], r["own_over_mkl"]) for r in rows if r["mode"] == mode)
    best = -1
    for i, (macs, _) in enumerate(pts):
        if all(ratio > 1.0 for _, ratio in pts[i:]):
            best = macs
            break
    return best


def main(argv=None) -> int:
    from rnn_ablations import AblatedRNN
    from rnn_ablations import plan as run_plan
    from rnn_ablations.commands.machine import describe
    from rnn_ablations.kernels import registry
    from rnn_ablations.variants import get_variant
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(p, ["lstm", "ran"])
    args = p.parse_args(argv)
    shapes = checked_shapes(p, args)
    if registry._C is None:
        print("step_gemm_library: the CPU kernel is not built (bash scripts/setup.sh)")
        return 2
    if not getattr(registry._C, "library_gemm", lambda: False)():
        print("step_gemm_library: this torch has no MKL packed GEMM (cblas_sgemm_pack); the "
              "step GEMM runs on the kernel's own")
        return 2
    for v in args.variants:
        if not get_variant(v).reads_hidden:
            p.error(f"--variants {v!r}: a cell that reads no h_{{t-1}} has no step GEMM")
    torch.set_num_threads(args.threads)
    isa = registry._C.kernel_isa()
    base = run_plan.POLICY
    policies = {"own": dataclasses.replace(base, library_step_gemm=((isa, -1, -1),)),
                "mkl": dataclasses.replace(base, library_step_gemm=((isa, 0, 0),))}
    rows = []
    try:
        for label, layers, d_in, hidden, bi, batch, seq_len in shapes:
            torch.manual_seed(0)
            x = torch.randn(batch, seq_len, d_in, requires_grad=True)
            for v in args.variants:
                model = AblatedRNN(v, d_in, hidden, num_layers=layers, bidirectional=bi,
                                   batch_first=True)
                r_blocks = model.weight_hh_l0.shape[0] // hidden
                for mode in ("train", "inference"):
                    med = time_policies(model, x, mode, policies, args.repeats, args.warmup)
                    row = {"shape": label, "layers": layers, "d_in": d_in, "hidden": hidden,
                           "bidirectional": bi, "batch": batch, "steps": seq_len,
                           "variant": v, "mode": mode,
                           "step_macs": batch * r_blocks * hidden * hidden,
                           **pair_fields(med, "own", "mkl")}
                    rows.append(row)
                    print(f"{label:24s} {v:14s} {mode:9s} own {row['own_ms']:9.2f} ms  MKL "
                          f"{row['mkl_ms']:9.2f} ms  own/MKL {row['own_over_mkl']:.2f}",
                          flush=True)
    finally:
        run_plan.POLICY = base
    entry = (isa, suggest(rows, "train"), suggest(rows, "inference"))
    print(f"supported Policy.library_step_gemm entry for {isa}: {entry}")
    machine = describe()
    from rnn_ablations.commands.machine import cpu_file_name
    name = args.name or f"step_gemm_library_{cpu_file_name()}"
    meta = {"command": "python benchmarks/step_gemm_library.py " + " ".join(argv or sys.argv[1:]),
            "machine": machine, "isa": isa, "threads": args.threads, "repeats": args.repeats,
            "suggested_entry": list(entry)}
    lines = [f"# Step GEMM: own packed kernel vs MKL packed GEMM ({machine})", "",
             f"float32, {args.threads} thread(s), median of {args.repeats} interleaved rounds; "
             "own/MKL > 1: MKL faster", "",
             "| shape | variant | mode | step MACs | own ms | MKL ms | own/MKL |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['shape']} | {r['variant']} | {r['mode']} | {r['step_macs']} | "
                     f"{r['own_ms']:.2f} | {r['mkl_ms']:.2f} | {r['own_over_mkl']:.2f} |")
    lines += ["", f"Supported `Policy.library_step_gemm` entry: `{entry}`"]
    write_results(args.out, name, meta, rows, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
