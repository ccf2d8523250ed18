"""The run plan (rnn_ablations.plan.plan_layer): each decision from a table of settings, call
shapes, devices, dtypes, gradient modes and threads, without running a layer; the environment
variables that set the defaults; and that the layer calls do what the plan says."""
import dataclasses

import pytest
import torch

import rnn_ablations as ra
from conftest import run_python
from rnn_ablations import dispatch, plan as P, settings
from rnn_ablations.plan import Kernels, LayerCall, Plan, Policy, plan_layer
from rnn_ablations.settings import Options

#: a process with every kernel
ALL = Kernels(cpu=True, cuda=True, cpu_scan=True, cuda_scan=True, persistent=True,
              onednn=True, isa="avx2")
NONE = Kernels(cpu_error="no compiler", cuda_error="no nvcc")
POLICY = Policy()


def call(**kw) -> LayerCall:
    """A small CPU LSTM layer: T = 8, B = 2, H = 3, R = 4 (step GEMM 72 multiply-adds)."""
    base = dict(device="cpu", dtype=torch.float32, steps=8, batch=2, hidden=3, rec_blocks=4,
                proj_weight=36, directions=1, needs_grad=True, threads=2)
    base.update(kw)
    return LayerCall(**base)


#: (id, settings, call, kernels, expected Plan fields)
STEP_CASES = [
    # implementation
    ("cpu f32", {}, {}, ALL, dict(path="cpu", isa="avx2")),
    ("cpu f64", {}, dict(dtype=torch.float64), ALL, dict(path="cpu")),
    ("cpu bf16: the float32 kernels", {}, dict(dtype=torch.bfloat16), ALL,
     dict(path="cpu", bf16_on_f32=True)),
    ("cpu bf16, generic backend", dict(backend="generic"), dict(dtype=torch.bfloat16), ALL,
     dict(path="generic", bf16_on_f32=False)),
    ("cpu bf16 without a kernel: generic, warned", {}, dict(dtype=torch.bfloat16), NONE,
     dict(path="generic", bf16_on_f32=False)),
    ("cpu f16: generic", {}, dict(dtype=torch.float16), ALL, dict(path="generic")),
    ("generic backend", dict(backend="generic"), {}, ALL, dict(path="generic", schedule=None)),
    ("no cpu kernel warns", {}, {}, NONE,
     dict(path="generic", warning=("CPU", "rnn_ablations: compiled CPU kernel unavailable (no "
                                          "compiler); using the slower generic path"))),
    ("empty batch", {}, dict(batch=0), ALL, dict(path="generic")),
    ("empty steps", dict(backend="kernel"), dict(steps=0), ALL, dict(path="generic")),
    ("cuda f32", {}, dict(device="cuda"), ALL,
     dict(path="cuda", recurrence="steps", graphs=True, schedule=None, isa=None)),
    ("cuda bf16", {}, dict(device="cuda", dtype=torch.bfloat16), ALL, dict(path="cuda")),
    ("cuda no kernel", {}, dict(device="cuda"), NONE,
     dict(path="generic", warning=("CUDA", "rnn_ablations: compiled CUDA kernel unavailable (no "
                                           "nvcc); using the slower generic path"))),
    ("mps -> generic", {}, dict(device="mps"), ALL, dict(path="generic")),
    # CPU autocast in bfloat16: the float32 kernels (autocast off inside), bfloat16 results
    ("cpu autocast", {}, dict(autocast_dtype=torch.bfloat16), ALL,
     dict(path="cpu", bf16_on_f32=True, concurrent=False)),
    ("cpu autocast f16: generic", {}, dict(autocast_dtype=torch.float16), ALL,
     dict(path="generic", bf16_on_f32=False)),
    ("cpu autocast f64", {}, dict(dtype=torch.float64, autocast_dtype=torch.bfloat16), ALL,
     dict(path="cpu", schedule="pipelined")),
    ("cuda autocast", {}, dict(device="cuda", autocast_dtype=torch.float16), ALL,
     dict(path="cuda")),
    # CPU schedule (auto)
    ("short: plain", {}, dict(steps=3), ALL, dict(schedule="plain")),
    ("2 threads, small step: pipelined", {}, {}, ALL, dict(schedule="pipelined")),
    ("2 threads, 54 M step: plain", {}, dict(batch=32, hidden=650), ALL,
     dict(schedule="plain")),
    ("2 threads, 18.9 M step, training: pipelined", {}, dict(batch=32, hidden=384), ALL,
     dict(schedule="pipelined")),
    ("2 threads, 18.9 M step, inference: plain", {},
     dict(batch=32, hidden=384, needs_grad=False), ALL, dict(schedule="plain")),
    ("1 thread, big step: pipelined", {}, dict(batch=32, hidden=650, threads=1), ALL,
     dict(schedule="pipelined")),
    ("1 thread, inference, oneDNN weight: plain on oneDNN", {},
     dict(threads=1, needs_grad=False, proj_weight=640_000), ALL,
     dict(schedule="plain", onednn=True)),
    ("1 thread, inference, oneDNN weight, f64: pipelined", {},
     dict(threads=1, needs_grad=False, proj_weight=640_000, dtype=torch.float64), ALL,
     dict(schedule="pipelined", onednn=False)),
    ("1 thread, inference, no oneDNN: pipelined", {},
     dict(threads=1, needs_grad=False, proj_weight=640_000),
     dataclasses.replace(ALL, onednn=False), dict(schedule="pipelined", onednn=False)),
    ("1 thread, training, oneDNN weight: pipelined", {},
     dict(threads=1, proj_weight=640_000), ALL, dict(schedule="pipelined", onednn=False)),
    ("forced plain", dict(cpu_schedule="plain"), {}, ALL, dict(schedule="plain")),
    ("forced pipelined, 1 step", dict(cpu_schedule="pipelined"), dict(steps=1), ALL,
     dict(schedule="pipelined")),
    ("forced pipelined, big step", dict(cpu_schedule="pipelined"),
     dict(batch=32, hidden=650), ALL, dict(schedule="pipelined")),
    ("chunk", dict(pipeline_chunk=3), {}, ALL, dict(chunk=3)),
    # concurrent directions
    ("bi, 2 threads: concurrent pipelined", {}, dict(directions=2), ALL,
     dict(concurrent=True, schedule="pipelined")),
    ("bi, 2 threads, short: concurrent plain", {}, dict(directions=2, steps=3), ALL,
     dict(concurrent=True, schedule="plain")),
    ("bi, 2 threads, big step: concurrent pipelined (one thread each)", {},
     dict(directions=2, batch=32, hidden=650), ALL, dict(concurrent=True, schedule="pipelined")),
    ("bi, 1 thread: one after the other", {}, dict(directions=2, threads=1), ALL,
     dict(concurrent=False, schedule="pipelined")),
    ("bi, 1 thread, on", dict(concurrent_directions="on"), dict(directions=2, threads=1), ALL,
     dict(concurrent=True)),
    ("bi, 3 threads, small step: concurrent", {}, dict(directions=2, threads=3), ALL,
     dict(concurrent=True)),
    ("bi, 3 threads, inference above the threshold: not", {},
     dict(directions=2, threads=3, needs_grad=False, batch=32, hidden=384), ALL,
     dict(concurrent=False, schedule="plain")),
    ("bi, off", dict(concurrent_directions="off"), dict(directions=2), ALL,
     dict(concurrent=False, schedule="pipelined")),
    ("bi, on, forced plain", dict(concurrent_directions="on", cpu_schedule="plain"),
     dict(directions=2), ALL, dict(concurrent=True, schedule="plain")),
    ("bi, mixed shapes: not", {}, dict(directions=2, uniform=False), ALL,
     dict(concurrent=False)),
    ("bi, f64 under cpu autocast: not", dict(concurrent_directions="on"),
     dict(directions=2, dtype=torch.float64, autocast_dtype=torch.bfloat16), ALL,
     dict(path="cpu", concurrent=False)),
    ("bi, cuda: never", dict(concurrent_directions="on"), dict(directions=2, device="cuda"),
     ALL, dict(concurrent=False)),
    # CUDA recurrence and graphs
    ("cuda auto = steps", dict(cuda_recurrence="auto"), dict(device="cuda"), ALL,
     dict(recurrence="steps", persistent=(0, 0, False))),
    ("cuda persistent", dict(cuda_recurrence="persistent", persistent_blocks=5,
                             persistent_batch_tile=4, persistent_backward=True),
     dict(device="cuda"), ALL, dict(recurrence="persistent", persistent=(5, 4, True))),
    ("cuda graphs off", dict(cuda_graphs=False), dict(device="cuda"), ALL, dict(graphs=False)),
    ("cpu: no graphs", {}, {}, ALL, dict(graphs=False, recurrence=None)),
]


