"""rnn_ablations.settings: a module apart (it imports nothing of the package), environment values
checked when they are read (their range included), process-wide settings that two threads'
blocks cannot overlap on, and the fallback warning outside a traced graph."""
import ast
import threading
import warnings
from pathlib import Path

import pytest
import torch

import rnn_ablations as ra
from conftest import run_python
from rnn_ablations import backend, settings
from rnn_ablations.plan import Kernels

SETTINGS_FILE = Path(settings.__file__)


def test_the_settings_module_imports_nothing_of_the_package():
    tree = ast.parse(SETTINGS_FILE.read_text())
    relative = [node.module for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) and node.level > 0]
    absolute = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names if alias.name.startswith("rnn_ablations")]
    assert set(relative) <= {"_env"} and not absolute, (relative, absolute)
    # and it loads on its own, without torch
    code = ("import importlib.util, sys\n"
            f"spec = importlib.util.spec_from_file_location('s', {str(SETTINGS_FILE)!r})\n"
            "m = importlib.util.module_from_spec(spec); sys.modules['s'] = m\n"
            "spec.loader.exec_module(m)\n"
            "assert 'torch' not in sys.modules and 'rnn_ablations' not in sys.modules\n"
            "print(m.get_options().backend)")
    r = run_python(code, env={"RNN_ABLATIONS_NO_KERNEL": "", "RNN_ABLATIONS_DISABLE_KERNEL": ""})
    assert r.returncode == 0, r.stderr


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
    monkeypatch.setattr(backend, "kernels", lambda: none)
    monkeypatch.setattr(backend, "_warned", set())
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
