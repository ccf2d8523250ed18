"""The CUDA kernels' device code executed on the CPU (tests/cuda_emulation/README.md): the host
loops of rnn_ablations/kernels/cuda/host.py (step, scan, persistent; forward and backward) run
on CPU tensors with their real parameter structs, the kernels compiled from the same device
sources by the host C++ compiler (emulation.h), and their results are compared with the generic
path (rnn_ablations.functional.generic_layer in float64, with autograd for the gradients) or,
for the scan, with the CPU kernel's scan operators."""
import pytest
import torch

import rnn_ablations as ra
from rnn_ablations import get_variant
from rnn_ablations.functional import generic_layer
from rnn_ablations.kernels.cuda import host, programs
from rnn_ablations.variants import VARIANTS_TABLE

from . import emulator

STEP_VARIANTS = [n for n in VARIANTS_TABLE if get_variant(n).reads_hidden]
SCAN_VARIANTS = [n for n in VARIANTS_TABLE if not get_variant(n).reads_hidden]
HALF = [torch.float16, torch.bfloat16]

# |kernel - reference| <= atol + rtol * max|reference| per tensor (the reference is float64)
TOL = {torch.float64: 1e-10, torch.float32: 2e-5, torch.float16: 1.5e-2, torch.bfloat16: 8e-2}


def _close(got, want, dtype, what):
    got, want = got.double(), want.double()
    assert got.shape == want.shape, (what, got.shape, want.shape)
    tol = TOL[dtype]
    err = (got - want).abs().max().item() if want.numel() else 0.0
    bound = tol * (1.0 + want.abs().max().item()) if want.numel() else 0.0
    assert err <= bound, f"{what}: max |error| {err:.3g} > {bound:.3g} ({dtype})"


def _batch_sizes(T, B, padded):
    if not padded:
        return torch.full((T,), B, dtype=torch.int64)
    lengths = [max(1, T - 1 - 2 * b) for b in range(B)]  # the last step has no row at all
    return torch.tensor([sum(n > t for n in lengths) for t in range(T)], dtype=torch.int64)


def _layer(name, highway, dtype, T=5, B=3, H=6, padded=True, mask=True, seed=0):
    """The inputs of one layer (in dtype) and upstream gradients."""
    v = get_variant(name)
    rec, inp = v.blocks(highway)
    R, X = len(rec), len(inp)
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype)

    x = dict(v=v, R=R, X=X, H=H, proj=rnd(T, B, (R + X) * H), w_hh=rnd(R * H, H, scale=0.4),
             h0=rnd(B, H, scale=0.5), c0=rnd(B, H, scale=0.5), bs=_batch_sizes(T, B, padded),
             mask=(torch.bernoulli(torch.full((B, H), 0.7, dtype=torch.float64), generator=g)
                   / 0.7).to(dtype) if mask else torch.empty(0, dtype=dtype),
             g_out=rnd(T, B, H), g_hn=rnd(B, H), g_cn=rnd(B, H))
    return x


def _reference(x, highway):
    """generic_layer in float64: (out, h_n, c_n) and the gradients (d_proj, d_w_hh, d_h0, d_c0)."""
    d = torch.float64
    proj, w, h0, c0 = (x[k].to(d).requires_grad_() for k in ("proj", "w_hh", "h0", "c0"))
    RH = x["R"] * x["H"]
    xo = proj[..., RH:] if x["X"] else None
    mask = x["mask"].to(d) if x["mask"].numel() else None
    out, h_n, c_n, _ = generic_layer(x["v"], highway, proj[..., :RH], xo, w, h0, c0, x["bs"], mask)
    loss = ((out * x["g_out"].to(d)).sum() + (h_n * x["g_hn"].to(d)).sum()
            + (c_n * x["g_cn"].to(d)).sum())
    grads = torch.autograd.grad(loss, [proj, w, h0, c0], allow_unused=True)
    grads = [torch.zeros_like(t) if gr is None else gr for gr, t in zip(grads, (proj, w, h0, c0))]
    return [t.detach() for t in (out, h_n, c_n)], grads


