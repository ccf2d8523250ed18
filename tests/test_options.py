"""rnn_ablations.options / set_options / get_options: nesting and restoring, per-thread
isolation, the process-wide settings, validation, and the short forms (use_backend, ...)."""
import dataclasses
import threading

import pytest
import torch

import rnn_ablations as ra

from conftest import requires_kernel, run_python
from rnn_ablations import aliases, dispatch
from rnn_ablations.settings import Options


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
            "sys.modules['rnn_ablations._C_cuda'] = None\n"
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
