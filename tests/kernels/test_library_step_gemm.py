"""The CPU kernel's step GEMM on MKL's packed GEMM (``csrc/cpu/library_gemm.h``), chosen by
``plan.POLICY.library_step_gemm``: the same numbers as the generic path (float32 tolerance),
forward and gradients, both schedules, one and two directions, training and inference; the
policy's thresholds reach the kernel; bad entries are refused."""
import dataclasses

import pytest
import torch

from rnn_ablations import AblatedRNN, options
from rnn_ablations import plan as run_plan
from rnn_ablations.kernels import registry

pytestmark = pytest.mark.skipif(
    registry.cpu_kernel() is None
    or not getattr(registry.cpu_kernel(), "library_gemm", lambda: False)(),
    reason="the CPU kernel is not built, or this torch links no MKL packed GEMM")


@pytest.fixture
def library_everywhere(monkeypatch):
    isa = registry.cpu_kernel().kernel_isa()
    monkeypatch.setattr(run_plan, "POLICY", dataclasses.replace(
        run_plan.POLICY, library_step_gemm=((isa, 0, 0),)))
    yield
    _reset()


def _reset():
    """The kernel back to its own GEMM (the next plan's thresholds are given where they
    differ from what the kernel holds)."""
    registry.cpu_kernel().set_library_step_gemm(-1, -1)


@pytest.mark.parametrize("variant", ["lstm", "srnn", "ran"])
@pytest.mark.parametrize("schedule", ["plain", "pipelined"])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_library_step_gemm_matches_generic(variant, schedule, bidirectional, library_everywhere):
    torch.manual_seed(0)
    model = AblatedRNN(variant, 9, 13, num_layers=2, bidirectional=bidirectional)
    x = torch.randn(8, 5, 9, requires_grad=True)
    lengths = torch.tensor([8, 3, 6, 8, 1])

    def run(backend_name):
        model.zero_grad()
        x.grad = None
        packed = torch.nn.utils.rnn.pack_padded_sequence(x, lengths, enforce_sorted=False)
        with options(backend=backend_name, cpu_schedule=schedule):
            out, (h, c) = model(packed)
            pad, _ = torch.nn.utils.rnn.pad_packed_sequence(out)
            (pad.square().sum() + h.sum() + c.sum()).backward()
            with torch.no_grad():
                inf, _ = model(packed)
        return ([pad.detach(), h.detach(), c.detach(), x.grad.clone(),
                 torch.nn.utils.rnn.pad_packed_sequence(inf)[0]]
                + [p.grad.clone() for p in model.parameters()])

    got = run("kernel")
    assert registry.cpu_kernel().library_step_gemm() == [0, 0]
    ref = run("generic")
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_policy_reaches_the_kernel(monkeypatch):
    isa = registry.cpu_kernel().kernel_isa()
    monkeypatch.setattr(run_plan, "POLICY", dataclasses.replace(
        run_plan.POLICY, library_step_gemm=((isa, 123, 456),)))
    try:
        with torch.no_grad(), options(backend="kernel"):
            AblatedRNN("lstm", 3, 4)(torch.randn(2, 1, 3))
        assert registry.cpu_kernel().library_step_gemm() == [123, 456]
        assert run_plan.library_step_thresholds(run_plan.POLICY, "no such path") == (-1, -1)
    finally:
        _reset()


def test_bad_entries_are_refused():
    with pytest.raises(ValueError, match="library_step_gemm"):
        dataclasses.replace(run_plan.POLICY, library_step_gemm=(("avx2", -5, 0),))
    with pytest.raises(ValueError, match="library_step_gemm"):
        dataclasses.replace(run_plan.POLICY, library_step_gemm=(("avx2", 0),))
    with pytest.raises(RuntimeError, match="set_library_step_gemm"):
        registry.cpu_kernel().set_library_step_gemm(-2, 0)
