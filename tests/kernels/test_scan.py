"""LSTM − S-RNN − HIDDEN (``lstm_minus_srnn_minus_hidden``): the table's facts, the equations
written out by hand (float64, outputs and gradients, multi-layer, bidirectional, padded, highway),
gradcheck through the element-wise scan kernel, and the kernel against the generic path."""
import math

import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from rnn_ablations import (AblatedRNN, VARIANTS, get_variant, recurrent_param_count, use_backend,
                           weighted_sum)
from rnn_ablations.dispatch import run_scan_layer
from rnn_ablations.kernels.scan import scan_applies, scan_kernel_available

NAME = "lstm_minus_srnn_minus_hidden"
HAS_KERNEL = scan_kernel_available("cpu")
BACKENDS = ["kernel", "generic"] if HAS_KERNEL else ["generic"]


def test_scan_kernel_is_built():
    import rnn_ablations
    if not rnn_ablations.kernel_available():
        pytest.skip("no compiled CPU kernel in this install (e.g. the GPU machine's Python, "
                    "RNN_ABLATIONS_NO_KERNEL=1): the generic path runs")
    assert HAS_KERNEL, "the CPU scan kernel was not built: rebuild the extension (scripts/setup.sh)"


# --------------------------------------------------------------------------- the table
def test_table_row_and_alias():
    v = get_variant("minus_hidden")
    assert v.name == NAME and NAME in VARIANTS and get_variant("LSTM-minus-SRNN-minus-HIDDEN") is v
    assert v.paper_name == "LSTM − S-RNN − HIDDEN"
    assert not v.reads_hidden and not v.has_step_kernel and v.has_memory
    assert v.blocks() == ((), ("i", "f", "o", "c")) and v.biased_blocks() == ("i", "f", "o")
    assert v.blocks(True) == ((), ("i", "f", "o", "r", "c", "hw"))
    assert v.biased_blocks(True) == ("i", "f", "o", "r")
    # the scan runs it; the kernels' view (block offsets from the spec) is derived from the table
    assert scan_applies(v)
    if HAS_KERNEL:
        from rnn_ablations import _C
        assert _C.describe_scan_spec(v.kernel_spec, False)["input_only"] == [
            "i", "f", "o", "content"]
        assert _C.describe_scan_spec(v.kernel_spec, True)["input_only"] == [
            "i", "f", "o", "r", "content", "hw"]
    # every other variant reads h_{t-1} and keeps its step kernel
    for other in VARIANTS:
        if other != NAME:
            assert get_variant(other).reads_hidden and not scan_applies(get_variant(other))


def test_variant_is_built_with_keywords():
    from rnn_ablations.variants import Variant
    with pytest.raises(TypeError):
        Variant("x", "X", None, (), ("c",), True, "identity", True, "")  # noqa


@pytest.mark.parametrize("bidirectional,highway", [(False, False), (True, False), (True, True)])
def test_parameters_and_count(bidirectional, highway):
    d_in, H, layers = 7, 5, 2
    m = AblatedRNN(NAME, d_in, H, num_layers=layers, bidirectional=bidirectional, highway=highway)
    dirs = 2 if bidirectional else 1
    G, nb = (6, 4) if highway else (4, 3)
    expected = {}
    for k in range(layers):
        for sfx in [""] + (["_reverse"] if bidirectional else []):
            expected[f"weight_ih_l{k}{sfx}"] = (G * H, d_in if k == 0 else H * dirs)
            expected[f"bias_l{k}{sfx}"] = (nb * H,)
    assert {n: tuple(p.shape) for n, p in m.named_parameters()} == expected
    n_params = sum(p.numel() for p in m.parameters())
    assert recurrent_param_count(NAME, d_in, H, layers, bidirectional=bidirectional,
                                 highway=highway) == n_params
    if not highway:
        assert n_params == dirs * (4 * H * d_in + 3 * H) + dirs * (4 * H * H * dirs + 3 * H)


def test_default_init_is_torch_lstm_rule():
    H = 64
    m = AblatedRNN(NAME, 32, H)
    bound = 1 / math.sqrt(H)
    for name, p in m.named_parameters():
        assert p.abs().max() <= bound, name
        assert p.abs().max() > 0.9 * bound and p.std() > 0.5 * bound / math.sqrt(3), name