@pytest.mark.parametrize("name,settings,kw,kernels,want", STEP_CASES,
                         ids=[c[0] for c in STEP_CASES])
def test_step_cell_plan(name, settings, kw, kernels, want):
    got = plan_layer(Options(**settings), call(**kw), kernels, POLICY)
    assert isinstance(got, Plan)
    for field, value in want.items():
        assert getattr(got, field) == value, (field, got)


#: cells that read no h_{t-1}: the scan
SCAN_CASES = [
    ("fused", {}, {}, ALL, dict(path="cpu", schedule="fused_scan")),
    ("fused cuda", {}, dict(device="cuda", dtype=torch.float16), ALL,
     dict(path="cuda", schedule="fused_scan")),
    ("empty: two nodes", {}, dict(batch=0), ALL, dict(path="cpu", schedule="scan")),
    ("mixed dtypes: two nodes", {}, dict(uniform=False), ALL, dict(schedule="scan")),
    ("cuda autocast: two nodes in the autocast dtype", {},
     dict(device="cuda", autocast_dtype=torch.bfloat16), ALL, dict(path="cuda", schedule="scan")),
    ("cpu autocast: the float32 scan", {}, dict(autocast_dtype=torch.bfloat16), ALL,
     dict(path="cpu", schedule="fused_scan", bf16_on_f32=True, bf16_gemm=False)),
    ("generic backend", dict(backend="generic"), {}, ALL, dict(path="generic", onednn=False)),
    ("no layout", {}, dict(scan_layout=False), ALL, dict(path="generic")),
    ("kernel without the scan warns", {}, {},
     Kernels(cpu=True, cpu_error="rebuild it"),
     dict(path="generic", warning=("CPU scan", "rnn_ablations: compiled CPU scan kernel "
                                               "unavailable (rebuild it); using the slower "
                                               "generic path"))),
    ("oneDNN for both directions' weights", {}, dict(proj_weight=640_000, directions=2), ALL,
     dict(onednn=True)),
]


