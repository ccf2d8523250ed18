"""Non-finite numbers propagate through every kernel path exactly as through the generic path:
NaN and +-Inf in the input (several positions) or in the initial state give outputs, h_n and c_n
with the same NaN / +Inf / -Inf pattern as the generic path (and the same finite values), for
every variant, each vector path this CPU runs (plus the emulated AVX-512 path), both CPU
schedules, with and without autograd, and the scan of -HIDDEN."""
import pytest
import torch

import rnn_ablations as ra
from rnn_ablations import AblatedRNN, VARIANTS

from conftest import KERNEL_SCHEDULES, backend_path, requires_kernel

ISAS = ra.supported_kernel_isas() if ra.kernel_available() else []
TEST_ISAS = ISAS + (["emulated_avx512"] if "avx2" in ISAS else [])

INF, NAN = float("inf"), float("nan")
T, B, D, H = 6, 3, 5, 7
#: (where in x (t, b, d) -> value) per case; "h0"/"c0": a non-finite initial state instead
CASES = {
    "inf": {(2, 1, 0): INF},
    "-inf": {(0, 0, 1): -INF},
    "nan": {(2, 1, 0): NAN},
    "last_step": {(T - 1, 2, 4): INF},
    "mixed": {(1, 0, 0): NAN, (3, 2, 3): -INF, (4, 1, 2): INF},
    "h0": "h0",
    "c0": "c0",
}


def _inputs(case, dtype):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(T, B, D, generator=g, dtype=dtype)
    h0 = torch.randn(1, B, H, generator=g, dtype=dtype)
    c0 = torch.randn(1, B, H, generator=g, dtype=dtype)
    spec = CASES[case]
    if spec == "h0":
        h0[0, 1, 2] = INF
        h0[0, 0, 0] = NAN
    elif spec == "c0":
        c0[0, 2, 1] = -INF
        c0[0, 0, 3] = NAN
    else:
        for (t, b, d), v in spec.items():
            x[t, b, d] = v
    return x, (h0, c0)


def _pattern(t):
    return torch.stack([t.isnan(), t.isposinf(), t.isneginf()])


def _same(got, ref, what):
    for name, a, b in zip(("output", "h_n", "c_n"), got, ref):
        assert torch.equal(_pattern(a), _pattern(b)), (
            f"{what}: {name} has another NaN/Inf pattern than the generic path\n"
            f"kernel:\n{a}\ngeneric:\n{b}")
        finite = torch.isfinite(b)
        torch.testing.assert_close(a[finite], b[finite], atol=1e-5, rtol=1e-4,
                                   msg=lambda m: f"{what}: {name}: {m}")


def _run(m, x, hx, grad):
    with torch.set_grad_enabled(grad):
        out, (h, c) = m(x, hx)
    return out.detach(), h.detach(), c.detach()


def _check(variant, isa, dtype=torch.float32):
    torch.manual_seed(0)
    m = AblatedRNN(variant, D, H).to(dtype)
    for case in CASES:
        x, hx = _inputs(case, dtype)
        with backend_path("generic"):
            ref = _run(m, x, hx, True)
        if case == "nan":  # the generic path itself: a NaN reaches every later output of its row
            assert ref[0][2:, 1].isnan().all(), (variant, ref[0])
        for schedule in KERNEL_SCHEDULES:
            for grad in (True, False):
                with ra.use_kernel_isa(isa), backend_path(schedule):
                    got = _run(m, x, hx, grad)
                _same(got, ref, f"{variant}, {case}, isa {isa}, {schedule}, "
                                f"{'autograd' if grad else 'no_grad'}, {dtype}")


@requires_kernel
@pytest.mark.parametrize("isa", TEST_ISAS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_nonfinite_pattern_equals_generic(variant, isa):
    _check(variant, isa)


@requires_kernel
@pytest.mark.parametrize("variant", VARIANTS)
def test_nonfinite_pattern_equals_generic_float64(variant):
    _check(variant, "auto", torch.float64)


@requires_kernel
@pytest.mark.parametrize("isa", TEST_ISAS)
def test_nonfinite_bidirectional_two_layers(isa):
    """Both directions and a second layer (the reverse direction meets the value first)."""
    for variant in ("lstm", "ran", "lstm_minus_srnn_minus_hidden"):
        torch.manual_seed(0)
        m = AblatedRNN(variant, D, H, num_layers=2, bidirectional=True)
        x, _ = _inputs("mixed", torch.float32)
        with backend_path("generic"):
            ref = _run(m, x, None, True)
        for schedule in KERNEL_SCHEDULES:
            with ra.use_kernel_isa(isa), backend_path(schedule):
                _same(_run(m, x, None, False), ref, f"{variant} bidirectional, {isa}, {schedule}")
