"""The speed tables of the README and the docs, rendered from the results files they quote.

A Markdown file holds a rendered table between ``<!-- table: NAME -->`` and ``<!-- /table -->``;
``tests/test_readme.py`` renders every such table again and checks that the file holds exactly
that text, so a number in the documents cannot drift from its results file.  After a new run,
point :data:`TABLES` at its files and rewrite the documents' tables with

    python benchmarks/results_tables.py --write README.md docs/performance.md

(without ``--write`` it prints every table).  Ratios are ``time(nn.LSTM) / time(variant)`` of
the same run (> 1: faster than ``nn.LSTM``), train (forward + backward) / inference, with two
decimals, as the results files' Markdown shows them; times are milliseconds.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Dict, List, Sequence

RESULTS = Path(__file__).resolve().parent / "results"

FOUR = ["lstm", "lstm_minus_srnn", "ran", "identity_ran"]
SIX = ["lstm", "lstm_minus_srnn", "ran", "identity_ran", "lstm_minus_srnn_minus_hidden", "srnn"]
HEAD = {"lstm": "lstm", "lstm_minus_srnn": "lstm_minus_srnn", "ran": "ran",
        "identity_ran": "identity_ran", "lstm_minus_srnn_minus_hidden": "−HIDDEN",
        "srnn": "srnn"}

#: name -> how to render it: the results files (several: one run each, cells "run 1, run 2"),
#: the variants (columns), the suffix of the timed model's name in the files (e.g. " [avx512]"),
#: the dtypes (rows of a standard-shape table)
TABLES: Dict[str, Dict] = {
    "speed_cpu_avx2": dict(files=["speed_cpu_experiments_amd_epyc_avx2_2threads.json"],
                           variants=SIX),
    "speed_cpu_avx512": dict(files=["speed_cpu_avx512_experiments.json"], variants=SIX,
                             suffix=" [avx512]"),
    "speed_cpu_avx512_vs_avx2": dict(files=["speed_cpu_avx512_experiments.json"],
                                     variants=SIX, suffix=" [avx512]", other=" [avx2]"),
    "speed_cpu_all_variants": dict(
        files=["speed_cpu_avx2_experiments_all_variants_directions_ab.json"], variants=SIX),
    "speed_cpu_1thread": dict(files=["speed_cpu_avx2_1thread_cpu_clock.json"],
                              variants=["lstm", "lstm_minus_srnn", "ran", "identity_ran", "srnn"]),
    "speed_cuda_h100": dict(files=["speed_cuda_h100.json"], variants=SIX,
                            dtypes=["float32", "bfloat16", "float16"]),
    "speed_cuda_h100_experiments": dict(files=["speed_cuda_h100_experiments.json"],
                                        variants=["lstm", "lstm_minus_srnn", "ran"],
                                        dtypes=["float32", "bfloat16"]),
    "speed_cuda_h100_persistent": dict(
        files=["speed_cuda_h100_persistent.json"], dtypes=["float32", "bfloat16"],
        variants=["ran", "ran [persistent]", "lstm", "lstm [persistent]"]),
    "speed_cuda_h100_persistent_backward": dict(
        files=["speed_cuda_h100_persistent_backward.json"], dtypes=["float32", "bfloat16"],
        variants=["ran", "ran [persistent]", "lstm", "lstm [persistent]"]),
    "profile_cpu": dict(profile="profile_cpu.json"),
}


def _load(name: str) -> Dict:
    return json.loads((RESULTS / name).read_text())


def _key(r: Dict):
    if "shape" in r:
        bi = "bi" if r["bidirectional"] else "uni"
        return (f"{r['shape']} ({r['layers']}, {r['input_size']}, {r['hidden']}, {bi}, "
                f"{r['batch']}, {r['seq_len']})", r.get("dtype", "float32"))
    return (f"H = {r['hidden']}", r.get("dtype", "float32"))


def _index(meta: Dict) -> Dict:
    out: Dict = {}
    for r in meta["rows"]:
        out.setdefault(_key(r), {}).setdefault(r["model"], {})[r["mode"]] = r
    return out


def _r(x: float) -> str:
    return f"{x:.2f}"


def _ms(x: float) -> str:
    return f"{x:.0f}" if x >= 10 else f"{x:.2f}"


def _profile(name: str) -> str:
    """Share of the perf samples per category, min-max over the profiled shapes, per model and
    mode."""
    meta = _load(name)
    cats = meta["categories"]
    groups: Dict = {}
    for r in meta["rows"]:
        groups.setdefault((r["variant"], r["mode"]), []).append(r["shares"])
    lines = ["| model, mode | " + " | ".join(cats) + " |", "|" + "---|" * (len(cats) + 1)]
    for (model, mode), shares in groups.items():
        cells = []
        for c in cats:
            lo, hi = min(s[c] for s in shares), max(s[c] for s in shares)
            cells.append(f"{lo:.0f}–{hi:.0f} %" if round(lo) != round(hi) else f"{lo:.0f} %")
        lines.append(f"| {model}, {mode} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def render(name: str) -> str:
    """The Markdown table ``name`` of :data:`TABLES`."""
    spec = TABLES[name]
    if "profile" in spec:
        return _profile(spec["profile"])
    runs = [_index(_load(f)) for f in spec["files"]]
    suffix, other = spec.get("suffix", ""), spec.get("other")
    dtypes = spec.get("dtypes")
    keys = [k for k in runs[0] if dtypes is None or k[1] in dtypes]
    if dtypes is not None:  # rows grouped by dtype, in the order given
        keys.sort(key=lambda k: dtypes.index(k[1]))
    first = "shape (layers, d_in, H, bi, B, T)" if "(" in keys[0][0] else "hidden"
    cols = [first] + (["dtype"] if dtypes else []) + ["nn.LSTM ms, train / inference"] + \
        [HEAD.get(v, v) for v in spec["variants"]]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for key in keys:
        cells = [key[0]] + ([key[1]] if dtypes else [])
        base = [run[key]["nn.LSTM"] for run in runs]
        cells.append(", ".join(_ms(b["train"]["median_ms"]) for b in base) + " / " +
                     ", ".join(_ms(b["inference"]["median_ms"]) for b in base))
        for v in spec["variants"]:
            got = [run[key].get(v + suffix) for run in runs]
            if any(g is None for g in got):
                cells.append("—")
                continue
            cell = (", ".join(_r(g["train"]["ratio_vs_nn_lstm"]) for g in got) + " / " +
                    ", ".join(_r(g["inference"]["ratio_vs_nn_lstm"]) for g in got))
            if other is not None:
                o = runs[0][key][v + other]
                cell += (f" ({_r(o['train']['ratio_vs_nn_lstm'])} / "
                         f"{_r(o['inference']['ratio_vs_nn_lstm'])})")
            cells.append(cell)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


MARK = re.compile(r"^(<!-- table: ([\w-]+) -->\n)((?:(?!<!-- ).*\n)*?)(<!-- /table -->)$", re.M)


def tables_in(text: str) -> List[tuple]:
    """``[(name, the text between the markers)]`` of a Markdown document."""
    return [(m.group(2), m.group(3).rstrip("\n")) for m in MARK.finditer(text)]


def rewrite(text: str) -> str:
    return MARK.sub(lambda m: m.group(1) + render(m.group(2)) + "\n" + m.group(4), text)


def main(argv: Sequence[str] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--write", nargs="+", type=Path, default=None,
                   help="Markdown files whose marked tables are rewritten in place")
    args = p.parse_args(argv)
    if args.write is None:
        for name in TABLES:
            print(f"<!-- table: {name} -->\n{render(name)}\n<!-- /table -->\n")
        return 0
    for path in args.write:
        text = path.read_text()
        unknown = [n for n, _ in tables_in(text) if n not in TABLES]
        if unknown:
            p.error(f"{path}: unknown table(s) {unknown}; known: {sorted(TABLES)}")
        path.write_text(rewrite(text))
    return 0


if __name__ == "__main__":
    sys.exit(main())
