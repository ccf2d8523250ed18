"""Numerics of AblatedRNN against references: nn.LSTM, nn.RNN, the weighted-sum identity,
gradcheck through the fast path, padding invariance, fast path == generic path."""
import contextlib
import itertools
import platform

import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

import rnn_ablations as ra
from rnn_ablations import AblatedRNN, VARIANTS, get_variant, recurrent_param_count, weighted_sum

MEMORY_VARIANTS = [v for v in VARIANTS if get_variant(v).has_memory]
#: the three code paths: the pipelined kernel, the plain kernel, the generic PyTorch path
BACKENDS = ["pipelined", "plain", "generic"] if ra.kernel_available() else ["generic"]
KERNELS = ["pipelined", "plain"]


@contextlib.contextmanager
def path(name):
    """Force one code path (``auto`` would pick the pipeline only from 4 steps up)."""
    backend = "generic" if name == "generic" else "kernel"
    with ra.options(backend=backend, cpu_schedule="pipelined" if name == "pipelined" else "plain"):
        yield


def test_kernel_is_built():
    assert ra.kernel_available(), "the C++ kernel was not built: run `bash scripts/setup.sh`"


def _cpu_flags() -> set:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _cpu_has_avx2_fma() -> bool:
    return {"avx2", "fma"} <= _cpu_flags()


def _cpu_has_avx512() -> bool:
    return _cpu_has_avx2_fma() and {"avx512f", "avx512vl", "avx512bw", "avx512dq"} <= _cpu_flags()


#: the vector paths of the CPU kernel that this CPU runs (each is tested against float64 generic)
ISAS = ra.supported_kernel_isas() if ra.kernel_available() else []
#: ... plus the AVX-512 path's GEMM blocking emulated with AVX2 (where the CPU has AVX2 but no
#: AVX-512), so that its row blocks, panels and tails run on every AVX2 machine
TEST_ISAS = ISAS + (["emulated_avx512"] if "avx2" in ISAS else [])
#: the paths with the packed step GEMM
PACKED_ISAS = [i for i in TEST_ISAS if i != "portable"]


@pytest.mark.skipif(not ra.kernel_available(), reason="kernel not built")
def test_kernel_isa_follows_the_cpu():
    """One build, the path chosen at run time: AVX-512 where the CPU (and its OS) has
    AVX-512F/VL/BW/DQ, else AVX2 + FMA where it has both, the portable path always, each with
    the packed step GEMM except the portable one; RNN_ABLATIONS_ISA / set_kernel_isa force one,
    and a path this CPU cannot run is refused with the paths it can."""
    from rnn_ablations import _C
    assert ISAS[-1] == "portable"
    x86 = platform.machine() in ("x86_64", "AMD64")
    assert ("avx2" in ISAS) == (_cpu_has_avx2_fma() and x86)
    assert ("avx512" in ISAS) == (_cpu_has_avx512() and x86)
    assert "emulated_avx512" not in ISAS  # a test path: never listed, never chosen by "auto"
    import os
    assert ra.kernel_isa() == (os.environ.get("RNN_ABLATIONS_ISA") or ISAS[0])
    for isa in TEST_ISAS:
        with ra.use_kernel_isa(isa):
            assert ra.kernel_isa() == isa
            assert _C.packed_gemm() == (isa != "portable")
    with pytest.raises(ValueError, match="kernel_isa must be one of auto, avx512, avx2, portable"):
        ra.set_kernel_isa("sse9")
    for isa in ("avx512", "avx2"):
        if isa not in ISAS:
            with pytest.raises(ValueError, match=f"'{isa}' requested.*'portable' or 'auto'"):
                ra.set_kernel_isa(isa)
    assert ra.kernel_isa() == (os.environ.get("RNN_ABLATIONS_ISA") or ISAS[0])


