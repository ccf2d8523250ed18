"""Timing two or more ways of doing the same call in one process: each called once per round,
the order reversed every other round (so that a drift of the machine hits them alike), the
median of the rounds reported.  Shared by the library A/B benchmarks
(``step_gemm_library.py``, ``projection_library.py``)."""
from __future__ import annotations

import statistics
import time
from typing import Callable, Dict


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
