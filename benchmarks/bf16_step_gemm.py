#!/usr/bin/env python
"""bfloat16 models on the CPU kernels with the step GEMM in float32 and in bfloat16
(``Policy.bf16_step_gemm``), against ``nn.LSTM`` in bfloat16: the measurement behind the
policy's ``"auto"`` (bfloat16 where the CPU has AVX512-BF16 or AMX).

    python benchmarks/bf16_step_gemm.py                        # experiments' shapes, lstm and ran
    python benchmarks/bf16_step_gemm.py --variants lstm --shape-names "PTB medium LM"

Each shape (``benchmarks/speed.py --shapes experiments``, batch first) and variant is timed in
training (forward + backward) and inference (``torch.no_grad()``): ``nn.LSTM`` in bfloat16 (the
same layers, directions and sizes), the variant in bfloat16 with the step GEMM in float32
(``f32``) and in bfloat16 (``bf16``), the three called alternately in every round (median of
``--repeats`` rounds), at ``--threads`` threads.  Ratios are nn.LSTM's time over the variant's
(above 1: the variant is faster), as in ``speed.py``'s tables; ``f32/bf16`` above 1: the
bfloat16 step GEMM is faster.  The input projection's GEMM is as ``Policy.bf16_gemm`` says on
this CPU in those three; a fourth model, ``bf16, f32 proj``, has the bfloat16 step GEMM with the
projection in float32 (``bf16_gemm="off"``), which separates the two GEMMs' shares.  Only
meaningful on a CPU with bfloat16 GEMM instructions (the output says whether this one has
them); elsewhere the bfloat16 GEMM converts to float32 inside the library and is expected to
lose.  Writes ``OUT/bf16_step_gemm_<cpu-name>.{json,md}``.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _alternating import alternating_medians, write_results  # noqa: E402


def main(argv=None) -> int:
    from rnn_ablations import AblatedRNN, options
    from rnn_ablations import plan as run_plan
    from rnn_ablations.commands.machine import cpu_file_name, describe
    from rnn_ablations.commands.speed import EXPERIMENT_SHAPES
    from rnn_ablations.kernels import registry
    from rnn_ablations.kernels.registry import cpu_has_bf16_gemm
    from rnn_ablations.variants import get_variant
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variants", nargs="+", default=["lstm", "ran"])
    p.add_argument("--shape-names", nargs="+", default=None,
                   help="rows of the experiments' shapes (default: all)")
    p.add_argument("--modes", nargs="+", default=["train", "inference"],
                   choices=["train", "inference"])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    p.add_argument("--name", default=None)
    args = p.parse_args(argv)
    if args.threads < 1 or args.repeats < 1 or args.warmup < 0:
        p.error("--threads and --repeats must be >= 1, --warmup >= 0")
    if registry.cpu_kernel() is None:
        print("bf16_step_gemm: the CPU kernel is not built (bash scripts/setup.sh)")
        return 2
    for v in args.variants:
        if not get_variant(v).reads_hidden:
            p.error(f"--variants {v!r}: a cell that reads no h_{{t-1}} has no step GEMM")
    shapes = EXPERIMENT_SHAPES
    if args.shape_names:
        known = {s[0] for s in shapes}
        bad = [n for n in args.shape_names if n not in known]
        if bad:
            p.error(f"--shape-names {bad}: not an experiments' shape; choose from "
                    f"{sorted(known)}")
        shapes = [s for s in shapes if s[0] in args.shape_names]
    torch.set_num_threads(args.threads)
    has_isa = cpu_has_bf16_gemm()
    print(f"bfloat16 GEMM instructions (AVX512-BF16 or AMX): {'yes' if has_isa else 'no'}"
          + ("" if has_isa else " -- the bf16 step GEMM is converted to float32 inside the "
             "library here: these numbers do not decide the policy"), flush=True)
    base = run_plan.POLICY
    policies = {"f32": dataclasses.replace(base, bf16_step_gemm="off"),
                "bf16": dataclasses.replace(base, bf16_step_gemm="on"),
                "bf16_f32proj": dataclasses.replace(base, bf16_step_gemm="on",
                                                    bf16_gemm="off")}
    bf = torch.bfloat16
    rows = []
    try:
        for label, layers, d_in, hidden, bi, batch, seq_len in shapes:
            torch.manual_seed(0)
            x = torch.randn(batch, seq_len, d_in, dtype=bf, requires_grad=True)
            ref = torch.nn.LSTM(d_in, hidden, num_layers=layers, bidirectional=bi,
                                batch_first=True).to(bf)
            for v in args.variants:
                model = AblatedRNN(v, d_in, hidden, num_layers=layers, bidirectional=bi,
                                   batch_first=True).to(bf)
                for mode in args.modes:
                    def call(which, mode=mode, model=model):
                        run_plan.POLICY = policies.get(which, base)
                        m = ref if which == "nn.LSTM" else model
                        with options(backend="kernel"):
                            if mode == "inference":
                                with torch.no_grad():
                                    m(x)
                            else:
                                out, _ = m(x)
                                out.float().sum().backward()
                    calls = {k: (lambda k=k: call(k)) for k in ("nn.LSTM", *policies)}
                    med = alternating_medians(calls, args.repeats, args.warmup)
                    row = {"shape": label, "layers": layers, "d_in": d_in, "hidden": hidden,
                           "bidirectional": bi, "batch": batch, "steps": seq_len,
                           "variant": v, "mode": mode,
                           "lstm_ms": round(med["nn.LSTM"] * 1e3, 3),
                           "f32_ms": round(med["f32"] * 1e3, 3),
                           "bf16_ms": round(med["bf16"] * 1e3, 3),
                           "bf16_f32proj_ms": round(med["bf16_f32proj"] * 1e3, 3),
                           "ratio_f32": round(med["nn.LSTM"] / med["f32"], 3),
                           "ratio_bf16": round(med["nn.LSTM"] / med["bf16"], 3),
                           "f32_over_bf16": round(med["f32"] / med["bf16"], 3)}
                    rows.append(row)
                    print(f"{label:24s} {v:6s} {mode:9s} nn.LSTM {row['lstm_ms']:8.2f} ms  "
                          f"f32 step {row['f32_ms']:8.2f} ms ({row['ratio_f32']:.2f}x)  "
                          f"bf16 step {row['bf16_ms']:8.2f} ms ({row['ratio_bf16']:.2f}x)  "
                          f"f32/bf16 {row['f32_over_bf16']:.2f}  bf16 step, f32 proj "
                          f"{row['bf16_f32proj_ms']:8.2f} ms", flush=True)
    finally:
        run_plan.POLICY = base
    machine = describe()
    name = args.name or f"bf16_step_gemm_{cpu_file_name()}"
    meta = {"command": "python benchmarks/bf16_step_gemm.py " + " ".join(argv or sys.argv[1:]),
            "machine": machine, "bf16_instructions": has_isa, "threads": args.threads,
            "repeats": args.repeats, "bf16_gemm": base.bf16_gemm}
    lines = [f"# bfloat16: the step GEMM in float32 vs bfloat16, against nn.LSTM ({machine})", "",
             f"bfloat16 models, {args.threads} thread(s), median of {args.repeats} interleaved "
             f"rounds; ratio = nn.LSTM ms / variant ms (above 1: faster than nn.LSTM); "
             f"bfloat16 GEMM instructions: {'yes' if has_isa else 'no (not meaningful here)'}",
             "", "| shape | variant | mode | nn.LSTM ms | f32 step ms | ratio | bf16 step ms | "
             "ratio | f32/bf16 | bf16 step, f32 proj ms |", "|" + "---|" * 10]
    for r in rows:
        lines.append(f"| {r['shape']} | {r['variant']} | {r['mode']} | {r['lstm_ms']:.2f} | "
                     f"{r['f32_ms']:.2f} | {r['ratio_f32']:.2f}x | {r['bf16_ms']:.2f} | "
                     f"{r['ratio_bf16']:.2f}x | {r['f32_over_bf16']:.2f} | "
                     f"{r['bf16_f32proj_ms']:.2f} |")
    write_results(args.out, name, meta, rows, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