@pytest.mark.parametrize("name,settings,kw,kernels,want", SCAN_CASES,
                         ids=[c[0] for c in SCAN_CASES])
def test_scan_cell_plan(name, settings, kw, kernels, want):
    got = plan_layer(Options(**settings), call(rec_blocks=0, **kw), kernels, POLICY)
    for field, value in want.items():
        assert getattr(got, field) == value, (field, got)


@pytest.mark.parametrize("kw,kernels,match", [
    (dict(dtype=torch.float16), ALL, "CPU float32/float64 and CUDA"),
    (dict(device="mps"), ALL, "got mps"),
    ({}, NONE, "CPU kernel is not available: no compiler"),
    (dict(device="cuda"), NONE, "CUDA kernel is not available: no nvcc"),
    (dict(rec_blocks=0), Kernels(cpu=True, cpu_error="rebuild it"),
     "CPU scan kernel is not available: rebuild it"),
])
def test_kernel_backend_refuses_with_the_reason(kw, kernels, match):
    with pytest.raises(RuntimeError, match=match):
        plan_layer(Options(backend="kernel"), call(**kw), kernels, POLICY)


def test_persistent_without_the_kernel_says_what_to_do():
    with pytest.raises(RuntimeError, match="no persistent kernel.*cuda_recurrence='steps'"):
        plan_layer(Options(cuda_recurrence="persistent"), call(device="cuda"),
                   dataclasses.replace(ALL, persistent=False), POLICY)


def test_policy_thresholds_are_inputs():
    """The thresholds come from the Policy argument: moving one moves the decision."""
    c = call(batch=32, hidden=384, needs_grad=False)  # 18.9 M multiply-adds per step
    assert plan_layer(Options(), c, ALL, POLICY).schedule == "plain"
    loose = Policy(max_step_macs_inference=20_000_000)
    assert plan_layer(Options(), c, ALL, loose).schedule == "pipelined"
    assert plan_layer(Options(), call(steps=3), ALL, Policy(min_steps=2)).schedule == "pipelined"
    big = call(threads=1, needs_grad=False, proj_weight=1000)
    assert plan_layer(Options(), big, ALL, Policy(onednn_min_weight=1000)).onednn