def test_recurrent_dropout_has_no_effect_and_warns():
    with pytest.warns(UserWarning, match="no h_{t-1} to drop"):
        m = AblatedRNN(NAME, 4, 3, recurrent_dropout=0.3).double()
    x = torch.randn(6, 2, 4, dtype=torch.float64)
    m.train()
    out_train = m(x)[0]
    m.eval()
    assert torch.equal(out_train, m(x)[0])


# --------------------------------------------------------------------------- by hand
def _cell_by_hand(x_seq, w, b, c, highway):
    """The issue's equations, one row, one direction: x_seq (L, d) -> (outputs (L, H), h, c)."""
    H = c.shape[0]
    outs = []
    h = None
    for x_t in x_seq:
        z = w @ x_t
        i = torch.sigmoid(z[0:H] + b[0:H])
        f = torch.sigmoid(z[H:2 * H] + b[H:2 * H])
        o = torch.sigmoid(z[2 * H:3 * H] + b[2 * H:3 * H])
        if highway:
            r = torch.sigmoid(z[3 * H:4 * H] + b[3 * H:4 * H])
            content, hw = z[4 * H:5 * H], z[5 * H:6 * H]
        else:
            content = z[3 * H:4 * H]
        c = i * content + f * c
        h = o * torch.tanh(c)
        if highway:
            h = r * h + (1 - r) * hw
        outs.append(h)
    return torch.stack(outs), h, c


def _model_by_hand(m, x, lengths, c0):
    """(T, B, d) time-major input -> output, h_n, c_n, computed row by row from the parameters."""
    T, B = x.shape[0], x.shape[1]
    dirs = m.num_directions
    layer_in = x
    h_n, c_n = [], []
    for k in range(m.num_layers):
        outs = []
        for d in range(dirs):
            sfx = f"_l{k}" + ("_reverse" if d else "")
            w, b = getattr(m, "weight_ih" + sfx), getattr(m, "bias" + sfx)
            out = x.new_zeros(T, B, m.hidden_size)
            hs, cs = [], []
            for row in range(B):
                L = int(lengths[row])
                seq = layer_in[:L, row]
                if d:
                    seq = seq.flip(0)
                o, h, c = _cell_by_hand(seq, w, b, c0[k * dirs + d, row], m.highway)
                out[:L, row] = o.flip(0) if d else o
                hs.append(h)
                cs.append(c)
            outs.append(out)
            h_n.append(torch.stack(hs))
            c_n.append(torch.stack(cs))
        layer_in = torch.cat(outs, -1)
    return layer_in, torch.stack(h_n), torch.stack(c_n)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("layers,bidirectional,highway,padded", [
    (1, False, False, False), (2, True, False, True), (3, True, True, True), (2, False, True, True)])
def test_matches_equations_by_hand(backend, layers, bidirectional, highway, padded, one_thread):
    d_in, H, T, B = 5, 4, 6, 3
    m = AblatedRNN(NAME, d_in, H, num_layers=layers, bidirectional=bidirectional,
                   highway=highway).double()
    x = torch.randn(T, B, d_in, dtype=torch.float64, requires_grad=True)
    lengths = torch.tensor([6, 2, 4]) if padded else torch.full((B,), T)
    shape = (layers * m.num_directions, B, H)
    h0 = torch.randn(shape, dtype=torch.float64)
    c0 = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    with use_backend(backend):
        out, (h_n, c_n) = m(x, (h0, c0), lengths=lengths if padded else None)
    ref_out, ref_h, ref_c = _model_by_hand(m, x, lengths, c0)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(h_n, ref_h)
    torch.testing.assert_close(c_n, ref_c)
    # gradients of a loss that reads every output
    g_out, g_h, g_c = (torch.randn_like(t) for t in (out, h_n, c_n))
    inputs = [x, c0] + list(m.parameters())
    got = torch.autograd.grad((out * g_out).sum() + (h_n * g_h).sum() + (c_n * g_c).sum(), inputs)
    want = torch.autograd.grad((ref_out * g_out).sum() + (ref_h * g_h).sum()
                               + (ref_c * g_c).sum(), inputs)
    for name, a, b in zip(["x", "c0"] + [n for n, _ in m.named_parameters()], got, want):
        torch.testing.assert_close(a, b, msg=lambda s, n=name: f"gradient of {n}: {s}")