@pytest.mark.skipif(not ra.kernel_available(), reason="kernel not built")
def test_one_build_holds_every_x86_path():
    """The module compiled here holds the AVX-512 code (zmm registers) beside the AVX2 and
    portable code, whatever this CPU has, and this process (which ran the kernel on the path
    the CPU picked, e.g. AVX2 on an AVX2-only CPU) did not execute it: one build, and one wheel,
    for every x86-64 CPU."""
    import shutil
    import subprocess
    from rnn_ablations import _C
    if platform.machine() not in ("x86_64", "AMD64") or shutil.which("objdump") is None:
        pytest.skip("x86-64 with objdump only")
    if "avx2" not in ISAS and not _cpu_has_avx2_fma():
        pytest.skip("GCC target paths are checked where the CPU runs at least one")
    text = subprocess.run(["objdump", "-d", "--no-show-raw-insn", _C.__file__],
                          capture_output=True, text=True, timeout=120).stdout
    assert "zmm" in text, "no AVX-512 code in the module: was vec_avx512.cpp compiled?"
    assert "ymm" in text
    m = AblatedRNN("lstm", 8, 40)
    m(torch.randn(3, 2, 8))[0].sum().backward()  # ran on the path the CPU picked, without SIGILL


@pytest.mark.skipif(not PACKED_ISAS, reason="no path with the packed step GEMM on this CPU")
@pytest.mark.parametrize("isa", PACKED_ISAS)
@pytest.mark.parametrize("transposed", [True, False])
def test_packed_step_gemm_against_float64(isa, transposed):
    """The packed step GEMM of every vector path (its panel width: 24 AVX2, 32 AVX-512; row
    blocks of 4 or 8) against a float64 product, at every row count up to two blocks and more
    (each leftover height), panel counts with and without a partial last panel, K = 1, strided
    A and C (the step's views of proj), overwrite and accumulate, one panel range and the panels
    split over 2 threads."""
    from rnn_ablations import _C
    torch.manual_seed(0)
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with ra.use_kernel_isa(isa):
            for n, k in [(1, 1), (7, 9), (24, 5), (31, 7), (32, 16), (33, 3), (48, 40), (100, 100),
                         (400, 100), (650, 650)]:
                for m in list(range(1, 18)) + [20, 32, 40]:
                    a = torch.randn(m, k + 3)[:, :k]
                    w = torch.randn(n, k) if transposed else torch.randn(k, n)
                    b = w.double().t() if transposed else w.double()
                    for accumulate in (False, True):
                        for parallel in (False, True):
                            base = torch.randn(m, n + 5)
                            saved = base.clone()
                            c = base[:, :n]
                            before = c.double().clone()
                            _C.packed_matmul(a, w, transposed, c, accumulate, parallel)
                            want = a.double() @ b + (before if accumulate else 0)
                            torch.testing.assert_close(c.double(), want, atol=1e-4 * (1 + k ** 0.5),
                                                       rtol=1e-5, msg=lambda s: f"{isa} m={m} n={n} k={k} "
                                                       f"acc={accumulate} par={parallel}: {s}")
                            # the padding columns of C's rows are not written
                            assert torch.equal(base[:, n:], saved[:, n:])
    finally:
        torch.set_num_threads(old)


def _run(m, x, **kw):
    out, (h, c) = m(x, **kw)
    return out, h, c


# --------------------------------------------------------------------------- references
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("layers,bidirectional,batch_first", [
    (1, False, False), (2, True, True), (3, True, False), (3, False, True)])
@pytest.mark.parametrize("sizes", [(5, 7, 6, 3), (16, 12, 9, 4)])
def test_lstm_matches_torch(backend, layers, bidirectional, batch_first, sizes):
    d_in, hidden, seq_len, batch = sizes
    ref = torch.nn.LSTM(d_in, hidden, num_layers=layers, bidirectional=bidirectional,
                        batch_first=batch_first)
    ours = AblatedRNN("lstm", d_in, hidden, num_layers=layers, bidirectional=bidirectional,
                      batch_first=batch_first)
    ours.load_state_dict(ref.state_dict())
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in ref.named_parameters()]
    x = torch.randn((batch, seq_len, d_in) if batch_first else (seq_len, batch, d_in))
    h0 = torch.randn(layers * (2 if bidirectional else 1), batch, hidden)
    c0 = torch.randn_like(h0)
    with path(backend):
        for hx in (None, (h0, c0)):
            got = _run(ours, x, hx=hx) if hx is not None else _run(ours, x)
            want = ref(x, hx) if hx is not None else ref(x)
            want = (want[0], *want[1])
            for g, w in zip(got, want):
                torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("layers,bidirectional,batch_first", [(1, False, True), (2, True, False), (3, True, True)])
