"""The checks that decide whether the CUDA kernels can run, and the driver's context handling,
without a GPU: the numbers NVRTC and the driver would give (versions, architectures) are passed
in or stood in for, and a stand-in for libcuda records the context calls.

* NVRTC is looked up for torch's CUDA major first (a CUDA 12 torch gets NVRTC 12 where both are
  installed);
* a GPU older than NVRTC compiles for (sm_70 with NVRTC 13), or a driver older than NVRTC's CUDA
  version, is a reason the kernels are not in use, named with its fix (the generic path runs);
* the primary context is retained once per device, and a thread whose current context is not
  it is switched;
* ``precompile`` compiles for every visible device's architecture, or for a given list.
"""
import ctypes
import io
import os
import threading

import pytest
import torch

from rnn_ablations.kernels import cuda
from rnn_ablations.kernels.cuda import cache, driver, nvrtc, precompile, programs

NVRTC13 = [75, 80, 86, 87, 88, 89, 90, 100, 103, 110, 120, 121]


# ------------------------------------------------------------------------- NVRTC lookup order
def test_nvrtc_wheel_folders_put_torch_s_major_first():
    assert nvrtc.wheel_folders("12")[:2] == ["nvidia/cuda_nvrtc/lib", "nvidia/cu12/lib"]
    assert nvrtc.wheel_folders("12")[-1] == "nvidia/cu13/lib"
    assert nvrtc.wheel_folders("13")[0] == "nvidia/cu13/lib"
    assert nvrtc.wheel_folders(None)[0] == "nvidia/cu13/lib"  # a CPU torch: the newest
    assert nvrtc.library_names("12")[0] == "libnvrtc.so.12"
    assert nvrtc.library_names("13")[0] == "libnvrtc.so.13"


def test_cuda_12_torch_loads_nvrtc_12_where_both_wheels_are_installed(tmp_path, monkeypatch):
    """Both wheels on sys.path, torch built for CUDA 12 and its libnvrtc.so.12 not preloaded:
    the CUDA 12 library is the one loaded, not the CUDA 13 one."""
    site = tmp_path / "site-packages"
    for sub, lib in (("nvidia/cu13/lib", "libnvrtc.so.13"),
                     ("nvidia/cuda_nvrtc/lib", "libnvrtc.so.12")):
        (site / sub).mkdir(parents=True)
        (site / sub / lib).write_bytes(b"")
    monkeypatch.setattr(nvrtc.sys, "path", [str(site)])
    monkeypatch.setattr(torch.version, "cuda", "12.6")
    loaded = []

    def fake_cdll(name, mode=0):
        if os.sep not in name:  # a plain name: nothing is preloaded here
            raise OSError(f"{name}: cannot open shared object file")
        loaded.append(os.path.relpath(name, site))
        return object()

    monkeypatch.setattr(nvrtc.ctypes, "CDLL", fake_cdll)
    nvrtc._load()
    assert loaded == [os.path.join("nvidia", "cuda_nvrtc", "lib", "libnvrtc.so.12")], loaded
    loaded.clear()
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    nvrtc._load()
    assert loaded == [os.path.join("nvidia", "cu13", "lib", "libnvrtc.so.13")], loaded


def test_nvrtc_not_found_names_the_wheel_of_torch_s_major(tmp_path, monkeypatch):
    monkeypatch.setattr(nvrtc.sys, "path", [str(tmp_path)])
    monkeypatch.setattr(torch.version, "cuda", "12.6")

    def fake_cdll(name, mode=0):
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(nvrtc.ctypes, "CDLL", fake_cdll)
    with pytest.raises(nvrtc.NvrtcError, match="pip install nvidia-cuda-nvrtc-cu12"):
        nvrtc._load()


# ------------------------------------------------------------------ architecture and driver
def test_arch_older_than_nvrtc_knows_is_refused_with_the_fix():
    why = cuda.arch_problem({0: 70}, NVRTC13, (13, 0))
    assert "sm_75 and newer" in why and "device 0 (sm_70)" in why, why
    assert "generic PyTorch path" in why and "CUDA 12" in why, why
    assert "CUDA_VISIBLE_DEVICES" not in why  # no other device to keep
    mixed = cuda.arch_problem({0: 90, 1: 70, 2: 80}, NVRTC13, (13, 0))
    assert "device 1 (sm_70)" in mixed and "CUDA_VISIBLE_DEVICES=0,2" in mixed, mixed
    assert cuda.arch_problem({0: 90, 1: 80}, NVRTC13, (13, 0)) is None
    assert cuda.arch_problem({0: 75}, NVRTC13, (13, 0)) is None
    assert cuda.arch_problem({0: 130}, NVRTC13, (13, 0)) is None  # newer: PTX, JIT at load
    assert cuda.arch_problem({}, NVRTC13, (13, 0)) is None
    assert "no architecture" in cuda.arch_problem({0: 90}, [], (13, 0))


