"""Second derivatives (``create_graph=True``) through the kernel paths: gradgradcheck on both
CPU schedules for every variant, a float32 gradient penalty with recurrent dropout equal to the
generic path's, and the oneDNN input projection's double backward."""
import pytest
import torch

from rnn_ablations import AblatedRNN, VARIANTS
from rnn_ablations.variants import get_variant

from conftest import KERNEL_SCHEDULES as KERNELS, backend_path as path, requires_kernel

pytestmark = [requires_kernel, pytest.mark.usefixtures("one_thread")]

def _graded_module(variant, highway):
    return AblatedRNN(variant, 2, 2, num_layers=1, bidirectional=True, highway=highway).double()

@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("highway", [False, True])
def test_gradgradcheck_kernel_path(kernel, variant, highway):
    m = _graded_module(variant, highway)
    x = torch.randn(3, 2, 2, dtype=torch.double, requires_grad=True)
    h0 = torch.randn(2, 2, 2, dtype=torch.double, requires_grad=True)
    c0 = torch.randn(2, 2, 2, dtype=torch.double, requires_grad=True)
    lengths = torch.tensor([3, 2])
    names = [n for n, _ in m.named_parameters()]
    params = [p.detach().requires_grad_() for p in m.parameters()]

    def f(x, h0, c0, *ps):
        with torch.nn.utils.stateless._reparametrize_module(m, dict(zip(names, ps))):
            out, (h, c) = m(x, (h0, c0), lengths=lengths)
        return out, h, c

    if not get_variant(variant).has_memory:  # c_0 is ignored (and c_n is a copy of h_n)
        g, inputs = (lambda x, h0, *ps: f(x, h0, h0, *ps)[:2]), (x, h0, *params)
    else:
        g, inputs = f, (x, h0, c0, *params)
    with path(kernel):
        assert torch.autograd.gradgradcheck(g, inputs, fast_mode=True)

@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("variant", ["lstm", "ran", "srnn"])
def test_gradient_penalty_equals_generic_float32(kernel, variant):
    """A gradient penalty (double backward) in float32, recurrent dropout on: the kernel path
    gives the generic path's numbers on both schedules."""
    m = AblatedRNN(variant, 3, 4, num_layers=2, recurrent_dropout=0.25)
    x = torch.randn(5, 3, 3, requires_grad=True)
    lengths = torch.tensor([5, 2, 4])
    results = []
    for backend in (kernel, "generic"):
        torch.manual_seed(2)
        with path(backend):
            out, (h, c) = m(x, lengths=lengths)
            gx, = torch.autograd.grad(out.square().sum() + c.sum(), x, create_graph=True)
            assert gx.requires_grad, "the input gradient has no graph"
            penalty = gx.square().sum()
            penalty.backward()
        results.append([gx.detach(), x.grad.clone()] + [p.grad.clone() for p in m.parameters()])
        x.grad = None
        m.zero_grad()
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-4)

def test_onednn_linear_double_backward():
    """The oneDNN input projection (large float32 weights) under create_graph=True."""
    from rnn_ablations.kernels.registry import onednn_usable
    from rnn_ablations.kernels.projection import _OneDnnLinear
    if not onednn_usable():
        pytest.skip("this torch build has no oneDNN linear")
    x = torch.randn(4, 3, 5, requires_grad=True)
    w = torch.randn(6, 5, requires_grad=True)
    b = torch.randn(6, requires_grad=True)
    results = []
    for fn in (_OneDnnLinear.apply, torch.nn.functional.linear):
        y = fn(x, w, b)
        gx, gw, gb = torch.autograd.grad(y.square().sum(), (x, w, b), create_graph=True)
        (gx.square().sum() + gw.square().sum() + gb.square().sum()).backward()
        results.append([gx.detach(), gw.detach(), gb.detach(), x.grad.clone(), w.grad.clone(),
                        b.grad.clone()])
        x.grad = w.grad = b.grad = None
    for a, c in zip(*results):
        torch.testing.assert_close(a, c, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("bidirectional", [False, True])
def test_srnn_gradgradcheck_over_c0_and_weights(kernel, bidirectional):
    """The S-RNN never reads c_0: its gradient is ``None`` on the kernel paths as on the generic
    one (not a zero without a graph), so gradgradcheck over (c_0, weights) passes."""
    m = AblatedRNN("srnn", 2, 2, bidirectional=bidirectional, highway=True).double()
    dirs = 2 if bidirectional else 1
    x = torch.randn(3, 2, 2, dtype=torch.double)
    h0 = torch.randn(dirs, 2, 2, dtype=torch.double)
    c0 = torch.randn(dirs, 2, 2, dtype=torch.double, requires_grad=True)
    names = [n for n, _ in m.named_parameters()]
    params = [p.detach().requires_grad_() for p in m.parameters()]

    def f(c0, *ps):
        with torch.nn.utils.stateless._reparametrize_module(m, dict(zip(names, ps))):
            out, (h, c) = m(x, (h0, c0), lengths=torch.tensor([3, 2]))
        return out, h

    with path(kernel):
        assert torch.autograd.grad(f(c0, *params)[0].sum(), c0, allow_unused=True)[0] is None
        assert torch.autograd.gradgradcheck(f, (c0, *params), fast_mode=True)