@pytest.mark.skipif(not HAS_KERNEL, reason="scan kernel not built")
@pytest.mark.parametrize("highway,dirs", [(False, 1), (True, 1), (False, 2), (True, 2)])
def test_gradcheck_through_the_scan_kernel(highway, dirs, one_thread):
    v = get_variant(NAME)
    T, B, d_in, H = 5, 3, 3, 2
    G = v.num_input_only(highway)
    nb = v.num_biased(highway)
    x = torch.randn(T, B, d_in, dtype=torch.float64, requires_grad=True)
    ws = [(0.5 * torch.randn(G * H, d_in, dtype=torch.float64)).requires_grad_() for _ in range(dirs)]
    bs = [torch.randn(nb * H, dtype=torch.float64, requires_grad=True) for _ in range(dirs)]
    h0 = torch.randn(dirs, B, H, dtype=torch.float64)
    c0 = torch.randn(dirs, B, H, dtype=torch.float64, requires_grad=True)
    batch_sizes = torch.tensor([3, 3, 2, 2, 1])  # padded rows of lengths 5, 4, 2

    def f(x, c0, *params):
        return run_scan_layer(v, highway, x, params[:dirs], params[dirs:], h0, c0, batch_sizes)

    with use_backend("kernel"):
        assert torch.autograd.gradcheck(f, (x, c0, *ws, *bs))


@pytest.mark.skipif(not HAS_KERNEL, reason="scan kernel not built")
@pytest.mark.parametrize("highway,bidirectional", [(False, True), (True, True), (False, False)])
def test_kernel_matches_generic_float32(highway, bidirectional):
    m = AblatedRNN(NAME, 24, 33, num_layers=2, bidirectional=bidirectional, highway=highway,
                   dropout=0.0)
    x = torch.randn(9, 5, 24)
    lengths = torch.tensor([9, 3, 7, 9, 1])
    results = {}
    for backend in ("kernel", "generic"):
        with use_backend(backend):
            xb = x.clone().requires_grad_()
            out, (h, c) = m(xb, lengths=lengths)
            (out.sin().sum() + h.sum() + c.cos().sum()).backward()
            grads = [xb.grad] + [p.grad.clone() for p in m.parameters()]
            m.zero_grad()
            with torch.no_grad():
                infer = m(x, lengths=lengths)[0]
        results[backend] = (out.detach(), h.detach(), c.detach(), infer, *grads)
    for a, b in zip(results["kernel"], results["generic"]):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-4)


