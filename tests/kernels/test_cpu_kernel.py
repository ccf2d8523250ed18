"""The CPU kernel (rnn_ablations._C, csrc/cpu) against the generic path and float64: its vector
paths (the instruction sets this CPU runs, one build holding every x86 path), the packed step
GEMM, both schedules (pipelined, plain) and the pipeline's policy, float32 against float64 per
vector path, gradcheck through the kernel, the input projection on oneDNN."""
import contextlib
import platform

import pytest
import torch

import rnn_ablations as ra
from rnn_ablations import AblatedRNN, VARIANTS


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


# --------------------------------------------------------------------------- fast == generic, gradcheck
@pytest.mark.skipif(not ra.kernel_available(), reason="kernel not built")
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("highway,recurrent_dropout", [(False, 0.0), (True, 0.3)])
def test_kernel_equals_generic(kernel, variant, highway, recurrent_dropout):
    if not ra.get_variant(variant).reads_hidden:
        recurrent_dropout = 0.0  # no h_{t-1} to drop (the constructor would say so)
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
