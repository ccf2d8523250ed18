#!/usr/bin/env python
"""The operand layouts of a layer's big GEMMs, per layer of the experiments' shapes: the input
projection of a no-gradient call on a batch-first input (``F.linear`` on the (T, B, d) view
against the package's ``input_projection``, one (T·B, d) GEMM; float32 and bfloat16), and the
weight gradients of training (gᵀ·in written in place against (inᵀ·g)ᵀ copied; float32).

    python benchmarks/projection_layout.py
    python benchmarks/projection_layout.py --shape-names 'single layer 650' 'PTB medium LM'
    python benchmarks/projection_layout.py --products weight-grad

A batch-first input reaches a layer's projection as a (T, B, d) view.  Where the weight needs
no gradient (frozen parameters; the bfloat16 copy that the bfloat16 GEMM multiplies),
``torch.matmul`` does not fold such a view into one GEMM and runs T batched products against
the expanded weight (``aten::bmm``).  ``input_projection`` flattens the steps first.  Both are
timed here on the same tensors (lstm's 4H x d weight with its bias, no gradient), called
alternately in every round, median of ``--repeats`` rounds, at ``--threads`` threads;
bfloat16: the operands rounded to bfloat16, the result widened to float32 (``Plan.bf16_gemm``),
emulated on CPUs without AVX512-BF16 or AMX.  view/flat > 1: one GEMM is faster.

The weight gradients of W_ih (4H x d) and W_hh (4H x H) are one GEMM over all T·B rows of the
gate gradients g (T·B, 4H) and the layer's input or previous hidden state.  The kernel computes
gᵀ·in directly into the gradient (``weight_grad`` in ``csrc/cpu/layer_plain.cpp``); the other
layout computes inᵀ·g (which an earlier measurement on an AMD EPYC found faster for a 4H x H
result) and transposes it into a fresh tensor.  transposed/direct > 1: the kernel's layout is faster.  Writes
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
                          pair_fields, write_results)
from projection_library import layers_of  # noqa: E402


def main(argv=None) -> int:
    from rnn_ablations.commands.machine import cpu_file_name, describe
    from rnn_ablations.kernels.projection import input_projection
    from rnn_ablations.kernels.registry import cpu_has_bf16_gemm
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(p, ["lstm"])
    p.add_argument("--dtypes", nargs="+", choices=["float32", "bfloat16"],
                   default=["float32", "bfloat16"],
                   help="the projection's dtypes (the weight gradients are float32)")
    p.add_argument("--products", nargs="+", choices=["projection", "weight-grad"],
                   default=["projection", "weight-grad"],
                   help="the no-gradient input projection, the training weight gradients, or both")
    args = p.parse_args(argv)
    shapes = checked_shapes(p, args)
    if args.variants != ["lstm"]:
        p.error("--variants: this benchmark times lstm's projection (4H x d) only")
    torch.set_num_threads(args.threads)
    F = torch.nn.functional
    bf = torch.bfloat16
    rows, grads = [], []
    for shape in shapes:
        _, _, _, hidden, _, batch, seq_len = shape
        for label, d_in in layers_of(shape):
            if "weight-grad" in args.products:
                grads += weight_grad_rows(label, d_in, hidden, batch, seq_len, args)
            if "projection" not in args.products:
                continue
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
                row = {"product": "projection", "layer": label, "d_in": d_in,
                       "hidden": hidden, "batch": batch, "steps": seq_len, "dtype": dtype,
                       **pair_fields(med, "view", "flat")}
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
    lines = [f"# Operand layouts of a layer's GEMMs ({machine})", "",
             f"Command: `{meta['command']}`. lstm's weights, {args.threads} thread(s), median of "
             f"{args.repeats} interleaved rounds; this CPU: {bf16_note}."]
    if rows:
        lines += ["", "## Input projection of a batch-first view: F.linear on the view vs one "
                  "GEMM", "",
                  "4H x d weight and bias, no gradient. view/flat > 1: one (T·B, d) GEMM is "
                  "faster.", "",
                  "| layer | dtype | F.linear on the view ms | one GEMM ms | view/flat |",
                  "|---|---|---|---|---|"]
        for r in rows:
            lines.append(f"| {r['layer']} | {r['dtype']} | {r['view_ms']:.2f} | "
                         f"{r['flat_ms']:.2f} | {r['view_over_flat']:.2f} |")
    if grads:
        lines += ["", "## Weight gradients: gᵀ·in in place vs (inᵀ·g)ᵀ copied", "",
                  "g (T·B, 4H) float32; in: the layer input (W_ih) or the previous hidden "
                  "state (W_hh). transposed/direct > 1: the kernel's gᵀ·in is faster.", "",
                  "| layer | weight | rows | direct ms | transposed + copy ms | "
                  "transposed/direct |", "|---|---|---|---|---|---|"]
        for r in grads:
            lines.append(f"| {r['layer']} | {r['weight']} | {r['rows']} | {r['direct_ms']:.2f} "
                         f"| {r['transposed_ms']:.2f} | {r['transposed_over_direct']:.2f} |")
    write_results(args.out, name, meta, rows + grads, lines)
    return 0


def weight_grad_rows(label, d_in, hidden, batch, seq_len, args):
    """The two weight gradients of one layer direction, both layouts timed alternately."""
    out = []
    for weight, k in (("W_ih", d_in), ("W_hh", hidden)):
        torch.manual_seed(0)
        g, inp = torch.randn(seq_len * batch, 4 * hidden), torch.randn(seq_len * batch, k)
        ways = {"direct": lambda: torch.mm(g.t(), inp),
                "transposed": lambda: torch.mm(inp.t(), g).t().contiguous()}
        with torch.no_grad():
            med = alternating_medians(ways, args.repeats, args.warmup)
        row = {"product": "weight gradient", "layer": label, "weight": weight,
               "rows": seq_len * batch, "k": k, "hidden": hidden, "dtype": "float32",
               **pair_fields(med, "transposed", "direct")}
        out.append(row)
        print(f"{label:28s} {weight} gradient  direct {row['direct_ms']:9.2f} ms  transposed + "
              f"copy {row['transposed_ms']:9.2f} ms  transposed/direct "
              f"{row['transposed_over_direct']:.2f}", flush=True)
    return out


if __name__ == "__main__":
    sys.exit(main())
