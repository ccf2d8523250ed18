"""The input projection of all steps is one GEMM: ``(T·B, K) x Kᵀ``, whatever the layout of the
layer input.  A batch-first input reaches the projection as a (T, B, K) view, and ``F.linear``
on such a view with a weight that needs no gradient (the bfloat16 copy of the bfloat16 GEMM,
frozen parameters) would run as T batched GEMMs against an expanded weight (``aten::bmm``),
slower in float32 and, on CPUs with bfloat16 GEMM instructions, the reason a bfloat16
inference took as long as a training step."""
import dataclasses

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from conftest import record_plans
from rnn_ablations import AblatedRNN, options
from rnn_ablations import plan as run_plan
from rnn_ablations.kernels import registry
from rnn_ablations.kernels.projection import input_projection

pytestmark = pytest.mark.skipif(registry.cpu_kernel() is None,
                                reason="the CPU kernel is not built")


class _Ops(TorchDispatchMode):
    """The names of the aten operators a block of code calls."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.__name__.split(".")[0])
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("bf16_gemm", [False, True])
@pytest.mark.parametrize("bias", [True, False])
def test_projection_of_a_batch_first_view_is_one_gemm(bf16_gemm, bias):
    torch.manual_seed(0)
    x = torch.randn(3, 7, 5).transpose(0, 1)  # (T, B, K) view of a batch-first input
    w, b = torch.randn(8, 5), torch.randn(8) if bias else None
    with torch.no_grad(), _Ops() as ops:
        y = input_projection(x, w, b, onednn=False, bf16_gemm=bf16_gemm)
    assert "bmm" not in ops.names and ops.names.count("addmm") + ops.names.count("mm") == 1, \
        ops.names
    assert y.shape == (7, 3, 8) and y.dtype == torch.float32
    cast = (lambda t: t.bfloat16().float()) if bf16_gemm else (lambda t: t)
    ref = torch.einsum("tbk,nk->tbn", cast(x), cast(w)) + (cast(b) if bias else 0)
    torch.testing.assert_close(y, ref, **(dict(rtol=2e-2, atol=2e-2) if bf16_gemm else {}))


def test_projection_keeps_the_input_gradient_of_a_view():
    torch.manual_seed(0)
    xb = torch.randn(3, 7, 5, requires_grad=True)
    w, b = torch.randn(8, 5, requires_grad=True), torch.randn(8, requires_grad=True)
    y = input_projection(xb.transpose(0, 1), w, b, onednn=False)
    g = torch.randn_like(y)
    got = torch.autograd.grad(y, (xb, w, b), g)
    ref = torch.autograd.grad(torch.nn.functional.linear(xb.transpose(0, 1), w, b), (xb, w, b), g)
    for a, r in zip(got, ref):
        torch.testing.assert_close(a, r)


@pytest.mark.parametrize("case", ["frozen float32", "bfloat16"])
def test_batch_first_inference_runs_no_batched_gemm(case, monkeypatch):
    """A whole layer stack: frozen float32 parameters (F.linear below the oneDNN threshold) and a
    bfloat16 model with the projection in bfloat16."""
    monkeypatch.setattr(run_plan, "POLICY", dataclasses.replace(run_plan.POLICY, bf16_gemm="on"))
    torch.manual_seed(0)
    model = AblatedRNN("lstm", 16, 24, num_layers=2, batch_first=True).requires_grad_(False)
    x = torch.randn(4, 9, 16)
    if case == "bfloat16":
        model, x = model.bfloat16(), x.bfloat16()
    seen = record_plans(monkeypatch)
    with options(backend="kernel", cpu_schedule="plain"), torch.no_grad(), _Ops() as ops:
        out, _ = model(x)
    assert [p.runner for p in seen] == ["cpu_plain"] * 2, seen
    assert all(p.bf16_gemm == (case == "bfloat16") and not p.onednn for p in seen), seen
    assert "bmm" not in ops.names, ops.names
    with options(backend="generic"), torch.no_grad():
        ref, _ = model.float()(x.float())
    tol = dict(rtol=3e-2, atol=3e-2) if case == "bfloat16" else {}
    torch.testing.assert_close(out.float(), ref, **tol)
