#!/usr/bin/env python
"""Each ratio of a speed table (``benchmarks/speed.py``'s JSON) beside the ratio its matrix
products allow: the multiply-adds of ``nn.LSTM`` over the variant's, same configuration.

Per token, layer and direction a cell with R recurrent and X input-only blocks of H rows
(``Variant.blocks``) multiplies (R + X)·H·d for its input projection and R·H·H for its
recurrent product; ``nn.LSTM`` 4H·(d + H).  Training repeats both three times (forward, input
gradient, weight gradient), so one bound holds for training and inference:

    bound = Σ_layers 4H·(d_l + H) / Σ_layers H·((R + X)·d_l + R·H),  d_l = d_in, then H·dirs

It is what a variant reaches where it and ``nn.LSTM`` run at the same matrix-product speed,
and where the element-wise work of both is small beside the products: srnn 4, ran 1.6 and
lstm_minus_srnn 1.14 where d = H.  A ratio above its bound comes from ``nn.LSTM``'s own losses
(small per-step products, sequential element-wise work); the goals of a speed table are to be
read against it.

    python benchmarks/speed_bounds.py benchmarks/results/speed_cpu_experiments_amd_epyc_avx2_2threads.json
    python benchmarks/speed_bounds.py A.json B.json --out benchmarks/results/speed_bounds

Prints, per table, the geometric means of the ratio, the bound and the share of the bound per
variant and mode, with the lowest share and its shape, then every row; ``--out OUT`` also writes
``OUT.json`` / ``OUT.md``.  Models labelled ``variant [isa]`` (``--isas``) are read as the
variant.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rnn_ablations.variants import get_variant  # noqa: E402


def matmul_bound(variant: str, layers: int, d_in: int, hidden: int, bidirectional: bool) -> float:
    """Multiply-adds of ``nn.LSTM`` over those of ``variant`` (no highway), same configuration
    (the module docstring's formula)."""
    rec, inp = get_variant(variant).blocks()
    r, g = len(rec), len(rec) + len(inp)
    dirs = 2 if bidirectional else 1
    ins = [d_in] + [hidden * dirs] * (layers - 1)
    return sum(4 * (d + hidden) for d in ins) / sum(g * d + r * hidden for d in ins)


def _geomean(values: List[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def bound_rows(table: dict) -> List[dict]:
    """The rows of one speed JSON with their bound and share of it (float32 rows of the
    variants; ``nn.LSTM`` and rows without a shape's layer count are skipped)."""
    out = []
    for r in table["rows"]:
        model = r["model"]
        if model.startswith("nn.LSTM") or "layers" not in r:
            continue
        variant = model.split(" ")[0]
        b = matmul_bound(variant, r["layers"], r["input_size"], r["hidden"], r["bidirectional"])
        out.append({"shape": r.get("shape", str(r["hidden"])), "model": model,
                    "variant": variant, "mode": r["mode"], "dtype": r["dtype"],
                    "ratio": r["ratio_vs_nn_lstm"], "bound": round(b, 3),
                    "share_of_bound": round(r["ratio_vs_nn_lstm"] / b, 3)})
    return out


def summary(rows: List[dict]) -> List[dict]:
    groups: Dict[tuple, List[dict]] = {}
    for r in rows:
        groups.setdefault((r["model"], r["mode"], r["dtype"]), []).append(r)
    out = []
    for (model, mode, dtype), rs in groups.items():
        low = min(rs, key=lambda r: r["share_of_bound"])
        out.append({"model": model, "mode": mode, "dtype": dtype, "shapes": len(rs),
                    "ratio_geomean": round(_geomean([r["ratio"] for r in rs]), 3),
                    "bound_geomean": round(_geomean([r["bound"] for r in rs]), 3),
                    "share_geomean": round(_geomean([r["share_of_bound"] for r in rs]), 3),
                    "share_lowest": low["share_of_bound"], "lowest_shape": low["shape"]})
    return out


def format_tables(name: str, machine: str, rows: List[dict]) -> str:
    lines = [f"## {name}", "", f"Machine: {machine}", "",
             "| model | mode | dtype | ratio (geomean) | bound (geomean) | share of bound "
             "(geomean) | lowest share (shape) |", "|---|---|---|---:|---:|---:|---|"]
    for s in summary(rows):
        lines.append(f"| {s['model']} | {s['mode']} | {s['dtype']} | {s['ratio_geomean']:.2f} | "
                     f"{s['bound_geomean']:.2f} | {s['share_geomean']:.0%} | "
                     f"{s['share_lowest']:.0%} ({s['lowest_shape']}) |")
    lines += ["", "| shape | model | mode | ratio | bound | share |", "|---|---|---|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['shape']} | {r['model']} | {r['mode']} | {r['ratio']:.2f} | "
                     f"{r['bound']:.2f} | {r['share_of_bound']:.0%} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("tables", nargs="+", type=Path, help="speed JSON files (benchmarks/speed.py)")
    p.add_argument("--out", type=Path, help="also write OUT.json and OUT.md")
    args = p.parse_args(argv)
    report, parts = [], []
    for path in args.tables:
        try:
            table = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            p.error(f"{path}: not a readable speed JSON ({exc}); give the .json that "
                    f"benchmarks/speed.py --out wrote")
        if "rows" not in table:
            p.error(f"{path}: no 'rows' (not a benchmarks/speed.py JSON)")
        rows = bound_rows(table)
        machine = table.get("machine", "(machine not recorded)")
        text = format_tables(path.name, machine, rows)
        print(text)
        parts.append(text)
        report.append({"table": str(path), "machine": machine, "summary": summary(rows),
                       "rows": rows})
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
        head = ("# Speed ratios against their matrix-product bound\n\n"
                "Command: `python benchmarks/speed_bounds.py "
                + " ".join(str(t) for t in args.tables)
                + f" --out {args.out}`. The bound: nn.LSTM's multiply-adds over the variant's "
                "(the script's docstring); share = ratio / bound.\n\n")
        args.out.with_suffix(".md").write_text(head + "\n".join(parts))
        print(f"wrote {args.out.with_suffix('.json')} / .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
