"""CUDA: the CUDA kernel (when built) and the generic path against the CPU, against each other,
and against nn.LSTM / nn.RNN (cuDNN); gradcheck on the GPU.

These tests skip on machines without a GPU (CI has none); they were run on a lent GPU machine
with `bash benchmarks/gpu_check.sh` (see the README's speed section).  Matrix products on CUDA
run without TF32 here so that float32 comparisons are meaningful.
"""
import pytest
import torch

from rnn_ablations import AblatedRNN, VARIANTS, get_variant, use_backend, weighted_sum
from rnn_ablations.dispatch import cuda_kernel_available

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
MEMORY_VARIANTS = [v for v in VARIANTS if get_variant(v).has_memory]
needs_cuda_kernel = pytest.mark.skipif(not cuda_kernel_available(),
                                       reason="the CUDA kernel rnn_ablations._C_cuda is not built")


def test_cuda_kernel_is_built_where_nvcc_is():
    from torch.utils.cpp_extension import CUDA_HOME
    if CUDA_HOME is None:
        pytest.skip("no CUDA compiler: the CUDA kernel is not built here")
    assert cuda_kernel_available(), "CUDA torch and nvcc present but rnn_ablations._C_cuda missing"


@pytest.fixture(autouse=True)
def _no_tf32():
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


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("highway", [False, True])
def test_cuda_equals_cpu(variant, highway):
    cpu = AblatedRNN(variant, 5, 7, num_layers=2, bidirectional=True, highway=highway,
                     batch_first=True)
    gpu = AblatedRNN(variant, 5, 7, num_layers=2, bidirectional=True, highway=highway,
                     batch_first=True).cuda()
    gpu.load_state_dict(cpu.state_dict())
    x = torch.randn(4, 9, 5)
    lengths = torch.tensor([9, 4, 6, 1])
    want = _run_and_grads(cpu, x.clone().requires_grad_(), lengths=lengths)
    got = _run_and_grads(gpu, x.cuda().requires_grad_(), lengths=lengths.cuda())
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("bidirectional", [False, True])
def test_cuda_lstm_matches_cudnn(bidirectional):
    ref = torch.nn.LSTM(6, 8, num_layers=2, bidirectional=bidirectional).cuda()
    ours = AblatedRNN("lstm", 6, 8, num_layers=2, bidirectional=bidirectional).cuda()
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(11, 3, 6, device="cuda")
    out, (h, c) = ours(x)
    want, (wh, wc) = ref(x)
    for g, w in ((out, want), (h, wh), (c, wc)):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


def test_cuda_srnn_matches_torch_rnn():
    ref = torch.nn.RNN(6, 8, num_layers=2, nonlinearity="tanh").cuda()
    ours = AblatedRNN("srnn", 6, 8, num_layers=2).cuda()
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(7, 3, 6, device="cuda")
    out, (h, _) = ours(x)
    want, wh = ref(x)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(h, wh, atol=1e-5, rtol=1e-5)


@needs_cuda_kernel
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("highway,recurrent_dropout", [(False, 0.0), (True, 0.3)])
def test_cuda_kernel_equals_cuda_generic(variant, highway, recurrent_dropout):
    m = AblatedRNN(variant, 5, 6, num_layers=2, bidirectional=True, highway=highway,
                   recurrent_dropout=recurrent_dropout, dropout=0.2).cuda()
    x = torch.randn(7, 4, 5, device="cuda")
    lengths = torch.tensor([7, 3, 5, 1])
    results = []
    for backend in ("kernel", "generic"):
        torch.manual_seed(1)  # same dropout masks
        with use_backend(backend):
            results.append(_run_and_grads(m, x.clone().requires_grad_(), lengths=lengths))
        m.zero_grad()
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("backend", ["auto", "generic"])
@pytest.mark.parametrize("variant,highway", [(v, False) for v in VARIANTS] + [("ran", True),
                                                                           ("srnn", True)])
def test_cuda_gradcheck(backend, variant, highway):
    m = AblatedRNN(variant, 2, 3, bidirectional=True, highway=highway).double().cuda()
    x = torch.randn(4, 3, 2, dtype=torch.double, device="cuda", requires_grad=True)
    h0 = torch.randn(2, 3, 3, dtype=torch.double, device="cuda", requires_grad=True)
    c0 = torch.randn(2, 3, 3, dtype=torch.double, device="cuda", requires_grad=True)
    lengths = torch.tensor([4, 2, 3])

    def f(x, h0, c0):
        out, (h, c) = m(x, (h0, c0), lengths=lengths)
        return out, h, c

    with use_backend(backend):
        assert torch.autograd.gradcheck(f, (x, h0, c0))


@pytest.mark.parametrize("variant", MEMORY_VARIANTS)
def test_cuda_weighted_sum_identity(variant):
    m = AblatedRNN(variant, 4, 5, bidirectional=True, batch_first=True).cuda()
    x = torch.randn(3, 6, 4, device="cuda")
    ws = weighted_sum(m, x, direction=1, lengths=torch.tensor([6, 3, 5]))
    recon = (ws.weights * ws.content.unsqueeze(1)).sum(dim=2)
    torch.testing.assert_close(recon, ws.memory, atol=1e-5, rtol=1e-5)


def test_cuda_rejects_state_on_another_device():
    m = AblatedRNN("ran", 4, 5).cuda()
    x = torch.randn(3, 2, 4, device="cuda")
    h0 = torch.zeros(1, 2, 5)
    with pytest.raises(ValueError, match="device"):
        m(x, (h0, h0))
