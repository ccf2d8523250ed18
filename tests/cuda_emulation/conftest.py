"""Fixtures of the CUDA emulation (tests/cuda_emulation/README.md):

* ``emulation_device``: the emulated device (session-wide; builds the emulated kernels once,
  skips with the reason where no C++ compiler is found);
* ``emulated_cuda``: that device installed as the CUDA driver's implementation for one test,
  with ``common.DEVICE_TYPE = "cpu"`` (emulator.installed), restored after it.
"""
import shutil

import pytest

from . import emulator


@pytest.fixture(scope="session")
def emulation_device():
    if shutil.which(emulator.CXX) is None:
        pytest.skip(f"the CUDA emulation needs a C++ compiler ({emulator.CXX} not found; set CXX)")
    return emulator.EmulatedDevice()


@pytest.fixture
def emulated_cuda(emulation_device):
    with emulator.installed(emulation_device) as device:
        yield device