def test_driver_older_than_nvrtc_is_refused_with_the_fix():
    why = cuda.driver_problem(12040, (13, 0))
    assert "supports CUDA 12.4" in why and "NVRTC 13.0" in why, why
    assert "driver for CUDA 13.0 or newer" in why and "torch built for CUDA 12.x" in why, why
    assert cuda.driver_problem(13000, (13, 0)) is None
    assert cuda.driver_problem(13020, (13, 0)) is None
    # minor version compatibility: CUBIN of NVRTC 12.8 loads with a 12.2 driver, PTX does not
    assert cuda.driver_problem(12020, (12, 8)) is None
    ptx = cuda.driver_problem(12020, (12, 8), ptx=True)
    assert "PTX" in ptx and "12.2" in ptx and "12.8" in ptx, ptx
    assert cuda.driver_problem(12080, (12, 8), ptx=True) is None
    assert cuda.driver_problem(0, (13, 0)) is None  # the driver did not say


@pytest.fixture
def machine(monkeypatch):
    """A CUDA 13 torch with a visible GPU, NVRTC 13.0 and a driver, all stood in for: set
    ``archs`` (device -> compute capability) and ``driver`` (cuDriverGetVersion) per test."""
    state = {"archs": {0: 90}, "driver": 13000}
    monkeypatch.delenv("RNN_ABLATIONS_NO_KERNEL", raising=False)
    monkeypatch.delenv("RNN_ABLATIONS_DISABLE_KERNEL", raising=False)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(nvrtc, "library_error", lambda: None)
    monkeypatch.setattr(nvrtc, "version", lambda: (13, 0))
    monkeypatch.setattr(nvrtc, "supported_archs", lambda: list(NVRTC13))
    monkeypatch.setattr(driver, "driver_error", lambda: None)
    monkeypatch.setattr(driver, "device_count", lambda: len(state["archs"]))
    monkeypatch.setattr(driver, "compute_capability", lambda d: state["archs"][d])
    monkeypatch.setattr(driver, "driver_version", lambda: state["driver"])
    return state


def test_unavailable_reason_checks_the_arch_and_the_driver(machine):
    assert cuda.unavailable_reason() is None
    machine["archs"] = {0: 70}
    why = cuda.unavailable_reason()
    assert why is not None and "sm_70" in why and "sm_75 and newer" in why, why
    assert cuda.load() == (None, why)
    machine["archs"] = {0: 90}
    machine["driver"] = 12040
    why = cuda.unavailable_reason()
    assert why is not None and "supports CUDA 12.4" in why and "NVRTC 13.0" in why, why
    machine["driver"] = 13000
    machine["archs"] = {0: 90, 1: 130}  # a GPU newer than NVRTC 13.0: PTX, fine with driver 13.0
    assert cuda.unavailable_reason() is None


def test_unavailable_reason_reports_a_failing_driver_query(machine, monkeypatch):
    def broken():
        raise driver.CudaDriverError("rnn_ablations CUDA kernel: cuDeviceGetCount failed: x")
    monkeypatch.setattr(driver, "device_count", broken)
    assert "cuDeviceGetCount failed" in cuda.unavailable_reason()


# ---------------------------------------------------------------------------- the contexts
class FakeDriver:
    """Stands for libcuda's context calls: a current context per thread, primary context
    ``0x1000 + device``; another context of device 0 is ``0xBAD0``."""

    FOREIGN = 0xBAD0

    def __init__(self):
        self.local = threading.local()
        self.retained = []
        self.set_calls = []
        self.lock = threading.Lock()

    def _cur(self):
        return getattr(self.local, "ctx", None)

    def cuCtxGetCurrent(self, ref):
        ref._obj.value = self._cur()
        return 0

    def cuCtxGetDevice(self, ref):
        cur = self._cur()
        if not cur:
            return 201  # CUDA_ERROR_INVALID_CONTEXT
        ref._obj.value = 0 if cur == self.FOREIGN else cur - 0x1000
        return 0

    def cuDeviceGet(self, ref, ordinal):
        ref._obj.value = ordinal
        return 0

    def cuDevicePrimaryCtxRetain(self, ref, dev):
        with self.lock:
            self.retained.append(dev.value if hasattr(dev, "value") else dev)
        ref._obj.value = 0x1000 + (dev.value if hasattr(dev, "value") else dev)
        return 0

    def cuCtxSetCurrent(self, ctx):
        value = ctx.value if hasattr(ctx, "value") else ctx
        with self.lock:
            self.set_calls.append(value)
        self.local.ctx = value
        return 0