def _run(x, highway, persistent=False, blocks=0, batch_tile=0):
    spec = x["v"].kernel_spec
    args = (spec, highway, x["proj"], x["w_hh"], x["h0"], x["c0"], x["bs"], x["mask"])
    if persistent:
        fwd = host.persistent_forward(*args, True, blocks, batch_tile)
    else:
        fwd = host.plain_forward(*args, True)
    out, h_n, c_n, gates, cs, hin = fwd
    back = (spec, highway, x["g_out"], x["g_hn"], x["g_cn"], gates, cs, hin, out, x["proj"],
            x["w_hh"], x["h0"], x["c0"], x["bs"], x["mask"])
    if persistent:
        grads = host.persistent_backward(*back, blocks, batch_tile)
    else:
        grads = host.plain_backward(*back)
    return fwd, grads


def _check(x, highway, dtype, **kw):
    (out, h_n, c_n, *_), grads = _run(x, highway, **kw)
    want, want_grads = _reference(x, highway)
    for name, got, ref in zip(("out", "h_n", "c_n"), (out, h_n, c_n), want):
        assert got.dtype == dtype
        _close(got, ref, dtype, name)
    for name, got, ref in zip(("d_proj", "d_w_hh", "d_h0", "d_c0"), grads, want_grads):
        assert got.dtype == dtype
        _close(got, ref, dtype, name)


def test_emulation_builds_every_program(emulation_device):
    """One emulated kernel per NVRTC program, each with the launcher's parameter list (the
    generated source's static_asserts)."""
    assert emulation_device.lib.emulation_programs() == len(programs.all_programs()) == 62


@pytest.mark.parametrize("dtype", HALF)
def test_16_bit_conversions_are_torchs(emulation_device, dtype):
    """device_types.cuh's Half / BFloat16 (the bfloat16 rounding is the device code itself; the
    float16 one the emulation's stand-in for the PTX instruction) round as torch does: to nearest
    even, overflow to infinity, subnormals, and a NaN stays a NaN."""
    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.randn(4000, generator=g) * 10.0 ** torch.randint(-9, 6, (4000,),
                                                                          generator=g),
                   torch.tensor([0.0, -0.0, 1.0, 65504.0, 65520.0, 1e6, -1e6, 6e-8, 3e-8,
                                 float("inf"), float("-inf"), float("nan"), 3.0e38, 1e-40]),
                   # halfway between two 16-bit neighbours: ties to even
                   (torch.arange(1, 200, dtype=torch.float64) + 0.5).float() / 1024 + 1,
                   torch.tensor([1 + 2.0 ** -11, 1 + 3 * 2.0 ** -11, 1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8])])
    bits = torch.empty(x.numel(), dtype=torch.int16)
    back = torch.empty_like(x)
    emulation_device.lib.emulation_convert(0 if dtype == torch.float16 else 1, x.data_ptr(),
                                           bits.data_ptr(), back.data_ptr(), x.numel())
    want = x.to(dtype)
    nan = x.isnan()
    assert torch.equal(bits[~nan], want.view(torch.int16)[~nan])
    assert back[nan].isnan().all() and bits.view(dtype)[nan].isnan().all()
    assert torch.equal(back[~nan], want.float()[~nan])


# ------------------------------------------------------------------------------ step kernel
@pytest.mark.parametrize("padded,mask", [(False, False), (True, True)])
@pytest.mark.parametrize("highway", [False, True])
@pytest.mark.parametrize("variant", STEP_VARIANTS)
def test_step_kernel_equals_generic_float32(emulated_cuda, variant, highway, padded, mask):
    x = _layer(variant, highway, torch.float32, padded=padded, mask=mask)
    before = emulated_cuda.launches()
    _check(x, highway, torch.float32)
    # one element-wise launch per active step, forward and backward
    active = int((x["bs"] > 0).sum())
    assert emulated_cuda.launches() - before == 2 * active


@pytest.mark.parametrize("highway", [False, True])
@pytest.mark.parametrize("variant", STEP_VARIANTS)
def test_step_kernel_equals_generic_float64(emulated_cuda, variant, highway):
    _check(_layer(variant, highway, torch.float64, seed=1), highway, torch.float64)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("variant", STEP_VARIANTS)
