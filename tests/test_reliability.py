"""Bad and edge inputs (issue 14): an empty batch, short sequences on the pipelined schedule,
second derivatives on the kernel path, state dicts of another variant, mismatched dtypes,
``weighted_sum`` on degenerate input, and the compiled entry points called with sizes or variant
codes they cannot handle.  Each must behave like ``torch.nn.LSTM`` or fail with a message that
says what to do; none may crash the process or give a silently wrong number."""
import contextlib
import io
import subprocess
import sys

import pytest
import torch

import rnn_ablations as ra
from rnn_ablations import AblatedRNN, VARIANTS, use_backend, use_pipeline, weighted_sum
from rnn_ablations.variants import get_variant

from conftest import REPO

#: the three code paths: the pipelined kernel, the plain kernel, the generic PyTorch path
BACKENDS = ["pipelined", "plain", "generic"] if ra.kernel_available() else ["generic"]
KERNELS = ["pipelined", "plain"]
needs_kernel = pytest.mark.skipif(not ra.kernel_available(), reason="kernel not built")

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: see conftest.one_thread


@contextlib.contextmanager
def path(name):
    backend = "generic" if name == "generic" else "kernel"
    with use_backend(backend), use_pipeline("always" if name == "pipelined" else "never"):
        yield


# --------------------------------------------------------------------------- 1. empty batch
def test_empty_batch_does_not_kill_the_process():
    """The issue's reproduction, in a child process: the pipelined schedule died of SIGFPE
    (exit 136) before, and the plain one (T < 4 under "auto") failed in the backward with the
    kernel's internal "gates must be the forward's (T, B, R*H) activations"."""
    code = ("import torch, rnn_ablations as ra\n"
            "torch.set_num_threads(1)\n"
            "for mode in ('always', 'never', 'auto'):\n"
            "    for T in (20, 2):\n"
            "        with ra.use_pipeline(mode):\n"
            "            m = ra.AblatedRNN('ran', 4, 5)\n"
            "            x = torch.randn(T, 0, 4, requires_grad=True)\n"
            "            out, (h, c) = m(x)\n"
            "            (out.sum() + h.sum()).backward()\n"
            "            assert out.shape == (T, 0, 5) and h.shape == (1, 0, 5), out.shape\n"
            "print('ok')\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", (proc.returncode, proc.stderr)


def _empty_case(variant, layers, bidirectional, batch_first, how, seq_len):
    ours = AblatedRNN(variant, 4, 5, num_layers=layers, bidirectional=bidirectional,
                      batch_first=batch_first)
    ref = torch.nn.LSTM(4, 5, num_layers=layers, bidirectional=bidirectional,
                        batch_first=batch_first)
    shape = (0, seq_len, 4) if batch_first else (seq_len, 0, 4)
    x = torch.randn(*shape, requires_grad=True)
    kwargs, hx = {}, None
    if how == "mask":
        kwargs["mask"] = torch.ones(0, seq_len, dtype=torch.bool)
    elif how == "lengths":
        kwargs["lengths"] = torch.zeros(0, dtype=torch.int64)
    elif how == "hx":
        hx = tuple(torch.randn(layers * (2 if bidirectional else 1), 0, 5, requires_grad=True)
                   for _ in range(2))
    return ours, ref, x, kwargs, hx


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("layers,bidirectional,batch_first,how,seq_len", [
    (1, False, False, "plain", 20), (2, True, True, "mask", 6), (3, True, False, "lengths", 3),
    (2, False, True, "hx", 2), (1, True, False, "hx", 1)])
def test_empty_batch_behaves_like_nn_lstm(backend, variant, layers, bidirectional, batch_first,
                                          how, seq_len):
    ours, ref, x, kwargs, hx = _empty_case(variant, layers, bidirectional, batch_first, how,
                                           seq_len)
    ref_out, (ref_h, ref_c) = ref(x, hx)
    ours.train()  # dropout / recurrent dropout draw masks of B = 0 rows
    ours.recurrent_dropout = 0.3
    with path(backend):
        out, (h, c) = ours(x, hx, **kwargs)
        assert out.shape == ref_out.shape and h.shape == ref_h.shape and c.shape == ref_c.shape
        (out.sum() + h.sum() + c.sum()).backward()
    assert x.grad is not None and x.grad.shape == x.shape
    for name, p in ours.named_parameters():  # nn.LSTM: zero gradients of the parameter's shape
        assert p.grad is not None and p.grad.shape == p.shape and not p.grad.any(), name
    if hx is not None:  # (srnn ignores c_0; lstm_minus_srnn_minus_hidden never reads h_0)
        v = get_variant(variant)
        used = hx[:1] if not v.has_memory else hx if v.reads_hidden else hx[1:]
        for s in used:
            assert s.grad is not None and s.grad.shape == s.shape


@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_batch_unbatched_and_inference(backend):
    m = AblatedRNN("lstm_minus_srnn", 3, 4, num_layers=2, bidirectional=True).eval()
    with path(backend), torch.no_grad():
        out, (h, c) = m(torch.randn(7, 0, 3))
    assert out.shape == (7, 0, 8) and h.shape == c.shape == (4, 0, 4)


@needs_kernel
@pytest.mark.parametrize("seq_len", [1, 2, 3])
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("highway", [False, True])
def test_pipelined_short_sequences_forward_and_backward(seq_len, variant, highway):
    """T < 4 (fewer steps than the pipeline's usual four chunks), padded rows included."""
    m = AblatedRNN(variant, 3, 4, num_layers=2, bidirectional=True, highway=highway)
    x = torch.randn(seq_len, 3, 3, requires_grad=True)
    lengths = torch.tensor([seq_len, max(1, seq_len - 1), 1])
    results = []
    for backend in ("pipelined", "generic"):
        with path(backend):
            out, (h, c) = m(x, lengths=lengths)
            (out.square().sum() + h.sum() + 2 * c.sum()).backward()
        results.append([out.detach(), h.detach(), c.detach(), x.grad.clone()]
                       + [p.grad.clone() for p in m.parameters()])
        x.grad = None
        m.zero_grad()
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


# --------------------------------------------------------------------------- compiled entry points
RAN = get_variant("ran").kernel_spec  # the step kernels' spec of a variant (csrc/kernel_spec.h)


def _plain_args(name, highway, T, B, H, dtype=torch.float64):
    v = get_variant(name)
    R, X = v.num_recurrent(highway), v.num_input_only(highway)
    proj = torch.randn(T, B, (R + X) * H, dtype=dtype)
    w_hh = torch.randn(R * H, H, dtype=dtype)
    h0, c0 = torch.zeros(B, H, dtype=dtype), torch.zeros(B, H, dtype=dtype)
    return proj, w_hh, h0, c0, torch.full((T,), B, dtype=torch.int64)


@needs_kernel
def test_entry_points_refuse_unknown_kernel_specs():
    from rnn_ablations import _C
    e = torch.empty(0, dtype=torch.float64)
    # not a spec at all: small integers (variant codes), a missing tag, unknown bits
    for spec in (-1, 0, 3, 6, 99, RAN & 0xFF, RAN | (1 << 20), RAN | (1 << 6)):
        proj, w_hh, h0, c0, bs = _plain_args("ran", False, 3, 2, 4)
        with pytest.raises(RuntimeError, match=f"unknown kernel spec {spec} .*Variant.kernel_spec"):
            _C.forward(spec, False, proj, w_hh, h0, c0, bs, e, True)
        x, w_ih = torch.randn(3, 2, 5, dtype=torch.float64), torch.randn(12, 5, dtype=torch.float64)
        with pytest.raises(RuntimeError, match=f"unknown kernel spec {spec}"):
            _C.fused_forward(spec, False, x, w_ih, e, w_hh, h0, c0, bs, e, True, 0)
    # LSTM − S-RNN − HIDDEN's spec is a valid one, but its gates read no h_{t-1}: the step entry
    # points send it to the scan
    mh = get_variant("lstm_minus_srnn_minus_hidden")
    assert not mh.has_step_kernel
    proj, w_hh, h0, c0, bs = _plain_args("ran", False, 3, 2, 4)
    with pytest.raises(RuntimeError, match=f"kernel spec {mh.kernel_spec} .*has no step kernel.*scan"):
        _C.forward(mh.kernel_spec, False, proj, w_hh, h0, c0, bs, e, True)
    with pytest.raises(RuntimeError, match=f"kernel spec {mh.kernel_spec} .*has no step kernel"):
        _C.fused_forward(mh.kernel_spec, False, x, w_ih, e, w_hh, h0, c0, bs, e, True, 0)
    # combinations the kernels do not implement are refused with what to do
    srnn, lstm = get_variant("srnn").kernel_spec, get_variant("lstm").kernel_spec
    for spec, message in ((srnn | 0x10, "output rule 'content' needs a cell without memory"),
                          (lstm & ~0x10, "needs a memory cell"),
                          (srnn | 0x4, "no recurrence at all"),
                          (RAN | 0x8, "input-only content with tanh")):
        with pytest.raises(RuntimeError, match=message):
            _C.forward(spec, False, proj, w_hh, h0, c0, bs, e, True)
    # a valid spec whose block layout does not match the tensors (lstm needs 4 blocks, not 2+1)
    with pytest.raises(RuntimeError, match="needs 4 recurrent and 0 input-only blocks"):
        _C.forward(lstm, False, proj, w_hh, h0, c0, bs, e, True)
    out, h_n, c_n, gates, cs, hin = _C.forward(RAN, False, proj.clone(), w_hh, h0, c0, bs, e, True)
    g = torch.ones_like(out)
    for spec in (-1, 5, mh.kernel_spec, lstm):
        with pytest.raises(RuntimeError, match="unknown kernel spec|needs 4 recurrent|no step "
                                               "kernel"):
            _C.backward(spec, False, g, h_n, c_n, gates, cs, hin, out, proj, w_hh, h0, c0, bs, e)


@needs_kernel
def test_entry_points_check_sizes():
    from rnn_ablations import _C
    e = torch.empty(0, dtype=torch.float64)
    proj, w_hh, h0, c0, bs = _plain_args("ran", False, 3, 2, 4)
    # H = 0 was a division by zero (w_hh.size(0) % w_hh.size(1))
    with pytest.raises(RuntimeError, match="H > 0"):
        _C.forward(RAN, False, torch.randn(3, 2, 0, dtype=torch.float64),
                   torch.empty(0, 0, dtype=torch.float64), h0[:, :0], c0[:, :0], bs, e, True)
    x = torch.randn(3, 2, 5, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="H > 0"):
        _C.fused_forward(RAN, False, x, torch.empty(0, 5, dtype=torch.float64), e,
                         torch.empty(0, 0, dtype=torch.float64), h0[:, :0], c0[:, :0], bs, e,
                         True, 0)
    out, h_n, c_n, gates, cs, hin = _C.forward(RAN, False, proj.clone(), w_hh, h0, c0, bs, e, True)
    g = torch.ones_like(out)
    bad = {"grad_out": (torch.ones(3, 1, 4, dtype=torch.float64), "grad_out must have shape"),
           "grad_hn": (torch.ones(1, 4, dtype=torch.float64), "grad_hn must have shape"),
           "cs": (cs[:2], "cs must be contiguous with shape"),
           "gates": (gates[:, :1], "gates must be the forward's")}
    for name, (value, message) in bad.items():
        args = dict(grad_out=g, grad_hn=h_n, grad_cn=c_n, gates=gates, cs=cs)
        args[name] = value
        with pytest.raises(RuntimeError, match=message):
            _C.backward(RAN, False, args["grad_out"], args["grad_hn"], h_n, args["gates"],
                        args["cs"], hin, out, proj, w_hh, h0, c0, bs, e)
    with pytest.raises(RuntimeError, match="batch_sizes"):
        _C.backward(RAN, False, g, h_n, c_n, gates, cs, hin, out, proj, w_hh, h0, c0,
                    torch.tensor([2, 3, 1]), e)
    p2, w2, _, _, _ = _plain_args("ran", True, 3, 2, 4)
    o2, hn2, cn2, g2, cs2, hin2 = _C.forward(RAN, True, p2.clone(), w2, h0, c0, bs, e, True)
    with pytest.raises(RuntimeError, match="hin \\(highway inputs\\)"):  # highway without hin
        _C.backward(RAN, True, torch.ones_like(o2), hn2, cn2, g2, cs2, e, o2, p2, w2, h0, c0,
                    bs, e)
    # an inference forward (keep_hin=False) keeps no memories and no hin: the backward says so
    o3, hn3, cn3, g3, cs3, hin3 = _C.forward(RAN, True, p2.clone(), w2, h0, c0, bs, e, False)
    assert cs3.numel() == 0 and hin3.numel() == 0
    with pytest.raises(RuntimeError, match="inference \\(keep_hin=False\\) and kept nothing"):
        _C.backward(RAN, True, torch.ones_like(o3), hn3, cn3, g3, cs3, hin3, o3, p2, w2, h0, c0,
                    bs, e)


@needs_kernel
@pytest.mark.parametrize("T,B", [(0, 3), (4, 0), (0, 0), (2, 0)])
def test_entry_points_on_empty_sizes(T, B):
    """Called directly with T = 0 or B = 0 (the Python layer never does), every entry point
    returns empty results and zero weight gradients instead of dividing by B or indexing."""
    from rnn_ablations import _C
    e = torch.empty(0, dtype=torch.float64)
    H, D = 3, 5
    proj, w_hh, h0, c0, bs = _plain_args("ran", False, T, B, H)
    out, h_n, c_n, gates, cs, hin = _C.forward(RAN, False, proj.clone(), w_hh, h0, c0, bs, e, True)
    assert out.shape == (T, B, H) and h_n.shape == (B, H)
    dproj, dw, dh0, dc0 = _C.backward(RAN, False, torch.ones_like(out), h_n, c_n, gates, cs, hin,
                                      out, proj, w_hh, h0, c0, bs, e)
    assert dproj.shape == proj.shape and dw.shape == w_hh.shape and not dw.any()
    x, w_ih = torch.randn(T, B, D, dtype=torch.float64), torch.randn(3 * H, D, dtype=torch.float64)
    b = torch.randn(2 * H, dtype=torch.float64)
    for chunk in (0, 1):
        out, h_n, c_n, gates, cs, hin, xo = _C.fused_forward(RAN, False, x, w_ih, b, w_hh, h0, c0,
                                                             bs, e, True, chunk)
        assert out.shape == (T, B, H)
        for need_dx in (True, False):
            dx, dw_ih, db, dw_hh, dh0, dc0 = _C.fused_backward(
                RAN, False, torch.ones_like(out), h_n, c_n, gates, cs, hin, xo, out, x, w_ih, w_hh,
                h0, c0, bs, e, need_dx, True, True, chunk)
            assert dw_ih.shape == w_ih.shape and dw_hh.shape == w_hh.shape and db.shape == b.shape
            assert not dw_ih.any() and not dw_hh.any() and not db.any()
            if need_dx:
                assert dx.shape == x.shape


# --------------------------------------------------------------------------- 2. second derivatives
def _graded_module(variant, highway):
    return AblatedRNN(variant, 2, 2, num_layers=1, bidirectional=True, highway=highway).double()


@needs_kernel
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


@needs_kernel
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("variant", ["lstm", "ran", "srnn"])
def test_gradient_penalty_equals_generic_float32(kernel, variant):
    """A gradient penalty (double backward) in float32, recurrent dropout on: the kernel path
    gives the generic path's numbers (the plain schedule's were wrong before)."""
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


@needs_kernel
def test_onednn_linear_double_backward():
    """The oneDNN input projection (large float32 weights) under create_graph=True."""
    from rnn_ablations.dispatch import _OneDnnLinear, _onednn_usable
    if not _onednn_usable():
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


# --------------------------------------------------------------------------- 5. state dicts
def test_state_dict_of_another_variant_is_refused():
    ran = AblatedRNN("ran", 3, 4)
    ident = AblatedRNN("identity_ran", 3, 4)  # same shapes
    with pytest.raises(ValueError, match="variant 'ran' into one of variant 'identity_ran'"):
        ident.load_state_dict(ran.state_dict())
    with pytest.raises(ValueError, match="variant 'ran' into one of variant 'identity_ran'"):
        ident.load_state_dict(ran.state_dict(), strict=False)
    before = [p.clone() for p in ident.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(before, ident.parameters()))  # nothing loaded
    hw = AblatedRNN("ran", 3, 4, highway=True)
    with pytest.raises(ValueError, match="'ran' with highway into one of variant 'ran'"):
        AblatedRNN("ran", 3, 4).load_state_dict(hw.state_dict(), strict=False)
    # the same variant round-trips, through torch.save / torch.load(weights_only=True) too
    buf = io.BytesIO()
    torch.save(ran.state_dict(), buf)
    buf.seek(0)
    again = AblatedRNN("tanh_ran", 3, 4)
    again.load_state_dict(torch.load(buf, weights_only=True))
    for a, b in zip(ran.parameters(), again.parameters()):
        assert torch.equal(a, b)


def test_state_dict_without_variant_still_loads():
    """nn.LSTM / nn.RNN state dicts, and AblatedRNN ones saved before the variant was recorded."""
    ours = AblatedRNN("lstm", 3, 4, num_layers=2)
    ours.load_state_dict(torch.nn.LSTM(3, 4, num_layers=2).state_dict())  # strict
    srnn = AblatedRNN("srnn", 3, 4)
    srnn.load_state_dict(torch.nn.RNN(3, 4).state_dict())
    old = {k: v for k, v in AblatedRNN("ran", 3, 4).state_dict().items() if k != "variant_state"}
    AblatedRNN("ran", 3, 4).load_state_dict(old)
    assert AblatedRNN("ran", 3, 4).variant_state.tolist() == [get_variant("ran").code, 0]
    # integer buffer: dtype conversions leave it alone
    assert AblatedRNN("ran", 3, 4).double().half().variant_state.dtype == torch.int64


@pytest.mark.parametrize("highway", [False, True])
def test_every_variant_records_its_own_code(highway):
    """variant_state holds Variant.code (not the kernels' spec, which may change with the
    kernels); no two variants share one."""
    codes = {}
    for name in VARIANTS:
        v = get_variant(name)
        m = AblatedRNN(name, 3, 4, highway=highway)
        assert m.variant_state.tolist() == [v.code, int(highway)]
        codes[v.code] = name
        again = AblatedRNN(name, 3, 4, highway=highway)
        again.load_state_dict(m.state_dict())  # round trip
    assert len(codes) == len(VARIANTS)
    mh = AblatedRNN("lstm_minus_srnn_minus_hidden", 3, 4, highway=highway)
    sd = mh.state_dict()
    sd["variant_state"] = torch.tensor([get_variant("lstm_minus_srnn").code, int(highway)])
    with pytest.raises(ValueError, match="variant 'lstm_minus_srnn'.* into one of variant "
                                         "'lstm_minus_srnn_minus_hidden'"):
        mh.load_state_dict(sd)


def test_corrupt_variant_state_is_refused():
    sd = AblatedRNN("ran", 3, 4).state_dict()
    sd["variant_state"] = torch.tensor([42, 0])
    with pytest.raises(ValueError, match="unknown variant code 42"):
        AblatedRNN("ran", 3, 4).load_state_dict(sd)
    sd["variant_state"] = torch.tensor([0.5, 1.0])
    with pytest.raises(ValueError, match="integer tensor"):
        AblatedRNN("ran", 3, 4).load_state_dict(sd)


# --------------------------------------------------------------------------- 6. dtypes, weighted_sum
@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16])
def test_input_dtype_mismatch_says_what_to_do(dtype):
    m = AblatedRNN("ran", 4, 5)
    with pytest.raises(ValueError, match=f"input dtype \\({dtype}\\) does not match the module's "
                                         f"parameter dtype \\(torch.float32\\).*model.to\\({dtype}\\)"):
        m(torch.randn(3, 2, 4).to(dtype))
    out, _ = m.to(dtype)(torch.randn(3, 2, 4).to(dtype)) if dtype != torch.float16 else (None, None)
    assert out is None or out.dtype == dtype


