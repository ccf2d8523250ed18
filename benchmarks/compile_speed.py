"""AblatedRNN compiled with ``torch.compile`` (default backend, ``fullgraph=True``) against the
same module in eager mode, on the experiments' shapes: training (forward + backward) and
inference, interleaved rounds in one process, median; ratio = eager time / compiled time (> 1:
the compiled module is faster).  The compiled graph calls the same kernel operators, so the
ratio measures what compiling the code around them costs or gains.  The shape "fixed cost" (one
layer of 8 units, one row, one step) has next to no kernel time: its compiled - eager difference
is the per-call cost of the compiled wrapper (dynamo's guards, the AOT runtime wrapper, the
operators' dispatch), which the other rows carry too.

    python benchmarks/compile_speed.py --shapes "PTB medium LM" "BiDAF modeling" --variants ran lstm
    python benchmarks/compile_speed.py --out benchmarks/results/compile_speed_cpu
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

from rnn_ablations import AblatedRNN  # noqa: E402
from rnn_ablations.commands.machine import cpu_info, describe  # noqa: E402
from rnn_ablations.commands.speed import EXPERIMENT_SHAPES  # noqa: E402


#: (name, layers, input size, hidden, bidirectional, batch, steps), beside the experiments' shapes
FIXED_COST_SHAPE = ("fixed cost", 1, 8, 8, False, 1, 1)


def measure(shape, variant: str, rounds: int, warmup: int, calls: int = 1):
    name, layers, d_in, hidden, bi, batch, seq_len = shape
    # each (shape, variant) compiles afresh: AblatedRNN.forward is one code object for every
    # module, and dynamo's recompile limit (8 graphs per code object) counts them together
    torch._dynamo.reset()
    torch.manual_seed(0)
    rnn = AblatedRNN(variant, d_in, hidden, num_layers=layers, bidirectional=bi, batch_first=True)
    compiled = torch.compile(rnn, fullgraph=True)
    x = torch.randn(batch, seq_len, d_in, requires_grad=True)

    def train(m):
        out, _ = m(x)
        out.sum().backward()

    def infer(m):
        with torch.no_grad():
            m(x)

    times = {(k, mode): [] for k in ("eager", "compiled") for mode in ("train", "inference")}
    for r in range(warmup + rounds):
        for key, m in (("eager", rnn), ("compiled", compiled)):
            for mode, fn in (("train", train), ("inference", infer)):
                elapsed = 0.0
                for _ in range(calls):
                    t0 = time.perf_counter()
                    fn(m)
                    elapsed += time.perf_counter() - t0
                    rnn.zero_grad(set_to_none=True)
                    x.grad = None
                if r >= warmup:
                    times[(key, mode)].append(elapsed / calls)
    rows = []
    for mode in ("train", "inference"):
        eager = statistics.median(times[("eager", mode)])
        comp = statistics.median(times[("compiled", mode)])
        rows.append({"shape": name, "variant": variant, "mode": mode,
                     "eager_ms": round(eager * 1e3, 3), "compiled_ms": round(comp * 1e3, 3),
                     "eager_over_compiled": round(eager / comp, 3),
                     "compiled_minus_eager_us": round((comp - eager) * 1e6, 1),
                     "rounds": rounds, "calls_per_round": calls})
    return rows


def main(argv=None) -> int:
    shapes = {s[0]: s for s in [FIXED_COST_SHAPE, *EXPERIMENT_SHAPES]}
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", nargs="+", default=list(shapes), help=", ".join(shapes))
    p.add_argument("--variants", nargs="+", default=["ran", "lstm"])
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--warmup", type=int, default=3,
                   help="rounds not timed (the first compiles)")
    p.add_argument("--calls", type=int, default=1,
                   help="calls per round and mode, timed together (their mean per call is the "
                        "round's time; more calls steady the small shapes)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, help="write OUT.json and OUT.md")
    a = p.parse_args(argv)
    bad = [s for s in a.shapes if s not in shapes]
    if bad:
        p.error(f"unknown shape(s) {bad}; choose from: {', '.join(shapes)}")
    if a.rounds < 1 or a.warmup < 1 or a.threads < 1 or a.calls < 1:
        p.error("--rounds, --warmup, --calls and --threads must be >= 1 (the first call "
                "compiles)")
    torch.set_num_threads(a.threads)
    machine = describe(dict(cpu_info(), threads=a.threads))
    print(f"# machine: {machine}", flush=True)
    rows = []
    for s in a.shapes:
        for v in a.variants:
            got = measure(shapes[s], v, a.rounds, a.warmup, a.calls)
            for r in got:
                print(f"{r['shape']:16s} {r['variant']:6s} {r['mode']:9s} eager "
                      f"{r['eager_ms']:9.3f} ms  compiled {r['compiled_ms']:9.3f} ms  "
                      f"eager/compiled {r['eager_over_compiled']:.3f}  compiled-eager "
                      f"{r['compiled_minus_eager_us']:7.1f} us", flush=True)
            rows += got
    if a.out is not None:
        command = "python benchmarks/compile_speed.py " + " ".join(
            f"'{x}'" if " " in x else x for x in (argv if argv is not None else sys.argv[1:]))
        a.out.with_suffix(".json").write_text(json.dumps(
            {"machine": machine, "command": command, "torch": torch.__version__, "rows": rows},
            indent=1) + "\n")
        lines = ["# torch.compile (default backend, fullgraph) against eager", "",
                 f"Machine: {machine}; torch {torch.__version__}. Command: `{command}`. Median of "
                 f"{a.rounds} interleaved rounds of {a.calls} call(s) each; eager / compiled > 1: "
                 "compiled faster. \"fixed cost\": one layer of 8 units, one row, one step (the "
                 "compiled wrapper's per-call cost).", "",
                 "| shape | variant | mode | eager ms | compiled ms | eager / compiled | "
                 "compiled - eager µs |",
                 "|---|---|---|---|---|---|---|"]
        lines += [f"| {r['shape']} | {r['variant']} | {r['mode']} | {r['eager_ms']:.3f} | "
                  f"{r['compiled_ms']:.3f} | {r['eager_over_compiled']:.3f} | "
                  f"{r['compiled_minus_eager_us']:.0f} |" for r in rows]
        a.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
