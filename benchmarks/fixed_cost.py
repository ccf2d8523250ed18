"""The fixed cost of a layer call on the CPU: where the time of a small inference call goes
that is not the arithmetic, stage by stage, Python and C++.

Every stage is timed on its own, in a loop of calls with the same tensors, as the thread's CPU
time (``time.thread_time``: robust to other processes on a shared machine, which a wall clock
is not) with one torch thread, and as the wall clock with ``--threads`` threads; each figure is
the median over ``--rounds`` interleaved rounds of the per-call mean of ``--calls`` calls.
The stages, each including the ones below it:

* ``module``: ``AblatedRNN.forward`` of the whole stack (``nn.LSTM`` beside it);
* ``run_layer_call``: one layer through :func:`rnn_ablations.dispatch.run_layer_call` (what the
  module adds around its layers is ``module`` minus the layers' sum);
* ``plan``: :func:`rnn_ablations.plan.decide` alone (describing the call, the settings, the
  kept plan);
* ``runner``: the plan's runner (``dispatch.RUNNERS[plan.runner]``) alone: ``run_layer_call``
  minus this is the checks before it (bf16, plan, step-GEMM sync);
* ``kernel entry``: the kernel object's entry (``registry.cpu_kernel().<entry>``, its eager
  check and list of results) with the runner's prepared tensors;
* ``C++ entry``: the compiled function itself (``rnn_ablations._C``), without Python around it;
  at the shape "fixed cost" (one step, one row, 8 units) this is the C++ fixed cost: checks,
  packing, allocations, the thread team's fork and join.

* ``C++ pack w_hh`` (cells that read h_{t-1}): the forward's packing of w_hh for the step GEMM
  alone (``_C.packed_matmul`` with a one-row product), which every layer call pays.

``runner`` - ``kernel entry`` is the Python of the runner (projection, contiguous copies, the
autograd wrappers' checks); ``kernel entry`` - ``C++ entry`` the Python of the kernel object.

    python benchmarks/fixed_cost.py --out benchmarks/results/fixed_cost_amd_epyc_avx2
    python benchmarks/fixed_cost.py --variants lstm ran lstm_minus_srnn_minus_hidden --threads 2
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rnn_ablations import AblatedRNN, dispatch  # noqa: E402
from rnn_ablations import plan as plan_mod  # noqa: E402
from rnn_ablations.commands.machine import cpu_info, describe  # noqa: E402
from rnn_ablations.functional import Reversal, projection_bias  # noqa: E402
from rnn_ablations.kernels import registry  # noqa: E402

#: (name, layers, input size, hidden, bidirectional, batch, steps)
SHAPES = {
    "fixed cost": ("fixed cost", 1, 8, 8, False, 1, 1),
    "PTB small LM": ("PTB small LM", 2, 200, 200, False, 20, 20),
    "PTB medium LM": ("PTB medium LM", 2, 650, 650, False, 20, 35),
    "DrQA": ("DrQA", 3, 400, 128, True, 32, 200),
}


def _stages(shape, variant):
    """``{stage: callable}`` for one shape and variant (inference, no gradient)."""
    _, layers, d_in, H, bi, B, T = shape
    torch.manual_seed(0)
    stages = {}
    x = torch.randn(B, T, d_in)
    if variant == "nn.LSTM":
        m = torch.nn.LSTM(d_in, H, layers, bidirectional=bi, batch_first=True)
        stages["module"] = lambda: m(x)
        return stages
    m = AblatedRNN(variant, d_in, H, num_layers=layers, bidirectional=bi, batch_first=True)
    stages["module"] = lambda: m(x)
    dirs = 2 if bi else 1
    xt = x.transpose(0, 1)
    params = [m.layer_parameters(0, d) for d in range(dirs)]
    h0 = xt.new_zeros(dirs, B, H)
    c0 = xt.new_zeros(dirs, B, H)
    bs = torch.full((T,), B, dtype=torch.int64)
    masks = [None] * dirs
    rev = Reversal(None)
    v = m.variant
    stages["run_layer_call"] = lambda: dispatch.run_layer_call(v, False, xt, params, h0, c0, bs,
                                                               masks, rev)
    scan_layout = dispatch.scan.scan_applies(v) if not v.reads_hidden else False
    p = plan_mod.decide(xt, params, h0, c0, scan_layout=scan_layout, spec=v.kernel_spec)
    stages["plan"] = lambda: plan_mod.decide(xt, params, h0, c0, scan_layout=scan_layout,
                                             spec=v.kernel_spec)
    runner = dispatch.RUNNERS[p.runner]
    stages["runner"] = lambda: runner(p, v, False, xt, params, h0, c0, bs, masks, rev)
    ext = registry.cpu_kernel()
    if ext is None:
        return stages
    raw = ext.raw
    spec = v.kernel_spec
    empty = xt.new_empty(0)
    if p.runner == "cpu_pipelined":
        w_ih, w_hh, b = params[0]
        xc, bc = xt.contiguous(), (b.contiguous() if b is not None else empty)
        hd, cd = h0[0].contiguous(), c0[0].contiguous()
        stages["kernel entry"] = lambda: ext.pipelined_forward(spec, False, xc, w_ih, bc, w_hh,
                                                               hd, cd, bs, empty, False, 0)
        stages["C++ entry"] = lambda: raw.pipelined_forward(spec, False, xc, w_ih, bc, w_hh, hd,
                                                            cd, bs, empty, False, 0)
    elif p.runner == "cpu_plain":
        w_ih, w_hh, b = params[0]
        proj = torch.nn.functional.linear(xt, w_ih, projection_bias(b, w_ih.shape[0]))
        hd, cd = h0[0].contiguous(), c0[0].contiguous()
        stages["kernel entry"] = lambda: ext.plain_forward(spec, False, proj, w_hh, hd, cd, bs,
                                                           empty, False, in_place=True)
        stages["C++ entry"] = lambda: raw.plain_forward(spec, False, proj, w_hh, hd, cd, bs,
                                                        empty, False, True)
    elif p.runner in ("fused_scan", "scan"):
        weight = torch.cat([w for w, _, _ in params]) if dirs > 1 else params[0][0]
        proj = torch.nn.functional.linear(xt, weight)
        bias = dispatch._scan_bias(params)
        stages["kernel entry"] = lambda: ext.scan_forward(spec, False, proj, h0, c0, bs, False,
                                                          bias)
        stages["C++ entry"] = lambda: raw.scan_forward(spec, False, proj, h0, c0, bs, False,
                                                       bias)
    if v.reads_hidden and getattr(raw, "packed_gemm", lambda: False)():
        # the forward's packing of w_hh (every layer call packs it), with a one-row product
        w_hh = params[0][1]
        a1, c1 = xt.new_zeros(1, H), xt.new_empty(1, w_hh.shape[0])
        stages["C++ pack w_hh"] = lambda: raw.packed_matmul(a1, w_hh, True, c1, False, False)
    return stages


def _statements():
    """``{statement: callable}``: the Python statements a small layer call runs besides the
    kernel (module, dispatch, plan, runner), each alone, at the shape "fixed cost" (lstm)."""
    from rnn_ablations import rnn as rnn_mod
    from rnn_ablations.kernels import autograd, ops
    from rnn_ablations.kernels.projection import input_projection
    m = AblatedRNN("lstm", 8, 8, num_layers=1, batch_first=True)
    x = torch.randn(1, 1, 8)
    xt = x.transpose(0, 1)
    params = [m.layer_parameters(0, 0)]
    w_ih, w_hh, b = params[0]
    h0 = torch.zeros(1, 1, 8)
    bs = torch.full((1,), 1, dtype=torch.int64)
    proj = torch.nn.functional.linear(xt, w_ih, b)
    step_plan = plan_mod.decide(xt, params, h0, h0)
    return {
        "module: check_input": lambda: m.check_input(xt),
        "module: _initial_state (two new_zeros)": lambda: m._initial_state(None, 1, xt),
        "module: batch_sizes = torch.full": lambda: torch.full((1,), 1, dtype=torch.int64),
        "module: layer_parameters (lstm: b_ih + b_hh)": lambda: m.layer_parameters(0, 0),
        "module: torch.stack of h_n (and again c_n)": lambda: torch.stack([h0[0]]),
        "module: _autocast_output_dtype": lambda: rnn_mod._autocast_output_dtype(xt),
        "module: transpose (batch_first, in and out)": lambda: x.transpose(0, 1),
        "dispatch: h0[d] / c0[d] (one of 2 per direction)": lambda: h0[0],
        "dispatch: c0.detach (cells without memory)": lambda: h0.detach(),
        "dispatch: _step_kernel (the plan's step-GEMM thresholds)": lambda: dispatch._step_kernel(
            step_plan),
        "dispatch: registry.autocast_like": lambda: registry.autocast_like(proj, w_hh, h0[0],
                                                                          h0[0], None),
        "plan: decide (describe + call_settings + kept plan)": lambda: plan_mod.decide(
            xt, params, h0, h0),
        "plan: describe": lambda: plan_mod.describe(xt, params, h0, h0),
        "plan: call_settings": lambda: plan_mod.call_settings(),
        "plan: registry.kernels": lambda: registry.kernels(),
        "projection: F.linear (1 x 8 x 32)": lambda: torch.nn.functional.linear(xt, w_ih, b),
        "projection: input_projection (F.linear + checks)": lambda: input_projection(
            xt, w_ih, b, False),
        "kernels: autograd._needs_grad": lambda: autograd._needs_grad(proj, w_hh, h0, h0),
        "kernels: ops._plain_eager": lambda: ops._plain_eager(proj),
        "kernels: proj.narrow (gates view)": lambda: proj.narrow(2, 0, 32),
        "torch: an empty tensor": lambda: torch.empty(3),
        "python: a call of a lambda that does nothing": lambda: None,
    }


def _time(fn, calls: int, clock) -> float:
    t0 = clock()
    for _ in range(calls):
        fn()
    return (clock() - t0) / calls


def measure(shape, variants, rounds: int, calls: int, threads: int):
    rows = []
    with torch.no_grad():
        stages = {v: _stages(shape, v) for v in variants}
        for label, n, clock in (("cpu_us_1thread", 1, time.thread_time),
                                (f"wall_us_{threads}threads", threads, time.perf_counter)):
            torch.set_num_threads(n)
            got = {(v, s): [] for v in variants for s in stages[v]}
            for fn in (f for v in variants for f in stages[v].values()):  # warm-up
                for _ in range(3):
                    fn()
            for _ in range(rounds):
                for v in variants:
                    for s, fn in stages[v].items():
                        got[(v, s)].append(_time(fn, calls, clock))
            for (v, s), ts in got.items():
                row = next((r for r in rows if r["variant"] == v and r["stage"] == s), None)
                if row is None:
                    row = {"shape": shape[0], "variant": v, "stage": s,
                           "runner": _runner_of(shape, v)}
                    rows.append(row)
                row[label] = round(statistics.median(ts) * 1e6, 1)
    return rows


def _runner_of(shape, variant) -> str:
    if variant == "nn.LSTM":
        return "-"
    _, layers, d_in, H, bi, B, T = shape
    m = AblatedRNN(variant, d_in, H, num_layers=layers, bidirectional=bi)
    dirs = 2 if bi else 1
    x = torch.zeros(T, B, d_in)
    params = [m.layer_parameters(0, d) for d in range(dirs)]
    h = x.new_zeros(dirs, B, H)
    v = m.variant
    with torch.no_grad():
        return plan_mod.decide(x, params, h, h, scan_layout=dispatch.scan.scan_applies(v)
                               if not v.reads_hidden else False, spec=v.kernel_spec).runner


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", nargs="+", default=["fixed cost", "PTB small LM"],
                   choices=list(SHAPES))
    p.add_argument("--variants", nargs="+", default=["nn.LSTM", "lstm", "ran",
                                                     "lstm_minus_srnn_minus_hidden"])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--calls", type=int, default=200, help="calls per round and stage (their "
                   "mean is the round's figure); a large shape takes fewer (at least 5)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--statements", action="store_true",
                   help="also time the Python statements of a small layer call one by one")
    p.add_argument("--out", type=Path, help="write OUT.json and OUT.md")
    a = p.parse_args(argv)
    machine = describe(dict(cpu_info(), threads=a.threads))
    print(f"# machine: {machine}; kernel: {registry.cpu_kernel_source()}", flush=True)
    rows = []
    wall = f"wall_us_{a.threads}threads"
    for name in a.shapes:
        shape = SHAPES[name]
        calls = a.calls if name == "fixed cost" else max(5, a.calls // 20)
        got = measure(shape, a.variants, a.rounds, calls, a.threads)
        for r in got:
            print(f"{r['shape']:13s} {r['variant']:30s} {r['stage']:15s} {r['runner']:15s} "
                  f"cpu(1t) {r['cpu_us_1thread']:9.1f} us  wall({a.threads}t) {r[wall]:9.1f} us",
                  flush=True)
        rows += got
    statements = []
    if a.statements:
        torch.set_num_threads(1)
        with torch.no_grad():
            fns = _statements()
            got = {k: [] for k in fns}
            for _ in range(a.rounds):
                for k, fn in fns.items():
                    got[k].append(_time(fn, 10 * a.calls, time.thread_time))
        for k, ts in got.items():
            statements.append({"statement": k, "cpu_us_1thread": round(statistics.median(ts)
                                                                          * 1e6, 2)})
            print(f"{k:62s} {statements[-1]['cpu_us_1thread']:7.2f} us", flush=True)
    if a.out is not None:
        command = "python benchmarks/fixed_cost.py " + " ".join(
            f"'{x}'" if " " in x else x for x in (argv if argv is not None else sys.argv[1:]))
        a.out.with_suffix(".json").write_text(json.dumps(
            {"machine": machine, "command": command, "torch": torch.__version__,
             "rounds": a.rounds, "calls": a.calls, "rows": rows, "statements": statements},
            indent=1) + "\n")
        lines = ["# The fixed cost of a layer call (inference), stage by stage", "",
                 f"Machine: {machine}; torch {torch.__version__}. Command: `{command}`. "
                 f"Median of {a.rounds} interleaved rounds; CPU µs: the calling thread's CPU "
                 f"time per call with 1 torch thread; wall µs: with {a.threads} threads. Each "
                 "stage includes those below it (see the script's docstring); `module` is the "
                 "whole stack, the other stages one layer.", "",
                 f"| shape | model | runner | stage | CPU µs (1 thread) | wall µs ({a.threads} "
                 "threads) |", "|---|---|---|---|---|---|"]
        lines += [f"| {r['shape']} | {r['variant']} | {r['runner']} | {r['stage']} | "
                  f"{r['cpu_us_1thread']:.1f} | {r[wall]:.1f} |" for r in rows]
        if statements:
            lines += ["", "Python statements of a small layer call, each alone (shape \"fixed "
                      "cost\", lstm; the calling thread's CPU µs per call, 1 torch thread):", "",
                      "| statement | CPU µs |", "|---|---|"]
            lines += [f"| {r['statement']} | {r['cpu_us_1thread']:.2f} |" for r in statements]
        a.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