def test_onednn_threshold_per_cpu_vendor(monkeypatch):
    """``Policy.onednn_min_weight_by_vendor`` replaces the threshold on CPUs of that vendor
    (``Kernels.cpu_vendor``), for step cells and the scan alike; other vendors, and a CPU whose
    vendor is not known, keep ``onednn_min_weight``; a malformed entry is refused."""
    policy = Policy(onednn_min_weight=500_000, onednn_min_weight_by_vendor=(("amd", 400_000),))
    step = call(threads=1, needs_grad=False, proj_weight=409_600)
    scan = call(threads=1, needs_grad=False, proj_weight=409_600, rec_blocks=0)
    for c in (step, scan):
        amd = plan_layer(Options(), c, dataclasses.replace(ALL, cpu_vendor="amd"), policy)
        intel = plan_layer(Options(), c, dataclasses.replace(ALL, cpu_vendor="intel"), policy)
        unknown = plan_layer(Options(), c, ALL, policy)
        assert (amd.onednn, intel.onednn, unknown.onednn) == (True, False, False), c
        # the threshold the call was planned with is a field of its plan (explain prints it)
        assert (amd.onednn_min_weight, intel.onednn_min_weight) == (400_000, 500_000), c
    assert plan_layer(Options(), call(device="cuda"), ALL, policy).onednn_min_weight == 0
    assert P.onednn_min_weight(policy, "amd") == 400_000
    assert P.onednn_min_weight(policy, None) == P.onednn_min_weight(policy, "intel") == 500_000
    with pytest.raises(ValueError, match=r"\(vendor, min_weight\)"):
        Policy(onednn_min_weight_by_vendor=(("amd",),))
    # the process's vendor, as registry.kernels() records it, from /proc/cpuinfo
    from rnn_ablations.kernels import registry
    assert registry.kernels().cpu_vendor == registry.cpu_vendor()
    assert registry.cpu_vendor() in ("intel", "amd", None)


def test_bf16_instructions_are_a_field_of_kernels(monkeypatch):
    """Whether the CPU has bfloat16 GEMM instructions reaches the plan as ``Kernels.bf16_gemm``
    (``registry.kernels()`` probes it): ``Policy.bf16_gemm="auto"`` follows it, the plan of a
    bfloat16 call carries it (``Plan.bf16_instructions``, which explain prints), and the plan
    asks the machine nothing itself (a probe patched to say the opposite changes no plan)."""
    from rnn_ablations.explanation import plan_in_words
    from rnn_ablations.kernels import registry
    bf16 = call(dtype=torch.bfloat16)
    with_isa = dataclasses.replace(ALL, bf16_gemm=True)
    for probe in (False, True):
        monkeypatch.setattr(registry, "cpu_has_bf16_gemm", lambda probe=probe: probe)
        monkeypatch.setattr(P, "cpu_has_bf16_gemm", lambda probe=probe: probe, raising=False)
        plain = Options(cpu_schedule="plain")  # (the pipelined kernel projects inside)
        without = plan_layer(plain, bf16, ALL, POLICY)
        assert not without.bf16_gemm and not without.bf16_instructions
        got = plan_layer(plain, bf16, with_isa, POLICY)
        assert got.bf16_on_f32 and got.bf16_gemm and got.bf16_instructions and not got.onednn, got
        # explain says what the plan read of the machine
        assert "this CPU has bfloat16 GEMM instructions" in "\n".join(plan_in_words(got, bf16))
        assert "this CPU has no bfloat16 GEMM instructions" in "\n".join(
            plan_in_words(without, bf16))
        # the step GEMM's default stays float32 until measured on such a CPU
        assert not got.bf16_step_gemm
        assert plan_layer(plain, bf16, with_isa, Policy(bf16_step_gemm="auto")).bf16_step_gemm
    monkeypatch.undo()
    assert registry.kernels().bf16_gemm == registry.cpu_has_bf16_gemm()
    # a float32 call reads nothing of it
    assert not plan_layer(Options(), call(), with_isa, POLICY).bf16_instructions


def test_the_plan_is_pure():
    """Same arguments, same plan, and the cached form agrees."""
    args = (Options(), call(directions=2), ALL, POLICY)
    assert plan_layer(*args) == plan_layer(*args) == P.cached_plan(*args)


# --------------------------------------------------------------------------- one decision
#: a large no-gradient LSTM layer: T = 1000, B = 1000, 4H = 256 (1 GB of projections)
BIG = dict(steps=1000, batch=1000, hidden=64, proj_weight=256 * 64, proj_width=256,
           needs_grad=False)


