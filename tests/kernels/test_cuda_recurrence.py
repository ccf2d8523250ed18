"""Which CUDA recurrence runs a layer (rnn_ablations/kernels/cuda/recurrence.py) and the
persistent kernels (csrc/cuda/persistent_kernel.cuh, off by default): the run plan asks for them
(cuda_recurrence="persistent") and checks that they fit (plan.check_persistent),
cuda_recurrence.step_kernel looks them up (on the CPU, with a stand-in kernel); on a GPU every
step-kernel variant against the float64 generic path in float32/bfloat16/float16, forced grids
and batch tiles, the saved tensors and the backward against the step kernel's, sequences longer
than one launch, graph replay, autocast, the speed command's rows."""
import copy

import pytest
import torch

import rnn_ablations as ra
from _cuda_cases import (HALF_DTYPES, HALF_TOL, STEP_VARIANTS, _check_against_float64_generic,
                         _layer_run, _layer_tensors, _rel_err, _repeat_calls, _run_and_grads,
                         fresh_graphs, needs_cuda_kernel, no_tf32, requires_cuda)  # noqa: F401
from rnn_ablations import AblatedRNN, get_variant, use_backend, use_cuda_recurrence
from rnn_ablations.kernels import registry
from rnn_ablations.kernels.cuda import graphs as cuda_graphs
from rnn_ablations.kernels.cuda import recurrence as cuda_recurrence


class _CudaLike:
    """Stands for a CUDA projection tensor in the selection (which reads only device/dtype)."""
    device = torch.device("cuda")
    dtype = torch.float32
    shape = (3, 2, 16)


class _FakePersistentExt:
    def __init__(self, ok=True, why=""):
        self.ok, self.why, self.calls = ok, why, []

    def persistent_plan(self, spec, highway, proj, w_hh, blocks, batch_tile, backward):
        self.calls.append(("plan", spec, highway, blocks, batch_tile, backward))
        return (self.ok or backward, self.why, 4, 2, 2, 1024)

    def persistent_forward(self, *args):
        self.calls.append(("persistent_forward",) + args)
        return "persistent result"

    def plain_backward(self, *args):
        self.calls.append(("backward",) + args)
        return "step backward"

    def persistent_backward(self, *args):
        self.calls.append(("persistent_backward",) + args)
        return "persistent backward"


def test_cuda_recurrence_selection(given_kernels):
    """auto and steps keep the step kernel (graphed as the plan says, never inside a compiled
    graph); persistent asks the kernel's plan (in the run plan), runs the persistent forward and
    the step kernel's backward, or says why it cannot and what to do."""
    from rnn_ablations.plan import Kernels, LayerCall, check_persistent, plan_layer
    v = get_variant("ran")
    fake = _FakePersistentExt()
    given_kernels(cuda=fake)
    kernels = Kernels(cpu=True, cuda=True, persistent=True)
    call = LayerCall(device="cuda", dtype=torch.float32, steps=3, batch=2, hidden=8,
                     rec_blocks=2, proj_weight=48)

    def select(**settings):
        plan = plan_layer(ra.get_options().replace(**settings), call, kernels)
        check_persistent(plan, fake, v.kernel_spec, True, _CudaLike(), None)
        return cuda_recurrence.step_kernel(plan)

    for mode in ("auto", "steps"):
        assert select(cuda_recurrence=mode, cuda_graphs=False) is fake
        graphed = select(cuda_recurrence=mode, cuda_graphs=True)
        assert isinstance(graphed, cuda_graphs.GraphedKernel) and graphed.ext is fake
    assert fake.calls == []  # auto = steps: the persistent kernel is not even asked
    ext = select(cuda_recurrence="persistent", persistent_blocks=3, cuda_graphs=False)
    assert isinstance(ext, cuda_recurrence.PersistentKernel)
    assert fake.calls[-1] == ("plan", v.kernel_spec, True, 3, 0, False)
    before = cuda_recurrence.persistent_stats()["persistent_forward"]
    assert ext.plain_forward(v.kernel_spec, True, "p", "w", "h", "c", "bs", "m", True) == \
        "persistent result"
    assert fake.calls[-1] == ("persistent_forward", v.kernel_spec, True, "p", "w", "h", "c",
                              "bs", "m", True, 3, 0)
    assert cuda_recurrence.persistent_stats()["persistent_forward"] == before + 1
    grads = tuple(range(15))  # the 15 arguments of plain_backward
    assert ext.plain_backward(*grads) == "step backward"
    ext_b = select(cuda_recurrence="persistent", persistent_blocks=3, persistent_backward=True,
                   cuda_graphs=False)
    assert fake.calls[-1] == ("plan", v.kernel_spec, True, 3, 0, True)
    assert ext_b is not ext and ext_b.plain_backward(*grads) == "persistent backward"
    assert fake.calls[-1] == ("persistent_backward",) + grads + (3, 0)
    assert ext.plain_backward(*grads) == "step backward"  # chosen at the forward, kept
    graphed = select(cuda_recurrence="persistent", persistent_blocks=3, persistent_backward=True,
                     cuda_graphs=True)
    assert isinstance(graphed, cuda_graphs.GraphedKernel)
    assert graphed.tag.startswith("persistent(backward=True, blocks=3")
    fake.ok, fake.why = False, "the W_hh slice does not fit"
    with pytest.raises(ValueError, match="does not fit.*'steps'"):
        select(cuda_recurrence="persistent")
    with pytest.raises(RuntimeError, match="no persistent kernel"):
        plan_layer(ra.get_options().replace(cuda_recurrence="persistent"), call,
                   Kernels(cpu=True, cuda=True, persistent=False))
    for mode in ("steps", "persistent"):  # a compiled graph holds the operators themselves
        plan = plan_layer(ra.get_options().replace(cuda_recurrence=mode, cuda_graphs=True),
                          call._replace(compiling=True), kernels)
        assert plan.runner == "cuda" and not plan.graphs


