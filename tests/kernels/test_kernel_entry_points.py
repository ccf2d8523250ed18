"""The compiled CPU kernel's entry points called directly, as the Python layer never calls
them: variant specs they do not implement, tensors of the wrong sizes, empty sizes, a bad
recurrent-dropout mask.  Each is refused with a message that names the problem (or, for empty
sizes, returns empty results); none may crash the process."""
import pytest
import torch

from rnn_ablations.variants import SPEC_FIELDS, get_variant

from conftest import requires_kernel

pytestmark = requires_kernel

RAN = get_variant("ran").kernel_spec  # the step kernels' spec of a variant (csrc/common/kernel_spec.h)

def _plain_args(name, highway, T, B, H, dtype=torch.float64):
    v = get_variant(name)
    R, X = v.num_recurrent(highway), v.num_input_only(highway)
    proj = torch.randn(T, B, (R + X) * H, dtype=dtype)
    w_hh = torch.randn(R * H, H, dtype=dtype)
    h0, c0 = torch.zeros(B, H, dtype=dtype), torch.zeros(B, H, dtype=dtype)
    return proj, w_hh, h0, c0, torch.full((T,), B, dtype=torch.int64)

def test_entry_points_refuse_unknown_kernel_specs():
    from rnn_ablations import _C
    e = torch.empty(0, dtype=torch.float64)
    # not a spec at all: small integers (variant codes), a missing tag, unknown bits
    for spec in (-1, 0, 3, 6, 99, RAN & 0xFF, RAN | (1 << 20), RAN | (1 << 7)):
        proj, w_hh, h0, c0, bs = _plain_args("ran", False, 3, 2, 4)
        with pytest.raises(RuntimeError, match=f"unknown kernel spec {spec} .*Variant.kernel_spec"):
            _C.plain_forward(spec, False, proj, w_hh, h0, c0, bs, e, True)
        x, w_ih = torch.randn(3, 2, 5, dtype=torch.float64), torch.randn(12, 5, dtype=torch.float64)
        with pytest.raises(RuntimeError, match=f"unknown kernel spec {spec}"):
            _C.pipelined_forward(spec, False, x, w_ih, e, w_hh, h0, c0, bs, e, True, 0)
    # LSTM − S-RNN − HIDDEN's spec is a valid one, but its gates read no h_{t-1}: the step entry
    # points send it to the scan
    mh = get_variant("lstm_minus_srnn_minus_hidden")
    assert not mh.has_step_kernel
    proj, w_hh, h0, c0, bs = _plain_args("ran", False, 3, 2, 4)
    with pytest.raises(RuntimeError, match=f"kernel spec {mh.kernel_spec} .*has no step kernel.*scan"):
        _C.plain_forward(mh.kernel_spec, False, proj, w_hh, h0, c0, bs, e, True)
    with pytest.raises(RuntimeError, match=f"kernel spec {mh.kernel_spec} .*has no step kernel"):
        _C.pipelined_forward(mh.kernel_spec, False, x, w_ih, e, w_hh, h0, c0, bs, e, True, 0)
    # combinations the kernels do not implement are refused with what to do
    srnn, lstm = get_variant("srnn").kernel_spec, get_variant("lstm").kernel_spec
    for spec, message in ((srnn | SPEC_FIELDS["memory"], "output rule 'content' needs a cell without memory"),
                          (lstm & ~SPEC_FIELDS["memory"], "needs a memory cell"),
                          (srnn | SPEC_FIELDS["content_input_only"], "no recurrence at all"),
                          (RAN | SPEC_FIELDS["content_tanh"], "input-only content with tanh")):
        with pytest.raises(RuntimeError, match=message):
            _C.plain_forward(spec, False, proj, w_hh, h0, c0, bs, e, True)
    # a valid spec whose block layout does not match the tensors (lstm needs 4 blocks, not 2+1)
    with pytest.raises(RuntimeError, match="needs 4 recurrent and 0 input-only blocks"):
        _C.plain_forward(lstm, False, proj, w_hh, h0, c0, bs, e, True)
    out, h_n, c_n, gates, cs, hin = _C.plain_forward(RAN, False, proj.clone(), w_hh, h0, c0, bs, e, True)
    g = torch.ones_like(out)
    for spec in (-1, 5, mh.kernel_spec, lstm):
        with pytest.raises(RuntimeError, match="unknown kernel spec|needs 4 recurrent|no step "
                                               "kernel"):
            _C.plain_backward(spec, False, g, h_n, c_n, gates, cs, hin, out, proj, w_hh, h0, c0, bs, e)

