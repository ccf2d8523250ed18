"""A/B of two builds of the CPU kernel in ONE process: the plain kernel's forward
(``_C.plain_forward``: the step GEMM and the element-wise pass, no input projection) and its
forward + backward (``plain_backward``: the per-step GEMM for dh and the weight gradient), or with
``--kernel scan`` the element-wise scan's forward and backward, of the installed module against
another compiled ``_C`` module (e.g. one built from an older commit), called in interleaved order
so that machine load hits both alike.  Prints the median time of each, their ratio and the
largest output difference (0 when the arithmetic is the same).

    python benchmarks/ab_kernel_modules.py --other /path/to/old/_C.cpython-311-x86_64-linux-gnu.so
    python benchmarks/ab_kernel_modules.py --other OLD_SO --kernel scan --isa portable

Build the other module from a checkout of the older commit (``python setup.py build_ext
--inplace`` there) and copy its ``rnn_ablations/_C*.so`` out first.  Both modules must have
the same ``forward`` entry point (``spec, highway, proj, w_hh, h0, c0, batch_sizes, rec_mask,
keep_hin, in_place``) and ``plain_backward`` (``spec, highway, grad_out, grad_hn, grad_cn,
gates, cs, hin, out, proj, w_hh, h0, c0, batch_sizes, rec_mask``); for the scan ``scan_forward`` / ``scan_backward`` with the kernel spec and
highway flag first): a module with another signature is refused by the call.
"""
from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import json
import os
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch

import rnn_ablations as ra
from rnn_ablations.kernels import registry
from rnn_ablations.commands.machine import describe

# the step kernel: variant, hidden, batch, steps (PTB medium, single layer 256, PTB small, parser-like)
SHAPES = [("ran", 650, 20, 35), ("lstm", 650, 20, 35), ("ran", 256, 32, 64), ("lstm", 256, 32, 64),
          ("ran", 200, 20, 20), ("lstm", 200, 20, 20), ("lstm", 100, 40, 200)]
# the element-wise scan (LSTM - S-RNN - HIDDEN): hidden, batch, steps, highway
SCAN_SHAPES = [(256, 32, 100, False), (256, 32, 100, True), (650, 32, 100, False),
               (650, 32, 100, True)]
SCAN_VARIANT = "lstm_minus_srnn_minus_hidden"


def _load(path: str):
    if not os.path.isfile(path):
        raise SystemExit(f"--other {path!r}: no such file; give the path of a compiled _C*.so")
    loader = importlib.machinery.ExtensionFileLoader("rnn_ablations_other._C", path)
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    if _plain_forward(module) is None:
        raise SystemExit(f"--other {path!r} has no plain_forward (or older: forward) entry point: "
                         "not an rnn_ablations _C")
    return module


def _plain_forward(module):
    """The plain step kernel's forward entry of ``module``: ``plain_forward``, or ``forward`` in a
    module built from sources older than that name."""
    return getattr(module, "plain_forward", None) or getattr(module, "forward", None)


def step_calls(dtype):
    """(label, call(module)) for the plain step kernel on SHAPES: its forward as in inference,
    and its forward keeping what the backward reads followed by ``plain_backward`` (training)."""
    for variant, hidden, batch, steps in SHAPES:
        v = ra.get_variant(variant)
        torch.manual_seed(0)
        m = ra.AblatedRNN(variant, hidden, hidden).to(dtype)
        w = m.weight_hh_l0.detach().contiguous()
        proj0 = torch.randn(steps, batch, m.weight_ih_l0.shape[0], dtype=dtype)
        h0 = torch.zeros(batch, hidden, dtype=dtype)
        g_out = torch.randn(steps, batch, hidden, dtype=dtype)
        bs = torch.full((steps,), batch, dtype=torch.int64)
        empty = torch.empty(0, dtype=dtype)

        def run(module, v=v, proj0=proj0, w=w, h0=h0, bs=bs, empty=empty):
            return [_plain_forward(module)(v.kernel_spec, False, proj0.clone(), w, h0, h0, bs,
                                           empty, False, True)[0]]

        def train(module, v=v, proj0=proj0, w=w, h0=h0, bs=bs, empty=empty, g_out=g_out):
            proj = proj0.clone()
            out, _, _, gates, cs, hin = _plain_forward(module)(
                v.kernel_spec, False, proj, w, h0, h0, bs, empty, True, True)
            backward = getattr(module, "plain_backward", None)
            if backward is None:
                raise SystemExit(f"{module.__file__!r} has no plain_backward entry point: build "
                                 "the other module from a newer commit, or use --kernel scan")
            return backward(v.kernel_spec, False, g_out, h0, h0, gates, cs, hin, out, proj, w, h0,
                            h0, bs, empty)

        label = f"{variant:5s} H={hidden:4d} B={batch:3d} T={steps:4d}"
        yield label + " forward", run
        yield label + " fwd+bwd", train


