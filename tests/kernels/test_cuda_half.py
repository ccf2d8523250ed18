"""Half precision on CUDA (bfloat16, float16, torch.autocast): the CUDA kernels in the half types
against the float64 generic path, a half module against float64, autocast running the kernel;
the CPU kernel refuses the half types naming them."""
import copy

import pytest
import torch

from _cuda_cases import (HALF_DTYPES, HALF_TOL, STEP_VARIANTS, _check_against_float64_generic,
                         _layer_run, _layer_tensors, _rel_err, _run_and_grads,
                         needs_cuda_kernel, no_tf32, requires_cuda)  # noqa: F401
from rnn_ablations import AblatedRNN, use_backend
from rnn_ablations import dispatch
from rnn_ablations import cuda_kernel_available
from rnn_ablations.kernels import registry


def test_kernel_backend_names_the_cuda_half_dtypes():
    """float16 on the CPU has no kernel (bfloat16 runs the float32 kernels,
    tests/kernels/test_cpu_bfloat16.py): the kernel backend refuses it naming the dtypes the
    kernels take."""
    if not (registry.kernel_available() or cuda_kernel_available()):
        pytest.skip("no compiled kernel")
    x, w = torch.zeros(3, 2, 4, dtype=torch.float16), torch.zeros(8, 4, dtype=torch.float16)
    with use_backend("kernel"), pytest.raises(RuntimeError, match="bfloat16/float16"):
        dispatch.layer_plan([x], [(w, w[:, :2], None)])


@requires_cuda
@needs_cuda_kernel
@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=str)
@pytest.mark.parametrize("variant", STEP_VARIANTS)
@pytest.mark.parametrize("highway,use_mask,padded", [(False, False, False), (True, True, True),
                                                     (False, True, True)])
def test_half_kernel_matches_float64_generic(dtype, variant, highway, use_mask, padded):
    v, t = _layer_tensors(variant, highway, dtype)
    T, B = t["x"].shape[:2]
    if padded:
        batch_sizes = torch.tensor([6, 6, 5, 5, 5, 4, 4, 3, 3, 2, 2, 2, 1])
    else:
        batch_sizes = torch.full((T,), B, dtype=torch.int64)
    if not v.has_memory:  # the S-RNN has no cell: c0 is h0
        t["c0"] = t["h0"]
    with use_backend("kernel"):
        got = _layer_run(v, highway, t, batch_sizes, use_mask)
    _check_against_float64_generic(v, highway, t, batch_sizes, use_mask, got, dtype,
                                   HALF_TOL[dtype])


@requires_cuda
@needs_cuda_kernel
@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=str)
@pytest.mark.parametrize("variant", ["ran", "lstm"])
def test_half_module_matches_float64(dtype, variant):
    """A whole module cast with .to(dtype): 2 layers, both directions, padding."""
    m = AblatedRNN(variant, 10, 32, num_layers=2, bidirectional=True, batch_first=True).cuda()
    m_half = copy.deepcopy(m).to(dtype)
    m64 = copy.deepcopy(m_half).double()
    x = torch.randn(5, 17, 10, device="cuda").to(dtype)
    lengths = torch.tensor([17, 9, 12, 3, 17])
    with use_backend("kernel"):
        got = _run_and_grads(m_half, x.clone().requires_grad_(), lengths=lengths)
    with use_backend("generic"):
        want = _run_and_grads(m64, x.double().requires_grad_(), lengths=lengths)
    for a, b in zip(got, want):
        assert a.dtype == dtype
        assert _rel_err(a, b) < HALF_TOL[dtype]


@requires_cuda
@needs_cuda_kernel
@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=str)
@pytest.mark.parametrize("variant", ["ran", "lstm_minus_srnn", "lstm", "lstm_minus_srnn_minus_hidden"])
def test_autocast_runs_the_kernel(monkeypatch, dtype, variant):
    """torch.autocast("cuda"): the kernel (the step kernel, or the −HIDDEN variant's scan) runs
    in the autocast dtype (never the Python loop), the results are close to float32, and the
    float32 parameters get float32 gradients; a state carried in the autocast dtype (a language
    model's h_n) is accepted.  (The −HIDDEN scan once refused the float32 states beside the
    autocast projection: "h0 and c0 must be ... of proj's dtype", seen on an H100.)"""
    def no_generic(*args, **kwargs):
        raise AssertionError("the generic Python loop ran under autocast")

    from rnn_ablations import dispatch
    from rnn_ablations.kernels import scan
    monkeypatch.setattr(scan, "generic_directions", no_generic)
    monkeypatch.setattr(dispatch, "generic_directions", no_generic)

    m = AblatedRNN(variant, 12, 32, num_layers=2, recurrent_dropout=0.0).cuda()
    x = torch.randn(9, 4, 12, device="cuda")
    ref = _run_and_grads(m, x.clone().requires_grad_())
    m.zero_grad()
    from rnn_ablations.kernels import autograd as kernel_autograd
    monkeypatch.setattr(kernel_autograd, "generic_from_projection", no_generic)
    xg = x.clone().requires_grad_()
    with torch.autocast("cuda", dtype=dtype):
        out, (h, c) = m(xg)
        assert out.dtype == dtype and h.dtype == dtype and c.dtype == dtype
        out2, _ = m(x, (h.detach(), c.detach()))  # state carried in the autocast dtype
        assert out2.dtype == dtype
    (out.float().square().sum() + h.float().sum() + 2 * c.float().sum()).backward()
    got = [out, h, c, xg.grad] + [p.grad for p in m.parameters()]
    for p in m.parameters():
        assert p.grad.dtype == torch.float32
    for a, b in zip(got, ref):
        assert _rel_err(a, b) < 2 * HALF_TOL[dtype]