@pytest.fixture
def fake_driver(monkeypatch):
    fake = FakeDriver()
    monkeypatch.setattr(driver, "driver", lambda: fake)
    monkeypatch.setattr(driver, "_primary", {}, raising=False)
    return fake


def test_primary_context_is_retained_once_per_device_not_per_thread(fake_driver):
    def work():
        driver._ensure_context(0)
        driver._ensure_context(1)
        driver._ensure_context(0)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(fake_driver.retained) == [0, 1], fake_driver.retained
    # each thread starts with no context: made current, switched between the devices
    assert fake_driver.set_calls.count(0x1000) == 8 and fake_driver.set_calls.count(0x1001) == 4


def test_a_thread_already_on_the_primary_context_is_left_alone(fake_driver):
    driver._ensure_context(0)
    fake_driver.set_calls.clear()
    driver._ensure_context(0)
    driver._ensure_context(0)
    assert fake_driver.set_calls == []


def test_another_context_of_the_same_device_is_switched_not_passed(fake_driver):
    """A context some other library made current on device 0 does not hold the modules loaded
    in the primary context: it is replaced by the primary context."""
    fake_driver.local.ctx = FakeDriver.FOREIGN
    driver._ensure_context(0)
    assert fake_driver.local.ctx == 0x1000, hex(fake_driver.local.ctx or 0)
    assert fake_driver.retained == [0]


# ----------------------------------------------------------------- precompile for every device
@pytest.fixture
def fake_nvrtc(monkeypatch, tmp_path):
    compiled = []

    def compile_program(source, name, expressions, options, cubin=True):
        target = [o for o in options if o.startswith("--gpu-architecture=")][0].split("=")[1]
        compiled.append((name, target))
        return b"\x7fELF" + name.encode() + target.encode(), ["_Z" + name], ""

    monkeypatch.setattr(nvrtc, "version", lambda: (13, 0))
    monkeypatch.setattr(nvrtc, "supported_archs", lambda: list(NVRTC13))
    monkeypatch.setattr(nvrtc, "compile_program", compile_program)
    monkeypatch.setenv("RNN_ABLATIONS_CACHE", str(tmp_path))
    cache._memory.clear()
    yield compiled
    cache._memory.clear()


def _targets(compiled):
    return sorted({t for _, t in compiled})


def test_precompile_compiles_for_every_visible_device(fake_nvrtc, monkeypatch, capsys):
    caps = {0: (8, 0), 1: (9, 0), 2: (8, 0)}
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(caps))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: caps[d])
    assert precompile.main(["--jobs", "1"]) == 0
    n = len(programs.all_programs())
    assert _targets(fake_nvrtc) == ["sm_80", "sm_90"] and len(fake_nvrtc) == 2 * n
    out = capsys.readouterr().out
    assert "target sm_80 (CUBIN)" in out and "target sm_90 (CUBIN)" in out
    assert "architectures sm_80, sm_90: all compiled" in out


@pytest.mark.parametrize("argv", [["--arch", "sm_80,sm_90"], ["--arch", "sm_80", "--arch", "90"],
                                  ["--arch", "sm_80,sm_90,sm_80"]])
def test_precompile_arch_takes_a_list(fake_nvrtc, argv, capsys):
    assert precompile.main(argv + ["--jobs", "1"]) == 0
    assert _targets(fake_nvrtc) == ["sm_80", "sm_90"]
    assert len(fake_nvrtc) == 2 * len(programs.all_programs())


def test_precompile_reports_an_arch_nvrtc_cannot_compile_for(fake_nvrtc, capsys):
    assert precompile.main(["--arch", "sm_70,sm_90", "--jobs", "1"]) == 1
    err = capsys.readouterr().err
    assert "sm_70" in err and "sm_75 and newer" in err, err
    assert _targets(fake_nvrtc) == ["sm_90"]


@pytest.mark.parametrize("bad", ["ninety", "sm_9", ",", "sm_80,x"])
def test_precompile_refuses_a_bad_arch_list(bad, capsys):
    with pytest.raises(SystemExit):
        precompile.main(["--arch", bad])
    assert "--arch" in capsys.readouterr().err


def test_precompile_without_a_device_asks_for_the_arch(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="--arch sm_80,sm_90"):
        precompile.main([])