def test_streaming_is_a_field_of_the_plan():
    want = P.stream_steps(1000, 1000, 256, 4, POLICY.stream_min_bytes, POLICY.stream_chunk_bytes)
    assert want > 0
    p = plan_layer(Options(), call(**BIG), ALL, POLICY)
    assert (p.stream, p.runner, p.schedule) == (want, "cpu_streamed", "plain")
    scan = plan_layer(Options(), call(rec_blocks=0, **BIG), ALL, POLICY)
    assert (scan.stream, scan.runner) == (want, "scan_streamed")
    bf16 = plan_layer(Options(), call(dtype=torch.bfloat16, **BIG), ALL, POLICY)
    assert (bf16.stream, bf16.runner, bf16.bf16_on_f32) == (want, "cpu_streamed", True)
    f64 = plan_layer(Options(), call(dtype=torch.float64, **BIG), ALL, POLICY)
    assert f64.stream == P.stream_steps(1000, 1000, 256, 8, POLICY.stream_min_bytes,
                                        POLICY.stream_chunk_bytes)
    for name, kw, settings_ in [("gradient", dict(needs_grad=True), {}),
                                ("compiling", dict(compiling=True), {}),
                                ("subclass", dict(plain_tensor=False), {}),
                                ("reversal", dict(directions=2, reversal=False), {}),
                                ("generic", {}, dict(backend="generic")),
                                ("f16 autocast", dict(autocast_dtype=torch.float16), {}),
                                ("small", dict(steps=10), {})]:
        got = plan_layer(Options(**settings_), call(**dict(BIG, **kw)), ALL, POLICY)
        assert got.stream == 0 and got.runner != "cpu_streamed", name
    # a scan cell reverses its second direction itself
    assert plan_layer(Options(), call(rec_blocks=0, directions=2, reversal=False, **BIG), ALL,
                      POLICY).runner == "scan_streamed"


def test_step_gemm_thresholds_are_a_field_of_the_plan():
    pol = Policy(library_step_gemm=(("avx2", 5, 6), ("avx512", 7, 8)))
    assert plan_layer(Options(), call(), ALL, pol).step_gemm == (5, 6)
    assert plan_layer(Options(), call(), dataclasses.replace(ALL, isa="avx512"),
                      pol).step_gemm == (7, 8)
    assert plan_layer(Options(), call(), dataclasses.replace(ALL, isa="portable"),
                      pol).step_gemm == (-1, -1)
    assert plan_layer(Options(), call(rec_blocks=0), ALL, pol).step_gemm == (-1, -1)
    assert plan_layer(Options(backend="generic"), call(), ALL, pol).step_gemm == (-1, -1)


def test_bf16_gemm_where_the_runner_projects():
    on, off = Policy(bf16_gemm="on"), Policy(bf16_gemm="off")
    plain = plan_layer(Options(), call(dtype=torch.bfloat16, steps=3), ALL, on)
    assert (plain.runner, plain.bf16_gemm, plain.onednn) == ("cpu_plain", True, False)
    assert not plan_layer(Options(), call(dtype=torch.bfloat16, steps=3), ALL, off).bf16_gemm
    piped = plan_layer(Options(), call(dtype=torch.bfloat16), ALL, on)
    assert (piped.runner, piped.bf16_gemm) == ("cpu_pipelined", False)  # projects inside
    assert not plan_layer(Options(), call(steps=3), ALL, on).bf16_gemm  # a float32 call


def test_a_cuda_family_that_failed_its_check_is_not_available():
    failed = ("cuda:0", "step_forward[float32]+step_backward[float32]", "d_proj differs")
    p = plan_layer(Options(), call(device="cuda"), ALL, POLICY, failed)
    assert (p.path, p.runner) == ("generic", "generic")
    assert "step_forward[float32]+step_backward[float32] failed their check on cuda:0" in p.reason
    scan = plan_layer(Options(), call(device="cuda", rec_blocks=0), ALL, POLICY, failed)
    assert scan.runner == "generic_scan"
    with pytest.raises(RuntimeError, match=r"backend='kernel': the CUDA kernels step_forward"
                                           r"\[float32\]\+step_backward\[float32\] failed their "
                                           r"check on cuda:0 \(d_proj differs\)"):
        plan_layer(Options(backend="kernel"), call(device="cuda"), ALL, POLICY, failed)
    # a CPU call is not concerned
    assert plan_layer(Options(), call(), ALL, POLICY, failed).path == "cpu"