def test_step_kernel_half_equals_generic(emulated_cuda, variant, dtype):
    """float16 / bfloat16 through the emulated conversions (device_types.cuh Half, BFloat16)."""
    _check(_layer(variant, True, dtype, seed=2), True, dtype)


def test_step_kernel_two_layers_bidirectional(emulated_cuda):
    """A 2-layer bidirectional LSTM of per-direction step-kernel calls (direction 1 on the
    reversed sequence), against the same composition of generic layers."""
    torch.manual_seed(3)
    v = get_variant("lstm")
    T, B, I, H = 4, 2, 3, 5
    x = torch.randn(T, B, I, dtype=torch.float64)
    bs = torch.full((T,), B, dtype=torch.int64)
    h0 = torch.randn(2, 2, B, H, dtype=torch.float64) * 0.5
    c0 = torch.randn(2, 2, B, H, dtype=torch.float64) * 0.5
    ws = [[(torch.randn(4 * H, I if layer == 0 else 2 * H, dtype=torch.float64) * 0.4,
            torch.randn(4 * H, H, dtype=torch.float64) * 0.4) for _ in range(2)]
          for layer in range(2)]

    def run(layer_fn):
        inp = x
        for layer in range(2):
            outs = []
            for d in range(2):
                w_ih, w_hh = ws[layer][d]
                seq = inp if d == 0 else inp.flip(0)
                proj = (seq @ w_ih.t()).contiguous()
                out = layer_fn(proj, w_hh, h0[layer, d].contiguous(), c0[layer, d].contiguous())
                outs.append(out if d == 0 else out.flip(0))
            inp = torch.cat(outs, 2)
        return inp

    got = run(lambda p, w, h, c: host.plain_forward(v.kernel_spec, False, p, w, h, c, bs,
                                                    torch.empty(0), False)[0])
    want = run(lambda p, w, h, c: generic_layer(v, False, p, None, w, h, c, bs)[0])
    _close(got, want, torch.float64, "2-layer bidirectional output")


# ------------------------------------------------------------------------------ persistent
@pytest.mark.parametrize("highway", [False, True])
@pytest.mark.parametrize("variant", STEP_VARIANTS)
def test_persistent_kernels_equal_generic(emulated_cuda, variant, highway):
    """Forward and backward in one cooperative launch each, on a grid of 2 blocks (one per
    emulated SM) that meet at the grid barrier every step; padded rows, recurrent mask."""
    x = _layer(variant, highway, torch.float32, T=4, B=3, H=6, seed=4)
    ok, why, blocks, *_ = host.persistent_plan(x["v"].kernel_spec, highway, x["proj"], x["w_hh"],
                                               0, 0, False)
    assert ok and blocks == emulator.SMS >= 2, why
    before = emulated_cuda.launches()
    _check(x, highway, torch.float32, persistent=True)
    assert emulated_cuda.launches() - before == 2


@pytest.mark.parametrize("blocks,batch_tile", [(3, 1), (4, 2)])
def test_persistent_forced_grid_and_row_tiles(emulated_cuda, blocks, batch_tile):
    """More blocks than SMs (units split unevenly: the last block has fewer) and several tiles
    of rows per step."""
    x = _layer("lstm", True, torch.float32, T=4, B=3, H=7, seed=5)
    _check(x, True, torch.float32, persistent=True, blocks=blocks, batch_tile=batch_tile)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("variant", ["lstm", "srnn"])
def test_persistent_half_equals_generic(emulated_cuda, variant, dtype):
    _check(_layer(variant, True, dtype, T=4, B=3, H=6, seed=6), True, dtype, persistent=True)


@pytest.mark.parametrize("variant", ["lstm", "ran"])
def test_persistent_saves_what_the_step_kernel_saves(emulated_cuda, variant):
    """gates, cs and hin of the persistent forward equal the step kernel's on every active
    (step, row), so either backward reads either forward's."""
    x = _layer(variant, True, torch.float32, T=4, B=3, H=6, seed=7)
    args = (x["v"].kernel_spec, True, x["proj"], x["w_hh"], x["h0"], x["c0"], x["bs"], x["mask"],
            True)
    step = host.plain_forward(*args)
    pers = host.persistent_forward(*args, 0, 0)
    for t, n in enumerate(x["bs"].tolist()):
        for i, name in ((3, "gates"), (4, "cs"), (5, "hin")):
            _close(pers[i][t, :n], step[i][t, :n], torch.float32, f"{name}[{t}]")


