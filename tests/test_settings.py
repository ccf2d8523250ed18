"""rnn_ablations.settings: a module apart (it imports nothing of the package), environment values
checked when they are read (their range included), process-wide settings that two threads'
blocks cannot overlap on, the fallback warning outside a traced graph; rnn_ablations.options /
set_options / get_options: nesting and restoring, per-thread isolation, the process-wide
settings, validation, and the short forms (use_backend, set_cuda_graphs, use_cuda_recurrence,
...)."""
import ast
import dataclasses
import os
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import pytest
import torch

import rnn_ablations as ra
from conftest import requires_kernel, run_python
from rnn_ablations import aliases, dispatch, settings, use_cuda_recurrence
from rnn_ablations.kernels import registry
from rnn_ablations.plan import Kernels
from rnn_ablations.settings import Options

SETTINGS_FILE = Path(settings.__file__)
SWITCHES = ("RNN_ABLATIONS_NO_KERNEL", "RNN_ABLATIONS_DISABLE_KERNEL")


def _run(code, env):
    """``python -c code`` with the kernel switch's two names taken from ``env`` only."""
    full = {k: v for k, v in os.environ.items() if k not in SWITCHES}
    full.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full,
                          timeout=300)


def test_the_settings_module_imports_nothing_of_the_package():
    tree = ast.parse(SETTINGS_FILE.read_text())
    relative = [(node.module or "") + ":" + ",".join(a.name for a in node.names)
                for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level > 0]
    absolute = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names if alias.name.startswith("rnn_ablations")]
    assert relative == [":_env"] and not absolute, (relative, absolute)
    # and it loads on its own (with the kernel switch it reads), without torch
    code = ("import sys, types\n"
            "pkg = types.ModuleType('rnn_ablations')\n"
            f"pkg.__path__ = [{str(SETTINGS_FILE.parent)!r}]\n"
            "sys.modules['rnn_ablations'] = pkg\n"
            "import rnn_ablations.settings as m\n"
            "loaded = sorted(k for k in sys.modules if k.startswith('rnn_ablations.') or k == 'rnn_ablations')\n"
            "assert loaded == ['rnn_ablations', 'rnn_ablations._env', 'rnn_ablations.settings'], "
            "loaded\n"
            "assert 'torch' not in sys.modules\n"
            "print(m.get_options().backend)")
    r = _run(code, {"RNN_ABLATIONS_NO_KERNEL": "1"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "generic"


@pytest.mark.parametrize("env,backend", [
    ({"RNN_ABLATIONS_NO_KERNEL": "1"}, "generic"),
    ({"RNN_ABLATIONS_DISABLE_KERNEL": "1"}, "generic"),
    ({"RNN_ABLATIONS_NO_KERNEL": "0"}, "auto"),
    ({"RNN_ABLATIONS_NO_KERNEL": "1", "RNN_ABLATIONS_BACKEND": "generic"}, "generic"),
])
def test_the_kernel_switch_makes_generic_the_default(env, backend):
    assert settings.from_environment(env).backend == backend


@pytest.mark.parametrize("env,match", [
    ({"RNN_ABLATIONS_NO_KERNEL": "yes"}, "RNN_ABLATIONS_NO_KERNEL='yes' is not understood"),
    ({"RNN_ABLATIONS_DISABLE_KERNEL": "true"}, "RNN_ABLATIONS_DISABLE_KERNEL='true' is not"),
    ({"RNN_ABLATIONS_NO_KERNEL": "1", "RNN_ABLATIONS_BACKEND": "kernel"},
     "RNN_ABLATIONS_NO_KERNEL=1 keeps the compiled kernels from loading, but "
     "RNN_ABLATIONS_BACKEND=kernel asks for one"),
])
def test_the_kernel_switch_refuses_other_values(env, match):
    with pytest.raises(ValueError, match=match):
        settings.from_environment(env)


def test_with_the_kernel_switch_the_plan_names_the_generic_path():
    code = ("import torch\n"
            "from rnn_ablations import dispatch\n"
            "x, w = torch.randn(6, 2, 4), torch.randn(16, 4)\n"
            "print(dispatch.layer_plan([x], [(w, w, None)]).runner)")
    for var in SWITCHES:
        r = _run(code, {var: "1"})
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == "generic", (var, r.stdout)


@pytest.mark.parametrize("value", ["99999999999999999999999", "2147483648", "-3", "1e3"])
def test_a_count_out_of_range_is_refused_naming_the_variable(value):
    with pytest.raises(ValueError, match="RNN_ABLATIONS_PIPELINE_CHUNK must be an integer >= 0 "
                                         "and <= 2147483647"):
        settings.from_environment({"RNN_ABLATIONS_PIPELINE_CHUNK": value})
    assert settings.from_environment({"RNN_ABLATIONS_PIPELINE_CHUNK": "2147483647"}) \
        .pipeline_chunk == 2 ** 31 - 1


def test_a_count_out_of_range_stops_the_import():
    r = run_python("import rnn_ablations",
                   env={"RNN_ABLATIONS_PIPELINE_CHUNK": "99999999999999999999999",
                        "RNN_ABLATIONS_NO_KERNEL": "1"})
    assert r.returncode != 0
    assert "RNN_ABLATIONS_PIPELINE_CHUNK must be an integer >= 0 and <= 2147483647, got " \
           "'99999999999999999999999'" in r.stderr
    assert "Traceback" not in r.stderr.split("ValueError")[-1]


@pytest.mark.parametrize("name", ["pipeline_chunk", "cuda_graphs_max", "persistent_blocks",
                                  "persistent_batch_tile"])
def test_set_options_refuses_a_count_out_of_range(name):
    with pytest.raises(ValueError, match=f"{name} must be an integer >= 0 and <= 2147483647"):
        ra.set_options(**{name: 10 ** 22})
    with pytest.raises(ValueError, match=name):
        ra.options(**{name: 2 ** 31})


@pytest.mark.parametrize("setting", [dict(cuda_graphs_max=3), dict(kernel_isa="auto")])
def test_process_wide_blocks_of_two_threads_cannot_overlap(setting):
    name = next(iter(setting))
    opened, done = threading.Event(), threading.Event()
    errors = []

    def holder():
        with ra.options(**setting):
            opened.set()
            done.wait(timeout=60)

    t = threading.Thread(target=holder, name="holder")
    t.start()
    try:
        assert opened.wait(timeout=60)
        with pytest.raises(RuntimeError, match=f"{name} is process-wide, and thread 'holder' is "
                                               "inside an options block that sets it"):
            with ra.options(**setting):
                errors.append("entered")
        # a block of this thread that sets only per-thread settings is fine
        with ra.options(backend="generic"):
            pass
    finally:
        done.set()
        t.join(timeout=60)
    assert not errors
    # once the other block is closed, this thread's opens, nests, and leaves nothing behind
    before = ra.get_options()
    with ra.options(**setting):
        with ra.options(**setting):
            pass
        assert getattr(ra.get_options(), name) == setting[name]
    assert ra.get_options() == before and not settings._owners


def test_the_fallback_warning_is_given_outside_a_traced_graph(monkeypatch):
    """Without a kernel the auto backend falls back with a warning; that warning is given where
    the plan is made, which a traced graph treats as a constant, so torch.compile(fullgraph=True)
    traces the generic path (the warning takes a lock, which dynamo refuses)."""
    none = Kernels(cpu_error="no compiler", cuda_error="no CUDA")
    monkeypatch.setattr(registry, "kernels", lambda: none)
    monkeypatch.setattr(registry, "_warned", set())
    torch.manual_seed(0)
    model = ra.AblatedRNN("ran", 3, 4)
    x = torch.randn(5, 2, 3)
    with ra.options(backend="generic"):
        want = model(x)[0]
    torch._dynamo.reset()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        got = torch.compile(model, fullgraph=True, backend="eager")(x)[0]
    assert torch.allclose(got, want)
    assert [str(w.message) for w in seen if "unavailable" in str(w.message)] == \
        ["rnn_ablations: compiled CPU kernel unavailable (no compiler); using the slower generic "
         "path"]
    torch._dynamo.reset()


# --------------------------------------------------------------------------- options
@pytest.fixture(autouse=True)
def _restore_defaults():
    before = ra.get_options()
    yield
    ra.reset_options()
    ra.set_options(**{f.name: getattr(before, f.name) for f in dataclasses.fields(Options)})


def test_context_manager_nests_and_restores():
    start = ra.get_options()
    with ra.options(backend="generic") as inside:
        assert inside.backend == "generic" and ra.get_options() is inside
        with ra.options(cpu_schedule="plain", backend="auto"):
            assert (ra.get_options().backend, ra.get_options().cpu_schedule) == ("auto", "plain")
            with ra.options():
                assert ra.get_options().cpu_schedule == "plain"
        assert (ra.get_options().backend, ra.get_options().cpu_schedule) == \
            ("generic", start.cpu_schedule)
    assert ra.get_options() == start


def test_context_manager_restores_after_an_error():
    start = ra.get_options()
    with pytest.raises(KeyError):
        with ra.options(concurrent_directions="off"):
            raise KeyError("inside")
    assert ra.get_options() == start


def test_set_options_is_process_wide_and_blocks_override_it():
    ra.set_options(cpu_schedule="plain")
    assert ra.get_options().cpu_schedule == "plain"
    with ra.options(cpu_schedule="pipelined"):
        assert ra.get_options().cpu_schedule == "pipelined"
        ra.set_options(pipeline_chunk=5)  # a process-wide change shows inside the block too
        assert ra.get_options().pipeline_chunk == 5
    assert ra.get_options().cpu_schedule == "plain"
    ra.reset_options()
    assert ra.get_options() == ra.settings.from_environment()


def test_a_block_does_not_leak_into_other_threads():
    """A block in one thread leaves the others on the defaults; a thread's own block is its
    own; a thread started inside a block starts from the defaults."""
    barrier = threading.Barrier(2, timeout=60)
    seen = {}

    def worker(name, setting):
        with ra.options(backend=setting):
            barrier.wait()  # both blocks open at once
            seen[name] = ra.get_options().backend
            barrier.wait()

    threads = [threading.Thread(target=worker, args=("a", "generic")),
               threading.Thread(target=worker, args=("b", "kernel" if ra.kernel_available()
                                                     else "auto"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert seen == {"a": "generic", "b": "kernel" if ra.kernel_available() else "auto"}
    assert ra.get_options().backend == ra.settings.process_options().backend

    outside = {}
    with ra.options(backend="generic", cpu_schedule="plain"):
        t = threading.Thread(target=lambda: outside.update(o=ra.get_options()))
        t.start()
        t.join(timeout=60)
        assert ra.get_options().backend == "generic"
    assert outside["o"] == ra.settings.process_options()


@requires_kernel
def test_a_block_in_another_thread_does_not_change_this_threads_layers():
    """The layer a thread runs follows its own settings while another thread holds a block that
    forces the generic path."""
    m = ra.AblatedRNN("ran", 4, 5)
    x = torch.randn(6, 2, 4)
    opened, done = threading.Event(), threading.Event()

    def other():
        with ra.options(backend="generic"):
            opened.set()
            done.wait(timeout=120)

    t = threading.Thread(target=other)
    t.start()
    try:
        assert opened.wait(timeout=60)
        params = [m.layer_parameters(0, 0)]
        assert dispatch.layer_plan([x], params).path == "cpu"
        with ra.options(backend="kernel"):
            out_kernel = m(x)[0]
    finally:
        done.set()
        t.join(timeout=60)
    with ra.options(backend="generic"):
        torch.testing.assert_close(out_kernel, m(x)[0], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("settings,error,match", [
    (dict(backend="fast"), ValueError, "backend must be one of auto, kernel, generic; got 'fast'"),
    (dict(kernel_isa="sse9"), ValueError,
     "kernel_isa must be one of auto, avx512, avx2, portable, emulated_avx512; got 'sse9'"),
    (dict(cpu_schedule="always"), ValueError, "cpu_schedule must be one of auto, plain, pipelined"),
    (dict(concurrent_directions=True), ValueError, "concurrent_directions must be one of auto, "
                                                   "on, off; got True"),
    (dict(cuda_recurrence="fast"), ValueError, "cuda_recurrence must be one of auto, steps, "
                                               "persistent"),
    (dict(cuda_graphs="yes"), TypeError, "cuda_graphs must be True or False, got 'yes'"),
    (dict(persistent_backward=1), TypeError, "persistent_backward must be True or False"),
    (dict(pipeline_chunk=-1), ValueError, "pipeline_chunk must be an integer >= 0"),
    (dict(pipeline_chunk=2.0), ValueError, "pipeline_chunk must be an integer >= 0"),
    (dict(cuda_graphs_max=True), ValueError, "cuda_graphs_max must be an integer >= 0"),
    (dict(persistent_blocks="4"), ValueError, "persistent_blocks must be an integer >= 0"),
    (dict(persistent_batch_tile=-2), ValueError, "persistent_batch_tile must be an integer"),
    (dict(schedule="plain"), TypeError, "unknown setting 'schedule'; the settings are backend, "
                                        "kernel_isa, cpu_schedule"),
])
def test_settings_are_validated(settings, error, match):
    start = ra.get_options()
    with pytest.raises(error, match=match):
        ra.set_options(**settings)
    with pytest.raises(error, match=match):
        with ra.options(**settings):
            pass
    with pytest.raises(error, match=match):
        Options(**settings) if "schedule" not in settings else start.replace(**settings)
    assert ra.get_options() == start


def test_a_bad_setting_changes_nothing():
    start = ra.get_options()
    with pytest.raises(ValueError):
        ra.set_options(cpu_schedule="plain", backend="fast")
    assert ra.get_options() == start


@requires_kernel
def test_kernel_isa_is_process_wide():
    """kernel_isa switches the compiled kernel for the process (it holds one path), in a block
    too, and is restored when the block ends; a path this CPU lacks is refused."""
    isas = ra.supported_kernel_isas()
    before = ra.kernel_isa()
    seen = {}
    with ra.options(kernel_isa="portable"):
        assert ra.kernel_isa() == "portable"
        t = threading.Thread(target=lambda: seen.update(isa=ra.get_options().kernel_isa))
        t.start()
        t.join(timeout=60)
    assert seen["isa"] == "portable"
    assert ra.kernel_isa() == before
    ra.set_options(kernel_isa="portable")
    assert ra.kernel_isa() == "portable"
    ra.set_options(kernel_isa="auto")
    assert ra.kernel_isa() == isas[0]
    for isa in ("avx512", "avx2"):
        if isa not in isas:
            with pytest.raises(ValueError, match=f"'{isa}' requested.*'portable' or 'auto'"):
                ra.set_options(kernel_isa=isa)
            assert ra.kernel_isa() == isas[0]


def test_cuda_graphs_max_is_process_wide():
    with ra.options(cuda_graphs_max=3):
        assert ra.settings.process_options().cuda_graphs_max == 3
        assert ra.get_options().cuda_graphs_max == 3
    assert ra.get_options().cuda_graphs_max == ra.settings.process_options().cuda_graphs_max


def test_kernel_backend_without_a_kernel_is_refused():
    """In a process without a compiled kernel (the installed module hidden, none compiled on
    first use), asking for one is an error that says so."""
    code = ("import sys\nsys.modules['rnn_ablations._C'] = None\n"
            "import rnn_ablations as ra\nassert not ra.kernel_available()\n"
            "try:\n    ra.set_options(backend='kernel')\n"
            "except RuntimeError as exc:\n    print('refused:', exc)\n")
    proc = run_python(code, env={"RNN_ABLATIONS_NO_KERNEL": "1", "CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "refused:" in proc.stdout and "no compiled kernel is available" in proc.stdout


# --------------------------------------------------------------------------- short forms
def test_short_forms_are_the_settings():
    with ra.use_backend("generic"):
        assert ra.get_options().backend == "generic" == aliases.get_backend()
    for word, value in (("always", "pipelined"), ("never", "plain"), ("auto", "auto")):
        with ra.use_pipeline(word):
            assert ra.get_options().cpu_schedule == value
            assert aliases.get_pipeline() == word
    for word, value in (("always", "on"), ("never", "off"), ("auto", "auto")):
        with aliases.use_concurrent_directions(word):
            assert ra.get_options().concurrent_directions == value
            assert aliases.get_concurrent_directions() == word
    with ra.use_cuda_graphs(False):
        assert ra.get_options().cuda_graphs is False and not ra.get_cuda_graphs()
    with ra.use_cuda_recurrence("persistent"):
        assert ra.get_options().cuda_recurrence == "persistent" == ra.get_cuda_recurrence()
    ra.set_pipeline("never")
    assert ra.get_options().cpu_schedule == "plain"
    aliases.set_concurrent_directions("always")
    assert ra.get_options().concurrent_directions == "on"
    ra.set_cuda_recurrence("steps")
    assert ra.get_options().cuda_recurrence == "steps"
    ra.set_cuda_graphs(False)
    assert ra.get_options().cuda_graphs is False


def test_short_forms_validate_in_their_own_words():
    with pytest.raises(ValueError, match="unknown pipeline mode 'sometimes'; choose one of auto, "
                                         "always, never"):
        ra.set_pipeline("sometimes")
    with pytest.raises(ValueError, match="unknown concurrent-directions mode 'plain'"):
        aliases.use_concurrent_directions("plain")
    with pytest.raises(TypeError, match="set_cuda_graphs takes True or False"):
        ra.set_cuda_graphs("yes")
    with pytest.raises(ValueError, match="cuda_recurrence must be one of"):
        ra.set_cuda_recurrence("fast")
    with pytest.raises(ValueError, match="backend must be one of"):
        ra.use_backend("fast").__enter__()


def test_options_outside_a_with_statement_warns_and_changes_nothing():
    start = ra.get_options()
    with pytest.warns(UserWarning, match=r"options\(backend='generic'\) was called outside a "
                                         r"`with` statement and changed nothing.*"
                                         r"set_options\(backend='generic'\)"):
        ra.options(backend="generic")
    assert ra.get_options() == start
    block = ra.options(cpu_schedule="plain")  # kept and entered later: no warning
    with block as inside, block as again:  # one object, entered twice (nested)
        assert inside.cpu_schedule == again.cpu_schedule == "plain"
    assert ra.get_options() == start


def test_graph_switch_validates_and_restores():
    old = ra.get_cuda_graphs()
    with pytest.raises(TypeError, match="True or False"):
        ra.set_cuda_graphs("yes")
    with ra.use_cuda_graphs(not old):
        assert ra.get_cuda_graphs() is (not old)
    assert ra.get_cuda_graphs() is old


def test_graph_env_flag():
    from rnn_ablations.settings import from_environment
    for value, want in (("0", False), ("off", False), ("1", True), ("on", True), ("", True)):
        assert from_environment({"RNN_ABLATIONS_CUDA_GRAPHS": value}).cuda_graphs is want
    with pytest.raises(ValueError, match="RNN_ABLATIONS_CUDA_GRAPHS must be 0 or 1"):
        from_environment({"RNN_ABLATIONS_CUDA_GRAPHS": "maybe"})


def test_cuda_recurrence_switch_validates_and_restores():
    old = ra.get_cuda_recurrence()
    for bad in ("fast", "", None, "Persistent"):
        with pytest.raises(ValueError, match="auto, steps, persistent"):
            ra.set_cuda_recurrence(bad)
    assert ra.get_cuda_recurrence() == old
    with use_cuda_recurrence("persistent"):
        assert ra.get_cuda_recurrence() == "persistent"
        with use_cuda_recurrence("steps"):
            assert ra.get_cuda_recurrence() == "steps"
        assert ra.get_cuda_recurrence() == "persistent"
    assert ra.get_cuda_recurrence() == old


def test_cuda_recurrence_env():
    from rnn_ablations.settings import from_environment
    assert from_environment({}).cuda_recurrence == "auto"  # untested code is never the default
    for value, want in (("persistent", "persistent"), (" Steps ", "steps"), ("", "auto")):
        assert from_environment({"RNN_ABLATIONS_CUDA_RECURRENCE": value}).cuda_recurrence == want
    with pytest.raises(ValueError, match="RNN_ABLATIONS_CUDA_RECURRENCE must be one of auto, "
                                         "steps, persistent"):
        from_environment({"RNN_ABLATIONS_CUDA_RECURRENCE": "cooperative"})
    for value, want in (("0", 0), ("12", 12), ("", 0)):
        assert from_environment({"RNN_ABLATIONS_PERSISTENT_BLOCKS": value}).persistent_blocks \
            == want
    for value in ("-1", "many"):
        with pytest.raises(ValueError, match="integer >= 0"):
            from_environment({"RNN_ABLATIONS_PERSISTENT_BLOCKS": value})
