"""The CUDA kernels (NVRTC, rnn_ablations/kernels/cuda) in use on a GPU, and against the CPU,
the generic path on CUDA, nn.LSTM / nn.RNN (cuDNN); gradcheck on the GPU.  The half precision,
CUDA-graph, persistent-kernel and operator tests are in test_cuda_half.py, test_cuda_graphs.py,
test_cuda_recurrence.py and test_ops_cuda.py.

These tests skip on machines without a GPU (CI has none); they were run on a lent GPU machine with
`bash benchmarks/gpu_check.sh` (see the README's speed section), once with graphs on (the
default) and once with RNN_ABLATIONS_CUDA_GRAPHS=0.
"""
import pytest
import torch

from _cuda_cases import (MEMORY_VARIANTS, needs_cuda_kernel, no_tf32,  # noqa: F401
                         requires_cuda, _run_and_grads)
from rnn_ablations import AblatedRNN, VARIANTS, use_backend, weighted_sum
from rnn_ablations import cuda_kernel_available
from rnn_ablations.kernels import registry


@requires_cuda
def test_cuda_kernels_are_in_use():
    """On a GPU the package's CUDA kernels run (NVRTC, no build step): no reason to refuse."""
    from rnn_ablations.kernels.cuda import unavailable_reason
    assert unavailable_reason() is None, unavailable_reason()
    assert cuda_kernel_available(), registry.cuda_kernel_error()


@requires_cuda
def test_nvrtc_kernels_compile_for_this_gpu_and_come_from_the_cache(tmp_path, monkeypatch):
    """A program compiles to CUBIN for the local GPU, loads, and a second process-level lookup
    reads it from the disk cache; the driver's attributes the persistent plan reads exist."""
    from rnn_ablations.kernels.cuda import cache, driver, programs
    monkeypatch.setenv("RNN_ABLATIONS_CACHE", str(tmp_path))
    major, minor = torch.cuda.get_device_capability()
    prog = programs.Program("step_forward", "float32")
    b, source = cache.lookup(prog, major * 10 + minor, quiet=True, force=True)
    assert source == "compiled" and b.kind in ("cubin", "ptx")
    cache._memory.clear()
    assert cache.lookup(prog, major * 10 + minor, quiet=True)[1] == "disk"
    k = driver.Kernel(prog, torch.cuda.current_device())
    assert k.function.value
    assert driver.device_attribute(driver.ATTR_MULTIPROCESSOR_COUNT, 0) > 0


@requires_cuda
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


@requires_cuda
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


@requires_cuda
def test_cuda_srnn_matches_torch_rnn():
    ref = torch.nn.RNN(6, 8, num_layers=2, nonlinearity="tanh").cuda()
    ours = AblatedRNN("srnn", 6, 8, num_layers=2).cuda()
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(7, 3, 6, device="cuda")
    out, (h, _) = ours(x)
    want, wh = ref(x)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(h, wh, atol=1e-5, rtol=1e-5)


@requires_cuda
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


@requires_cuda
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


@requires_cuda
@pytest.mark.parametrize("variant", MEMORY_VARIANTS)
def test_cuda_weighted_sum_identity(variant):
    m = AblatedRNN(variant, 4, 5, bidirectional=True, batch_first=True).cuda()
    x = torch.randn(3, 6, 4, device="cuda")
    ws = weighted_sum(m, x, direction=1, lengths=torch.tensor([6, 3, 5]))
    recon = (ws.weights * ws.content.unsqueeze(1)).sum(dim=2)
    torch.testing.assert_close(recon, ws.memory, atol=1e-5, rtol=1e-5)


@requires_cuda
def test_cuda_rejects_state_on_another_device():
    m = AblatedRNN("ran", 4, 5).cuda()
    x = torch.randn(3, 2, 4, device="cuda")
    h0 = torch.zeros(1, 2, 5)
    with pytest.raises(ValueError, match="device"):
        m(x, (h0, h0))
