"""Shared fixtures and skip markers.

Every test that needs something an install may lack skips through one of the markers below, so
that the reason a test did not run reads the same everywhere and names the fix:

* ``requires_kernel`` / ``requires_scan_kernel``: the compiled CPU kernel (its step and scan
  entry points);
* ``requires_cuda`` / ``requires_cuda_kernel``: a CUDA device / the compiled CUDA kernel;
* ``requires_allennlp`` / ``requires_onmt``: the host frameworks (``bash scripts/setup.sh``
  installs both);
* ``requires_shared_data(*parts)``: a file or folder of the experiments' data (``../shared/data``
  or ``$RNN_ABLATIONS_SHARED_DATA``), which the package never needs to run its tests' defaults.

The marker ``slow`` names the tests that build a copy of the package or of its kernels (the
recipes' copies, the first-use build, the wheel, all NVRTC programs) or train a model end to
end: the README's test command deselects them (``-m "not slow"``), and ``.ci/run`` runs them in a
second step (``pytest -m slow tests``).
"""
import contextlib
import importlib.machinery
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import rnn_ablations as ra
from rnn_ablations.kernels.scan import scan_kernel_available

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("RNN_ABLATIONS_SHARED_DATA", REPO.parent / "shared" / "data"))

_SETUP = "run `bash scripts/setup.sh` (or `pip install --no-build-isolation -e .`)"

requires_kernel = pytest.mark.skipif(
    not ra.kernel_available(), reason=f"the compiled CPU kernel is not built: {_SETUP}")
requires_scan_kernel = pytest.mark.skipif(
    not scan_kernel_available("cpu"),
    reason=f"the compiled CPU scan kernel is not built: {_SETUP}")
requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
requires_cuda_kernel = pytest.mark.skipif(
    not ra.cuda_kernel_available(),
    reason="the CUDA kernel is not built (it is built by `pip install --no-build-isolation -e .` "
           "where torch is a CUDA build and nvcc is found)")


def _installed(name):
    """Whether a top-level package is on sys.path, without importing it and without running the
    start-up hook's import finder (``importlib.util.find_spec`` would: the hook acts once, on the
    first lookup, and a lookup here would leave the real import without it)."""
    return importlib.machinery.PathFinder.find_spec(name) is not None


requires_allennlp = pytest.mark.skipif(
    not _installed("allennlp"), reason="AllenNLP is not installed (bash scripts/setup.sh installs it)")
requires_onmt = pytest.mark.skipif(
    not _installed("onmt"), reason="OpenNMT-py is not installed (bash scripts/setup.sh installs it)")


#: the CPU kernel's two schedules, and every code path a CPU call can take (the pipelined and the
#: plain kernel, the generic PyTorch path), for tests that compare them
KERNEL_SCHEDULES = ["pipelined", "plain"]
BACKENDS = KERNEL_SCHEDULES + ["generic"] if ra.kernel_available() else ["generic"]


@contextlib.contextmanager
def backend_path(name):
    """Run the block on one of :data:`BACKENDS`."""
    backend = "generic" if name == "generic" else "kernel"
    with ra.use_backend(backend), ra.use_pipeline("always" if name == "pipelined" else "never"):
        yield


def requires_shared_data(*parts):
    path = SHARED_DATA.joinpath(*parts)
    return pytest.mark.skipif(not path.exists(),
                              reason=f"shared data {path} is absent (set RNN_ABLATIONS_SHARED_DATA)")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "slow: builds a copy of the package or its kernels, or trains end to end "
        "(run by .ci/run's second step: pytest -m slow tests)")


@pytest.fixture
def fresh_cuda_selfcheck():
    """The CUDA kernels' first-use check with no result remembered and switched on, for the
    block; reset and back to its setting after it."""
    from rnn_ablations.kernels.cuda import selfcheck
    selfcheck.reset()
    selfcheck.set_enabled(True)
    yield
    selfcheck.reset()
    selfcheck.set_enabled(None)


_UNCHANGED = object()


@pytest.fixture
def given_kernels(monkeypatch):
    """``given_kernels(cpu=..., cuda=...)``: the run layer's kernels for the test are the
    objects given (a counting wrapper, a stand-in; ``None`` for no kernel), through the
    registry's accessors (``registry.cpu_kernel()``, ``cuda_kernel()``,
    ``graphed_cuda_kernel()``, which wraps the CUDA one given); the registry's own after the
    test.  The one place the tests set the registry's loaded kernels (every other read goes
    through its accessors)."""
    from rnn_ablations.kernels import registry

    def give(cpu=_UNCHANGED, cuda=_UNCHANGED):
        if cpu is not _UNCHANGED:
            registry.load_cpu_kernel()
            monkeypatch.setattr(registry, "_C", cpu)
        if cuda is not _UNCHANGED:
            registry.load_cuda_kernel()
            monkeypatch.setattr(registry, "_C_cuda", cuda)
    return give


@pytest.fixture
def cpu_kernel():
    """The loaded CPU kernel (``registry.cpu_kernel()``), or the test skips with the reason."""
    from rnn_ablations.kernels import registry
    kernel = registry.cpu_kernel()
    if kernel is None:
        pytest.skip(f"the compiled CPU kernel is not built ({registry.cpu_kernel_error()}): "
                    f"{_SETUP}")
    return kernel


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture
def one_thread():
    """Tiny tensors: one thread is much faster than two, above all on a busy 2-core machine
    (waiting OpenMP threads spin)."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@contextlib.contextmanager
def threads(n):
    """torch's intra-op thread count set to ``n`` inside the block."""
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def run_python(code: str, *argv: str, env=None, timeout: int = 300):
    """``python -c code argv...`` in a child process with this interpreter, the environment
    updated with ``env``; returns the CompletedProcess (text output captured)."""
    return subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True,
                          env=dict(os.environ, **(env or {})), timeout=timeout)


def record_plans(monkeypatch):
    """The plans the runners of ``rnn_ablations.dispatch.RUNNERS`` receive from here on, in
    order (each runner wrapped for the test; it still runs)."""
    from rnn_ablations import dispatch
    seen = []
    for name, fn in list(dispatch.RUNNERS.items()):
        monkeypatch.setitem(dispatch.RUNNERS, name,
                            lambda plan, *a, _fn=fn: seen.append(plan) or _fn(plan, *a))
    return seen