def _thread_cpu_seconds():
    """CPU time (user + system) of each thread of this process, from /proc."""
    import os
    tick = os.sysconf("SC_CLK_TCK")
    times = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended
            continue
        times[int(tid)] = (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return times


@pytest.mark.skipif(not HAS_KERNEL, reason="scan kernel not built")
@pytest.mark.skipif(not __import__("os").path.isdir("/proc/self/task")
                    or "OpenMP" not in torch.__config__.parallel_info(),
                    reason="needs Linux's per-thread CPU times and torch's OpenMP backend")
def test_kernel_runs_rows_in_parallel(one_thread):
    """With two threads the scan splits its rows over both: the threads other than the caller
    do a share of the work (their CPU time, which machine load does not change, measured per
    thread around the kernel calls), while with one thread they do none; and the split gives
    the same numbers, forward and backward, as one thread."""
    import threading
    from rnn_ablations import _C
    v = get_variant(NAME)
    spec = v.kernel_spec
    T, B, D, H = 200, 32, 2, 256  # D * B rows; large enough to be split (see scan.cpp)
    proj = torch.randn(T, B, D * v.num_input_only(False) * H)
    bias = torch.randn(proj.size(2))
    h0 = torch.zeros(D, B, H)
    c0 = torch.randn(D, B, H)
    bs = torch.tensor(sorted(torch.randint(1, B + 1, (T,)).tolist(), reverse=True))
    bs[0] = B
    g_out, g_hn, g_cn = torch.randn(T, B, D * H), torch.randn(D, B, H), torch.randn(D, B, H)

    def both():
        out, h_n, c_n, cs = _C.scan_forward(spec, False, proj, h0, c0, bs, True, bias)
        return (out, h_n, c_n) + tuple(_C.scan_backward(spec, False, g_out, g_hn, g_cn, proj, c0,
                                                        cs, bs, bias, True))

    def others_share(n_threads):
        torch.set_num_threads(n_threads)
        both()  # warm up (the thread pool starts)
        me = threading.get_native_id()
        before = _thread_cpu_seconds()
        mine = 0.0
        while mine < 0.5:  # enough CPU time for the clock's ticks
            results = both()
            now = _thread_cpu_seconds()
            mine = now[me] - before.get(me, 0.0)
        others = sum(t - before.get(tid, 0.0) for tid, t in now.items() if tid != me)
        return others / (mine + others), results

    one_share, one = others_share(1)
    two_share, two = others_share(2)
    assert one_share < 0.1, f"with one thread other threads did {one_share:.0%} of the work"
    assert two_share > 0.25, (f"with two threads the other thread did {two_share:.0%} of the "
                              "work: the scan did not split its rows")
    for a, b in zip(one, two):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


@pytest.mark.skipif(not HAS_KERNEL, reason="scan kernel not built")
def test_kernel_rejects_a_bad_spec_or_shape():
    """The scan decodes the variant from its kernel spec (csrc/common/kernel_spec.h) and refuses
    what it does not run, saying what does; then the tensors' shapes."""
    from rnn_ablations import _C
    from rnn_ablations.variants import Variant
    spec = get_variant(NAME).kernel_spec
    proj = torch.randn(3, 2, 8)  # G = 4 blocks of H = 2
    z = torch.zeros(1, 2, 2)  # (D, B, H)
    bs = torch.tensor([2, 2, 1])
    for other in VARIANTS:  # the cells that read h_{t-1}: the step kernels run them
        if get_variant(other).reads_hidden:
            with pytest.raises(RuntimeError, match=r"read h_\{t-1\}; it runs on the step kernels"):
                _C.scan_forward(get_variant(other).kernel_spec, False, proj, z, z, bs, False)
    with pytest.raises(RuntimeError, match="unknown kernel spec 5 .*Variant.kernel_spec"):
        _C.scan_forward(get_variant(NAME).code, False, proj, z, z, bs, False)
    with pytest.raises(RuntimeError, match="reads 6 blocks of H = 2 columns"):
        _C.scan_forward(spec, True, proj, z, z, bs, False)  # highway: 6 blocks, proj has 4
    fields = dict(paper_name="toy", recurrent=(), context_independent_content=True,
                  equations="toy")
    tanh_content = Variant(name="toy_tanh_content", code=110, input_only_biased=("i", "f"),
                           input_only=("c",), content_block="c", content_activation="tanh",
                           has_memory=True, output="tanh", **fields)
    no_memory = Variant(name="toy_no_memory", code=111, input_only=("c",), content_block="c",
                        has_memory=False, output="content", **fields)
    assert not scan_applies(tanh_content) and not scan_applies(no_memory)
    with pytest.raises(RuntimeError, match="tanh of the content is not implemented.*CONTRIBUTING"):
        _C.scan_forward(tanh_content.kernel_spec, False, torch.randn(3, 2, 6), z, z, bs, False)
    with pytest.raises(RuntimeError, match="without memory .* no recurrence"):
        _C.scan_forward(no_memory.kernel_spec, False, torch.randn(3, 2, 2), z, z, bs, False)
    with pytest.raises(RuntimeError, match=r"\(D, B, H\) with D = 1 or 2"):
        _C.scan_forward(spec, False, proj, z[0], z[0], bs, False)
    with pytest.raises(RuntimeError, match="multiple of D\\*H"):
        _C.scan_forward(spec, False, torch.randn(3, 2, 6), z.expand(2, 2, 2).contiguous(),
                        z.expand(2, 2, 2).contiguous(), bs, False)
    with pytest.raises(RuntimeError, match="non-increasing"):
        _C.scan_forward(spec, False, proj, z, z, torch.tensor([1, 2, 2]), False)
    with pytest.raises(TypeError, match="takes a Variant"):
        scan_applies(NAME)


# --------------------------------------------------------------------------- the vector paths
ISAS = __import__("rnn_ablations").supported_kernel_isas() if HAS_KERNEL else []


def _scan_call(key, proj, bias, h0, c0, bs, g_out, g_hn, g_cn):
    from rnn_ablations import _C
    spec, highway = key
    out, h_n, c_n, cs = _C.scan_forward(spec, highway, proj, h0, c0, bs, True, bias)
    dproj, dc0, db = _C.scan_backward(spec, highway, g_out, g_hn, g_cn, proj, c0, cs, bs, bias,
                                      True)
    return out, h_n, c_n, cs, dproj, dc0, db


@pytest.mark.skipif(not HAS_KERNEL, reason="scan kernel not built")
@pytest.mark.parametrize("highway,dirs,H", [(False, 1, 13), (True, 2, 13), (False, 2, 16),
                                            (True, 1, 3)])
def test_scan_vector_paths_agree(highway, dirs, H, one_thread):
    """Every vector path this CPU runs (avx2: 8 units per instruction, a masked tail when H is
    not a multiple of 8; portable) gives the float64 kernel's numbers in float32, forward and
    backward, with the bias added inside the scan and its gradient summed there."""
    import rnn_ablations as ra
    v = get_variant(NAME)
    key = (v.kernel_spec, highway)
    G = v.num_input_only(highway)
    T, B = 7, 5
    bs = torch.tensor([5, 5, 4, 3, 3, 2, 1])
    proj = torch.randn(T, B, dirs * G * H, dtype=torch.float64) * 2
    bias = torch.randn(dirs * G * H, dtype=torch.float64)
    h0, c0 = torch.randn(2, dirs, B, H, dtype=torch.float64)
    g_out = torch.randn(T, B, dirs * H, dtype=torch.float64)
    g_hn, g_cn = torch.randn(2, dirs, B, H, dtype=torch.float64)
    ref = _scan_call(key, proj, bias, h0, c0, bs, g_out, g_hn, g_cn)
    # the fused bias is the bias added to proj; its gradient the sum of d_proj
    plain = _scan_call(key, proj + bias, None, h0, c0, bs, g_out, g_hn, g_cn)
    for k in (0, 1, 2, 4, 5, 6):  # cs holds nothing at padded steps
        torch.testing.assert_close(ref[k], plain[k])
    torch.testing.assert_close(ref[6], ref[4].sum((0, 1)))
    assert ISAS[-1] == "portable"
    for isa in ISAS:
        with ra.use_kernel_isa(isa):
            got = _scan_call(key, *(t.float() for t in (proj, bias, h0, c0)), bs,
                             *(t.float() for t in (g_out, g_hn, g_cn)))
        for name, a, b in zip(["out", "h_n", "c_n", "cs", "d_proj", "d_c0", "d_bias"], got, ref):
            if name == "cs":  # nothing at padded steps
                valid = torch.arange(T).unsqueeze(1) < (bs.unsqueeze(0) > torch.arange(B).unsqueeze(1)).sum(1)
                a, b = a[valid], b[valid]
            torch.testing.assert_close(a.double(), b, atol=2e-5, rtol=2e-5,
                                       msg=lambda s, n=name, i=isa: f"{i} {n}: {s}")
        assert got[0][bs.numel() - 1, 1:].abs().sum() == 0  # padding outputs zero
        assert got[4][-1, 1:].abs().sum() == 0              # and gets no gradient


@pytest.mark.skipif(not HAS_KERNEL, reason="scan kernel not built")
@pytest.mark.parametrize("isa", ISAS)
def test_scan_batch_major_layout(isa, one_thread):
    """A batch-major proj (the time-major view of a contiguous (B, T, W) tensor, as from a
    batch_first input) gives the same numbers, and batch-major outputs and gradients."""
    import rnn_ablations as ra
    key = (get_variant(NAME).kernel_spec, False)
    T, B, H = 6, 4, 9
    bs = torch.tensor([4, 4, 3, 3, 1, 1])
    proj_bm = torch.randn(B, T, 2 * 4 * H)
    bias = torch.randn(2 * 4 * H)
    h0, c0 = torch.randn(2, 2, B, H)
    g_out_bm = torch.randn(B, T, 2 * H)
    g_hn, g_cn = torch.randn(2, 2, B, H)
    with ra.use_kernel_isa(isa):
        tm = _scan_call(key, proj_bm.transpose(0, 1).contiguous(), bias, h0, c0, bs,
                        g_out_bm.transpose(0, 1).contiguous(), g_hn, g_cn)
        bm = _scan_call(key, proj_bm.transpose(0, 1), bias, h0, c0, bs,
                        g_out_bm.transpose(0, 1), g_hn, g_cn)
    for k in (0, 1, 2, 4, 5, 6):  # cs holds nothing at padded steps
        torch.testing.assert_close(bm[k], tm[k], atol=0, rtol=0)
    for t in (bm[0], bm[3], bm[4]):
        assert t.transpose(0, 1).is_contiguous()


@pytest.mark.skipif(not HAS_KERNEL, reason="scan kernel not built")
def test_isa_environment_forces_the_portable_scan(tmp_path):
    """RNN_ABLATIONS_ISA=portable runs the portable rows: the same numbers as set_kernel_isa
    ("portable") in this process, and (where the CPU has AVX2) close to the avx2 rows."""
    import os
    import subprocess
    import sys
    import rnn_ablations as ra
    torch.manual_seed(3)
    m = AblatedRNN(NAME, 6, 11, num_layers=2, bidirectional=True)
    x = torch.randn(5, 3, 6)
    torch.save({"state": m.state_dict(), "x": x}, tmp_path / "case.pt")
    script = (
        "import sys, torch, rnn_ablations as ra\n"
        "from rnn_ablations import AblatedRNN\n"
        "torch.set_num_threads(1)\n"
        f"d = torch.load({str(tmp_path / 'case.pt')!r})\n"
        f"m = AblatedRNN({NAME!r}, 6, 11, num_layers=2, bidirectional=True)\n"
        "m.load_state_dict(d['state'])\n"
        "x = d['x'].clone().requires_grad_()\n"
        "out = m(x)[0]\n"
        "out.sin().sum().backward()\n"
        f"torch.save({{'isa': ra.kernel_isa(), 'out': out.detach(), 'dx': x.grad}}, "
        f"{str(tmp_path / 'got.pt')!r})\n")
    env = dict(os.environ, RNN_ABLATIONS_ISA="portable")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=300)
    got = torch.load(tmp_path / "got.pt")
    assert got["isa"] == "portable"
    for isa in ISAS:
        with ra.use_kernel_isa(isa):
            xr = x.clone().requires_grad_()
            out = m(xr)[0]
            out.sin().sum().backward()
        tol = 0 if isa == "portable" else 1e-5
        torch.testing.assert_close(got["out"], out.detach(), atol=tol, rtol=tol)
        torch.testing.assert_close(got["dx"], xr.grad, atol=tol, rtol=tol)