def test_entry_points_check_sizes():
    from rnn_ablations import _C
    e = torch.empty(0, dtype=torch.float64)
    proj, w_hh, h0, c0, bs = _plain_args("ran", False, 3, 2, 4)
    # H = 0 was a division by zero (w_hh.size(0) % w_hh.size(1))
    with pytest.raises(RuntimeError, match="H > 0"):
        _C.plain_forward(RAN, False, torch.randn(3, 2, 0, dtype=torch.float64),
                   torch.empty(0, 0, dtype=torch.float64), h0[:, :0], c0[:, :0], bs, e, True)
    x = torch.randn(3, 2, 5, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="H > 0"):
        _C.pipelined_forward(RAN, False, x, torch.empty(0, 5, dtype=torch.float64), e,
                         torch.empty(0, 0, dtype=torch.float64), h0[:, :0], c0[:, :0], bs, e,
                         True, 0)
    out, h_n, c_n, gates, cs, hin = _C.plain_forward(RAN, False, proj.clone(), w_hh, h0, c0, bs, e, True)
    g = torch.ones_like(out)
    bad = {"grad_out": (torch.ones(3, 1, 4, dtype=torch.float64), "grad_out must have shape"),
           "grad_hn": (torch.ones(1, 4, dtype=torch.float64), "grad_hn must have shape"),
           "cs": (cs[:2], "cs must be contiguous with shape"),
           "gates": (gates[:, :1], "gates must be the forward's")}
    for name, (value, message) in bad.items():
        args = dict(grad_out=g, grad_hn=h_n, grad_cn=c_n, gates=gates, cs=cs)
        args[name] = value
        with pytest.raises(RuntimeError, match=message):
            _C.plain_backward(RAN, False, args["grad_out"], args["grad_hn"], h_n, args["gates"],
                        args["cs"], hin, out, proj, w_hh, h0, c0, bs, e)
    with pytest.raises(RuntimeError, match="batch_sizes"):
        _C.plain_backward(RAN, False, g, h_n, c_n, gates, cs, hin, out, proj, w_hh, h0, c0,
                    torch.tensor([2, 3, 1]), e)
    p2, w2, _, _, _ = _plain_args("ran", True, 3, 2, 4)
    o2, hn2, cn2, g2, cs2, hin2 = _C.plain_forward(RAN, True, p2.clone(), w2, h0, c0, bs, e, True)
    with pytest.raises(RuntimeError, match="hin \\(highway inputs\\)"):  # highway without hin
        _C.plain_backward(RAN, True, torch.ones_like(o2), hn2, cn2, g2, cs2, e, o2, p2, w2, h0, c0,
                    bs, e)
    # an inference forward (keep_hin=False) keeps no memories and no hin: the backward says so
    o3, hn3, cn3, g3, cs3, hin3 = _C.plain_forward(RAN, True, p2.clone(), w2, h0, c0, bs, e, False)
    assert cs3.numel() == 0 and hin3.numel() == 0
    with pytest.raises(RuntimeError, match="inference \\(keep_hin=False\\) and kept nothing"):
        _C.plain_backward(RAN, True, torch.ones_like(o3), hn3, cn3, g3, cs3, hin3, o3, p2, w2, h0, c0,
                    bs, e)

@pytest.mark.parametrize("T,B", [(0, 3), (4, 0), (0, 0), (2, 0)])
def test_entry_points_on_empty_sizes(T, B):
    """Called directly with T = 0 or B = 0 (the Python layer never does), every entry point
    returns empty results and zero weight gradients instead of dividing by B or indexing."""
    from rnn_ablations import _C
    e = torch.empty(0, dtype=torch.float64)
    H, D = 3, 5
    proj, w_hh, h0, c0, bs = _plain_args("ran", False, T, B, H)
    out, h_n, c_n, gates, cs, hin = _C.plain_forward(RAN, False, proj.clone(), w_hh, h0, c0, bs, e, True)
    assert out.shape == (T, B, H) and h_n.shape == (B, H)
    dproj, dw, dh0, dc0 = _C.plain_backward(RAN, False, torch.ones_like(out), h_n, c_n, gates, cs, hin,
                                      out, proj, w_hh, h0, c0, bs, e)
    assert dproj.shape == proj.shape and dw.shape == w_hh.shape and not dw.any()
    x, w_ih = torch.randn(T, B, D, dtype=torch.float64), torch.randn(3 * H, D, dtype=torch.float64)
    b = torch.randn(2 * H, dtype=torch.float64)
    for chunk in (0, 1):
        out, h_n, c_n, gates, cs, hin, xo = _C.pipelined_forward(RAN, False, x, w_ih, b, w_hh, h0, c0,
                                                             bs, e, True, chunk)
        assert out.shape == (T, B, H)
        for need_dx in (True, False):
            dx, dw_ih, db, dw_hh, dh0, dc0 = _C.pipelined_backward(
                RAN, False, torch.ones_like(out), h_n, c_n, gates, cs, hin, xo, out, x, w_ih, w_hh,
                h0, c0, bs, e, need_dx, True, True, chunk)
            assert dw_ih.shape == w_ih.shape and dw_hh.shape == w_hh.shape and db.shape == b.shape
            assert not dw_ih.any() and not dw_hh.any() and not db.any()
            if need_dx:
                assert dx.shape == x.shape

def test_entry_points_check_the_recurrent_dropout_mask():
    from rnn_ablations import _C
    e = torch.empty(0, dtype=torch.float64)
    proj, w_hh, h0, c0, bs = _plain_args("ran", False, 3, 2, 4)
    for mask, message in ((torch.ones(2, 4), "rec_mask must have dtype"),
                          (torch.ones(2, 3, dtype=torch.float64), "rec_mask must be contiguous")):
        with pytest.raises(RuntimeError, match=message):
            _C.plain_forward(RAN, False, proj.clone(), w_hh, h0, c0, bs, mask, True)
        x, w_ih = torch.randn(3, 2, 5, dtype=torch.float64), torch.randn(12, 5, dtype=torch.float64)
        with pytest.raises(RuntimeError, match=message):
            _C.pipelined_forward(RAN, False, x, w_ih, e, w_hh, h0, c0, bs, mask, True, 0)
