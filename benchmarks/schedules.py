"""A/B of the CPU kernel's two schedules (pipelined vs plain) against torch.nn.LSTM.

    .venv/bin/python benchmarks/schedules.py [--hidden 256 650] [--variants lstm lstm_minus_srnn ran]
                                             [--rounds 15] [--threads N]

Each round times, for every variant, forward + backward and inference under
``use_pipeline("never")`` and ``use_pipeline("always")``, and nn.LSTM, interleaved (so that a
change in machine load hits all of them alike); it prints the median and ratio to nn.LSTM, and
writes benchmarks/results/schedules_<threads>t_h<hidden sizes>.{json,md}.  Shapes as benchmarks/speed.py: batch 32,
length 64, input = hidden, batch_first, float32, one layer.
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

import rnn_ablations as ra
from rnn_ablations.commands.machine import describe


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hidden", type=int, nargs="+", default=[256, 650])
    p.add_argument("--variants", nargs="+", default=["lstm", "lstm_minus_srnn", "ran"])
    p.add_argument("--rounds", type=int, default=15, help="timed rounds (2 more warm up)")
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error("--rounds must be >= 1")
    if args.threads is not None:
        if args.threads < 1:
            p.error("--threads must be >= 1")
        torch.set_num_threads(args.threads)
    if not ra.kernel_available():
        p.error("the compiled CPU kernel is not built: run `bash scripts/setup.sh`")
    variants = [ra.get_variant(v).name for v in args.variants]
    rows = []
    for hidden in args.hidden:
        torch.manual_seed(0)
        x = torch.randn(32, 64, hidden, requires_grad=True)
        models = {"nn.LSTM": (torch.nn.LSTM(hidden, hidden, batch_first=True), "never")}
        for v in variants:
            m = ra.AblatedRNN(v, hidden, hidden, batch_first=True)
            for mode in ("never", "always"):
                models[f"{v} ({'pipelined' if mode == 'always' else 'plain'})"] = (m, mode)
        times = {(k, mode): [] for k in models for mode in ("train", "inference")}
        for r in range(args.rounds + 2):
            for k, (m, mode) in models.items():
                with ra.use_pipeline(mode):
                    t0 = time.perf_counter()
                    out, _ = m(x)
                    out.sum().backward()
                    t1 = time.perf_counter()
                    with torch.no_grad():
                        m(x)
                    t2 = time.perf_counter()
                m.zero_grad(set_to_none=True)
                x.grad = None
                if r >= 2:
                    times[(k, "train")].append(t1 - t0)
                    times[(k, "inference")].append(t2 - t1)
        base = {mode: statistics.median(times[("nn.LSTM", mode)]) for mode in ("train", "inference")}
        for k in models:
            row = {"hidden": hidden, "model": k}
            for mode in ("train", "inference"):
                med = statistics.median(times[(k, mode)])
                row[f"{mode}_ms"] = round(med * 1e3, 2)
                row[f"{mode}_ratio"] = round(base[mode] / med, 3)
            rows.append(row)
    lines = ["| hidden | model | train ms | train ratio | inference ms | inference ratio |",
             "|---|---|---:|---:|---:|---:|"]
    lines += [f"| {r['hidden']} | {r['model']} | {r['train_ms']:.1f} | {r['train_ratio']:.2f}× | "
              f"{r['inference_ms']:.1f} | {r['inference_ratio']:.2f}× |" for r in rows]
    table = "\n".join(lines)
    threads = torch.get_num_threads()
    machine = describe()
    head = (f"machine: {machine}\n\nbatch 32, length 64, input = hidden, batch_first, float32; "
            f"median of {args.rounds} interleaved rounds; wall clock, {threads} thread(s)")
    print(head)
    print(table)
    out = Path(__file__).resolve().parent / "results"
    out.mkdir(exist_ok=True)
    stem = f"schedules_{threads}t_h{'-'.join(str(h) for h in args.hidden)}"
    (out / f"{stem}.json").write_text(json.dumps(
        {"machine": machine, "threads": threads, "rounds": args.rounds, "rows": rows}, indent=2))
    (out / f"{stem}.md").write_text(f"{head}\n\n{table}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
