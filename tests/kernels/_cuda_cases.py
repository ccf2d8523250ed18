"""What the CUDA tests share (tests/kernels/test_cuda*.py, test_ops_cuda.py): the markers, the
variant lists, matrix products without TF32, and the layer cases checked against the float64
generic path."""
import pytest
import torch

from rnn_ablations import VARIANTS, get_variant, use_backend
from rnn_ablations.dispatch import run_layer
from rnn_ablations.kernels.cuda import graphs as cuda_graphs

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")

MEMORY_VARIANTS = [v for v in VARIANTS if get_variant(v).has_memory]
#: the variants the step kernels (run_layer) run; lstm_minus_srnn_minus_hidden runs through the
#: element-wise scan instead (its half-precision test is in tests/kernels/test_scan.py)
STEP_VARIANTS = [v for v in VARIANTS if get_variant(v).reads_hidden]
#: the CUDA kernels are compiled at first use by NVRTC: where there is a GPU they are in use
#: (test_cuda_kernels_are_in_use fails otherwise); nothing is skipped for a missing build
needs_cuda_kernel = requires_cuda


@pytest.fixture(autouse=True)
def no_tf32():
    """Matrix products on CUDA without TF32, so that float32 comparisons are meaningful (a
    test module that imports this fixture uses it for every test)."""
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def _run_and_grads(m, x, **kw):
    out, (h, c) = m(x, **kw)
    (out.square().sum() + h.sum() + 2 * c.sum()).backward()
    grads = [x.grad.detach().cpu()] + [p.grad.detach().cpu() for p in m.parameters()]
    return [out.detach().cpu(), h.detach().cpu(), c.detach().cpu()] + grads


#: relative tolerances (norm of the error / norm of the float64 result) per storage dtype:
#: bfloat16 keeps 8 significant bits (2^-9 = 2e-3 relative rounding), float16 11 (2^-12)
# bfloat16 keeps 8 bits of mantissa: the H200 run gave dx 3.5e-2 (T = 16 steps of backward)
HALF_TOL = {torch.bfloat16: 5e-2, torch.float16: 6e-3}
HALF_DTYPES = [torch.bfloat16, torch.float16]


def _rel_err(got, want) -> float:
    """None (no gradient reached the input) counts as zeros."""
    if got is None and want is None:
        return 0.0
    got = torch.zeros_like(want) if got is None else got
    want = torch.zeros_like(got) if want is None else want
    got, want = got.double().cpu(), want.double().cpu()
    return float((got - want).norm() / want.norm().clamp_min(1e-12))


def _layer_tensors(variant, highway, dtype, T=13, B=6, D=16, H=24, seed=0):
    """Random arguments of run_layer in ``dtype`` on CUDA (values first rounded to ``dtype``, so
    that the float64 copies hold the same numbers)."""
    v = get_variant(variant)
    R, X = v.num_recurrent(highway), v.num_input_only(highway)
    g = torch.Generator().manual_seed(seed)
    scale = H ** -0.5

    def rnd(*shape, s=1.0):
        return (torch.randn(*shape, generator=g) * s).to(dtype).cuda()

    keep = 0.5  # mask values 0 and 2: exact in every dtype
    mask = (torch.rand(B, H, generator=g) < keep).to(dtype).cuda() / keep
    return v, dict(x=rnd(T, B, D), w_ih=rnd((R + X) * H, D, s=scale), bias=rnd(R * H, s=0.1),
                   w_hh=rnd(R * H, H, s=scale), h0=rnd(B, H, s=0.5), c0=rnd(B, H, s=0.5),
                   mask=mask)


def _layer_run(v, highway, t, batch_sizes, use_mask):
    """run_layer's outputs and the gradients of a fixed loss w.r.t. every input."""
    leaves = {k: t[k].clone().requires_grad_() for k in ("x", "w_ih", "bias", "w_hh", "h0", "c0")}
    out, h_n, c_n = run_layer(v, highway, leaves["x"], leaves["w_ih"], leaves["bias"],
                              leaves["w_hh"], leaves["h0"], leaves["c0"], batch_sizes,
                              t["mask"] if use_mask else None)
    w = torch.linspace(-1, 1, out.shape[-1], device=out.device, dtype=torch.float64)
    loss = (out.double() * w).square().sum() + (h_n.double() * w).sum() + 2 * (c_n.double() * w).sum()
    loss.backward()
    return [out, h_n, c_n] + [leaves[k].grad for k in ("x", "w_ih", "bias", "w_hh", "h0", "c0")]


def _check_against_float64_generic(v, highway, t, batch_sizes, use_mask, got, dtype, tol):
    """``got`` (a :func:`_layer_run` result in ``dtype``) against the generic path on the same
    tensors in float64: every output and gradient in ``dtype``, relative error below ``tol``."""
    t64 = {k: a.double() for k, a in t.items()}
    with use_backend("generic"):
        want = _layer_run(v, highway, t64, batch_sizes, use_mask)
    names = ["out", "h_n", "c_n", "dx", "dw_ih", "dbias", "dw_hh", "dh0", "dc0"]
    for name, a, b in zip(names, got, want):
        assert a is None or a.dtype == dtype, f"{name} came back in {a.dtype}, not {dtype}"
        err = _rel_err(a, b)
        assert err < tol, f"{name}: relative error {err:.2e} >= {tol:.1e}"


@pytest.fixture
def fresh_graphs():
    cuda_graphs.clear_graphs()
    yield
    cuda_graphs.clear_graphs()


def _repeat_calls(m, xs, lengths, grad=True):
    results = []
    for x in xs:
        if grad:
            results.append(_run_and_grads(m, x.clone().requires_grad_(), lengths=lengths))
            m.zero_grad(set_to_none=True)
        else:
            with torch.no_grad():
                out, (h, c) = m(x, lengths=lengths)
            results.append([out.cpu(), h.cpu(), c.cpu()])
    return results
