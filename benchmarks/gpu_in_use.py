"""The in-use step of benchmarks/gpu_check.sh: the package's CUDA kernels run layers, every kernel
family ran (step, scan, persistent), each passed its first-use check, and the eager step loop's
time per step.

    python benchmarks/gpu_in_use.py [--device cuda|emulation] [--steps 256]

``cuda`` (the default): layers of ``lstm`` (the step kernel, then the persistent kernel) and of
``lstm_minus_srnn_minus_hidden`` (the scan) forward and backward on the GPU with
``backend="kernel"``, compared with the generic path; the programs loaded, by family; the
first-use check's results (``rnn_ablations.kernels.cuda.selfcheck.status()``); then the eager step
loop (``host.plain_forward`` of float32, B = 8, H = 64, ``--steps`` steps, graphs off) timed, in
microseconds per step, with the driver calls it made per step.
``emulation``: the same families through the host loops on the CPU with the device code emulated
(``tests/cuda_emulation/emulator.py``, built with g++ on first use): a dry run of this step on a
machine without a GPU (its times are the emulation's, not a GPU's).
Exit status 1, saying why, when a family did not run or failed its check, or a layer differs.
"""
import argparse
import collections
import os
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import rnn_ablations as ra  # noqa: E402
from rnn_ablations import get_variant  # noqa: E402
from rnn_ablations.kernels import registry  # noqa: E402
from rnn_ablations.kernels.cuda import driver, host, selfcheck  # noqa: E402
from rnn_ablations.plan import Plan  # noqa: E402

FAMILIES = ("step", "scan", "persistent")


def _layers_on_gpu():
    """Layer calls on the GPU: -> {family: programs loaded}."""
    if registry.cuda_kernel() is None:
        sys.exit(f"the CUDA kernels are not in use: {registry.cuda_kernel_error()}")
    torch.manual_seed(0)
    runs = [("lstm", "steps"), ("lstm", "persistent"), ("lstm_minus_srnn_minus_hidden", "steps")]
    for variant, recurrence in runs:
        m = ra.AblatedRNN(variant, 16, 32).cuda()
        x = torch.randn(5, 3, 16, device="cuda", requires_grad=True)
        with ra.options(backend="kernel", cuda_recurrence=recurrence, cuda_graphs=False):
            out, (h, c) = m(x)
            (out.sum() + c.sum()).backward()
        with ra.use_backend("generic"):
            want, _ = m(x.detach())
        err = (out - want).abs().max().item()
        print(f"{variant} ({recurrence}): max |kernel - generic| {err:.3g}")
        if err > 1e-4:
            sys.exit(f"{variant} ({recurrence}): the CUDA kernels' output differs from the "
                     f"generic path by {err}")
    loaded = collections.defaultdict(list)
    for _, prog in driver._kernels:
        loaded[prog.family.split("_")[0]].append(prog.name)
    return loaded


def _families_emulated():
    """Each family's first-use check through the host loops on the emulated device."""
    sys.path.insert(0, os.path.join(ROOT, "tests", "cuda_emulation"))
    import emulator
    t0 = time.perf_counter()
    device = emulator.EmulatedDevice()
    print(f"emulated kernels loaded in {time.perf_counter() - t0:.1f} s")
    lstm, scan_cell = get_variant("lstm"), get_variant("lstm_minus_srnn_minus_hidden")
    loaded = collections.defaultdict(list)
    with emulator.installed(device):
        plans = [(lstm, Plan("cuda", "", recurrence="steps")),
                 (lstm, Plan("cuda", "", recurrence="persistent", persistent=(0, 0, True))),
                 (scan_cell, Plan("cuda", "", schedule="scan"))]
        for variant, plan in plans:
            for fam in selfcheck.families(plan, variant, False, torch.float32):
                before = device.launches()
                why = selfcheck.check_family(fam, variant, torch.device("cpu"), host)
                selfcheck._results[("emulated", fam.name)] = why
                if device.launches() > before:
                    loaded[fam.kind].append(fam.name)
        timing = _step_loop_time(torch.device("cpu"), device.launches)
    return loaded, timing


def _step_loop_time(device, launches, steps=256, B=8, H=64):
    """Microseconds per step of the eager step loop (forward, float32), median of 5 calls."""
    v = get_variant("lstm")
    g = torch.Generator().manual_seed(0)
    proj = torch.randn(steps, B, 4 * H, generator=g).to(device)
    w_hh = (torch.randn(4 * H, H, generator=g) * 0.1).to(device)
    h0 = c0 = torch.zeros(B, H, device=device)
    bs = torch.full((steps,), B)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    times = []
    for _ in range(6):
        n0 = launches()
        sync()
        t = time.perf_counter()
        host.plain_forward(v.kernel_spec, False, proj, w_hh, h0, c0, bs, torch.empty(0,
                           device=device), False)
        sync()
        times.append(time.perf_counter() - t)
        per_step = (launches() - n0) / steps
    times = sorted(times[1:])
    return times[len(times) // 2] / steps * 1e6, per_step, (steps, B, H)


def _counting_launches():
    """A counter of cuLaunchKernel calls (wraps the driver library's entry)."""
    lib = driver.driver()
    real = lib.cuLaunchKernel
    count = [0]

    def counted(*args):
        count[0] += 1
        return real(*args)
    counted.argtypes = real.argtypes
    lib.cuLaunchKernel = counted
    return lambda: count[0]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cuda", "emulation"), default="cuda")
    ap.add_argument("--steps", type=int, default=256)
    args = ap.parse_args(argv)
    if args.steps < 2:
        ap.error("--steps must be at least 2")
    if args.device == "cuda":
        if not torch.cuda.is_available():
            sys.exit("no CUDA device is visible (use --device emulation for a dry run)")
        loaded = _layers_on_gpu()
        from rnn_ablations.kernels.cuda import cache
        if hasattr(cache, "compile_stats"):
            print("compile stats:", cache.compile_stats())
        timing = _step_loop_time(torch.device("cuda"), _counting_launches(), args.steps)
    else:
        loaded, timing = _families_emulated()
    failed = {k: v for k, v in selfcheck.status().items() if v is not None}
    for fam in FAMILIES:
        print(f"family {fam}: {sorted(set(loaded.get(fam, []))) or 'DID NOT RUN'}")
    for key, why in selfcheck.status().items():
        print(f"check {key}: {'passed' if why is None else 'FAILED: ' + why}")
    us, per_step, (T, B, H) = timing
    print(f"eager step loop: {us:.1f} us per step, {per_step:.2f} launches per step "
          f"(forward, float32, T={T}, B={B}, H={H}, {args.device})")
    missing = [f for f in FAMILIES if not loaded.get(f)]
    if missing:
        sys.exit(f"the kernel families {missing} did not run")
    if failed:
        sys.exit(f"families failed their first-use check: {failed}")


if __name__ == "__main__":
    main()
