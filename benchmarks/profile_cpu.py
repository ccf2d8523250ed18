#!/usr/bin/env python
"""Where the CPU time of one layer stack goes: ``perf record`` over a steady loop of forward
(+ backward) calls, the samples grouped by what did the work (below).

    python benchmarks/profile_cpu.py --shape "PTB medium LM" --variants lstm nn.LSTM --mode inference
    python benchmarks/profile_cpu.py --shapes-all --variants lstm ran nn.LSTM --out benchmarks/results

Categories (by the sampled symbol and library):

* ``step GEMM``: the packed per-step micro-kernel and its weight packing (``micro_kernel``,
  ``gemm_packed``, ``pack_b``);
* ``element-wise``: the fused element-wise passes and their transcendentals (``pointwise_*``,
  ``sigmoid_*``, ``tanh_*``, ``exp*``) and the −HIDDEN scan;
* ``oneDNN / MKL GEMM``: JIT-generated oneDNN code (the input projection, and all of
  ``nn.LSTM``'s work: its recurrence runs in oneDNN's JIT kernels too), MKL (the weight
  gradients, ATen's GEMMs) and OpenBLAS;
* ``sync (OpenMP)``: ``libgomp`` (threads waiting at the fork/join of a parallel region,
  spinning until work arrives) and the Linux scheduler's work for threads that slept while
  waiting (futex, context switches);
* ``memory (kernel)``: the rest of the Linux kernel's time: page faults of fresh allocations,
  zeroing and unmapping pages;
* ``Python``: the interpreter (``libpython``), including its garbage collector;
* ``other``: the rest (ATen's own element-wise ops, allocator, libc, ...).

Needs ``perf`` (linux-perf) and permission to sample the own process (``perf_event_paranoid``
<= 2); on a machine without it the script says so and exits with 2.  The percentages are of all
samples of the process (every thread), so with 2 threads a core that spins shows up as ``sync``.
Writes ``OUT/profile_cpu.{json,md}`` with ``--out``.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

CATEGORIES = ["step GEMM", "element-wise", "oneDNN / MKL GEMM", "sync (OpenMP)",
              "memory (kernel)", "Python", "other"]

_CHILD = r'''
import sys, time, torch
sys.path.insert(0, {repo!r})
from rnn_ablations import AblatedRNN
torch.set_num_threads({threads})
torch.manual_seed(0)
L, din, H, bi, B, T = {shape!r}
if {variant!r} == "nn.LSTM":
    m = torch.nn.LSTM(din, H, L, bidirectional=bi, batch_first=True)
else:
    m = AblatedRNN({variant!r}, din, H, num_layers=L, bidirectional=bi, batch_first=True)
x = torch.randn(B, T, din, requires_grad={train!r})
def step():
    if {train!r}:
        out, _ = m(x)
        out.sum().backward()
    else:
        with torch.no_grad():
            m(x)
def perf_ctl(cmd):  # perf records only the steady loop (started with -D -1, disabled)
    with open({ctl!r}, "w") as f:
        f.write(cmd + "\n")
    with open({ack!r}) as f:
        f.readline()
for _ in range(3):
    step()
perf_ctl("enable")
t0 = time.perf_counter(); n = 0
while time.perf_counter() - t0 < {seconds}:
    step(); n += 1
dt = time.perf_counter() - t0
perf_ctl("disable")
print("MS_PER_ITER", dt / n * 1e3, n)
'''


def categorise(dso: str, symbol: str) -> str:
    if dso.startswith("_C.") and dso.endswith(".so"):  # our kernel module
        if re.search(r"micro_kernel|gemm_packed|pack_b|packed_matmul", symbol):
            return "step GEMM"
        if re.search(r"pointwise|sigmoid|tanh|exp|scan|elementwise", symbol):
            return "element-wise"
        return "other"
    # (torch's CPU wheels link MKL and oneDNN into libtorch_cpu.so: matched by symbol)
    if (dso.startswith("[JIT]") or re.search(r"mkl|dnnl|openblas|blas", dso, re.I)
            or re.search(r"mkl_|dnnl|gemm|sgemm|jit_|brgemm", symbol, re.I)):
        return "oneDNN / MKL GEMM"
    if "libgomp" in dso or "libiomp" in dso:
        return "sync (OpenMP)"
    if dso.startswith("[kernel"):
        # a waiting OpenMP thread that gave up spinning sleeps in the kernel (futex) and is
        # woken by the scheduler: synchronisation too; the rest is memory (page faults of fresh
        # allocations, zeroing and freeing pages)
        if re.search(r"schedul|futex|switch|wake|idle|tick|irq|softirq|sched_|yield|pick_next|"
                     r"hrtimer|update_curr|enqueue|dequeue", symbol):
            return "sync (OpenMP)"
        return "memory (kernel)"
    if "libpython" in dso or dso.startswith("python"):
        return "Python"
    return "other"


def profile_one(variant: str, shape, mode: str, threads: int, seconds: float,
                perf: str) -> Dict:
    with tempfile.TemporaryDirectory() as tmp:
        data, ctl, ack = Path(tmp) / "perf.data", Path(tmp) / "ctl", Path(tmp) / "ack"
        os.mkfifo(ctl)
        os.mkfifo(ack)
        script = Path(tmp) / "child.py"
        script.write_text(_CHILD.format(repo=str(REPO), threads=threads, shape=tuple(shape),
                                        variant=variant, train=(mode == "train"),
                                        seconds=seconds, ctl=str(ctl), ack=str(ack)))
        run = subprocess.run([perf, "record", "-q", "-F", "1999", "-D", "-1", "--control",
                              f"fifo:{ctl},{ack}", "-o", str(data), sys.executable, str(script)],
                             capture_output=True, text=True)
        if run.returncode != 0:
            raise RuntimeError(f"perf record failed ({run.returncode}): {run.stderr[-2000:]}")
        m = re.search(r"MS_PER_ITER ([0-9.]+) ([0-9]+)", run.stdout)
        ms, iters = float(m.group(1)), int(m.group(2))
        rep = subprocess.run([perf, "report", "-i", str(data), "--stdio", "--sort", "dso,symbol",
                              "--no-children", "-F", "overhead,dso,symbol", "--percent-limit",
                              "0"], capture_output=True, text=True)
    shares = {c: 0.0 for c in CATEGORIES}
    top: Dict[str, float] = {}
    for line in rep.stdout.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        parts = line.split(None, 2)
        if len(parts) < 3 or not parts[0].endswith("%"):
            continue
        pct = float(parts[0].rstrip("%"))
        dso = parts[1]
        symbol = parts[2].split("]", 1)[-1].strip()
        cat = categorise(dso, symbol)
        shares[cat] += pct
        key = f"{dso.split('/')[-1]} {symbol[:60]}"
        top[key] = top.get(key, 0.0) + pct
    return {"variant": variant, "mode": mode, "ms_per_iter": round(ms, 2), "iterations": iters,
            "shares": {k: round(v, 1) for k, v in shares.items()},
            "top_symbols": sorted(([k, round(v, 2)] for k, v in top.items()),
                                  key=lambda kv: -kv[1])[:8]}


def main(argv=None) -> int:
    from rnn_ablations.commands.machine import describe
    from rnn_ablations.commands.speed import EXPERIMENT_SHAPES
    names = [s[0] for s in EXPERIMENT_SHAPES]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", action="append", choices=names,
                   help="an experiment shape (repeatable); default 'PTB medium LM'")
    p.add_argument("--shapes-all", action="store_true", help="every experiment shape")
    p.add_argument("--variants", nargs="+", default=["lstm", "nn.LSTM"])
    p.add_argument("--mode", nargs="+", choices=["train", "inference"],
                   default=["train", "inference"])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seconds", type=float, default=6.0, help="steady-state loop per profile")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    perf = shutil.which("perf")
    if perf is None:
        print("profile_cpu: `perf` is not installed (Debian: apt-get install linux-perf)")
        return 2
    if args.threads < 1 or args.seconds <= 0:
        p.error("--threads must be >= 1 and --seconds > 0")
    wanted = names if args.shapes_all else (args.shape or ["PTB medium LM"])
    from rnn_ablations.variants import get_variant
    for v in args.variants:
        if v != "nn.LSTM":
            get_variant(v)  # raises with the valid names
    shapes = [s for s in EXPERIMENT_SHAPES if s[0] in wanted]
    machine = describe()
    print(f"# machine: {machine}; {args.threads} thread(s); perf samples of the whole process")
    rows: List[Dict] = []
    for name, *shape in shapes:
        for mode in args.mode:
            for v in args.variants:
                r = profile_one(v, shape, mode, args.threads, args.seconds, perf)
                r["shape"] = name
                r["dims"] = list(shape)
                rows.append(r)
                s = r["shares"]
                print(f"{name:16s} {mode:9s} {v:16s} {r['ms_per_iter']:8.2f} ms  " +
                      "  ".join(f"{k} {s[k]:4.1f}%" for k in CATEGORIES))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        meta = {"machine": machine, "threads": args.threads, "seconds": args.seconds,
                "categories": CATEGORIES, "rows": rows}
        (args.out / "profile_cpu.json").write_text(json.dumps(meta, indent=2) + "\n")
        lines = [f"CPU profile (perf, all threads) — {machine}; {args.threads} thread(s); "
                 f"{args.seconds:g} s steady loop per row; `python benchmarks/profile_cpu.py`",
                 "", "| shape | mode | model | ms/iter | " + " | ".join(CATEGORIES) + " |",
                 "|---|---|---|---:|" + "---:|" * len(CATEGORIES)]
        for r in rows:
            lines.append(f"| {r['shape']} | {r['mode']} | {r['variant']} | {r['ms_per_iter']:.1f} | "
                         + " | ".join(f"{r['shares'][k]:.1f} %" for k in CATEGORIES) + " |")
        (args.out / "profile_cpu.md").write_text("\n".join(lines) + "\n")
        print(f"# wrote {args.out / 'profile_cpu.json'} and {args.out / 'profile_cpu.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