def test_weighted_sum_refuses_degenerate_input():
    m = AblatedRNN("ran", 3, 4)
    with pytest.raises(ValueError, match="seq_len 0"):
        weighted_sum(m, torch.randn(0, 2, 3))
    with pytest.raises(ValueError, match="floating-point"):
        weighted_sum(m, torch.ones(5, 2, 3, dtype=torch.int64))
    with pytest.raises(ValueError, match="input dtype \\(torch.float64\\)"):
        weighted_sum(m, torch.randn(5, 2, 3, dtype=torch.float64))
    ws = weighted_sum(m, torch.randn(5, 0, 3))  # an empty batch: empty results, as the RNN
    assert ws.weights.shape == (0, 5, 5, 4) and ws.memory.shape == (0, 5, 4)


@needs_kernel
def test_entry_points_check_the_recurrent_dropout_mask():
    from rnn_ablations import _C
    e = torch.empty(0, dtype=torch.float64)
    proj, w_hh, h0, c0, bs = _plain_args("ran", False, 3, 2, 4)
    for mask, message in ((torch.ones(2, 4), "rec_mask must have dtype"),
                          (torch.ones(2, 3, dtype=torch.float64), "rec_mask must be contiguous")):
        with pytest.raises(RuntimeError, match=message):
            _C.forward(RAN, False, proj.clone(), w_hh, h0, c0, bs, mask, True)
        x, w_ih = torch.randn(3, 2, 5, dtype=torch.float64), torch.randn(12, 5, dtype=torch.float64)
        with pytest.raises(RuntimeError, match=message):
            _C.fused_forward(RAN, False, x, w_ih, e, w_hh, h0, c0, bs, mask, True, 0)