def test_proj_size_is_the_generic_projected_runner():
    for kw in ({}, dict(rec_blocks=0), dict(device="cuda"), dict(dtype=torch.bfloat16)):
        p = plan_layer(Options(backend="kernel"), call(projected=True, **kw), ALL, POLICY)
        assert (p.path, p.runner) == ("generic", "generic_projected"), kw


# --------------------------------------------------------------------------- environment
ENV_CASES = [
    ({}, {}),
    ({"RNN_ABLATIONS_BACKEND": "generic"}, dict(backend="generic")),
    ({"RNN_ABLATIONS_BACKEND": " Kernel "}, dict(backend="kernel")),
    ({"RNN_ABLATIONS_ISA": "portable"}, dict(kernel_isa="portable")),
    ({"RNN_ABLATIONS_ISA": ""}, dict(kernel_isa="auto")),
    ({"RNN_ABLATIONS_CPU_SCHEDULE": "pipelined"}, dict(cpu_schedule="pipelined")),
    ({"RNN_ABLATIONS_CONCURRENT_DIRECTIONS": "off"}, dict(concurrent_directions="off")),
    ({"RNN_ABLATIONS_PIPELINE_CHUNK": "7"}, dict(pipeline_chunk=7)),
    ({"RNN_ABLATIONS_CUDA_RECURRENCE": "persistent"}, dict(cuda_recurrence="persistent")),
    ({"RNN_ABLATIONS_CUDA_GRAPHS": "0"}, dict(cuda_graphs=False)),
    ({"RNN_ABLATIONS_CUDA_GRAPHS": "off"}, dict(cuda_graphs=False)),
    ({"RNN_ABLATIONS_CUDA_GRAPHS": "on"}, dict(cuda_graphs=True)),
    ({"RNN_ABLATIONS_CUDA_GRAPHS_MAX": "2"}, dict(cuda_graphs_max=2)),
    ({"RNN_ABLATIONS_PERSISTENT_BLOCKS": "3"}, dict(persistent_blocks=3)),
    ({"RNN_ABLATIONS_PERSISTENT_BATCH_TILE": "0"}, dict(persistent_batch_tile=0)),
    ({"RNN_ABLATIONS_PERSISTENT_BACKWARD": "1"}, dict(persistent_backward=True)),
    ({"RNN_ABLATIONS_DISABLE_KERNEL": "1"}, dict(backend="generic")),
    ({"RNN_ABLATIONS_DISABLE_KERNEL": "1", "RNN_ABLATIONS_BACKEND": "generic"},
     dict(backend="generic")),
]


@pytest.mark.parametrize("env,want", ENV_CASES, ids=[",".join(e) or "none" for e, _ in ENV_CASES])
def test_environment_sets_the_defaults(env, want):
    assert settings.from_environment(env) == Options(**want)


def test_every_setting_has_one_variable():
    assert sorted(name for name, _ in settings.ENVIRONMENT.values()) == \
        sorted(f.name for f in dataclasses.fields(Options))


@pytest.mark.parametrize("env,match", [
    ({"RNN_ABLATIONS_BACKEND": "fast"}, "RNN_ABLATIONS_BACKEND must be one of auto, kernel, "
                                        "generic, got 'fast'"),
    ({"RNN_ABLATIONS_ISA": "sse9"}, "RNN_ABLATIONS_ISA must be one of auto, avx512, avx2"),
    ({"RNN_ABLATIONS_CPU_SCHEDULE": "always"}, "auto, plain, pipelined"),
    ({"RNN_ABLATIONS_CONCURRENT_DIRECTIONS": "2"}, "auto, on, off"),
    ({"RNN_ABLATIONS_CUDA_RECURRENCE": "fast"}, "auto, steps, persistent"),
    ({"RNN_ABLATIONS_CUDA_GRAPHS": "maybe"}, "RNN_ABLATIONS_CUDA_GRAPHS must be 0 or 1"),
    ({"RNN_ABLATIONS_PERSISTENT_BACKWARD": "2"}, "RNN_ABLATIONS_PERSISTENT_BACKWARD must be 0 or 1"),
    ({"RNN_ABLATIONS_PIPELINE_CHUNK": "-1"}, "RNN_ABLATIONS_PIPELINE_CHUNK must be an integer >= 0"),
    ({"RNN_ABLATIONS_CUDA_GRAPHS_MAX": "many"}, "RNN_ABLATIONS_CUDA_GRAPHS_MAX must be an integer"),
    ({"RNN_ABLATIONS_PERSISTENT_BLOCKS": "1.5"}, "RNN_ABLATIONS_PERSISTENT_BLOCKS must be an integer"),
    ({"RNN_ABLATIONS_PERSISTENT_BATCH_TILE": "x"}, "RNN_ABLATIONS_PERSISTENT_BATCH_TILE must be"),
    ({"RNN_ABLATIONS_DISABLE_KERNEL": "1", "RNN_ABLATIONS_BACKEND": "kernel"},
     "RNN_ABLATIONS_DISABLE_KERNEL=1 keeps the compiled kernels from loading"),
])
def test_bad_environment_names_the_variable_and_the_values(env, match):
    with pytest.raises(ValueError, match=match):
        settings.from_environment(env)


