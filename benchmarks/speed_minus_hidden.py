"""Speed of LSTM − S-RNN − HIDDEN (one input projection + element-wise scan) against
``torch.nn.LSTM`` of the same configuration, on the experiments' shapes (those of
``rnn-ablations speed --shapes experiments``), training (forward + backward of
``output.sum()``) and inference (``no_grad``), float32.

Every model is timed in interleaved rounds (each model once per round, so that a change in machine
load hits all alike); the table shows the median time and the ratio time(nn.LSTM) / time(model)
(> 1 = faster than nn.LSTM), with the spread of the per-round ratios.  Needs a quiet machine.
The file records the machine (``rnn_ablations.commands.machine``: the processor, its vector
flags, the kernel's vector path :func:`rnn_ablations.kernel_isa`, the GPU); ``--isas avx2
portable`` times each model under each vector path in the same rounds (the portable rows are
the fallback for CPUs without AVX2 + FMA).

    .venv/bin/python benchmarks/speed_minus_hidden.py --threads 2
    .venv/bin/python benchmarks/speed_minus_hidden.py --threads 2 --isas avx2 portable
    .venv/bin/python benchmarks/speed_minus_hidden.py --threads 2 --variants lstm_minus_srnn_minus_hidden lstm_minus_srnn
    .venv/bin/python benchmarks/speed_minus_hidden.py --device cuda --shapes gpu

writes ``benchmarks/results/speed_minus_hidden_<device>[_tiny].{json,md}``.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path

import torch

import rnn_ablations
from rnn_ablations import AblatedRNN, get_variant
from rnn_ablations.commands import speed as speed_cmd
from rnn_ablations.commands.machine import machine_info
from rnn_ablations.kernels.scan import scan_kernel_available

sys.path.insert(0, str(Path(__file__).resolve().parent))
from speed_bounds import matmul_bound  # noqa: E402

#: (name, layers, d_in, H, bidirectional, batch, seq_len): the experiments' shapes, the same
#: table as ``rnn-ablations speed --shapes experiments``
EXPERIMENT_SHAPES = list(speed_cmd.EXPERIMENT_SHAPES)
#: the single-layer shapes of the CUDA speed table (B = 32, T = 64, H = 256/650)
GPU_SHAPES = [
    ("single layer 256", 1, 256, 256, False, 32, 64),
    ("single layer 650", 1, 650, 650, False, 32, 64),
]
TINY_SHAPES = [("tiny", 2, 8, 6, True, 3, 5)]
SHAPES = {"experiments": EXPERIMENT_SHAPES, "gpu": GPU_SHAPES, "tiny": TINY_SHAPES}


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _label(variant: str, isa, isas) -> str:
    return variant if isa is None or len(isas) < 2 else f"{variant} [{isa}]"


def measure(shapes, variants, repeats: int, warmup: int, device: str, isas=(None,),
            clock=time.perf_counter):
    """Rows of the result table; every model once per round, each of ours under every ISA of
    ``isas`` (None: the kernel's current path); ``clock``: the wall clock, or
    ``time.process_time`` (the process's CPU time, all threads)."""
    rows = []
    for name, layers, d_in, H, bi, B, T in shapes:
        torch.manual_seed(0)
        models = {"nn.LSTM": torch.nn.LSTM(d_in, H, num_layers=layers, bidirectional=bi,
                                           batch_first=True)}
        for v in variants:
            models[v] = AblatedRNN(v, d_in, H, num_layers=layers, bidirectional=bi,
                                   batch_first=True)
        models = {k: m.to(device) for k, m in models.items()}
        x = torch.randn(B, T, d_in, device=device, requires_grad=True)
        # (label, model, ISA): nn.LSTM once, each variant under every ISA asked for
        runs = [("nn.LSTM", models["nn.LSTM"], None)]
        runs += [(_label(v, isa, isas), models[v], isa) for v in variants for isa in isas]
        times = {(k, mode): [] for k, _, _ in runs for mode in ("train", "inference")}

        def train(m):
            m(x)[0].sum().backward()

        def infer(m):
            with torch.no_grad():
                m(x)

        for r in range(warmup + repeats):
            for k, m, isa in runs:
                with (rnn_ablations.use_kernel_isa(isa) if isa else contextlib.nullcontext()):
                    for mode, step in (("train", train), ("inference", infer)):
                        _sync(device)
                        t0 = clock()
                        step(m)
                        _sync(device)
                        if r >= warmup:
                            times[(k, mode)].append(clock() - t0)
        bound = matmul_ratio(layers, d_in, H, bi)
        for mode in ("train", "inference"):
            ref = times[("nn.LSTM", mode)]
            for k, _, isa in runs:
                ts = times[(k, mode)]
                ratios = [a / b for a, b in zip(ref, ts)]
                rows.append({"shape": name, "layers": layers, "d_in": d_in, "hidden": H,
                             "bidirectional": bi, "batch": B, "seq_len": T, "model": k,
                             "kernel_isa": isa or (rnn_ablations.kernel_isa()
                                                   if device == "cpu" and k != "nn.LSTM" else None),
                             "mode": mode, "matmul_ratio": bound,
                             "median_ms": 1e3 * statistics.median(ts),
                             "ratio_vs_nn_lstm": statistics.median(ref) / statistics.median(ts),
                             "fraction_of_bound": (statistics.median(ref) / statistics.median(ts)
                                                   / bound),
                             "ratio_min": min(ratios), "ratio_max": max(ratios)})
        print(f"  done: {name}", file=sys.stderr, flush=True)
    return rows


def matmul_ratio(layers: int, d_in: int, hidden: int, bidirectional: bool) -> float:
    """Multiply-adds of nn.LSTM over those of LSTM − S-RNN − HIDDEN, same configuration:
    per token, layer and direction 4H·(d + H) against 4H·d (no recurrent product).  Where both
    run at the speed of their matrix products, the first is the ratio to expect; below 2 when
    the layers' inputs are wider than H (the gap to 2× must then come from nn.LSTM's small
    per-step products and its sequential element-wise work).  (``speed_bounds.py`` gives it
    for every variant.)"""
    return matmul_bound("lstm_minus_srnn_minus_hidden", layers, d_in, hidden, bidirectional)


def format_table(rows, variants) -> str:
    """``variants``: the model labels of the columns (a variant, or "variant [isa]")."""
    head = ["shape (layers, d_in, H, bi, B, T)"]
    for v in variants:
        head += [f"{v} train", f"{v} infer"]
    head += ["nn.LSTM train ms", "nn.LSTM infer ms", "matmul ratio"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    by = {(r["shape"], r["model"], r["mode"]): r for r in rows}
    for shape in dict.fromkeys(r["shape"] for r in rows):
        r0 = by[(shape, "nn.LSTM", "train")]
        cells = [f"{shape}: {r0['layers']}, {r0['d_in']}, {r0['hidden']}, "
                 f"{'bi' if r0['bidirectional'] else 'uni'}, {r0['batch']}, {r0['seq_len']}"]
        bound = matmul_ratio(r0['layers'], r0['d_in'], r0['hidden'], r0['bidirectional'])
        for v in variants:
            for mode in ("train", "inference"):
                r = by[(shape, v, mode)]
                cells.append(f"{r['ratio_vs_nn_lstm']:.2f}× ({r['ratio_min']:.2f}–"
                             f"{r['ratio_max']:.2f}; {r['ratio_vs_nn_lstm'] / bound:.0%} of "
                             f"{bound:.2f})")
        cells += [f"{by[(shape, 'nn.LSTM', m)]['median_ms']:.1f}" for m in ("train", "inference")]
        cells.append(f"{matmul_ratio(r0['layers'], r0['d_in'], r0['hidden'], r0['bidirectional']):.2f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", choices=sorted(SHAPES), default="experiments")
    p.add_argument("--shape-names", nargs="+", default=None,
                   help="time only these rows of --shapes (e.g. DrQA 'PTB small LM')")
    p.add_argument("--variants", nargs="+", default=["lstm_minus_srnn_minus_hidden"])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                   help="wall clock, or the process's CPU time (with --threads 1: robust to "
                        "other load on a shared machine)")
    p.add_argument("--isas", nargs="+", default=None,
                   help="CPU: time each variant under these vector paths of the kernel (e.g. "
                        "avx2 portable; default: the path in use)")
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    args = p.parse_args(argv)
    if args.threads < 1 or args.repeats < 1 or args.warmup < 0:
        p.error("--threads and --repeats must be >= 1, --warmup >= 0")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device is visible")
    variants = [get_variant(v).name for v in args.variants]
    isas = (None,)
    if args.isas:
        if args.device != "cpu":
            p.error("--isas applies to --device cpu only")
        if not rnn_ablations.kernel_available():
            p.error("--isas needs the compiled CPU kernel")
        unknown = [i for i in args.isas if i not in rnn_ablations.supported_kernel_isas()]
        if unknown:
            p.error(f"--isas {' '.join(unknown)}: this CPU/build runs "
                    f"{', '.join(rnn_ablations.supported_kernel_isas())}")
        isas = tuple(dict.fromkeys(args.isas))
    torch.set_num_threads(args.threads)
    info = machine_info(args.device)
    machine = info["machine"]
    kernel = scan_kernel_available(args.device)
    line = machine
    print(f"{line}; scan kernel {'compiled' if kernel else 'NOT available (generic path)'}",
          flush=True)
    if args.clock == "cpu" and args.device != "cpu":
        p.error("--clock cpu measures CPU work; use the wall clock with --device cuda")
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    shapes = SHAPES[args.shapes]
    if args.shape_names:
        unknown = sorted(set(args.shape_names) - {s[0] for s in shapes})
        if unknown:
            p.error(f"--shape-names {unknown}: choose from {[s[0] for s in shapes]}")
        shapes = [s for s in shapes if s[0] in args.shape_names]
    rows = measure(shapes, variants, args.repeats, args.warmup, args.device, isas,
                   clock)
    labels = [_label(v, isa, isas) for v in variants for isa in isas]
    table = format_table(rows, labels)
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"speed_minus_hidden_{args.device}"
    if args.clock == "cpu":
        stem += "_cpu_clock"
    if args.shapes == "tiny":
        stem += "_tiny"
    meta = {**info, "scan_kernel": kernel,
            "threads": args.threads, "repeats": args.repeats, "warmup": args.warmup,
            "shapes": args.shapes, "clock": args.clock, "command": " ".join(sys.argv),
            "rows": rows}
    (args.out / f"{stem}.json").write_text(json.dumps(meta, indent=1))
    (args.out / f"{stem}.md").write_text(f"{line}; {args.threads} threads, {args.clock} clock; "
                                         f"command `{meta['command']}`; ratio = time(nn.LSTM) "
                                         f"/ time(model), median of {args.repeats} interleaved "
                                         f"rounds (min–max of the per-round ratios; the "
                                         f"share of the bound, the matmul ratio); matmul "
                                         f"ratio = multiply-adds of nn.LSTM / of "
                                         f"LSTM − S-RNN − HIDDEN (see matmul_ratio), the FLOP "
                                         f"bound of the speed-up\n\n{table}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
