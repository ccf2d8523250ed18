#!/usr/bin/env python
"""The input projection of a no-gradient layer call on a batch-first input: ``F.linear`` on the
(T, B, d) view against the package's ``input_projection`` (one (T·B, d) GEMM), per layer of the
experiments' shapes, float32 and bfloat16.

    python benchmarks/projection_layout.py
    python benchmarks/projection_layout.py --shape-names 'single layer 650' 'PTB medium LM'

A batch-first input reaches a layer's projection as a (T, B, d) view.  Where the weight needs
no gradient (frozen parameters; the bfloat16 copy that the bfloat16 GEMM multiplies),
``torch.matmul`` does not fold such a view into one GEMM and runs T batched products against
the expanded weight (``aten::bmm``).  ``input_projection`` flattens the steps first.  Both are
timed here on the same tensors (lstm's 4H x d weight with its bias, no gradient), called
alternately in every round, median of ``--repeats`` rounds, at ``--threads`` threads;
bfloat16: the operands rounded to bfloat16, the result widened to float32 (``Plan.bf16_gemm``),
emulated on CPUs without AVX512-BF16 or AMX.  view/flat > 1: one GEMM is faster.  Writes
``OUT/projection_layout_<cpu-name>.{json,md}``.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _alternating import (add_arguments, alternating_medians, checked_shapes,  # noqa: E402
                          write_results)
from projection_library import layers_of  # noqa: E402


def main(argv=None) -> int:
    from rnn_ablations.commands.machine import cpu_file_name, describe
    from rnn_ablations.kernels.projection import cpu_has_bf16_gemm, input_projection
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(p, ["lstm"])
    p.add_argument("--dtypes", nargs="+", choices=["float32", "bfloat16"],
                   default=["float32", "bfloat16"])
    args = p.parse_args(argv)
    shapes = checked_shapes(p, args)
    if args.variants != ["lstm"]:
        p.error("--variants: this benchmark times lstm's projection (4H x d) only")
    torch.set_num_threads(args.threads)
    F = torch.nn.functional
    bf = torch.bfloat16
    rows = []
    for shape in shapes:
        _, _, _, hidden, _, batch, seq_len = shape
        for label, d_in in layers_of(shape):
            torch.manual_seed(0)
            x = torch.randn(batch, seq_len, d_in).transpose(0, 1)  # the (T, B, d) view
            w, b = torch.randn(4 * hidden, d_in), torch.randn(4 * hidden)
            for dtype in args.dtypes:
                if dtype == "float32":
                    ways = {"view": lambda: F.linear(x, w, b),
                            "flat": lambda: input_projection(x, w, b, onednn=False)}
                else:
                    ways = {"view": lambda: F.linear(x.to(bf), w.to(bf), b.to(bf)).float(),
                            "flat": lambda: input_projection(x, w, b, onednn=False,
                                                             bf16_gemm=True)}
                with torch.no_grad():
                    med = alternating_medians(ways, args.repeats, args.warmup)
                row = {"layer": label, "d_in": d_in, "hidden": hidden, "batch": batch,
                       "steps": seq_len, "dtype": dtype,
                       "view_ms": round(med["view"] * 1e3, 3),
                       "flat_ms": round(med["flat"] * 1e3, 3),
                       "view_over_flat": round(med["view"] / med["flat"], 3)}
                rows.append(row)
                print(f"{label:28s} {dtype:9s} F.linear on the view {row['view_ms']:9.2f} ms  "
                      f"one GEMM {row['flat_ms']:9.2f} ms  view/flat {row['view_over_flat']:.2f}",
                      flush=True)
    machine = describe()
    bf16_note = ("bfloat16 GEMM instructions (AVX512-BF16 or AMX)" if cpu_has_bf16_gemm()
                 else "no bfloat16 GEMM instructions: bfloat16 rows are emulated")
    name = args.name or f"projection_layout_{cpu_file_name()}"
    meta = {"command": "python benchmarks/projection_layout.py "
                       + " ".join(argv if argv is not None else sys.argv[1:]),
            "machine": machine, "bf16": bf16_note, "threads": args.threads,
            "repeats": args.repeats}
    lines = [f"# Input projection of a batch-first view: F.linear on the view vs one GEMM "
             f"({machine})", "",
             f"Command: `{meta['command']}`. lstm's projection (4H x d weight and bias, no "
             f"gradient), {args.threads} thread(s), median of {args.repeats} interleaved rounds; "
             f"this CPU: {bf16_note}. view/flat > 1: one (T·B, d) GEMM is faster.", "",
             "| layer | dtype | F.linear on the view ms | one GEMM ms | view/flat |",
             "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['layer']} | {r['dtype']} | {r['view_ms']:.2f} | {r['flat_ms']:.2f} "
                     f"| {r['view_over_flat']:.2f} |")
    write_results(args.out, name, meta, rows, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
