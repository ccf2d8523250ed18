"""The CUDA kernels' first-use check (rnn_ablations/kernels/cuda/selfcheck.py) on the emulated
device: the real host loops and device code pass it for every family (no false alarm, also in
the 16-bit types), and a kernel that computes a wrong backward or cannot be loaded fails it at
the first forward, with one warning, the generic path then serving the layer calls."""
import warnings

import pytest
import torch

import rnn_ablations as ra
from rnn_ablations import dispatch, get_variant
from rnn_ablations.kernels import registry
from rnn_ablations.kernels.cuda import ops as ops_cuda
from rnn_ablations.kernels.cuda import driver, host, selfcheck
from rnn_ablations.plan import Plan
from _cuda_plans import cuda_plans_on_cpu

CPU = torch.device("cpu")


pytestmark = pytest.mark.usefixtures("fresh_cuda_selfcheck")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_family_passes_on_the_emulated_device(dtype, emulated_cuda):
    lstm, scan_cell = get_variant("lstm"), get_variant("lstm_minus_srnn_minus_hidden")
    fams = [(lstm, selfcheck.Family("step", dtype, highway=True)),
            (lstm, selfcheck.Family("persistent", dtype, backward=True)),
            (lstm, selfcheck.Family("persistent", dtype, backward=False)),
            (scan_cell, selfcheck.families(Plan("cuda", "", schedule="scan"), scan_cell, False,
                                           dtype)[0])]
    for v, fam in fams:
        assert selfcheck.check_family(fam, v, CPU, host) is None, fam.name


class _Broken:
    """The emulated device with one fault: ``skip`` = a family whose launches do nothing (a
    kernel that writes a wrong result), ``load`` = a family whose program cannot be loaded."""

    def __init__(self, device, skip=None, load=None):
        self.device, self.skip, self.load = device, skip, load

    def kernel(self, prog, device):
        if prog.family == self.load:
            raise driver.CudaDriverError(f"rnn_ablations CUDA kernel: cuModuleLoadData("
                                         f"{prog.name}) failed: CUDA_ERROR_INVALID_PTX (218)")
        return self.device.kernel(prog, device)

    def launch(self, k, args, grid, block, smem=0, cooperative=False):
        if k.prog.family != self.skip:
            self.device.launch(k, args, grid, block, smem, cooperative)

    def device_attribute(self, attr, device):
        return self.device.device_attribute(attr, device)


def _layer(T=5, B=3, D=6, H=4):
    g = torch.Generator().manual_seed(5)
    v = get_variant("lstm")
    x = torch.randn(T, B, D, generator=g)
    w_ih = torch.randn(4 * H, D, generator=g) * 0.3
    w_hh = torch.randn(4 * H, H, generator=g) * 0.3
    bias = torch.randn(4 * H, generator=g) * 0.1
    h0, c0 = torch.randn(B, H, generator=g), torch.randn(B, H, generator=g)
    return v, [t.requires_grad_() for t in (x, w_ih, bias, w_hh, h0, c0)], torch.tensor(
        [3, 3, 2, 2, 1])


def _run(v, tensors, bs):
    x, w_ih, bias, w_hh, h0, c0 = tensors
    out, h_n, c_n = dispatch.run_layer(v, False, x, w_ih, bias, w_hh, h0, c0, bs)
    loss = out.square().sum() + h_n.sum() + 2 * c_n.sum()
    return [out, h_n, c_n] + list(torch.autograd.grad(loss, tensors))


@pytest.mark.parametrize("fault", [None, {"skip": "step_backward"}, {"load": "step_forward"}])
def test_layer_calls_through_the_emulated_kernels_or_their_fallback(fault, emulated_cuda,
                                                                    monkeypatch):
    """A CUDA plan's layer calls: with correct kernels they run on them (the emulated launches
    grow) and give the generic path's numbers; with a wrong backward or a program that cannot
    be loaded, the first call's check fails (before any of the call's own launches), one
    warning names the reason, and every call gives exactly the generic path's numbers."""
    v, tensors, bs = _layer()
    with ra.use_backend("generic"):
        want = _run(v, tensors, bs)
    if fault:
        driver.set_implementation(_Broken(emulated_cuda, **fault))
    cuda_plans_on_cpu(monkeypatch, ops_cuda.CudaKernel(host))  # as the registry loads it
    with warnings.catch_warnings(record=True) as caught, ra.options(cuda_graphs=False):
        warnings.simplefilter("always")
        ran = []
        for _ in range(2):
            before = emulated_cuda.launches()
            got = _run(v, tensors, bs)
            ran.append(emulated_cuda.launches() - before)
            for g, w in zip(got, want):
                if fault:
                    torch.testing.assert_close(g, w, rtol=0, atol=0)
                else:
                    torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    # a call: 5 forward and 5 backward steps; the check (first call only): 3 + 3 steps
    check = {None: 6, "skip": 3, "load": 0}[next(iter(fault)) if fault else None]
    assert ran == ([check, 0] if fault else [check + 10, 10])
    ours = [str(w.message) for w in caught if "failed their check" in str(w.message)]
    if fault is None:
        assert ours == [] and list(selfcheck.status().values()) == [None]
    else:
        assert len(ours) == 1
        assert ("d_proj differs" if "skip" in fault else "CUDA_ERROR_INVALID_PTX") in ours[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_step_loop_is_the_same_under_autocast(dtype, emulated_cuda):
    """Under torch.autocast the step loop's pre-activations (gates) stay in the accumulation type
    and every result is the one outside it, bit for bit (the loop runs with autocast off)."""
    v = get_variant("lstm")
    g = torch.Generator().manual_seed(2)
    T, B, H = 4, 3, 8
    proj = torch.randn(T, B, 4 * H, generator=g).to(dtype)
    w_hh = (torch.randn(4 * H, H, generator=g) * 0.3).to(dtype)
    h0, c0 = torch.randn(B, H, generator=g).to(dtype), torch.randn(B, H, generator=g).to(dtype)
    bs = torch.tensor([3, 3, 2, 1])
    args = (v.kernel_spec, False, proj, w_hh, h0, c0, bs, torch.empty(0, dtype=dtype), True)
    want = host.plain_forward(*args)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = host.plain_forward(*args)
    assert got[3].dtype == torch.float32
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and torch.equal(a, b)