@pytest.mark.skipif(not HAS_KERNEL, reason="scan kernel not built")
def test_fused_layer_inference_and_double_backward(one_thread):
    """The CPU layer node: inference (no_grad, nothing saved) gives the training forward's
    numbers; batch_first and time-major inputs agree; second derivatives through the node
    (create_graph) are exact (gradgradcheck, float64)."""
    m = AblatedRNN(NAME, 5, 6, num_layers=2, bidirectional=True, batch_first=True)
    x = torch.randn(3, 7, 5, requires_grad=True)
    lengths = torch.tensor([7, 4, 6])
    with use_backend("kernel"):
        out, (h, c) = m(x, lengths=lengths)
        with torch.no_grad():
            i_out, (i_h, i_c) = m(x, lengths=lengths)
        m.batch_first = False
        t_out = m(x.detach().transpose(0, 1).contiguous(), lengths=lengths)[0].transpose(0, 1)
        m.batch_first = True
    for a, b in ((out, i_out), (h, i_h), (c, i_c), (out, t_out)):
        torch.testing.assert_close(a.detach(), b, atol=1e-6, rtol=1e-6)
    v = get_variant(NAME)
    xd = torch.randn(4, 2, 3, dtype=torch.float64, requires_grad=True)
    w = (0.5 * torch.randn(4 * 2, 3, dtype=torch.float64)).requires_grad_()
    b = torch.randn(3 * 2, dtype=torch.float64, requires_grad=True)
    h0 = torch.zeros(1, 2, 2, dtype=torch.float64)
    c0 = torch.randn(1, 2, 2, dtype=torch.float64, requires_grad=True)
    bs = torch.tensor([2, 2, 1, 1])

    def f(xd, c0, w, b):
        return run_scan_layer(v, False, xd, [w], [b], h0, c0, bs)

    with use_backend("kernel"):
        assert torch.autograd.gradgradcheck(f, (xd, c0, w, b))


