"""The first ``torch.compile`` step: the seconds from the first call of a compiled model to the end
of its first backward (dynamo's trace, AOT autograd, the backend's code generation, the call), each
case in a fresh process with empty inductor and Triton caches (a cold start), against the same
first step of ``nn.LSTM``.

The backends split the cost: ``eager`` is dynamo's trace of the Python alone (the package's code
that dynamo walks: ``AblatedRNN.forward``, the plan, the runners, the operators' wrappers),
``aot_eager`` adds AOT autograd (the forward and backward graphs, the fake kernels), ``inductor``
(the default) adds the generated C++; dynamo's own breakdown (``compile_times``) is printed for
each.  Steps after the first run the compiled graph (benchmarks/compile_speed.py times those).

    python benchmarks/first_compile.py                         # 2-layer bidirectional ran, T=35, B=20, 200 units
    python benchmarks/first_compile.py --dynamic none --backends inductor
    python benchmarks/first_compile.py --out benchmarks/results/first_compile_cpu
    python benchmarks/first_compile.py --repeat 3              # the median of 3 fresh processes per case

``attempts`` counts dynamo's compile attempts of the first step: 2 when the trace was restarted
(e.g. to specialize a float that a module attribute made symbolic under ``dynamic=True``).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import torch
import rnn_ablations as ra
imported = time.perf_counter() - t0
variant, layers, hidden, bi, steps, batch, backend, dynamic = json.loads(sys.argv[1])
torch.manual_seed(0)
torch.set_num_threads(int(sys.argv[2]))
if variant == "nn.LSTM":
    model = torch.nn.LSTM(hidden, hidden, num_layers=layers, bidirectional=bi)
else:
    model = ra.AblatedRNN(variant, hidden, hidden, num_layers=layers, bidirectional=bi)
x = torch.randn(steps, batch, hidden, requires_grad=True)
model(x)[0].sum().backward()   # the eager first call: the kernel's load, the plan's caches
eager_start = time.perf_counter()
model(x)[0].sum().backward()
eager = time.perf_counter() - eager_start
compiled = torch.compile(model, backend=backend, dynamic={"none": None, "true": True, "false": False}[dynamic])
start = time.perf_counter()
compiled(x)[0].sum().backward()
first = time.perf_counter() - start
start = time.perf_counter()
compiled(x)[0].sum().backward()
second = time.perf_counter() - start
from torch._dynamo.utils import compile_times
times = compile_times(repr="str", aggregate=True)
print(json.dumps({"import_s": imported, "eager_step_s": eager, "first_s": first,
                  "second_s": second, "attempts": times.count("compile_attempt_"),
                  "dynamo": times}))
"""


def run_case(case, threads: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="first_compile_") as cold:
        env = dict(os.environ)
        env.update(TORCHINDUCTOR_CACHE_DIR=os.path.join(cold, "inductor"),
                   TRITON_CACHE_DIR=os.path.join(cold, "triton"))
        env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in [env.get("PYTHONPATH")] if p])
        proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(case), str(threads)],
                              env=env, capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise SystemExit(f"{case}: the child failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variants", nargs="+", default=["ran", "nn.LSTM"])
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=200)
    p.add_argument("--unidirectional", action="store_true")
    p.add_argument("--steps", type=int, default=35)
    p.add_argument("--batch", type=int, default=20)
    p.add_argument("--backends", nargs="+", default=["eager", "aot_eager", "inductor"])
    p.add_argument("--dynamic", choices=["none", "true", "false"], default="true")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=1,
                   help="fresh processes per case; the table gives the median first step")
    p.add_argument("--out", type=Path, help="write OUT.json and OUT.md")
    a = p.parse_args(argv)

    sys.path.insert(0, str(REPO))
    from rnn_ablations.commands.machine import describe, machine_info

    machine = describe()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    rows = []
    for variant in a.variants:
        for backend in a.backends:
            case = [variant, a.layers, a.hidden, not a.unidirectional, a.steps, a.batch, backend,
                    a.dynamic]
            runs = []
            for _ in range(a.repeat):
                got = run_case(case, a.threads)
                runs.append(got)
                print(f"{variant:9s} {backend:10s} first step {got['first_s']:7.1f} s  second "
                      f"{got['second_s'] * 1e3:8.1f} ms  eager step "
                      f"{got['eager_step_s'] * 1e3:8.1f} ms  (import {got['import_s']:.1f} s, "
                      f"{got['attempts']} compile attempts)", flush=True)
                print("    dynamo: " + " ".join(got["dynamo"].split()), flush=True)
            median = sorted(runs, key=lambda r: r["first_s"])[(len(runs) - 1) // 2]
            row = dict(median, variant=variant, backend=backend,
                       first_runs_s=[r["first_s"] for r in runs])
            rows.append(row)
    title = (f"First torch.compile step (forward + backward, cold caches), {a.layers}-layer "
             f"{'uni' if a.unidirectional else 'bi'}directional, H={a.hidden}, T={a.steps}, "
             f"B={a.batch}, dynamic={a.dynamic}, {a.threads} threads"
             + (f", median of {a.repeat} processes" if a.repeat > 1 else "")
             + f"; {machine}; 1-minute load {load:.1f} at the start, "
             f"{os.getloadavg()[0] if hasattr(os, 'getloadavg') else float('nan'):.1f} at the end")
    print(title)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.with_suffix(".json").write_text(json.dumps(
            {"title": title, "machine": machine_info(), "load": load, "args": vars(a) | {"out": str(a.out)},
             "rows": rows}, indent=1, default=str))
        lines = [f"# {title}", "", "`python benchmarks/first_compile.py " + " ".join(
            argv if argv is not None else sys.argv[1:]) + "`", "",
            "| model | backend | first step (s) | each run (s) | compile attempts | second step (ms) "
            "| eager step (ms) |",
            "|---|---|---|---|---|---|---|"]
        for r in rows:
            each = ", ".join(f"{t:.1f}" for t in r["first_runs_s"])
            lines.append(f"| {r['variant']} | {r['backend']} | {r['first_s']:.1f} | {each} | "
                         f"{r['attempts']} | {r['second_s'] * 1e3:.1f} | "
                         f"{r['eager_step_s'] * 1e3:.1f} |")
        a.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