#: float32 against the float64 generic path: relative error of the norms (T = 13 steps)
PERSISTENT_TOL = {torch.float32: 2e-5, **HALF_TOL}
PERSISTENT_DTYPES = [torch.float32] + HALF_DTYPES
#: (blocks, batch tile) forced on the kernel (0 = automatic): with H = 24 and B = 6, 5 blocks
#: of 5 units leave the last block a unit past H, tiles of 4 rows leave a partial tile; one
#: block runs every unit, one row per tile
PERSISTENT_CONFIGS = {"auto": (0, 0), "tiles": (5, 4), "one_block": (1, 1)}


def _persistent(config="auto", graphs=False, backward=False):
    """The persistent forward (and with ``backward`` the persistent backward) forced."""
    blocks, tile = PERSISTENT_CONFIGS[config]
    return ra.options(cuda_recurrence="persistent", cuda_graphs=graphs, persistent_blocks=blocks,
                      persistent_batch_tile=tile, persistent_backward=backward)


def _persistent_ran(fn, backward=False):
    """fn() under the persistent kernel; asserts that its forward (and backward) ran."""
    before = cuda_recurrence.persistent_stats()
    result = fn()
    after = cuda_recurrence.persistent_stats()
    assert after["persistent_forward"] > before["persistent_forward"], \
        "the persistent kernel did not run"
    if backward:
        assert after["persistent_backward"] > before["persistent_backward"], \
            "the persistent backward did not run"
    return result


@requires_cuda
@needs_cuda_kernel
def test_persistent_kernel_is_available():
    assert hasattr(registry.cuda_kernel(), "persistent_forward"), \
        "the CUDA kernel has no persistent kernel entry point"


def _persistent_case(variant, highway, dtype, use_mask, padded, config, backward=False):
    v, t = _layer_tensors(variant, highway, dtype)
    T, B = t["x"].shape[:2]
    batch_sizes = (torch.tensor([6, 6, 5, 5, 5, 4, 4, 3, 3, 2, 2, 2, 1]) if padded
                   else torch.full((T,), B, dtype=torch.int64))
    if not v.has_memory:  # the S-RNN has no cell: c0 is h0
        t["c0"] = t["h0"]
    with use_backend("kernel"), _persistent(config, backward=backward):
        got = _persistent_ran(lambda: _layer_run(v, highway, t, batch_sizes, use_mask), backward)
    _check_against_float64_generic(v, highway, t, batch_sizes, use_mask, got, dtype,
                                   PERSISTENT_TOL[dtype])


@requires_cuda
@needs_cuda_kernel
@pytest.mark.parametrize("dtype", PERSISTENT_DTYPES, ids=str)
@pytest.mark.parametrize("variant", STEP_VARIANTS)
@pytest.mark.parametrize("highway,use_mask,padded", [(False, False, False), (True, True, True),
                                                     (False, True, True)])
def test_persistent_matches_float64_generic(dtype, variant, highway, use_mask, padded):
    """Every step-kernel variant of the table: outputs, final states (h0/c0 given) and, through
    the step kernel's backward from the persistent kernel's saved tensors, every gradient."""
    _persistent_case(variant, highway, dtype, use_mask, padded, "auto")