# --------------------------------------------------------------------------- the nn.LSTM API
def test_packed_sequence_and_batch_first(one_thread):
    m = AblatedRNN(NAME, 4, 3, num_layers=2, bidirectional=True, batch_first=True)
    x = torch.randn(3, 5, 4)
    lengths = torch.tensor([2, 5, 3])
    out, (h, c) = m(x, lengths=lengths)
    packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
    p_out, (p_h, p_c) = m(packed)
    p_out, _ = pad_packed_sequence(p_out, batch_first=True)
    torch.testing.assert_close(p_out, out)
    torch.testing.assert_close(p_h, h)
    torch.testing.assert_close(p_c, c)
    assert out[0, 2:].abs().sum() == 0  # padded positions are zero
    # a row's result does not depend on the padding after it
    alone = m(x[:1, :2])[0]
    torch.testing.assert_close(alone[0], out[0, :2])


def test_single_h0_is_refused():
    m = AblatedRNN(NAME, 4, 3)
    with pytest.raises(ValueError, match="tuple"):
        m(torch.randn(2, 1, 4), torch.zeros(1, 1, 3))


# --------------------------------------------------------------------------- weighted sum
def test_weighted_sum_weights_depend_on_inputs_only():
    m = AblatedRNN(NAME, 4, 3, bidirectional=True).double()
    x = torch.randn(2, 6, 4, dtype=torch.float64)
    lengths = torch.tensor([6, 4])
    for direction in (0, 1):
        ws = weighted_sum(m, x.transpose(0, 1), direction=direction, lengths=lengths)
        # memory = Σ_j w_j^t ∘ c̃_j
        torch.testing.assert_close(torch.einsum("btjh,bjh->bth", ws.weights, ws.content), ws.memory)
        # the gates, hence the weights, are σ(W x + b) of each position alone
        sfx = "_l0" + ("_reverse" if direction else "")
        w, b = getattr(m, "weight_ih" + sfx), getattr(m, "bias" + sfx)
        z = x.transpose(0, 1) @ w.t()  # (T, B, 4H)... positions of the input
        i = torch.sigmoid(z[..., 0:3] + b[0:3]).transpose(0, 1)
        f = torch.sigmoid(z[..., 3:6] + b[3:6]).transpose(0, 1)
        valid = (torch.arange(6).unsqueeze(0) < lengths.unsqueeze(1)).unsqueeze(-1)
        torch.testing.assert_close(ws.input_gate, i * valid)
        torch.testing.assert_close(ws.forget_gate, f * valid)
        torch.testing.assert_close(ws.content, z.transpose(0, 1)[..., 9:12] * valid)


