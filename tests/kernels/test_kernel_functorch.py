"""torch.func on the layers: grad, jacrev and vmap give what autograd and a loop give, for
every variant (the kernels' autograd Functions have no functorch rules: under a torch.func
transform the plan names the generic path, which torch.func differentiates and batches)."""
import pytest
import torch
from torch.func import functional_call, grad, jacrev, vmap

import rnn_ablations as ra
from rnn_ablations import dispatch


@pytest.mark.parametrize("variant", sorted(ra.VARIANTS))
def test_torch_func_grad_jacrev_and_vmap(variant):
    torch.manual_seed(0)
    model = ra.AblatedRNN(variant, 3, 4, bidirectional=True).double()
    params = {k: v.detach() for k, v in model.named_parameters()}
    x = torch.randn(5, 2, 3, dtype=torch.double)

    def loss(p, x):
        out, (h_n, c_n) = functional_call(model, p, (x,))
        return (out * out).sum() + h_n.sum() + 2 * c_n.sum()

    # reference: autograd through the layer as it runs outside torch.func (the kernels)
    leaves = {k: v.clone().requires_grad_() for k, v in params.items()}
    xr = x.clone().requires_grad_()
    loss(leaves, xr).backward()
    got = grad(loss, argnums=(0, 1))(params, x)
    for k in params:
        torch.testing.assert_close(got[0][k], leaves[k].grad)
    torch.testing.assert_close(got[1], xr.grad)

    jac = jacrev(lambda x: functional_call(model, params, (x,))[0])(x)
    assert jac.shape == (5, 2, 8, 5, 2, 3)
    # row b of the output depends on row b of the input only
    assert jac[:, 0, :, :, 1].abs().max() == 0 and jac[:, 1, :, :, 1].abs().max() > 0

    xs = torch.randn(3, 5, 2, 3, dtype=torch.double)
    batched = vmap(lambda xx: functional_call(model, params, (xx,))[0])(xs)
    with torch.no_grad():
        torch.testing.assert_close(batched, torch.stack([model(xx)[0] for xx in xs]))


def test_outside_a_transform_the_plan_is_unchanged():
    x, w = torch.randn(5, 2, 4), torch.randn(16, 4)
    plan = dispatch.layer_plan([x], [(w, w, None)])
    assert plan.path == ("cpu" if ra.kernel_available() else "generic")
