"""The in-use step of benchmarks/gpu_check.sh: the package's CUDA kernels run layers, every kernel
family ran (step, scan, persistent), each passed its first-use check, and the eager step loop's
time per step.

    python benchmarks/gpu_in_use.py [--device cuda|emulation] [--steps 256]

``cuda`` (the default): the device's float16 / bfloat16 conversions (``device_types.cuh``
compiled by NVRTC: the PTX ``cvt`` of float16 and the bfloat16 rounding) against torch's, bit for
bit, on 2^16 values around every exponent, the halfway cases, overflow, subnormals and NaN; then
layers at B = 32, H = 256 (T = 12, padded rows) forward and backward on the GPU with
``backend="kernel"``: ``lstm`` and ``ran`` with highway through the step kernel, ``lstm`` through
the persistent kernels (forward and backward), ``lstm_minus_srnn_minus_hidden`` bidirectional
through the scan, in float32 (TF32 off) and bfloat16; every output (out, h_n, c_n) and every
gradient (the input's, h0's, c0's and each parameter's) compared with the generic path's on
the same GPU; the programs loaded, by family; the first-use check's results
(``rnn_ablations.kernels.cuda.selfcheck.status()``); then the eager step loop
(``host.plain_forward`` of float32, B = 8, H = 64, ``--steps`` steps, graphs off) timed, in
microseconds per step, with the driver calls it made per step.
``emulation``: the same families through the host loops on the CPU with the device code emulated
(``tests/cuda_emulation/emulator.py``, built with g++ on first use): a dry run of this step on a
machine without a GPU (its times are the emulation's, not a GPU's).
Exit status 1, saying why, when a conversion differs from torch's, a family did not run or
failed its check, or an output or gradient differs.
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


#: |kernel - generic| <= atol + rtol * max|generic| per tensor, on the same GPU
LAYER_TOL = {torch.float32: (1e-4, 1e-4), torch.bfloat16: (4e-2, 4e-2)}


def _run_layer(m, x, h0, c0, lengths, **opts):
    """out, h_n, c_n and the gradients of x, h0, c0 and every parameter, of one call."""
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
    leaves = [x, h0, c0] + list(m.parameters())
    with ra.options(**opts):
        out, (h, c) = m(pack_padded_sequence(x, lengths, enforce_sorted=False), (h0, c0))
        out, _ = pad_packed_sequence(out)
        g = torch.Generator(device=x.device).manual_seed(1)
        w = [torch.randn(t.shape, generator=g, device=x.device, dtype=t.dtype) for t in (out, h, c)]
        loss = sum((t.float() * wt.float()).sum() for t, wt in zip((out, h, c), w))
        grads = torch.autograd.grad(loss, leaves)
    names = ["out", "h_n", "c_n", "d_x", "d_h0", "d_c0"] + [f"d_{n}" for n, _ in
                                                              m.named_parameters()]
    return dict(zip(names, [out, h, c] + list(grads)))


def _layers_on_gpu():
    """Layer calls on the GPU at B = 32, H = 256, every output and gradient against the generic
    path: -> ({family: programs loaded}, [differences])."""
    if registry.cuda_kernel() is None:
        sys.exit(f"the CUDA kernels are not in use: {registry.cuda_kernel_error()}")
    T, B, I, H = 12, 32, 64, 256
    runs = [("lstm", True, False, "steps"), ("ran", True, False, "steps"),
            ("lstm", False, False, "persistent"),
            ("lstm_minus_srnn_minus_hidden", False, True, "steps")]
    wrong = []
    # the generic path's GEMMs in full float32 (TF32 would differ from it by more than the
    # float32 tolerance), restored after
    from rnn_ablations.kernels.cuda.selfcheck import _FullFloat32Gemms
    exact = _FullFloat32Gemms().__enter__()
    try:
        for dtype in (torch.float32, torch.bfloat16):
            for variant, highway, bidirectional, recurrence in runs:
                torch.manual_seed(0)
                m = ra.AblatedRNN(variant, I, H, highway=highway, bidirectional=bidirectional)
                m = m.to("cuda", dtype)
                D = 2 if bidirectional else 1
                x = torch.randn(T, B, I, device="cuda", dtype=dtype, requires_grad=True)
                h0 = (torch.randn(D, B, H, device="cuda", dtype=dtype) * 0.5).requires_grad_()
                c0 = (torch.randn(D, B, H, device="cuda", dtype=dtype) * 0.5).requires_grad_()
                lengths = torch.tensor([T - (b * (T - 1)) // B for b in range(B)])
                lengths = lengths[torch.randperm(B, generator=torch.Generator().manual_seed(2))]
                got = _run_layer(m, x, h0, c0, lengths, backend="kernel",
                                 cuda_recurrence=recurrence, cuda_graphs=False)
                want = _run_layer(m, x, h0, c0, lengths, backend="generic")
                rtol, atol = LAYER_TOL[dtype]
                worst = 0.0
                for name, a in got.items():
                    b = want[name]
                    err = (a.float() - b.float()).abs().max().item()
                    bound = atol + rtol * b.float().abs().max().item()
                    worst = max(worst, err / bound)
                    if not err <= bound:
                        wrong.append(f"{variant} ({recurrence}, {dtype}): {name} differs by "
                                     f"{err:.3g} (allowed {bound:.3g})")
                print(f"{variant} ({recurrence}{', highway' if highway else ''}"
                      f"{', bidirectional' if bidirectional else ''}, {dtype}, T={T} B={B} "
                      f"H={H}): {len(got)} outputs and gradients, worst |error| / allowed "
                      f"{worst:.3g}")
    finally:
        exact.__exit__(None, None, None)
    loaded = collections.defaultdict(list)
    for _, prog in driver._kernels:
        loaded[prog.family.split("_")[0]].append(prog.name)
    return loaded, wrong


CONVERT = r"""
#include "cuda/device_types.cuh"
extern "C" __global__ void convert16(const float* in, unsigned short* half_bits,
                                     float* half_back, unsigned short* bf16_bits,
                                     float* bf16_back, long long n) {
  const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const rnn_ablations::Half h(in[i]);
  half_bits[i] = h.x;
  half_back[i] = static_cast<float>(h);
  const rnn_ablations::BFloat16 b(in[i]);
  bf16_bits[i] = b.x;
  bf16_back[i] = static_cast<float>(b);
}
"""


def conversion_values() -> torch.Tensor:
    """float32 values that exercise 16-bit rounding: every float16 and every bfloat16 bit
    pattern's value and the midpoints between neighbours (ties), random values over the whole
    exponent range, overflow, subnormals, signed zeros, infinities and NaN."""
    halves = torch.arange(0, 1 << 16, dtype=torch.int32).to(torch.int16).view(torch.float16)
    bf16s = torch.arange(0, 1 << 16, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    vals = [halves.float(), bf16s.float()]
    for t in (halves, bf16s):
        f = t.double()
        f = f[f.isfinite()].unique()
        vals.append(((f[1:] + f[:-1]) / 2).float())  # halfway: ties to even
    g = torch.Generator().manual_seed(0)
    vals.append(torch.randn(1 << 16, generator=g)
                * 2.0 ** torch.randint(-140, 120, (1 << 16,), generator=g).float())
    vals.append(torch.tensor([0.0, -0.0, 65504.0, 65519.0, 65520.0, 1e6, -1e6, 3e38, 1e-45,
                              float("inf"), float("-inf"), float("nan")]))
    return torch.cat(vals)


def conversion_check(device: str = "cuda") -> list:
    """The device's Half / BFloat16 conversions of :func:`conversion_values`, compiled by NVRTC
    for this GPU, against torch's ``.to(float16)`` / ``.to(bfloat16)``: -> the differences
    (empty when every bit pattern and value read back is torch's; a NaN must stay a NaN)."""
    import ctypes
    from rnn_ablations.kernels.cuda import driver as drv, nvrtc, programs
    dev = torch.device(device)
    arch = drv.arch_of(dev.index or 0)
    from rnn_ablations.kernels.cuda import cache
    target, cubin = cache.target_for(arch)
    data, _, _ = nvrtc.compile_program(CONVERT, "convert16.cu", [],
                                       cache.options_for(target), cubin=cubin)
    drv._ensure_context(dev.index or 0)
    lib = drv.driver()
    module, fn = ctypes.c_void_p(), ctypes.c_void_p()
    image = ctypes.create_string_buffer(data + (b"" if cubin else b"\0"))
    drv._check(lib.cuModuleLoadData(ctypes.byref(module), image), "cuModuleLoadData(convert16)")
    drv._check(lib.cuModuleGetFunction(ctypes.byref(fn), module, b"convert16"),
               "cuModuleGetFunction(convert16)")
    x = conversion_values().to(dev)
    n = x.numel()
    hb = torch.empty(n, dtype=torch.int16, device=dev)
    bb = torch.empty_like(hb)
    hf, bf = torch.empty_like(x), torch.empty_like(x)
    args = [ctypes.c_void_p(t.data_ptr()) for t in (x, hb, hf, bb, bf)] + [ctypes.c_longlong(n)]
    params = (ctypes.c_void_p * len(args))(*[ctypes.addressof(a) for a in args])
    stream = ctypes.c_void_p(torch.cuda.current_stream(dev).cuda_stream)
    drv._check(lib.cuLaunchKernel(fn, (n + 255) // 256, 1, 1, 256, 1, 1, 0, stream, params,
                                  None), "cuLaunchKernel(convert16)")
    torch.cuda.synchronize(dev)
    wrong = []
    xc = x.cpu()
    nan = xc.isnan()
    for name, dt, bits, back in (("float16", torch.float16, hb, hf),
                                 ("bfloat16", torch.bfloat16, bb, bf)):
        want = xc.to(dt)
        bits, back = bits.cpu(), back.cpu()
        bad = (bits != want.view(torch.int16)) & ~nan
        bad |= (back != want.float()) & ~nan
        bad |= nan & ~(bits.view(dt).isnan() & back.isnan())
        if bad.any():
            i = int(bad.nonzero()[0])
            wrong.append(f"{name}: {int(bad.sum())} of {n} values convert differently from "
                         f"torch's, e.g. {xc[i].item()!r} -> bits {int(bits[i]) & 0xFFFF:#06x}, "
                         f"torch {int(want.view(torch.int16)[i]) & 0xFFFF:#06x}")
    return wrong


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
        wrong = conversion_check()
        print("16-bit conversions on the device: "
              + ("bit-exact with torch's" if not wrong else "; ".join(wrong)))
        if wrong:
            sys.exit("the device's 16-bit conversions differ from torch's: " + "; ".join(wrong))
        loaded, wrong = _layers_on_gpu()
        if wrong:
            sys.exit("the CUDA kernels differ from the generic path: " + "; ".join(wrong))
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