# --------------------------------------------------------------------------- CUDA (lent GPU only)
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.skipif(not scan_kernel_available("cuda"), reason="the CUDA scan kernel is not built")
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("highway,batch_first,padded", [(False, True, False), (True, True, True),
                                                        (False, False, True)])
def test_cuda_scan_layer_matches_generic(dtype, highway, batch_first, padded):
    """The CUDA layer node (bias inside the scan, its gradient summed there, batch-major reads
    of a batch_first input, lengths copied without a sync) against the generic path: outputs,
    states and every gradient, multi-layer, bidirectional; inference equals training forward."""
    torch.manual_seed(0)
    m = AblatedRNN(NAME, 7, 10, num_layers=2, bidirectional=True, highway=highway,
                   batch_first=batch_first).to("cuda", dtype)
    B, T = 4, 9
    x = torch.randn((B, T, 7) if batch_first else (T, B, 7), device="cuda", dtype=dtype)
    lengths = torch.tensor([9, 2, 6, 9]) if padded else None
    c0 = torch.randn(4, B, 10, device="cuda", dtype=dtype)
    h0 = torch.randn(4, B, 10, device="cuda", dtype=dtype)
    results = {}
    for backend in ("kernel", "generic"):
        with use_backend(backend):
            xb, cb = x.clone().requires_grad_(), c0.clone().requires_grad_()
            out, (h, c) = m(xb, (h0, cb), lengths=lengths)
            (out.sin().sum() + h.sum() + c.cos().sum()).backward()
            grads = [xb.grad, cb.grad] + [p.grad.clone() for p in m.parameters()]
            m.zero_grad()
            with torch.no_grad():
                infer = m(x, (h0, c0), lengths=lengths)[0]
        results[backend] = (out.detach(), h.detach(), c.detach(), infer, *grads)
    tol = dict(atol=1e-9, rtol=1e-7) if dtype == torch.float64 else dict(atol=3e-5, rtol=1e-4)
    for a, b in zip(results["kernel"], results["generic"]):
        torch.testing.assert_close(a, b, **tol)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.skipif(not scan_kernel_available("cuda"), reason="the CUDA scan kernel is not built")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cuda_scan_half_precision_against_float32(dtype):
    """The CUDA scan computes in float for float16/bfloat16 inputs: close to the float32 run."""
    m = AblatedRNN(NAME, 16, 32, num_layers=2, bidirectional=True, highway=True).cuda()
    x = torch.randn(12, 5, 16, device="cuda")
    lengths = torch.tensor([12, 3, 7, 12, 1])
    with use_backend("kernel"):
        want = m(x, lengths=lengths)
        low = m.to(dtype)
        got = low(x.to(dtype), lengths=lengths)
    for g, w in zip((got[0], *got[1]), (want[0], *want[1])):
        assert g.dtype == dtype
        torch.testing.assert_close(g.float(), w, atol=3e-2, rtol=3e-2)