def test_bad_environment_stops_the_import(tmp_path):
    """A bad value fails at import with the variable's name, not mid-run."""
    r = run_python("import rnn_ablations", env={"RNN_ABLATIONS_CPU_SCHEDULE": "sometimes",
                                                "RNN_ABLATIONS_NO_KERNEL": "1"})
    assert r.returncode != 0
    assert "RNN_ABLATIONS_CPU_SCHEDULE must be one of auto, plain, pipelined" in r.stderr


def test_environment_reaches_the_layers(tmp_path):
    """RNN_ABLATIONS_BACKEND=generic and RNN_ABLATIONS_CPU_SCHEDULE=plain, set before import,
    are the defaults the plan of a real layer sees."""
    script = ("import torch, rnn_ablations as ra\n"
              "from rnn_ablations import dispatch\n"
              "x, w = torch.randn(8, 2, 3), torch.randn(12, 3)\n"
              "print(ra.get_options().backend, ra.get_options().cpu_schedule,\n"
              "      dispatch.layer_plan([x], [(w, w, None)]).path)\n"
              "ra.set_options(backend='auto')\n"
              "p = dispatch.layer_plan([x], [(w, w, None)])\n"
              "print(p.path, p.schedule if ra.kernel_available() else 'plain')\n")
    r = run_python(script, env={"RNN_ABLATIONS_BACKEND": "generic",
                                "RNN_ABLATIONS_CPU_SCHEDULE": "plain"}, timeout=600)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.split("\n")
    assert lines[0] == "generic plain generic"
    want = "cpu plain" if ra.kernel_available() else "generic plain"
    assert lines[1] == want


# --------------------------------------------------------------------------- plans of real calls
@pytest.mark.skipif(not ra.kernel_available(), reason="CPU kernel not built")
def test_layer_calls_follow_the_plan(monkeypatch):
    """What a layer call runs is what layer_plan says, for each schedule the plan can name."""
    from rnn_ablations.kernels import autograd as kernel_autograd

    ran = []
    for name in ("_PipelinedDirections", "_KernelDirections", "_PipelinedLayer", "_KernelLayer"):
        fn = getattr(kernel_autograd, name)
        original = fn.apply

        def spy(*args, _name=name, _original=original):
            ran.append(_name)
            return _original(*args)
        monkeypatch.setattr(fn, "apply", spy)
    m = ra.AblatedRNN("lstm", 5, 4, bidirectional=True)
    x = torch.randn(6, 2, 5)
    params = [m.layer_parameters(0, d) for d in range(2)]
    want = {(True, "pipelined"): ["_PipelinedDirections"],
            (True, "plain"): ["_KernelDirections"],
            (False, "pipelined"): ["_PipelinedLayer"] * 2,
            (False, "plain"): ["_KernelLayer"] * 2}
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        for directions in ("on", "off"):
            for schedule in ("pipelined", "plain"):
                with ra.options(concurrent_directions=directions, cpu_schedule=schedule):
                    plan = dispatch.layer_plan([x, x], params)
                    ran.clear()
                    m(x)
                assert (plan.concurrent, plan.schedule) == (directions == "on", schedule)
                assert ran == want[(plan.concurrent, plan.schedule)], (directions, schedule)
        with ra.options(backend="generic"):
            assert dispatch.layer_plan([x, x], params).path == "generic"
            ran.clear()
            m(x)
        assert ran == []
    finally:
        torch.set_num_threads(old)
