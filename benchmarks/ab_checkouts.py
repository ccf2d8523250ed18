"""A/B of two checkouts of this repository on one of the experiments' shapes, whole model: this
checkout against ``--other`` (e.g. ``git worktree add /tmp/old <commit>`` with its kernel built
there: ``python setup.py build_ext --inplace``), in alternating processes, each process timing
the variant and ``nn.LSTM`` of the same configuration in interleaved rounds.  A checkout's ratio
to ``nn.LSTM`` in its own process is what is compared: the machine's drift between processes
cancels in it.  Prints each process's ratio and both checkouts' medians.

    python benchmarks/ab_checkouts.py --other /tmp/old --shape parser --variant lstm --mode train

Use it when a ratio of ``benchmarks/speed.py`` differs between two runs made at different
commits and the question is whether the code or the machine moved: both commits are timed here,
on the same machine, in alternating processes.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Runs inside a checkout (its directory first on sys.path): prints one JSON line.
CHILD = r"""
import json, statistics, sys, time
import torch
import rnn_ablations as ra
args = json.loads(sys.argv[1])
torch.set_num_threads(args["threads"])
L, D, H, bi, B, T = args["shape"]
torch.manual_seed(0)
m = ra.AblatedRNN(args["variant"], D, H, num_layers=L, bidirectional=bi, batch_first=True)
ref = torch.nn.LSTM(D, H, L, bidirectional=bi, batch_first=True)
x = torch.randn(B, T, D)
def call(f):
    if args["mode"] == "train":
        f.zero_grad()
        f(x)[0].sum().backward()
    else:
        with torch.inference_mode():
            f(x)
clock = time.process_time if args.get("clock") == "cpu" else time.perf_counter
ts = {"ours": [], "nn.LSTM": []}
for r in range(args["warmup"] + args["rounds"]):
    for k in (("ours", "nn.LSTM") if r % 2 else ("nn.LSTM", "ours")):
        t0 = clock()
        call(m if k == "ours" else ref)
        if r >= args["warmup"]:
            ts[k].append(clock() - t0)
ours, lstm = (1e3 * statistics.median(ts[k]) for k in ("ours", "nn.LSTM"))
print(json.dumps({"package": ra.__file__, "ours_ms": ours, "nn_lstm_ms": lstm,
                  "ratio": lstm / ours}))
"""


def _run(checkout: Path, args: dict) -> dict:
    env = dict(os.environ, PYTHONPATH=str(checkout))
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(args)], cwd=checkout, env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"ab_checkouts: the run in {checkout} failed:\n{proc.stderr[-2000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    if not Path(result["package"]).resolve().is_relative_to(checkout.resolve()):
        raise SystemExit(f"ab_checkouts: the run in {checkout} imported {result['package']}, not "
                         "the checkout's package")
    return result


def _compare(a, shape_name, shape, variant, mode) -> dict:
    """One (shape, variant, mode): ``a.processes`` processes per checkout, alternating."""
    child = {"shape": list(shape), "variant": variant, "mode": mode, "rounds": a.rounds,
             "warmup": a.warmup, "threads": a.threads, "clock": a.clock}
    ratios = {"this": [], "other": []}
    for i in range(a.processes):
        order = (("this", REPO), ("other", a.other)) if i % 2 == 0 else \
            (("other", a.other), ("this", REPO))
        for name, checkout in order:
            r = _run(checkout, child)
            ratios[name].append(r["ratio"])
            print(f"{name:5s} ({checkout}): {variant} {mode} {r['ours_ms']:.1f} ms, nn.LSTM "
                  f"{r['nn_lstm_ms']:.1f} ms, ratio {r['ratio']:.2f}", flush=True)
    this, other = (statistics.median(ratios[k]) for k in ("this", "other"))
    print(f"# {shape_name} {variant} {mode}, {a.threads} threads, {a.clock} clock: ratio to "
          f"nn.LSTM, median of "
          f"{a.processes} processes: this {this:.2f} "
          f"({min(ratios['this']):.2f}-{max(ratios['this']):.2f}), other {other:.2f} "
          f"({min(ratios['other']):.2f}-{max(ratios['other']):.2f})", flush=True)
    return {"shape": shape_name, "variant": variant, "mode": mode, "this": ratios["this"],
            "other": ratios["other"], "this_median": round(this, 3),
            "other_median": round(other, 3), "this_over_other": round(this / other, 3)}


def main(argv=None) -> int:
    sys.path.insert(0, str(REPO))
    from rnn_ablations.commands.machine import cpu_info, describe
    from rnn_ablations.commands.speed import EXPERIMENT_SHAPES
    shapes = {s[0]: s[1:] for s in EXPERIMENT_SHAPES}
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--other", type=Path, required=True, help="the other checkout's root")
    p.add_argument("--shape", required=True, nargs="+",
                   help=f"one or more of: {', '.join(shapes)}; or all")
    p.add_argument("--variant", default=["lstm"], nargs="+")
    p.add_argument("--mode", choices=["train", "inference", "both"], default="train")
    p.add_argument("--processes", type=int, default=3, help="processes per checkout")
    p.add_argument("--rounds", type=int, default=11)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                   help="wall clock, or each process's CPU time (all its threads; with "
                        "--threads 1 robust to other load on a shared machine)")
    p.add_argument("--out", type=Path, help="also write the rows to OUT.json and a table to "
                   "OUT.md (e.g. benchmarks/results/NAME)")
    a = p.parse_args(argv)
    names = list(shapes) if a.shape == ["all"] else a.shape
    unknown = [s for s in names if s not in shapes]
    if unknown:
        p.error(f"unknown shape(s) {unknown}; choose from: {', '.join(shapes)}, or all")
    if not (a.other / "rnn_ablations" / "__init__.py").is_file():
        p.error(f"--other {a.other}: no rnn_ablations package there (give a checkout's root)")
    if a.processes < 1 or a.rounds < 1 or a.warmup < 0 or a.threads < 1:
        p.error("--processes, --rounds and --threads must be >= 1, --warmup >= 0")
    machine = describe(dict(cpu_info(), threads=a.threads))
    print(f"# machine: {machine}", flush=True)
    modes = ["train", "inference"] if a.mode == "both" else [a.mode]
    rows = [_compare(a, name, shapes[name], variant, mode)
            for name in names for variant in a.variant for mode in modes]
    if a.out is not None:
        command = "python benchmarks/ab_checkouts.py " + " ".join(
            f"'{x}'" if " " in x else x for x in (argv if argv is not None else sys.argv[1:]))
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.with_suffix(".json").write_text(json.dumps(
            {"machine": machine, "command": command, "other": str(a.other), "rows": rows},
            indent=1) + "\n")
        lines = [f"# A/B of two checkouts: ratio to nn.LSTM in each process, median of "
                 f"{a.processes} processes per checkout", "", f"Machine: {machine}. "
                 f"Command: `{command}`; {a.threads} thread(s), {a.clock} clock.", "",
                 "| shape | variant | mode | this | other | this / other |", "|---|---|---|---|---|---|"]
        lines += [f"| {r['shape']} | {r['variant']} | {r['mode']} | {r['this_median']:.2f} | "
                  f"{r['other_median']:.2f} | {r['this_over_other']:.3f} |" for r in rows]
        a.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
