"""What the library A/B benchmarks (``step_gemm_library.py``, ``projection_library.py``,
``projection_layout.py``, ``bf16_step_gemm.py``) share:
their common options, the experiments' shapes they select, the timing of two or more ways
of doing the same call in one process (each called once per round, the order reversed every
other round, so that a drift of the machine hits them alike, the median of the rounds
reported), and the writing of a result (``write_results``, also used by
``inference_memory.py``)."""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

RESULTS = Path(__file__).resolve().parent / "results"


def add_arguments(p: argparse.ArgumentParser, variants: List[str]) -> None:
    """The options every library A/B takes (``--variants`` defaulting to ``variants``)."""
    p.add_argument("--variants", nargs="+", default=variants)
    p.add_argument("--shape-names", nargs="+", default=None,
                   help="rows of the experiments' shapes (default: all)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--name", default=None)


def checked_shapes(p: argparse.ArgumentParser, args) -> list:
    """The experiments' shapes ``args.shape_names`` names (all without it), after checking the
    counts; ``p.error`` names what was wrong."""
    from rnn_ablations.commands.speed import EXPERIMENT_SHAPES
    if args.threads < 1 or args.repeats < 1 or args.warmup < 0:
        p.error("--threads and --repeats must be >= 1, --warmup >= 0")
    if not args.shape_names:
        return list(EXPERIMENT_SHAPES)
    known = {s[0] for s in EXPERIMENT_SHAPES}
    bad = [n for n in args.shape_names if n not in known]
    if bad:
        p.error(f"--shape-names {bad}: not an experiments' shape; choose from {sorted(known)}")
    return [s for s in EXPERIMENT_SHAPES if s[0] in args.shape_names]


def alternating_medians(fn: Dict[str, Callable[[], object]], repeats: int,
                        warmup: int) -> Dict[str, float]:
    """Median seconds of each of the callables in ``fn``, called in alternating order in every
    round, after ``warmup`` untimed rounds."""
    for _ in range(warmup):
        for f in fn.values():
            f()
    times = {k: [] for k in fn}
    keys = list(fn)
    for r in range(repeats):
        for k in (keys if r % 2 == 0 else keys[::-1]):
            t0 = time.perf_counter()
            fn[k]()
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def pair_fields(med: Dict[str, float], a: str, b: str) -> Dict[str, float]:
    """The row fields of two timed ways ``a`` and ``b`` of ``med`` (seconds): ``{a}_ms``,
    ``{b}_ms`` and ``{a}_over_{b}`` (> 1: ``b`` is faster), rounded as the results files keep
    them."""
    return {f"{a}_ms": round(med[a] * 1e3, 3), f"{b}_ms": round(med[b] * 1e3, 3),
            f"{a}_over_{b}": round(med[a] / med[b], 3)}


def time_policies(model, x, mode: str, policies: Dict[str, object], repeats: int,
                  warmup: int) -> Dict[str, float]:
    """Median seconds of one call of ``model`` on ``x`` under each of ``policies`` (a name ->
    ``rnn_ablations.plan.Policy``), alternating (:func:`alternating_medians`): ``mode``
    ``"train"`` (forward + backward of the output's sum) or ``"inference"`` (no gradient),
    with the compiled kernels (``backend="kernel"``).  The policy in use is restored after."""
    import torch
    from rnn_ablations import options
    from rnn_ablations import plan as run_plan

    def call(which):
        run_plan.POLICY = policies[which]
        with options(backend="kernel"):
            if mode == "inference":
                with torch.no_grad():
                    model(x)
            else:
                out, _ = model(x)
                out.sum().backward()

    base = run_plan.POLICY
    try:
        return alternating_medians({k: (lambda k=k: call(k)) for k in policies}, repeats, warmup)
    finally:
        run_plan.POLICY = base


def write_results(out: Path, name: str, meta: dict, rows: list, lines: List[str]) -> None:
    """``OUT/NAME.json`` (``{"meta": meta, "rows": rows}``) and ``OUT/NAME.md`` (the lines of
    its table), and a line saying so."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    (out / f"{name}.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out / name}.json / .md")