def test_persistent_with_os_threads(emulation_device):
    """The same kernels with one OS thread per CUDA thread (1024 threads for 2 blocks of 512):
    the barriers and shuffles of emulation.h's other mode."""
    device = emulator.EmulatedDevice(threads="os")
    with emulator.installed(device):
        x = _layer("lstm", False, torch.float32, T=2, B=2, H=4, seed=8)
        _check(x, False, torch.float32, persistent=True)


def test_persistent_inference_and_float64(emulated_cuda):
    """Without training the persistent forward saves no gates and gives the step kernel's
    outputs; float64 has no persistent kernel, and the plan says which kernel runs it."""
    x = _layer("lstm", True, torch.float32, T=4, B=3, H=6, seed=10)
    args = (x["v"].kernel_spec, True, x["proj"], x["w_hh"], x["h0"], x["c0"], x["bs"], x["mask"],
            False)
    pers = host.persistent_forward(*args, 0, 0)
    step = host.plain_forward(*args)
    assert pers[3].numel() == 0 and pers[5].numel() == 0
    for i, name in enumerate(("out", "h_n", "c_n")):
        _close(pers[i], step[i], torch.float32, name)
    d = _layer("lstm", False, torch.float64, T=2, B=2, H=4)
    ok, why, *_ = host.persistent_plan(d["v"].kernel_spec, False, d["proj"], d["w_hh"], 0, 0,
                                       False)
    assert not ok and "step kernel runs it" in why


def test_persistent_launch_too_large_is_refused(emulated_cuda):
    """A cooperative grid that cannot be resident fails as on a GPU, and the plan says why."""
    x = _layer("lstm", False, torch.float32, T=2, B=2, H=40, seed=9)
    ok, why, *_ = host.persistent_plan(x["v"].kernel_spec, False, x["proj"], x["w_hh"], 40, 0,
                                       False)
    assert not ok and "resident" in why


# ------------------------------------------------------------------------------ scan
def _cpu_scan():
    from rnn_ablations.kernels import registry
    cpu = registry.cpu_kernel()
    if cpu is None or not cpu.scan:
        pytest.skip("the compiled CPU kernel's scan (the reference) is not built")
    return cpu.raw


SCAN_SPEC = get_variant(SCAN_VARIANTS[0]).kernel_spec


def _scan_spec(rule):
    """The scan variant's kernel spec with output rule ``rule`` (programs.RULES)."""
    return (SCAN_SPEC & ~0x7) | rule


def _scan_case(rule, highway, D, dtype, padded, batch_major, seed=0, T=5, B=3, H=4):
    from rnn_ablations.kernels.cuda import structs
    G = structs.decode_scan_spec(_scan_spec(rule), highway, "test").G
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)

    proj = rnd(B, T, D * G * H).transpose(0, 1) if batch_major else rnd(T, B, D * G * H)
    return dict(spec=_scan_spec(rule), G=G, proj=proj, h0=rnd(D, B, H), c0=rnd(D, B, H),
                bias=rnd(D * G * H), bs=_batch_sizes(T, B, padded),
                g_out=rnd(T, B, D * H), g_hn=rnd(D, B, H), g_cn=rnd(D, B, H))


def _scan_run(mod, s, highway, to=None):
    cast = (lambda t: t) if to is None else (lambda t: t.to(to))
    proj = cast(s["proj"])
    fwd = mod.scan_forward(s["spec"], highway, proj, cast(s["h0"]), cast(s["c0"]), s["bs"], True,
                           cast(s["bias"]))
    out, h_n, c_n, cs = fwd
    back = mod.scan_backward(s["spec"], highway, cast(s["g_out"]), cast(s["g_hn"]),
                             cast(s["g_cn"]), proj, cast(s["c0"]), cs, s["bs"], cast(s["bias"]),
                             True)
    return [out, h_n, c_n] + list(back)


