"""A/B of the inference workspace (``rnn_ablations/workspace.py``: a layer stack's outputs,
projections and reversed copies in buffers reused from layer to layer) in ONE process: every
shape of ``--shapes`` under ``torch.inference_mode()``, with the workspace and without it (each
layer allocating its tensors, as before), in interleaved rounds so that machine load hits both
alike, and ``nn.LSTM`` of the same configuration in the same rounds.  Prints and saves (under
``benchmarks/results/``) the median time of each, the ratio with/without, each one's ratio to
``nn.LSTM``, and the minor page faults and system CPU time per call (``getrusage``: the cost of
memory that the allocator returned to the OS and faults in again), with the machine.

    .venv/bin/python benchmarks/inference_workspace.py --repeats 21
    .venv/bin/python benchmarks/inference_workspace.py --shapes "PTB medium LM" DrQA --variants lstm

The outputs with and without the workspace are compared (they must be equal: the same
products, written into other memory).
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from pathlib import Path

import torch

import rnn_ablations as ra
from rnn_ablations import rnn as rnn_module
from rnn_ablations.commands.speed import EXPERIMENT_SHAPES, _machine, cpu_info

RESULTS = Path(__file__).resolve().parent / "results"


def _call(model, x):
    with torch.inference_mode():
        return model(x)[0]


def _timed(model, x, faults, sys_ms, times):
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    _call(model, x)
    times.append(1e3 * (time.perf_counter() - t0))
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    faults.append(r1.ru_minflt - r0.ru_minflt)
    sys_ms.append(1e3 * (r1.ru_stime - r0.ru_stime))


def measure(shapes, variants, repeats: int, warmup: int):
    rows = []
    real = rnn_module.inference_workspace
    for name, layers, d_in, hidden, bi, batch, steps in shapes:
        torch.manual_seed(0)
        x = torch.randn(steps, batch, d_in)
        ref = torch.nn.LSTM(d_in, hidden, layers, bidirectional=bi)
        models = {v: ra.AblatedRNN(v, d_in, hidden, num_layers=layers, bidirectional=bi).eval()
                  for v in variants}
        for v, m in models.items():
            rnn_module.inference_workspace = lambda *a: None
            try:
                without = _call(m, x)
            finally:
                rnn_module.inference_workspace = real
            diff = (_call(m, x) - without).abs().max().item()
            if diff != 0:
                raise SystemExit(f"{name} {v}: outputs differ with and without the workspace "
                                 f"(max |diff| {diff:.3e})")
        stats = {key: ([], [], []) for key in
                 ["nn.LSTM"] + [f"{v} {w}" for v in variants for w in ("workspace", "none")]}
        for r in range(warmup + repeats):
            order = list(stats)
            if r % 2:
                order.reverse()
            for key in order:
                faults, sys_ms, times = ([], [], []) if r < warmup else stats[key]
                if key == "nn.LSTM":
                    _timed(ref, x, faults, sys_ms, times)
                    continue
                v, mode = key.rsplit(" ", 1)
                if mode == "none":
                    rnn_module.inference_workspace = lambda *a: None
                try:
                    _timed(models[v], x, faults, sys_ms, times)
                finally:
                    rnn_module.inference_workspace = real
        lstm_ms = statistics.median(stats["nn.LSTM"][2])
        for v in variants:
            with_ms = statistics.median(stats[f"{v} workspace"][2])
            none_ms = statistics.median(stats[f"{v} none"][2])
            row = {"shape": name, "layers": layers, "input": d_in, "hidden": hidden,
                   "bidirectional": bi, "batch": batch, "steps": steps, "variant": v,
                   "nn_lstm_ms": lstm_ms, "workspace_ms": with_ms, "no_workspace_ms": none_ms,
                   "ratio_with_over_without": with_ms / none_ms,
                   "vs_nn_lstm_with": lstm_ms / with_ms, "vs_nn_lstm_without": lstm_ms / none_ms}
            for mode in ("workspace", "none"):
                faults, sys_ms, _ = stats[f"{v} {mode}"]
                row[f"faults_{mode}"] = statistics.median(faults)
                row[f"sys_ms_{mode}"] = statistics.median(sys_ms)
            row["nn_lstm_faults"] = statistics.median(stats["nn.LSTM"][0])
            rows.append(row)
            print(f"{name:16s} {v:16s} with {with_ms:8.2f} ms, without {none_ms:8.2f} ms "
                  f"(with/without {row['ratio_with_over_without']:.3f}); vs nn.LSTM "
                  f"{row['vs_nn_lstm_with']:.2f} / {row['vs_nn_lstm_without']:.2f}; page faults "
                  f"{row['faults_workspace']:.0f} / {row['faults_none']:.0f}, sys "
                  f"{row['sys_ms_workspace']:.2f} / {row['sys_ms_none']:.2f} ms", flush=True)
    return rows


def write(rows, machine: str, command: str, name: str) -> None:
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(
        {"machine": machine, "cpu": cpu_info(), "command": command, "rows": rows}, indent=1))
    lines = [f"Inference workspace A/B — {machine}; `{command}`; median per call, inference_mode; "
             "page faults and system CPU ms per call (getrusage), median", "",
             "| shape | variant | with ms | without ms | with / without | vs nn.LSTM with / without"
             " | page faults with / without (nn.LSTM) | sys ms with / without |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['shape']} | {r['variant']} | {r['workspace_ms']:.2f} | "
                     f"{r['no_workspace_ms']:.2f} | {r['ratio_with_over_without']:.3f} | "
                     f"{r['vs_nn_lstm_with']:.2f} / {r['vs_nn_lstm_without']:.2f} | "
                     f"{r['faults_workspace']:.0f} / {r['faults_none']:.0f} "
                     f"({r['nn_lstm_faults']:.0f}) | {r['sys_ms_workspace']:.2f} / "
                     f"{r['sys_ms_none']:.2f} |")
    (RESULTS / f"{name}.md").write_text("\n".join(lines) + "\n")


def main(argv=None) -> int:
    known = [s[0] for s in EXPERIMENT_SHAPES]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", nargs="+", default=[s for s in known if s not in
                                                   ("single layer 256", "single layer 650")],
                   help=f"experiment shapes by name (default: the multi-layer and bidirectional "
                        f"ones): {', '.join(known)}")
    p.add_argument("--variants", nargs="+", default=["lstm", "ran"])
    p.add_argument("--repeats", type=int, default=11)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--name", default="inference_workspace",
                   help="file name (no suffix) under benchmarks/results/")
    a = p.parse_args(argv)
    unknown = [s for s in a.shapes if s not in known]
    if unknown:
        raise SystemExit(f"unknown shape(s) {unknown}; choose from {known}")
    if a.repeats < 1 or a.warmup < 0 or a.threads < 1:
        raise SystemExit("--repeats and --threads must be >= 1, --warmup >= 0")
    for v in a.variants:
        ra.get_variant(v)  # raises with the list of variants
        if not ra.get_variant(v).reads_hidden:
            raise SystemExit(f"{v}: its layers run the scan, which takes no workspace")
    if not ra.kernel_available():
        raise SystemExit("the CPU kernel is not built: run `bash scripts/setup.sh`")
    torch.set_num_threads(a.threads)
    shapes = [s for s in EXPERIMENT_SHAPES if s[0] in a.shapes]
    machine = _machine()
    print(f"# {machine}", flush=True)
    rows = measure(shapes, a.variants, a.repeats, a.warmup)
    write(rows, machine, "python benchmarks/inference_workspace.py " + " ".join(
        sys.argv[1:] if argv is None else argv), a.name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
