"""rnn_ablations.settings: a module apart (it imports nothing of the package), environment values
checked when they are read (their range included), process-wide settings that two threads'
blocks cannot overlap on, and the fallback warning outside a traced graph."""
import ast
import os
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import pytest
import torch

import rnn_ablations as ra
from conftest import run_python
from rnn_ablations import settings
from rnn_ablations.kernels import registry
from rnn_ablations.plan import Kernels

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