@requires_cuda
@needs_cuda_kernel
@pytest.mark.parametrize("dtype", PERSISTENT_DTYPES, ids=str)
@pytest.mark.parametrize("variant", STEP_VARIANTS)
@pytest.mark.parametrize("highway,use_mask,padded", [(False, False, False), (True, True, True),
                                                     (False, True, True)])
def test_persistent_backward_matches_float64_generic(dtype, variant, highway, use_mask, padded):
    """The persistent backward (the persistent_backward setting) after the persistent forward."""
    _persistent_case(variant, highway, dtype, use_mask, padded, "auto", backward=True)


@requires_cuda
@needs_cuda_kernel
@pytest.mark.parametrize("backward", [False, True], ids=["fwd", "fwd+bwd"])
@pytest.mark.parametrize("config", ["tiles", "one_block"])
@pytest.mark.parametrize("variant", STEP_VARIANTS)
@pytest.mark.parametrize("highway,use_mask,padded", [(False, False, False), (True, True, True)])
def test_persistent_forced_grid_and_tiles(backward, config, variant, highway, use_mask, padded):
    """Partial blocks (units past H), partial batch tiles, one block for all units."""
    _persistent_case(variant, highway, torch.float32, use_mask, padded, config, backward)


@requires_cuda
@needs_cuda_kernel
@pytest.mark.parametrize("variant", STEP_VARIANTS)
@pytest.mark.parametrize("highway", [False, True])
def test_persistent_backward_equals_step_backward(variant, highway):
    """The raw entry points, float32, from the same saved tensors and incoming gradients (padded
    rows, steps without any row, mask, grad_hn, grad_cn): the step kernel's results."""
    ext = registry.cuda_kernel()
    v, t = _layer_tensors(variant, highway, torch.float32)
    pbias = torch.cat([t["bias"], t["bias"].new_zeros(t["w_ih"].shape[0] - t["bias"].shape[0])])
    proj = torch.nn.functional.linear(t["x"], t["w_ih"], pbias).contiguous()
    c0 = t["c0"] if v.has_memory else t["h0"]
    bs = torch.tensor([6, 6, 5, 5, 5, 4, 4, 3, 3, 2, 2, 0, 0])
    out, h_n, c_n, gates, cs, hin = ext.plain_forward(v.kernel_spec, highway, proj.clone(), t["w_hh"],
                                                t["h0"], c0, bs, t["mask"], True)
    g = torch.Generator(device="cuda").manual_seed(5)
    grads = [torch.randn(x.shape, device="cuda", generator=g) for x in (out, h_n, c_n)]
    args = (v.kernel_spec, highway, *grads, gates, cs, hin, out, proj, t["w_hh"], t["h0"], c0,
            bs, t["mask"])
    want = ext.plain_backward(*args)
    for blocks, tile in PERSISTENT_CONFIGS.values():
        got = ext.persistent_backward(*args, blocks, tile)
        for name, a, b in zip(["dproj", "dw_hh", "dh0", "dc0"], got, want):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4, msg=name)


@requires_cuda
@needs_cuda_kernel
@pytest.mark.parametrize("variant", STEP_VARIANTS)
@pytest.mark.parametrize("highway", [False, True])
def test_persistent_saves_what_the_step_kernel_saves(variant, highway):
    """The raw entry points, float32: out, h_n, c_n, cs, hin and the gate activations of the
    active rows as the step kernel's forward returns them (its backward reads them); inference
    (keep_hin=False) returns no gates."""
    ext = registry.cuda_kernel()
    v, t = _layer_tensors(variant, highway, torch.float32)
    proj = torch.nn.functional.linear(t["x"], t["w_ih"], torch.cat(
        [t["bias"], t["bias"].new_zeros(t["w_ih"].shape[0] - t["bias"].shape[0])])).contiguous()
    c0 = t["c0"] if v.has_memory else t["h0"]
    bs = torch.tensor([6, 6, 5, 5, 5, 4, 4, 3, 3, 2, 2, 0, 0])  # the last two steps: no row
    args = (v.kernel_spec, highway, proj, t["w_hh"], t["h0"], c0, bs, t["mask"])
    want = ext.plain_forward(*args, True)
    for blocks, tile in PERSISTENT_CONFIGS.values():
        got = ext.persistent_forward(*args, True, blocks, tile)
        for i, name in enumerate(["out", "h_n", "c_n"]):
            torch.testing.assert_close(got[i], want[i], atol=1e-5, rtol=1e-5, msg=name)
        for step, n in enumerate(bs.tolist()):
            torch.testing.assert_close(got[3][step, :n], want[3][step, :n], atol=1e-5,
                                       rtol=1e-5, msg=f"gates, step {step}")
            torch.testing.assert_close(got[4][step, :n], want[4][step, :n], atol=1e-5,
                                       rtol=1e-5, msg=f"cs, step {step}")
            if highway:
                torch.testing.assert_close(got[5][step, :n], want[5][step, :n], atol=1e-5,
                                           rtol=1e-5, msg=f"hin, step {step}")
        inference = ext.persistent_forward(*args, False, blocks, tile)
        assert inference[3].numel() == 0 and inference[5].numel() == 0
        for a, b in zip(inference[:3], got[:3]):
            torch.testing.assert_close(a, b, atol=0, rtol=0)