# --------------------------------------------------------------------------- the speed benchmark
def test_speed_benchmark_runs_at_a_tiny_setting(tmp_path, one_thread):
    """benchmarks/speed_minus_hidden.py end to end on one tiny shape (numbers not checked: a
    timing needs a quiet machine): the files it writes name the processor and the vector path
    and hold train and inference rows for nn.LSTM and the variant under every ISA asked for."""
    import importlib.util
    import json
    import os
    import rnn_ablations as ra
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                        "benchmarks", "speed_minus_hidden.py")
    spec = importlib.util.spec_from_file_location("speed_minus_hidden", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    isas = ["--isas", *ISAS] if ISAS else []
    assert bench.main(["--shapes", "tiny", "--repeats", "1", "--warmup", "0", "--threads", "1",
                       "--out", str(tmp_path), *isas]) == 0
    meta = json.loads((tmp_path / "speed_minus_hidden_cpu_tiny.json").read_text())
    assert meta["threads"] == 1 and meta["cpu"]["kernel_isa"] == ra.kernel_isa()
    assert meta["cpu"]["model"] and meta["machine"].startswith(meta["cpu"]["model"])
    models = {(r["model"], r["mode"], r["kernel_isa"]) for r in meta["rows"]}
    for mode in ("train", "inference"):
        assert ("nn.LSTM", mode, None) in models
        for isa in ISAS:
            assert (f"{NAME} [{isa}]" if len(ISAS) > 1 else NAME, mode, isa) in models
    assert all(r["median_ms"] > 0 and r["ratio_vs_nn_lstm"] > 0 for r in meta["rows"])
    md = (tmp_path / "speed_minus_hidden_cpu_tiny.md").read_text()
    assert f"kernel vector path {ra.kernel_isa()}" in md and "nn.LSTM train ms" in md
    # the FLOP bound beside each ratio: nn.LSTM's multiply-adds over the variant's, and the
    # share of it the ratio reaches (tiny: 2 layers, d_in 8, H 6, bidirectional)
    bound = bench.matmul_ratio(2, 8, 6, True)
    assert bound == pytest.approx((8 + 6 + 12 + 6) / (8 + 12))
    for r in meta["rows"]:
        assert r["matmul_ratio"] == pytest.approx(bound)
        assert r["fraction_of_bound"] == pytest.approx(r["ratio_vs_nn_lstm"] / bound)
    assert f"of {bound:.2f})" in md
    with pytest.raises(SystemExit):
        bench.main(["--shapes", "tiny", "--isas", "sse9", "--out", str(tmp_path)])
    with pytest.raises(SystemExit):
        bench.main(["--shapes", "tiny", "--shape-names", "no such shape", "--out",
                    str(tmp_path)])
