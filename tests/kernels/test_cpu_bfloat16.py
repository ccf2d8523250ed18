"""The bfloat16 CPU path (the run plan's ``Plan.bf16_on_f32``): a bfloat16 model, or a
float32 one under ``torch.autocast("cpu", torch.bfloat16)``, runs on the float32 CPU kernels
(states and element-wise pass in float32, the input projection in bfloat16 where
``plan.POLICY.bf16_gemm`` says) and returns bfloat16; its numbers match the float32 generic
path within bfloat16 tolerance, for every variant, one and two directions, forward and
gradients."""
import dataclasses

import pytest
import torch

from conftest import record_plans
from rnn_ablations import AblatedRNN, options
from rnn_ablations import plan as run_plan
from rnn_ablations.kernels import registry
from rnn_ablations.plan import bf16_gemm_applies
from rnn_ablations.variants import VARIANTS

pytestmark = pytest.mark.skipif(registry.cpu_kernel() is None,
                                reason="the CPU kernel is not built")

BF16_TOL = dict(rtol=3e-2, atol=3e-2)


def _reference(model, x, h0=None):
    """The float32 generic path on the same (bfloat16-valued) parameters and input."""
    ref = AblatedRNN(model.variant.name, model.input_size, model.hidden_size,
                     num_layers=model.num_layers, bidirectional=model.bidirectional,
                     highway=model.highway)
    # a dict of cast tensors has no metadata: its variant travels as the documented key
    ref.load_state_dict({**{k: v.float() for k, v in model.state_dict().items()},
                         "variant_state": model.variant_state})
    with options(backend="generic"):
        return ref, ref(x.float().detach().requires_grad_(x.requires_grad))


@pytest.fixture(params=["off", "on"])
def bf16_gemm(request, monkeypatch):
    monkeypatch.setattr(run_plan, "POLICY",
                        dataclasses.replace(run_plan.POLICY, bf16_gemm=request.param))
    return request.param


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("bidirectional", [False, True])
def test_bfloat16_model_matches_float32_generic(variant, bidirectional, bf16_gemm, monkeypatch):
    torch.manual_seed(0)
    model = AblatedRNN(variant, 8, 12, num_layers=2, bidirectional=bidirectional).bfloat16()
    x = torch.randn(7, 3, 8).bfloat16().requires_grad_()
    seen = record_plans(monkeypatch)
    with options(backend="kernel"):
        out, (h, c) = model(x)
    assert len(seen) == 2 and all(p.bf16_on_f32 and p.path == "cpu" for p in seen), seen
    assert all(p.bf16_gemm == (bf16_gemm == "on" and p.runner in ("cpu_plain", "cpu_plain_pair",
                                                                  "scan")) for p in seen), seen
    assert out.dtype == h.dtype == c.dtype == torch.bfloat16
    ref, (rout, (rh, rc)) = _reference(model, x)
    torch.testing.assert_close(out.float(), rout, **BF16_TOL)
    torch.testing.assert_close(h.float(), rh, **BF16_TOL)
    torch.testing.assert_close(c.float(), rc, **BF16_TOL)
    (out.float().sum() + h.float().sum()).backward()
    (rout.sum() + rh.sum()).backward()
    for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        assert p.grad is not None and p.grad.dtype == torch.bfloat16, name
        scale = q.grad.abs().max().clamp_min(1.0)
        torch.testing.assert_close(p.grad.float() / scale, q.grad / scale, rtol=0, atol=5e-2,
                                   msg=name)


@pytest.mark.parametrize("variant", ["lstm", "ran", "lstm_minus_srnn_minus_hidden"])
def test_autocast_bfloat16_lands_on_the_kernel(variant, monkeypatch):
    torch.manual_seed(1)
    model = AblatedRNN(variant, 6, 10, bidirectional=True)
    x = torch.randn(5, 4, 6)
    seen = record_plans(monkeypatch)
    with torch.no_grad(), options(backend="kernel"), torch.autocast("cpu", torch.bfloat16):
        out, (h, c) = model(x)
    assert seen and all(p.bf16_on_f32 for p in seen), seen
    assert out.dtype == torch.bfloat16
    with torch.no_grad(), options(backend="generic"):
        rout, _ = model(x)
    torch.testing.assert_close(out.float(), rout, **BF16_TOL)


def test_generic_backend_keeps_bfloat16_generic(monkeypatch):
    seen = record_plans(monkeypatch)
    model = AblatedRNN("lstm", 4, 4).bfloat16()
    with options(backend="generic"):
        out, _ = model(torch.randn(3, 2, 4).bfloat16())
    assert out.dtype == torch.bfloat16
    assert [(p.runner, p.bf16_on_f32) for p in seen] == [("generic", False)]


def test_bf16_gemm_setting():
    for has in (False, True):  # "on" / "off" whatever the CPU has; "auto" follows the CPU
        assert bf16_gemm_applies("on", has) and not bf16_gemm_applies("off", has)
        assert bf16_gemm_applies("auto", has) == has
    with pytest.raises(ValueError, match="bf16_gemm"):
        bf16_gemm_applies("sometimes", True)
    with pytest.raises(ValueError, match="bf16_gemm"):
        dataclasses.replace(run_plan.POLICY, bf16_gemm="yes")