def scan_calls(dtype):
    """(label, call(module)) for the element-wise scan's forward (saving the memories) and
    forward + backward (with the bias gradient) on SCAN_SHAPES."""
    v = ra.get_variant(SCAN_VARIANT)
    for hidden, batch, steps, highway in SCAN_SHAPES:
        torch.manual_seed(0)
        width = len(v.blocks(highway)[1]) * hidden
        proj = torch.randn(steps, batch, width, dtype=dtype)
        bias = torch.randn(width, dtype=dtype)
        zeros = torch.zeros(1, batch, hidden, dtype=dtype)
        g_out = torch.randn(steps, batch, hidden, dtype=dtype)
        bs = torch.full((steps,), batch, dtype=torch.int64)

        def fwd(module, highway=highway, proj=proj, bias=bias, zeros=zeros, bs=bs):
            return module.scan_forward(v.kernel_spec, highway, proj, zeros, zeros, bs, True, bias)

        def bwd(module, highway=highway, proj=proj, bias=bias, zeros=zeros, bs=bs, g_out=g_out,
                fwd=fwd):
            cs = fwd(module)[3]
            return module.scan_backward(v.kernel_spec, highway, g_out, zeros, zeros, proj, zeros,
                                        cs, bs, bias, True)

        label = f"scan H={hidden:4d} B={batch:3d} T={steps:4d} highway={int(highway)}"
        yield label + " forward", fwd
        yield label + " fwd+bwd", bwd


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--other", required=True, help="path of the other compiled _C module")
    p.add_argument("--calls", type=int, default=25, help="interleaved calls per module and shape")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--kernel", choices=("step", "scan"), default="step",
                   help="the plain step kernel's, or the element-wise scan's, forward and "
                        "forward + backward")
    p.add_argument("--isa", default=None,
                   help="the kernels' vector path in both modules (e.g. portable; default: "
                        "each module's own choice)")
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    p.add_argument("--out", type=Path,
                   help="also write OUT.json and OUT.md (the rows, the machine, the command)")
    p.add_argument("--other-label", default=None,
                   help="what the other module is, for --out (e.g. the commit it was built from)")
    a = p.parse_args(argv)
    if a.calls < 4 or a.threads < 1:
        raise SystemExit("--calls must be >= 4 and --threads >= 1")
    if registry.cpu_kernel() is None:
        raise SystemExit("the installed package has no CPU kernel: run `bash scripts/setup.sh`")
    torch.set_num_threads(a.threads)
    other, mine = _load(a.other), registry.cpu_kernel().raw
    dtype = getattr(torch, a.dtype)
    if a.isa is not None:
        for module in (other, mine):
            if a.isa not in module.supported_isas():
                raise SystemExit(f"--isa {a.isa!r}: not a vector path of "
                                 f"{'this' if module is mine else 'the other'} module on this CPU "
                                 f"(it has {', '.join(module.supported_isas())})")
            module.set_kernel_isa(a.isa)
    machine = describe()
    setting = (f"kernel vector path: this module {mine.kernel_isa()}, other {other.kernel_isa()}; "
               f"{a.threads} thread(s), {a.dtype}, median of {a.calls - 3} interleaved calls")
    print(f"# machine: {machine}")
    print(f"# {setting}")
    rows = []
    calls = step_calls(dtype) if a.kernel == "step" else scan_calls(dtype)
    for label, run in calls:
        times = {"this": [], "other": []}
        with torch.no_grad():
            for r in range(a.calls):
                pair = (("this", mine), ("other", other)) if r % 2 else (("other", other), ("this", mine))
                for name, module in pair:
                    t0 = time.perf_counter()
                    run(module)
                    times[name].append(time.perf_counter() - t0)
            diff = max(((x - y).abs().max().item() for x, y in zip(run(mine), run(other))
                        if x.numel()), default=0.0)
        this_ms = 1e3 * statistics.median(times["this"][3:])
        other_ms = 1e3 * statistics.median(times["other"][3:])
        print(f"{label}: this {this_ms:7.2f} ms, other {other_ms:7.2f} ms, "
              f"this/other {this_ms / other_ms:.3f}, max |diff| {diff:.2e}")
        rows.append({"call": label.strip(), "this_ms": round(this_ms, 3),
                     "other_ms": round(other_ms, 3), "this_over_other": round(this_ms / other_ms, 3),
                     "max_abs_diff": diff})
    if a.out is not None:
        _write(a, rows, machine, setting)
    return 0


def _write(a, rows, machine, setting) -> None:
    command = "python benchmarks/ab_kernel_modules.py " + shlex.join(sys.argv[1:])
    other = a.other_label or os.path.basename(a.other)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.with_suffix(".json").write_text(json.dumps(
        {"machine": machine, "setting": setting, "other": other, "command": command,
         "rows": rows}, indent=2) + "\n")
    lines = [f"# {a.kernel} kernel: this build against {other}, one process", "",
             f"Machine: {machine}. {setting[0].upper() + setting[1:]}. Command: `{command}`. "
             "this/other < 1: this build is faster.", "",
             "| call | this ms | other ms | this / other | max abs diff |", "|---|---|---|---|---|"]
    lines += [f"| {r['call']} | {r['this_ms']:.2f} | {r['other_ms']:.2f} | "
              f"{r['this_over_other']:.3f} | {r['max_abs_diff']:.1e} |" for r in rows]
    a.out.with_suffix(".md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
