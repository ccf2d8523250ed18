"""The CUDA kernels at the shapes they run at: 32 rows, hidden sizes 64 to 256, on emulated
devices shaped like real ones (emulator.PROFILES: "small", 16 SMs and 99 KiB of shared memory
per block; "h100", 132 SMs and 227 KiB), forward and backward against the generic path
(rnn_ablations.functional.generic_layer in float64, differentiated by autograd).

At these shapes the element-wise launches have many blocks (a grid sized by rows instead of
elements leaves most of them out), the persistent kernels run 16 or 132 blocks that meet at the
grid barrier, several tiles of rows per step and several output tiles per warp (accumulators
zeroed per tile, the shared buffers reused across tiles), and the scan is compared with the
generic path itself (not with the CPU scan, which compiles the same element-wise rules).  The
H100-shaped runs (132 blocks of 512 emulated threads) take tens of seconds: marked slow."""
import dataclasses

import pytest
import torch

from rnn_ablations import get_variant
from rnn_ablations.functional import generic_layer
from rnn_ablations.kernels.cuda import host, programs, structs

from . import emulator
from . import test_cuda_emulation as checks

B = 32


def _lengths(T, padded):
    """Row lengths: all T, or decreasing from T to 1 (and no row at the last step)."""
    if not padded:
        return [T] * B
    return [max(1, T - 1 - (b * (T - 1)) // B) for b in range(B)]


def _batch_sizes(lengths, T):
    return torch.tensor([sum(n > t for n in lengths) for t in range(T)], dtype=torch.int64)


def _layer(name, highway, H, T, padded, mask, dtype=torch.float32, seed=0):
    x = checks._layer(name, highway, dtype, T=T, B=B, H=H, padded=False, mask=mask, seed=seed)
    x["bs"] = _batch_sizes(_lengths(T, padded), T)
    x["w_hh"] = (x["w_hh"].double() * (1.0 / H ** 0.5)).to(dtype)  # pre-activations of order 1
    return x


@pytest.fixture
def small_device(emulation_device):
    device = emulator.EmulatedDevice(profile="small")
    with emulator.installed(device):
        yield device


@pytest.fixture
def h100_device(emulation_device):
    device = emulator.EmulatedDevice(profile="h100")
    with emulator.installed(device):
        yield device


# ------------------------------------------------------------------------------ step kernel
@pytest.mark.parametrize("H", [64, 256])
@pytest.mark.parametrize("variant", checks.STEP_VARIANTS)
def test_step_kernel_at_real_shapes(emulated_cuda, variant, H):
    """B = 32 rows (padded, the last step empty), highway, a recurrent-dropout mask: n x H up to
    8192 elements per launch (32 blocks of 256 threads)."""
    x = _layer(variant, True, H, T=5, padded=True, mask=True, seed=H)
    checks._check(x, True, torch.float32)


# ------------------------------------------------------------------------------ persistent
def _persistent(x, highway, blocks=0, batch_tile=0):
    spec = x["v"].kernel_spec
    fwd = host.persistent_plan(spec, highway, x["proj"], x["w_hh"], blocks, batch_tile, False)
    back = host.persistent_plan(spec, highway, x["proj"], x["w_hh"], blocks, batch_tile, True)
    assert fwd[0] and back[0], (fwd[1], back[1])
    checks._check(x, highway, torch.float32, persistent=True, blocks=blocks,
                  batch_tile=batch_tile)
    return fwd, back


def test_persistent_on_16_sms(small_device):
    """16 blocks of 512 threads (4 units each) meet at the grid barrier every step; padded rows,
    highway, a recurrent-dropout mask; 32 rows: several output tiles per warp."""
    x = _layer("lstm", True, 64, T=3, padded=True, mask=True, seed=3)
    fwd, back = _persistent(x, True)
    assert fwd[2] == back[2] == 16


@pytest.mark.slow
def test_persistent_on_16_sms_several_row_tiles(small_device):
    """At H = 256 a block holds 16 units, and its W_hh columns leave room for fewer than 32 rows
    per tile: the backward runs several tiles of rows per step."""
    x = _layer("ran", True, 256, T=3, padded=True, mask=True, seed=3)
    fwd, back = _persistent(x, True)
    assert fwd[2] == back[2] == 16 and back[4] < B, (fwd, back)


def test_persistent_unpadded_row_tiles(emulated_cuda):
    """Every row active at every step, 2 rows per tile: 4 tiles per step, the shared buffers
    reused by each next tile (the barriers between tiles), forward and backward."""
    x = checks._layer("lstm", False, torch.float32, T=3, B=8, H=64, padded=False, mask=False,
                      seed=4)
    x["w_hh"] = x["w_hh"] / 8
    fwd, back = _persistent(x, False, batch_tile=2)
    assert fwd[4] == back[4] == 2


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["lstm", "srnn"])
def test_persistent_on_an_h100_shaped_device(h100_device, variant):
    """132 blocks (2 units each at H = 256) with 227 KiB of shared memory per block: the plan a
    H100 gets, run."""
    x = _layer(variant, True, 256, T=3, padded=True, mask=True, seed=5)
    fwd, back = _persistent(x, True)
    assert fwd[2] == back[2] == 128 and fwd[3] == 2


def test_h100_profile_plans_what_an_h100_runs(h100_device):
    """The plan on the H100-shaped device (no launch) at H = 1024: 128 blocks of 8 units (one
    per SM, H / 8 of them), the W_hh slice (5 x 8 x 1024 float32, 160 KiB) and 16 rows of 1064
    float32 per tile within the 227 KiB a block opts in to."""
    x = _layer("lstm", True, 1024, T=2, padded=False, mask=False)
    ok, why, blocks, units, tile, smem = host.persistent_plan(
        x["v"].kernel_spec, True, x["proj"], x["w_hh"], 0, 0, False)
    assert ok, why
    assert (blocks, units, tile) == (128, 8, 16) and smem <= 227 * 1024


# ------------------------------------------------------------------------------ scan
def _scan_reference(s, v, highway, lengths):
    """generic_layer per direction in float64 (direction 1 on each row's reversed steps): out,
    h_n, c_n and the gradients of proj, c0 and bias."""
    from rnn_ablations.kernels.cuda.selfcheck import _reversed_steps
    d64 = torch.float64
    G, H = s["G"], s["h0"].size(2)
    D, T = s["h0"].size(0), s["proj"].size(0)
    proj, bias, c0 = (s[k].to(d64).requires_grad_() for k in ("proj", "bias", "c0"))
    h0 = s["h0"].to(d64)
    bs = s["bs"]
    rev = _reversed_steps(lengths, T)
    outs, hns, cns = [], [], []
    for d in range(D):
        p = proj[..., d * G * H:(d + 1) * G * H] + bias[d * G * H:(d + 1) * G * H]
        if d == 1:
            p = p.gather(0, rev.unsqueeze(2).expand_as(p))
        o, hn, cn, _ = generic_layer(v, highway, p[..., :0], p, None, h0[d], c0[d], bs)
        if d == 1:
            o = o.gather(0, rev.unsqueeze(2).expand_as(o))
        outs += [o]
        hns += [hn]
        cns += [cn]
    out, h_n, c_n = torch.cat(outs, 2), torch.stack(hns), torch.stack(cns)
    loss = ((out * s["g_out"].to(d64)).sum() + (h_n * s["g_hn"].to(d64)).sum()
            + (c_n * s["g_cn"].to(d64)).sum())
    dproj, dc0, dbias = torch.autograd.grad(loss, [proj, c0, bias])
    return [t.detach() for t in (out, h_n, c_n, dproj, dc0, dbias)]


def _scan_variant(rule):
    """The scan variant of the table (no h_{t-1} in its gates) with output rule ``rule``
    instead of its own (its gates: i, f, and o where the rule reads one)."""
    base = get_variant(checks.SCAN_VARIANTS[0])
    name = programs.RULES[rule]
    gates = ("i", "f", "o") if structs.output_has_gate(rule) else ("i", "f")
    return dataclasses.replace(base, name=f"{base.name}_{name}", output=name,
                               input_only_biased=gates)


@pytest.mark.parametrize("highway", [False, True])
@pytest.mark.parametrize("rule", sorted(programs.RULES))
def test_scan_against_the_generic_path(emulated_cuda, rule, highway):
    """Both directions over a batch-major projection, 32 rows of decreasing lengths, H = 256
    (2 x 32 x 256 elements: 64 blocks), a bias inside the scan, against generic_layer."""
    v = _scan_variant(rule)
    T, H = 5, 256
    lengths = _lengths(T, True)
    s = checks._scan_case(rule, highway, 2, torch.float32, True, True, seed=rule, T=T, B=B,
                          H=H)
    s["spec"] = v.kernel_spec
    s["bs"] = _batch_sizes(lengths, T)
    got = checks._scan_run(host, s, highway)
    want = _scan_reference(s, v, highway, lengths)
    for name, a, b in zip(("out", "h_n", "c_n", "d_proj", "d_c0", "d_bias"), got, want):
        checks._close(a, b, torch.float32, f"scan {name}")
