"""Parameter counts of the recurrent layers (what the papers' tables count: no embeddings, no
softmax; gate biases counted, the ablations' content layer has none)."""
from __future__ import annotations

import re
from typing import Dict, List, Optional, Sequence, Tuple

from ..variants import VARIANTS, get_variant, recurrent_param_count
from .configs import get_config

__all__ = ["PAPER_TABLE1", "parse_size", "param_rows", "format_param_table"]

#: The RAN paper's Table 1 (Lee et al. 2017), PTB language models, in millions.
PAPER_TABLE1: Dict[Tuple[str, str], float] = {
    ("medium", "lstm"): 6.77, ("medium", "ran"): 4.23, ("medium", "identity_ran"): 4.23,
    ("large", "lstm"): 36.02, ("large", "ran"): 22.52, ("large", "identity_ran"): 22.52,
}


def parse_size(text: str) -> Tuple[int, int]:
    """``"2x650"`` (layers × hidden) → ``(2, 650)``."""
    m = re.fullmatch(r"\s*(\d+)\s*[x×*]\s*(\d+)\s*", str(text))
    if not m or int(m.group(1)) <= 0 or int(m.group(2)) <= 0:
        raise ValueError(f"size {text!r} must look like LAYERSxHIDDEN, e.g. 2x650")
    return int(m.group(1)), int(m.group(2))


def param_rows(configs: Sequence[str] = ("small", "medium", "large"),
               sizes: Sequence[str] = (), variants: Optional[Sequence[str]] = None,
               input_size: Optional[int] = None) -> List[Dict]:
    names = [get_variant(v).name for v in variants] if variants else list(VARIANTS)
    if input_size is not None and (isinstance(input_size, bool) or not isinstance(input_size, int)
                                   or input_size <= 0):
        raise ValueError(f"--input-size must be a positive integer, got {input_size!r}")
    shapes = [(get_config(c).name, get_config(c).num_layers, get_config(c).hidden_size)
              for c in configs]
    shapes += [(f"{l}x{h}", l, h) for l, h in map(parse_size, sizes)]
    if not shapes:
        raise ValueError("give at least one --configs name or --sizes LAYERSxHIDDEN")
    rows = []
    for label, layers, hidden in shapes:
        d_in = input_size or hidden  # the PTB models: embedding size = hidden size
        for v in names:
            n = recurrent_param_count(v, d_in, hidden, layers)
            rows.append({"size": label, "layers": layers, "hidden": hidden, "input_size": d_in,
                         "variant": v, "paper_name": get_variant(v).paper_name, "params": n,
                         "paper_table1_M": PAPER_TABLE1.get((label, v))})
    return rows


def format_param_table(rows: List[Dict]) -> str:
    head = ["size", "layers × H", "variant", "paper name", "recurrent params", "RAN paper Table 1"]
    body = [[r["size"], f"{r['layers']} × {r['hidden']}", r["variant"], r["paper_name"],
             f"{r['params'] / 1e6:.2f}M ({r['params']:,})",
             f"{r['paper_table1_M']:.2f}M" if r["paper_table1_M"] else ""] for r in rows]
    table = [head] + body
    widths = [max(len(r[i]) for r in table) for i in range(len(head))]
    lines = ["  ".join(s.ljust(w) if i < 4 else s.rjust(w) for i, (s, w) in enumerate(zip(r, widths)))
             for r in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