@pytest.mark.parametrize("D,padded,batch_major", [(1, False, False), (2, True, False),
                                                  (2, True, True)])
@pytest.mark.parametrize("highway", [False, True])
@pytest.mark.parametrize("rule", sorted(programs.RULES))
def test_scan_kernels_equal_the_cpu_scan(emulated_cuda, rule, highway, D, padded, batch_major):
    """Every output rule x highway, one or two directions (direction 1 backwards within each
    row's length), padded rows, a bias inside the scan and its gradient, time- and
    batch-major layouts: forward and backward equal the CPU kernel's scan."""
    cpu = _cpu_scan()
    for dtype in (torch.float32, torch.float64):
        s = _scan_case(rule, highway, D, dtype, padded, batch_major, seed=rule)
        before = emulated_cuda.launches()
        got = _scan_run(host, s, highway)
        assert emulated_cuda.launches() - before == 2  # one launch each way
        want = _scan_run(cpu, s, highway)
        names = ("out", "h_n", "c_n", "d_proj", "d_c0", "d_bias")
        for name, a, b in zip(names, got, want):
            _close(a, b, dtype, f"scan {name}")


@pytest.mark.parametrize("dtype", HALF)
def test_scan_kernels_half_equal_the_cpu_scan_in_float64(emulated_cuda, dtype):
    cpu = _cpu_scan()
    s = _scan_case(1, True, 2, dtype, True, False, seed=11)
    got = _scan_run(host, s, True)
    want = _scan_run(cpu, s, True, to=torch.float64)
    for name, a, b in zip(("out", "h_n", "c_n", "d_proj", "d_c0", "d_bias"), got, want):
        assert a.dtype == dtype
        _close(a, b, dtype, f"scan {name}")


def test_scan_kernel_equals_generic(emulated_cuda):
    """The scan variant through the scan kernel against generic_layer (no CPU kernel needed)."""
    v = get_variant(SCAN_VARIANTS[0])
    s = _scan_case(v.kernel_spec & 0x7, False, 1, torch.float64, True, False, seed=12)
    out, h_n, c_n, *_ = _scan_run(host, s, False)
    proj = s["proj"] + s["bias"]
    want = generic_layer(v, False, proj[..., :0], proj, None, s["h0"][0], s["c0"][0], s["bs"])
    for name, a, b in zip(("out", "h_n", "c_n"), (out, h_n[0], c_n[0]), want[:3]):
        _close(a, b, torch.float64, f"scan {name}")


# ------------------------------------------------------------------------------ the backend
def test_backend_runs_the_cuda_step_scan_and_persistent_kernels(emulated_cuda, monkeypatch):
    """registry.kernels() built from the real host module (the emulated driver installed) finds
    the CUDA step, scan and persistent entry points in use, and each runs."""
    from rnn_ablations.kernels import registry
    from rnn_ablations.kernels.cuda import ops as ops_cuda
    monkeypatch.setattr(registry, "_C_cuda", ops_cuda.CudaKernel(host))  # as the registry loads it
    monkeypatch.setattr(registry, "_kernels_cache", {})
    k = registry.kernels()
    assert k.cuda and k.cuda_scan and k.persistent, k
    assert host.scan_abi == registry.SCAN_ABI
    x = _layer("lstm", False, torch.float32, T=2, B=2, H=4, padded=False, mask=False)
    out = registry.cuda_kernel().plain_forward(x["v"].kernel_spec, False, x["proj"], x["w_hh"], x["h0"],
                                        x["c0"], x["bs"], x["mask"], False)[0]
    pers = registry.cuda_kernel().persistent_forward(x["v"].kernel_spec, False, x["proj"], x["w_hh"],
                                              x["h0"], x["c0"], x["bs"], x["mask"], False, 0,
                                              0)[0]
    _close(pers, out, torch.float32, "persistent vs step")
    s = _scan_case(1, False, 1, torch.float32, False, False)
    assert registry.cuda_kernel().scan_forward(s["spec"], False, s["proj"], s["h0"], s["c0"], s["bs"],
                                        False)[0].isfinite().all()
