"""CUDA plans for layer calls on CPU tensors: the run plan's own decision (``plan.decide``, the
CUDA kernels' first-use check included) with the call described as a CUDA call and the process
holding CUDA kernels (a stand-in, or the emulated device's real host loops), so that the CPU
runs the CUDA runner and the check the way a GPU would."""
import dataclasses

from rnn_ablations import plan as run_plan
from rnn_ablations.kernels import registry


def cuda_plans_on_cpu(monkeypatch, kernel, scan: bool = False) -> None:
    """For the rest of the test (``monkeypatch``): every layer call is described as a CUDA call
    (``LayerCall.device == "cuda"``), the process has the CUDA step kernel (and the scan kernel
    with ``scan``), and ``registry.cuda_kernel()`` is ``kernel``.  Turn CUDA graphs off in the
    test (``options(cuda_graphs=False)``): a CPU tensor cannot be captured."""
    real = run_plan.describe
    monkeypatch.setattr(run_plan, "describe",
                        lambda *a, **k: real(*a, **k)._replace(device="cuda"))
    have = dataclasses.replace(registry.kernels(), cuda=True, cuda_scan=scan, persistent=False)
    monkeypatch.setattr(registry, "kernels", lambda: have)
    monkeypatch.setattr(registry, "cuda_kernel", lambda: kernel)


def emulator_or_skip():
    """The CUDA emulation's ``emulator`` module (``tests/cuda_emulation``), or a skip that says
    what is missing (the tests folder not on ``sys.path``, or no C++ compiler)."""
    import shutil

    import pytest
    try:
        from cuda_emulation import emulator
    except ImportError:  # pragma: no cover - tests/ not on sys.path
        pytest.skip("tests/cuda_emulation is not importable")
    if shutil.which(emulator.CXX) is None:
        pytest.skip(f"the CUDA emulation needs a C++ compiler ({emulator.CXX})")
    return emulator