@requires_cuda
@needs_cuda_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("variant", ["ran", "lstm", "srnn"])
def test_persistent_module_matches_float64(dtype, variant):
    """A whole module: 2 layers, both directions, highway, padding, given h0/c0, training
    (gradients) and inference."""
    m = AblatedRNN(variant, 10, 32, num_layers=2, bidirectional=True, highway=True,
                   batch_first=True).cuda()
    m_half = copy.deepcopy(m).to(dtype)
    m64 = copy.deepcopy(m_half).double()
    x = torch.randn(5, 17, 10, device="cuda").to(dtype)
    h0 = (0.5 * torch.randn(4, 5, 32, device="cuda")).to(dtype)
    c0 = (0.5 * torch.randn(4, 5, 32, device="cuda")).to(dtype)
    lengths = torch.tensor([17, 9, 12, 3, 17])

    def run(model, x, state):
        out, (h, c) = model(x, state, lengths=lengths)
        (out.double().square().sum() + h.double().sum() + 2 * c.double().sum()).backward()
        return [out, h, c, x.grad] + [p.grad for p in model.parameters()]

    with use_backend("kernel"), _persistent():
        got = _persistent_ran(lambda: run(m_half, x.clone().requires_grad_(), (h0, c0)))
        with torch.no_grad():
            inf_out, (inf_h, inf_c) = m_half(x, (h0, c0), lengths=lengths)
    with use_backend("generic"):
        want = run(m64, x.double().requires_grad_(), (h0.double(), c0.double()))
    tol = PERSISTENT_TOL[dtype]
    for a, b in zip(got, want):
        assert a.dtype == dtype
        assert _rel_err(a, b) < tol
    for a, b in zip((inf_out, inf_h, inf_c), got[:3]):  # the same kernel without saving
        torch.testing.assert_close(a, b)


@requires_cuda
@needs_cuda_kernel
@pytest.mark.parametrize("variant", ["ran", "lstm"])
def test_persistent_long_sequence_spans_launches(variant):
    """More steps than one launch carries (1024): the second launch continues the first (forward
    and backward); a row ends exactly at the first forward launch's last step."""
    m = AblatedRNN(variant, 4, 8).cuda()
    x = torch.randn(1030, 3, 4, device="cuda")
    lengths = torch.tensor([1030, 1024, 3])
    with use_backend("kernel"):
        with use_cuda_recurrence("steps"), ra.use_cuda_graphs(False):
            want = _run_and_grads(m, x.clone().requires_grad_(), lengths=lengths)
        m.zero_grad()
        with _persistent(backward=True):
            got = _persistent_ran(
                lambda: _run_and_grads(m, x.clone().requires_grad_(), lengths=lengths), True)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-3)