def test_srnn_matches_torch_rnn(backend, layers, bidirectional, batch_first):
    ref = torch.nn.RNN(6, 8, num_layers=layers, bidirectional=bidirectional, nonlinearity="tanh",
                       batch_first=batch_first)
    ours = AblatedRNN("srnn", 6, 8, num_layers=layers, bidirectional=bidirectional,
                      batch_first=batch_first)
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(4, 5, 6)
    h0 = torch.randn(layers * (2 if bidirectional else 1), 5 if not batch_first else 4, 8)
    if batch_first:
        h0 = torch.randn(layers * (2 if bidirectional else 1), 4, 8)
    with path(backend):
        out, (h, c) = ours(x, h0)
    want_out, want_h = ref(x, h0)
    torch.testing.assert_close(out, want_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(h, want_h, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(c, h)  # documented: c_n is a copy of h_n for the S-RNN


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bidirectional", [False, True])
def test_packed_sequence_matches_torch(backend, bidirectional):
    ref = torch.nn.LSTM(4, 6, num_layers=2, bidirectional=bidirectional)
    ours = AblatedRNN("lstm", 4, 6, num_layers=2, bidirectional=bidirectional)
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(7, 4, 4)
    lengths = torch.tensor([3, 7, 1, 5])
    packed = pack_padded_sequence(x, lengths, enforce_sorted=False)
    with path(backend):
        out, (h, c) = ours(packed)
    want_out, (want_h, want_c) = ref(packed)
    assert torch.equal(out.batch_sizes, want_out.batch_sizes)
    torch.testing.assert_close(out.data, want_out.data, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(h, want_h, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(c, want_c, atol=1e-5, rtol=1e-5)
    # lengths= on the padded tensor gives the same as the packed input
    with path(backend):
        out2, (h2, c2) = ours(x, lengths=lengths)
    padded, _ = pad_packed_sequence(want_out)
    torch.testing.assert_close(out2[:padded.shape[0]], padded, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(h2, want_h, atol=1e-5, rtol=1e-5)


def test_unbatched_input_matches_torch():
    ref = torch.nn.LSTM(3, 5)
    ours = AblatedRNN("lstm", 3, 5)
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(6, 3)
    out, (h, c) = ours(x)
    want, (wh, wc) = ref(x)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(h, wh, atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------- fast == generic, gradcheck
@pytest.mark.skipif(not ra.kernel_available(), reason="kernel not built")
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("highway,recurrent_dropout", [(False, 0.0), (True, 0.3)])
def test_kernel_equals_generic(kernel, variant, highway, recurrent_dropout):
    m = AblatedRNN(variant, 5, 6, num_layers=2, bidirectional=True, highway=highway,
                   recurrent_dropout=recurrent_dropout, dropout=0.2)
    x = torch.randn(7, 4, 5, requires_grad=True)
    lengths = torch.tensor([7, 3, 5, 1])
    results = []
    for backend in (kernel, "generic"):
        torch.manual_seed(1)  # same dropout masks
        with path(backend):
            out, (h, c) = m(x, lengths=lengths)
            (out.square().sum() + h.sum() + 2 * c.sum()).backward()
        grads = [x.grad.clone()] + [p.grad.clone() for p in m.parameters()]
        x.grad = None
        m.zero_grad()
        results.append((out.detach(), h.detach(), c.detach(), grads))
    (o1, h1, c1, g1), (o2, h2, c2, g2) = results
    for a, b in zip((o1, h1, c1, *g1), (o2, h2, c2, *g2)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_pipeline_policy():
    """The CPU schedule the run plan picks for real tensors (the table of every decision is in
    tests/test_run_plan.py): pipelined from 4 steps while a step's GEMM is small, plain above
    the measured threshold with 2 threads, and as the cpu_schedule setting forces."""
    from rnn_ablations import dispatch

    def schedule(x, w_ih, w_hh, needs_grad):
        plan = dispatch.layer_plan([x], [(w_ih, w_hh, None)], needs_grad)
        return plan.schedule if plan.path == "cpu" else None

    big_x, w_big = torch.randn(8, 2, 400), torch.randn(1600, 400)  # >= ONEDNN_MIN_WEIGHT
    small_w, small_hh = torch.randn(12, 3), torch.randn(12, 3)
    # one step's GEMM of B = 32 rows against a (4H, H) weight at H = 650: 54 M multiply-adds
    wide_x, wide_hh = torch.randn(8, 32, 3), torch.empty(2600, 650)
    assert 32 * 2600 * 650 >= ra.plan.POLICY.max_step_macs > 32 * 1024 * 256
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert schedule(torch.randn(8, 2, 3), small_w, small_hh, False) == "pipelined"
        assert schedule(torch.randn(3, 2, 3), small_w, small_hh, True) == "plain"
        assert schedule(wide_x, small_w, wide_hh, True) == "plain"
        assert schedule(wide_x, small_w, torch.empty(1024, 256), True) == "pipelined"
        mid_hh = torch.empty(1536, 384)  # 18.9 M: pipelined to train, plain for inference
        assert schedule(wide_x, small_w, mid_hh, True) == "pipelined"
        assert schedule(wide_x, small_w, mid_hh, False) == "plain"
        torch.set_num_threads(1)
        assert schedule(wide_x, small_w, wide_hh, True) == "pipelined"
        assert schedule(big_x, w_big, small_hh, True) == "pipelined"
        onednn = dispatch.layer_plan([big_x], [(w_big, small_hh, None)], False).onednn
        assert schedule(big_x, w_big, small_hh, False) == ("plain" if onednn else "pipelined")
        with ra.options(cpu_schedule="plain"):
            assert schedule(big_x, small_w, small_hh, True) == "plain"
        with ra.options(cpu_schedule="pipelined"):
            assert schedule(torch.randn(1, 2, 3), small_w, small_hh, False) == "pipelined"
            assert schedule(wide_x, small_w, wide_hh, True) == "pipelined"
    finally:
        torch.set_num_threads(old)
    with pytest.raises(ValueError, match="always, never"):
        ra.set_pipeline("sometimes")


@pytest.mark.skipif(not ra.kernel_available(), reason="kernel not built")
@pytest.mark.parametrize("isa,packed", [(i, p) for i in TEST_ISAS
                                         for p in (["1", "0"] if i in ("avx2", "avx512") else ["1"])])
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("variant,highway,recurrent_dropout", [
    ("lstm", False, 0.0), ("lstm_minus_srnn", True, 0.25), ("ran", False, 0.25), ("srnn", True, 0.0)])
def test_float32_step_gemm_against_float64_generic(monkeypatch, isa, packed, kernel, variant,
                                                   highway, recurrent_dropout):
    """Every vector path this CPU runs (``isa``: the AVX-512 and AVX2 + FMA packed
    micro-kernels and element-wise passes, also with ATen's GEMM via RNN_ABLATIONS_PACKED_GEMM=0;
    the AVX-512 blocking emulated with AVX2; the portable element-wise pass with ATen's GEMM) at
    shapes with several weight panels, a last partial panel in both passes (R*H and H not
    multiples of 24 or 32), row blocks of 4 or 8 with rows left over as the batch shrinks, and
    the panels split over 2 threads; against the generic path in float64
    (test_float64_kernel_per_isa_equals_generic covers the float64 kernel per path)."""
    monkeypatch.setenv("RNN_ABLATIONS_PACKED_GEMM", packed)
    with ra.use_kernel_isa(isa):
        _float32_against_float64(kernel, variant, highway, recurrent_dropout)


def _float32_against_float64(kernel, variant, highway, recurrent_dropout):
    torch.manual_seed(0)
    m = AblatedRNN(variant, 30, 100, bidirectional=True, highway=highway,
                   recurrent_dropout=recurrent_dropout)
    x = torch.randn(9, 13, 30)
    lengths = torch.tensor([9, 9, 8, 8, 7, 6, 6, 5, 4, 3, 3, 2, 1])
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        results = [_training_pass(m, dtype, name, x, lengths)
                   for dtype, name in ((torch.float32, kernel), (torch.float64, "generic"))]
        inference = _float32_inference(m, kernel, x, lengths)
    finally:
        torch.set_num_threads(old)
        m.float()
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, atol=2e-4, rtol=1e-3)
    for a, b in zip(inference, results[1][:3]):
        torch.testing.assert_close(a, b, atol=2e-4, rtol=1e-3)


def _training_pass(m, dtype, name, x, lengths):
    """Outputs, final states and the gradients of a fixed loss (input and every parameter) of
    ``m`` cast to ``dtype`` on path ``name``, with fixed dropout masks; ``m`` stays cast."""
    mm = m.to(dtype)
    xx = x.to(dtype).detach().clone().requires_grad_()
    torch.manual_seed(1)  # same dropout masks
    with path(name):
        out, (h, c) = mm(xx, lengths=lengths)
        (out.square().sum() + h.sum() + 2 * c.sum()).backward()
    result = ([t.detach().double() for t in (out, h, c, xx.grad)]
              + [p.grad.double() for p in mm.parameters()])
    mm.zero_grad()
    return result


def _float32_inference(m, name, x, lengths):
    """The float32 model under no_grad (the kernels' inference calls: memories in one rolling
    buffer, nothing kept for a backward), with the training pass's dropout masks."""
    mm = m.float()
    torch.manual_seed(1)
    with path(name), torch.no_grad():
        out, (h, c) = mm(x.float(), lengths=lengths)
    return [t.double() for t in (out, h, c)]


@pytest.mark.skipif(not PACKED_ISAS, reason="no path with the packed step GEMM on this CPU")
@pytest.mark.parametrize("isa", PACKED_ISAS)
@pytest.mark.parametrize("variant,highway,recurrent_dropout", [
    ("lstm", False, 0.0), ("lstm_minus_srnn", True, 0.25), ("ran", False, 0.25),
    ("identity_ran", True, 0.0), ("srnn", True, 0.0)])
def test_unit_split_forward_against_float64_generic(isa, variant, highway, recurrent_dropout):
    """The plain kernel's forward split by hidden units (w_hh packed per gate block, each thread
    computing every gate column of its units and then their element-wise pass: one parallel
    region per step) at H = 260: 11 AVX2 or 9 AVX-512 panels per block, the last one partial,
    unequal unit chunks; padded rows, recurrent dropout masks, highway; the forward and (the
    backward is not split) the gradients against the generic path in float64; and the steps did
    take that path (_C.unit_split_steps)."""
    from rnn_ablations import _C
    torch.manual_seed(0)
    m = AblatedRNN(variant, 12, 260, highway=highway, recurrent_dropout=recurrent_dropout)
    x = torch.randn(5, 9, 12)
    lengths = torch.tensor([5, 5, 4, 4, 3, 3, 2, 1, 1])
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        before = _C.unit_split_steps()
        with ra.use_kernel_isa(isa):
            results = [_training_pass(m, dtype, name, x, lengths)
                       for dtype, name in ((torch.float32, "plain"), (torch.float64, "generic"))]
            inference = _float32_inference(m, "plain", x, lengths)
        # every step whose product is large enough to be split (gemm_packed's size rule), in
        # the training forward and in the inference call
        r = m.weight_hh_l0.shape[0] // 260
        want = sum(n * r * 260 * 260 >= 1 << 18 for n in (9, 7, 5, 4, 2))
        assert want >= 4 and _C.unit_split_steps() - before == 2 * want
    finally:
        torch.set_num_threads(old)
        m.float()
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, atol=2e-4, rtol=1e-3)
    for a, b in zip(inference, results[1][:3]):
        torch.testing.assert_close(a, b, atol=2e-4, rtol=1e-3)


@pytest.mark.skipif(not ra.kernel_available(), reason="kernel not built")
@pytest.mark.parametrize("isa", TEST_ISAS)
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_float64_kernel_per_isa_equals_generic(isa, kernel, variant):
    """The float64 element-wise pass of each vector path (forward and backward, with highway and
    padding) equals the generic path to rounding."""
    torch.manual_seed(0)
    m = AblatedRNN(variant, 5, 26, bidirectional=True, highway=True).double()
    x = torch.randn(6, 5, 5, dtype=torch.double)
    lengths = torch.tensor([6, 5, 5, 3, 1])
    results = []
    for name in (kernel, "generic"):
        xx = x.clone().requires_grad_()
        with ra.use_kernel_isa(isa), path(name):
            out, (h, c) = m(xx, lengths=lengths)
            (out.square().sum() + h.sum() + 2 * c.sum()).backward()
        results.append([out, h, c, xx.grad] + [p.grad.clone() for p in m.parameters()])
        m.zero_grad()
    for a, b in zip(*results):
        torch.testing.assert_close(a.detach(), b.detach(), atol=1e-10, rtol=1e-9)


@pytest.mark.skipif(not ra.kernel_available(), reason="kernel not built")
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("chunk", [1, 3, 0])
@pytest.mark.parametrize("variant,highway", [("lstm", False), ("ran", False), ("srnn", True)])
@pytest.mark.parametrize("input_grad,bias", [(True, True), (False, False)])
def test_pipeline_schedules_equal_generic(threads, chunk, variant, highway, input_grad, bias):
    """Every chunking of the pipeline, its two roles on one or two threads, with and without
    an input gradient (without one, the weight gradients are the pipelined task) and a bias."""
    m = AblatedRNN(variant, 5, 6, bidirectional=True, highway=highway, bias=bias)
    x = torch.randn(10, 4, 5, requires_grad=input_grad)
    lengths = torch.tensor([10, 7, 10, 2])
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        results = []
        for name in ("pipelined", "generic"):
            with path(name), ra.options(pipeline_chunk=chunk):
                out, (h, c) = m(x, lengths=lengths)
                (out.square().sum() + h.sum() + 2 * c.sum()).backward()
            grads = [p.grad.clone() for p in m.parameters()]
            if input_grad:
                grads.append(x.grad.clone())
                x.grad = None
            m.zero_grad()
            results.append([out.detach(), h.detach(), c.detach()] + grads)
    finally:
        torch.set_num_threads(old)
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


@pytest.mark.skipif(not ra.kernel_available(), reason="kernel not built")
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("highway", [False, True])
def test_gradcheck_fast_path(kernel, variant, highway):
    m = AblatedRNN(variant, 2, 3, num_layers=2, bidirectional=True, highway=highway).double()
    x = torch.randn(4, 3, 2, dtype=torch.double, requires_grad=True)
    h0 = torch.randn(4, 3, 3, dtype=torch.double, requires_grad=True)
    c0 = torch.randn(4, 3, 3, dtype=torch.double, requires_grad=True)
    lengths = torch.tensor([4, 2, 3])
    params = list(m.parameters())

    def f(x, h0, c0, *ps):
        with torch.nn.utils.stateless._reparametrize_module(
                m, dict(zip([n for n, _ in m.named_parameters()], ps))):
            out, (h, c) = m(x, (h0, c0), lengths=lengths)
        return out, h, c

    with path(kernel):
        # the full Jacobian (fast_mode=False) w.r.t. the inputs and states ...
        assert torch.autograd.gradcheck(lambda x, h0, c0: f(x, h0, c0, *params), (x, h0, c0))
        # ... and random projections of it w.r.t. every parameter as well
        assert torch.autograd.gradcheck(
            f, (x, h0, c0, *[p.detach().requires_grad_() for p in params]), fast_mode=True)


@pytest.mark.skipif(not ra.kernel_available(), reason="kernel not built")
@pytest.mark.parametrize("kernel", KERNELS)
def test_gradcheck_recurrent_dropout_mask(kernel):
    m = AblatedRNN("ran", 3, 4, recurrent_dropout=0.5).double()
    x = torch.randn(4, 2, 3, dtype=torch.double, requires_grad=True)

    def f(x):
        torch.manual_seed(3)
        return m(x)[0]

    with path(kernel):
        assert torch.autograd.gradcheck(f, (x,))


# --------------------------------------------------------------------------- padding
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_padding_invariance_both_directions(backend, variant):
    m = AblatedRNN(variant, 4, 5, num_layers=2, bidirectional=True, batch_first=True).eval()
    lengths = [6, 2, 4]
    rows = [torch.randn(n, 4) for n in lengths]
    padded = torch.zeros(3, 6, 4)
    for i, r in enumerate(rows):
        padded[i, :len(r)] = r
    padded_garbage = padded.clone()
    padded_garbage[1, 2:] = 100.0  # padding content must not matter
    mask = torch.arange(6).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)
    with path(backend):
        out, (h, c) = m(padded_garbage, mask=mask)
        for i, r in enumerate(rows):
            alone, (ha, ca) = m(r.unsqueeze(0))
            n = len(r)
            torch.testing.assert_close(out[i, :n], alone[0], atol=1e-5, rtol=1e-5)
            assert torch.all(out[i, n:] == 0)
            torch.testing.assert_close(h[:, i], ha[:, 0], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(c[:, i], ca[:, 0], atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------- weighted sum
@pytest.mark.parametrize("variant", MEMORY_VARIANTS)
@pytest.mark.parametrize("layer,direction", [(0, 0), (1, 1)])
def test_weighted_sum_identity(variant, layer, direction):
    m = AblatedRNN(variant, 4, 5, num_layers=2, bidirectional=True, batch_first=True)
    x = torch.randn(3, 6, 4)
    lengths = torch.tensor([6, 3, 5])
    ws = weighted_sum(m, x, layer=layer, direction=direction, lengths=lengths)
    assert ws.weights.shape == (3, 6, 6, 5)
    recon = (ws.weights * ws.content.unsqueeze(1)).sum(dim=2)
    torch.testing.assert_close(recon, ws.memory, atol=1e-5, rtol=1e-5)
    # weights only where the direction reaches
    t, j = torch.meshgrid(torch.arange(6), torch.arange(6), indexing="ij")
    unreachable = (j > t) if direction == 0 else (j < t)
    assert torch.all(ws.weights[:, unreachable] == 0)
    # the memory is the model's own cell: for the top layer, c_n of the model
    out, (h, c) = m(x, lengths=lengths)
    idx = layer * 2 + direction
    last = ws.memory[torch.arange(3), lengths - 1] if direction == 0 else ws.memory[:, 0]
    torch.testing.assert_close(last, c[idx], atol=1e-5, rtol=1e-5)


def test_weighted_sum_refuses_srnn():
    m = AblatedRNN("srnn", 3, 4)
    with pytest.raises(ValueError, match="no memory cell"):
        weighted_sum(m, torch.randn(5, 1, 3))


# --------------------------------------------------------------------------- parameters and init
@pytest.mark.parametrize("variant,hidden,expected", [
    ("lstm", 650, 6.77e6), ("ran", 650, 4.23e6), ("lstm", 1500, 36.02e6), ("ran", 1500, 22.52e6)])
def test_param_counts_match_ran_paper_table1(variant, hidden, expected):
    n = recurrent_param_count(variant, hidden, hidden, num_layers=2)
    assert abs(n - expected) / expected < 0.005
    if hidden == 650:  # the module allocates exactly that
        m = AblatedRNN(variant, hidden, hidden, num_layers=2)
        assert sum(p.numel() for p in m.parameters()) == n


def test_parameter_names_protect_ablated_biases():
    for v in VARIANTS:
        names = [n for n, _ in AblatedRNN(v, 3, 4, bidirectional=True).named_parameters()]
        if get_variant(v).lstm_parameter_names:
            assert "bias_hh_l0" in names and "bias_ih_l0_reverse" in names
        else:
            assert not any("bias_hh" in n or "bias_ih" in n for n in names), names
            assert "bias_l0" in names and "bias_l0_reverse" in names


@pytest.mark.parametrize("variant", ["lstm_minus_srnn", "ran", "identity_ran"])
def test_documented_init_forget_bias(variant):
    """Default: nn.LSTM's uniform rule (no forget-bias head start); forget_bias=1 on request."""
    H = 4
    m = AblatedRNN(variant, 3, H, highway=True)
    assert m.bias_l0.abs().max() <= 0.5 and m.bias_l0.std() > 0.1
    m = AblatedRNN(variant, 3, H, highway=True, forget_bias=1.0)
    assert torch.equal(m.bias_l0.detach()[H:2 * H], torch.ones(H))  # blocks i, f, (o), r
    others = torch.cat([m.bias_l0.detach()[:H], m.bias_l0.detach()[2 * H:]])
    assert others.abs().max() <= 0.5 and others.std() > 0.1
    assert m.weight_ih_l0.abs().max() <= 0.5 and m.weight_hh_l0.shape == (m.variant.num_recurrent(m.highway) * H, H)


# --------------------------------------------------------------------------- bad input
def test_unknown_variant_lists_valid_ones():
    with pytest.raises(ValueError, match="valid variants are lstm, srnn, lstm_minus_srnn, ran, identity_ran"):
        AblatedRNN("gru", 3, 4)


def test_aliases():
    assert AblatedRNN("lstm_minus_gates", 3, 4).variant.name == "srnn"
    assert AblatedRNN("tanh_ran", 3, 4).variant.name == "ran"
    assert AblatedRNN("LSTM-minus-SRNN-minus-OUT", 3, 4).variant.name == "ran"


@pytest.mark.parametrize("kwargs,match", [
    (dict(dropout=1.0), "dropout must be a number in \\[0, 1\\)"),
    (dict(dropout=-0.1), "dropout must be a number in \\[0, 1\\)"),
    (dict(recurrent_dropout=1.5), "recurrent_dropout must be"),
    (dict(num_layers=0), "num_layers must be a positive integer"),
    (dict(proj_size=3), r"proj_size projects h_t = o_t\*tanh\(c_t\)"),  # ran has no output gate
])
def test_bad_constructor_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        AblatedRNN("ran", 3, 4, **kwargs)


def test_bad_forward_inputs():
    m = AblatedRNN("ran", 3, 4, num_layers=2)
    x = torch.randn(5, 2, 3)
    with pytest.raises(ValueError, match="Expected 3, got 7"):
        m(torch.randn(5, 2, 7))
    with pytest.raises(ValueError, match="lengths must have shape \\(2,\\)"):
        m(x, lengths=torch.tensor([5, 4, 3]))
    with pytest.raises(ValueError, match="mask has shape \\(3, 5\\)"):
        m(x, mask=torch.ones(3, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="at least one token; got a length of 0"):
        m(x, lengths=torch.tensor([5, 0]))
    with pytest.raises(ValueError, match="a length of 6 exceeds the input's seq_len 5"):
        m(x, lengths=torch.tensor([6, 2]))
    with pytest.raises(ValueError, match="left-aligned"):
        m(x, mask=torch.tensor([[True, False, True, False, False]] * 2))
    with pytest.raises(ValueError, match="h_0 must have shape \\(2, 2, 4\\)"):
        m(x, (torch.zeros(1, 2, 4), torch.zeros(1, 2, 4)))
    with pytest.raises(ValueError, match="must be a tuple \\(h_0, c_0\\)"):
        m(x, torch.zeros(2, 2, 4))
    with pytest.raises(ValueError, match="either mask or lengths"):
        m(x, mask=torch.ones(2, 5, dtype=torch.bool), lengths=torch.tensor([5, 5]))
    with pytest.raises(ValueError, match="2-D \\(unbatched\\) or 3-D"):
        m(torch.randn(5, 2, 3, 1))


@pytest.mark.skipif(not ra.kernel_available(), reason="kernel not built")
def test_large_projection_path_equals_generic():
    """Above ONEDNN_MIN_WEIGHT the input projection runs on oneDNN (forward and input gradient)."""
    m = AblatedRNN("lstm", 400, 400)
    assert m.weight_ih_l0.numel() >= ra.plan.POLICY.onednn_min_weight
    x = torch.randn(5, 3, 400, requires_grad=True)
    results = []
    for backend in ("kernel", "generic"):
        with path(backend):
            out, (h, c) = m(x)
            (out.square().sum() + c.sum()).backward()
        results.append([out.detach(), x.grad.clone()] + [p.grad.clone() for p in m.parameters()])
        x.grad = None
        m.zero_grad()
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("variant", VARIANTS)
def test_dropout_with_one_layer_warns_as_nn_lstm(variant):
    """dropout acts between layers: with one layer it does nothing, and AblatedRNN says so with
    nn.LSTM's warning, on nn.LSTM's condition (dropout > 0 and num_layers == 1)."""
    import warnings
    with pytest.warns(UserWarning, match="non-zero dropout expects num_layers greater than 1") as w:
        torch.nn.LSTM(3, 4, dropout=0.25)
    want = str(w[0].message)
    with pytest.warns(UserWarning) as got:
        AblatedRNN(variant, 3, 4, dropout=0.25)
    assert [str(r.message) for r in got] == [want]
    assert got[0].filename == __file__  # points at the caller's line
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        AblatedRNN(variant, 3, 4, dropout=0.25, num_layers=2)
        AblatedRNN(variant, 3, 4, dropout=0.0)
        torch.nn.LSTM(3, 4, dropout=0.25, num_layers=2)
