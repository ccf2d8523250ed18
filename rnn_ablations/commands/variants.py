"""``rnn-ablations variants``: the variant table as a user reads it.

For every row of :data:`rnn_ablations.variants.VARIANTS_TABLE`: its name (what ``AblatedRNN``,
the AllenNLP configs and ``-encoder_type`` take, with the aliases that name it too), the paper's
name, its equations (``Variant.equations``), whether its gates read h_{t-1} (else it runs as an
element-wise scan), and the parameters of one layer for ``--input-size`` / ``--hidden-size``
(``recurrent_param_count``: what ``AblatedRNN`` allocates)::

    rnn-ablations variants
    rnn-ablations variants ran --input-size 650 --hidden-size 650
"""
from __future__ import annotations

import argparse
import json

from ..variants import ALIASES, VARIANTS, get_variant, recurrent_param_count

__all__ = ["describe_variants", "add_subparser"]


def describe_variants(names=None, input_size: int = 100, hidden_size: int = 100):
    """One dict per variant (all of them, or ``names``, each resolved by ``get_variant``)."""
    for label, value in (("--input-size", input_size), ("--hidden-size", hidden_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{label} must be a positive integer, got {value!r}")
    rows = []
    for name in (names or VARIANTS):
        v = get_variant(name)
        rows.append({
            "name": v.name,
            "aliases": sorted(a for a, c in ALIASES.items() if c == v.name),
            "paper_name": v.paper_name,
            "equations": v.equations,
            "reads_hidden": v.reads_hidden,
            "parameters_per_layer": recurrent_param_count(v.name, input_size, hidden_size),
        })
    return rows


def _run(args) -> int:
    rows = describe_variants(args.names, args.input_size, args.hidden_size)
    if args.json:
        print(json.dumps(rows, indent=1, ensure_ascii=False))
        return 0
    for r in rows:
        aliases = f" (also: {', '.join(r['aliases'])})" if r["aliases"] else ""
        runs_as = "step kernel (reads h_{t-1})" if r["reads_hidden"] else \
            "element-wise scan (reads x_t only)"
        print(f"{r['name']}{aliases}: {r['paper_name']}\n"
              f"  {r['equations']}\n"
              f"  runs as: {runs_as}; parameters of one layer, d_in = {args.input_size}, "
              f"H = {args.hidden_size}: {r['parameters_per_layer']:,}")
    return 0


def add_subparser(subparsers) -> None:
    p = subparsers.add_parser(
        "variants", help="list the variants: names, the papers' names, equations, parameters",
        description="List the variants of the table with their equations and the parameters of "
                    "one layer (what AblatedRNN allocates).")
    p.add_argument("names", nargs="*", help="variants to show (default: all); aliases accepted")
    p.add_argument("--input-size", type=int, default=100, help="d_in for the count (default 100)")
    p.add_argument("--hidden-size", type=int, default=100, help="H for the count (default 100)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.set_defaults(func=_run)