@requires_cuda
@needs_cuda_kernel
@pytest.mark.parametrize("backward", [False, True], ids=["fwd", "fwd+bwd"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_persistent_graph_replay(fresh_graphs, dtype, backward):
    """With CUDA graphs on, the persistent forward (a cooperative launch) is captured and
    replayed, giving the eager numbers (training and inference)."""
    m = AblatedRNN("ran", 8, 16, num_layers=2, bidirectional=True, recurrent_dropout=0.25,
                   batch_first=True).cuda().to(dtype)
    xs = [torch.randn(4, 7, 8, device="cuda").to(dtype) for _ in range(4)]
    lengths = torch.tensor([7, 3, 5, 7])
    results = {}
    for graphs in (False, True):
        torch.manual_seed(3)
        with use_backend("kernel"), _persistent(graphs=graphs, backward=backward):
            results[graphs] = (_repeat_calls(m, xs, lengths, True)
                               + _repeat_calls(m, xs, lengths, False))
            stats = cuda_graphs.graph_stats()
    assert stats["captures"] > 0 and stats["replays"] > 0, stats
    assert stats["failed"] == 0, f"capture of the persistent kernel failed: {stats}"
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=1e-2, rtol=1e-2)
    for g, w in zip(results[True], results[False]):
        for a, b in zip(g, w):
            torch.testing.assert_close(a, b, **tol)


@requires_cuda
@needs_cuda_kernel
def test_persistent_under_autocast():
    m = AblatedRNN("ran", 12, 32, num_layers=2).cuda()
    x = torch.randn(9, 4, 12, device="cuda")
    ref = _run_and_grads(m, x.clone().requires_grad_())
    m.zero_grad()
    xg = x.clone().requires_grad_()
    with _persistent(), torch.autocast("cuda", dtype=torch.bfloat16):
        out, (h, c) = _persistent_ran(lambda: m(xg))
    assert out.dtype == torch.bfloat16
    (out.float().square().sum() + h.float().sum() + 2 * c.float().sum()).backward()
    got = [out, h, c, xg.grad] + [p.grad for p in m.parameters()]
    for a, b in zip(got, ref):
        assert _rel_err(a, b) < 2 * HALF_TOL[torch.bfloat16]


@requires_cuda
@needs_cuda_kernel
def test_persistent_forced_where_it_cannot_run():
    """float64, and a W_hh slice too large for one block's shared memory: a clear error that
    names the fix; the step kernel runs the same layer under auto."""
    m = AblatedRNN("lstm", 8, 512).cuda()
    x = torch.randn(3, 2, 8, device="cuda")
    with _persistent(), pytest.raises(ValueError, match="float64.*'steps'"):
        m.double()(x.double())
    m.float()
    with _persistent("one_block"), pytest.raises(ValueError, match="shared memory"):
        m(x)  # all 512 units in one block: 4 MiB of W_hh
    with use_cuda_recurrence("auto"):
        m(x)


@requires_cuda
@needs_cuda_kernel
@pytest.mark.parametrize("dtype", PERSISTENT_DTYPES, ids=str)
@pytest.mark.parametrize("variant,hidden", [("ran", 256), ("ran", 650), ("lstm", 650)])
def test_persistent_applies_to_the_benchmark_shapes(dtype, variant, hidden):
    """The benchmark's shapes (B = 32) fit: every unit in a block, all blocks resident."""
    v = get_variant(variant)
    proj = torch.empty(2, 32, v.num_recurrent(False) * hidden + v.num_input_only(False) * hidden,
                       device="cuda", dtype=dtype)
    w_hh = torch.empty(v.num_recurrent(False) * hidden, hidden, device="cuda", dtype=dtype)
    for backward in (False, True):
        ok, why, blocks, units, tile, smem = registry.cuda_kernel().persistent_plan(
            v.kernel_spec, False, proj, w_hh, 0, 0, backward)
        assert ok, why
        assert blocks * units >= hidden > (blocks - 1) * units
        assert blocks <= torch.cuda.get_device_properties(0).multi_processor_count
        assert 1 <= tile <= 32 and smem > 0


def test_speed_recurrence_choices():
    from rnn_ablations.commands.speed import measure
    with pytest.raises(ValueError, match="recurrence must be one of auto, steps, persistent, both"):
        measure(hidden_sizes=(4,), batch=1, seq_len=2, repeats=1, variants=["ran"],
                recurrence="fast")
    rows = measure(hidden_sizes=(4,), batch=1, seq_len=2, repeats=1, warmup=0, variants=["ran"],
                   recurrence="both")  # on the CPU: no CUDA recurrence, no persistent rows
    assert {r["model"] for r in rows} == {"nn.LSTM", "ran"}
    assert {r["recurrence"] for r in rows} == {"-"}


@requires_cuda
@needs_cuda_kernel
def test_speed_rows_of_the_persistent_kernel():
    from rnn_ablations.commands.speed import measure
    rows = measure(hidden_sizes=(16,), batch=2, seq_len=3, repeats=1, warmup=0,
                   variants=["ran"], device="cuda", recurrence="both", dtype="bfloat16")
    got = {(r["model"], r["mode"]): r for r in rows}
    assert set(got) == {(m, mode) for m in ("nn.LSTM", "ran", "ran [persistent]")
                        for mode in ("train", "inference")}
    assert got[("ran", "train")]["recurrence"] == "steps"
    assert got[("ran [persistent]", "inference")]["recurrence"] == "persistent"
    assert all(r["dtype"] == "bfloat16" for r in rows)
    calls = got[("ran [persistent]", "train")]["cuda_graph_calls"]
    assert calls["replays"] + calls["eager"] >= 2  # the forward and backward of the round
