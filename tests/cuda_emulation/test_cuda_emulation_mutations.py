"""The emulation's checks can fail: each test below breaks one thing the way a bug would (on a
copy or by monkeypatching, never in the repository) and asserts that the corresponding check of
test_cuda_emulation.py then fails:

(a) the CUDA host module without ``scan_abi`` (the name ops.scan_built reads): the backend
    no longer finds the CUDA scan;
(b) the step loop's c_{t-1} pointer one element off: the step kernel's results differ from the
    generic path;
(c) the persistent forward kernel without its grid barrier (built from a copy of csrc with the
    call removed): a block reads h_{t-1} before the other blocks wrote it, and some run of a few
    differs from the generic path (blocks are concurrent OS threads: the race is real);
(d) a grid barrier that waits for one arrival too many: the emulation's watchdog fails the
    launch in seconds (a GPU would hang);
(e) (slow) every planted bug of mutations.MUTATIONS, each in a child process: the test named
    for it fails (the mutation table, benchmarks/results/cuda_emulation_mutations.md);
(f) (slow) the emulation built with AddressSanitizer (RNN_ABLATIONS_EMULATION_ASAN=1, libasan
    preloaded in a child process) passes the kernel tests, and names the line of an
    out-of-bounds write planted in the step kernel.
"""
import importlib.util
import inspect
import os
import shutil
import sys

import pytest
import torch

from rnn_ablations.kernels.cuda import host, programs

from . import emulator, mutations
from . import test_cuda_emulation as checks


def test_without_scan_abi_the_backend_loses_the_cuda_scan(emulated_cuda, monkeypatch):
    monkeypatch.delattr(host, "scan_abi")
    monkeypatch.setattr(host, "SCAN_ABI", 3, raising=False)  # another name does not count
    with pytest.raises(AssertionError, match="cuda_scan=False"):
        checks.test_backend_runs_the_cuda_step_scan_and_persistent_kernels(emulated_cuda,
                                                                          monkeypatch)


STEP_MUTATION = ("a_cp.value = p_c0 if t == 0 else p_cs + (t - 1) * B * H * ea",
                 "a_cp.value = p_c0 if t == 0 else p_cs + ((t - 1) * B * H + 1) * ea")


def _mutated_module(module, old, new):
    """A copy of ``module`` with ``old`` replaced by ``new`` in its source (once)."""
    text = inspect.getsource(module)
    assert text.count(old) >= 1, (
        f"the mutation's pattern is no longer in {module.__file__}: update STEP_MUTATION "
        f"({old!r})")
    spec = importlib.util.spec_from_loader(module.__name__ + "_mutated", loader=None)
    copy = importlib.util.module_from_spec(spec)
    copy.__package__ = module.__package__
    copy.__file__ = module.__file__
    exec(compile(text.replace(old, new, 1), module.__file__, "exec"), copy.__dict__)
    return copy


def test_a_step_pointer_one_element_off_is_caught(emulated_cuda, monkeypatch):
    x = checks._layer("lstm", False, torch.float32)
    checks._check(x, False, torch.float32)  # the real loop passes
    owner = sys.modules[host.plain_forward.__module__]
    copy = _mutated_module(owner, *STEP_MUTATION)
    monkeypatch.setattr(host, "plain_forward", copy.plain_forward)
    with pytest.raises(AssertionError, match="max \\|error\\|"):
        checks._check(x, False, torch.float32)


BARRIER_CALL = "if (s + 1 < a.steps) grid_barrier(a.barrier, arrivals);"


def unbarriered_device(tmp_path) -> emulator.EmulatedDevice:
    """The persistent kernels built from a copy of csrc whose forward has no grid barrier."""
    csrc = tmp_path / "csrc"
    shutil.copytree(programs.CSRC, csrc)
    path = csrc / "cuda" / "persistent_kernel.cuh"
    text = path.read_text()
    assert text.count(BARRIER_CALL) == 1, f"update BARRIER_CALL: not found in {path}"
    path.write_text(text.replace(BARRIER_CALL, "", 1))
    progs = [p for p in programs.all_programs() if p.family.startswith("persistent")]
    return emulator.EmulatedDevice(csrc=str(csrc), progs=progs)


def wrong_runs(device, runs: int) -> int:
    """Of ``runs`` persistent forwards on 4 blocks, how many differ from the generic path."""
    x = checks._layer("lstm", False, torch.float32, T=6, B=2, H=8, padded=False, mask=False,
                      seed=13)
    (want, *_), _ = checks._reference(x, False)
    wrong = 0
    with emulator.installed(device):
        for _ in range(runs):
            out = host.persistent_forward(x["v"].kernel_spec, False, x["proj"], x["w_hh"],
                                          x["h0"], x["c0"], x["bs"], x["mask"], False, 4, 0)[0]
            wrong += not torch.allclose(out.double(), want, atol=1e-4, rtol=1e-4)
    return wrong


def test_a_missing_grid_barrier_is_caught(emulation_device, tmp_path):
    assert wrong_runs(emulation_device, 2) == 0  # the real kernel
    device = unbarriered_device(tmp_path)
    assert wrong_runs(device, 5) >= 1


@pytest.mark.slow
@pytest.mark.parametrize("name", [m.name for m in mutations.MUTATIONS if not m.equivalent])
def test_each_planted_bug_is_caught(name):
    """The bug planted alone: the first of its checks that fails is a test of this suite;
    a bug only a GPU shows (memory ordering, the L2 load, the PTX rounding) passes them."""
    m = mutations.BY_NAME[name]
    r = mutations.run_child(name)
    if m.hardware:
        assert r["caught"] is None, (
            f"{name} is marked as visible on a GPU only, but {r['caught']} caught it: "
            f"{r['error']} (remove its hardware note in mutations.py)")
    else:
        assert r["caught"], f"{name} ({m.what}) was caught by none of {m.checks}: {r['error']}"


def _asan_available():
    import subprocess as sp
    try:
        emulator.asan_runtime()
    except RuntimeError as exc:
        return str(exc)
    done = sp.run([emulator.CXX, "-fsanitize=address", "-x", "c++", "-", "-o", os.devnull],
                  input="int main() { return 0; }", capture_output=True, text=True)
    return None if done.returncode == 0 else f"{emulator.CXX} -fsanitize=address fails"


OOB_WRITE = ("  c_out[b * H + j] = c;\n  h_out[b * H + j] = static_cast<T>(h);\n}",
             "  c_out[b * H + j] = c;\n  h_out[b * H + j] = static_cast<T>(h);\n"
             "  if (idx == n * H - 1) c_out[n * H + 64] = c;\n}")


@pytest.mark.slow
def test_the_asan_build_passes_and_names_an_out_of_bounds_write(tmp_path):
    import subprocess as sp
    why = _asan_available()
    if why:
        pytest.skip(f"AddressSanitizer: {why}")
    env = emulator.asan_environment()
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = sp.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x",
                   "cuda_emulation/test_cuda_emulation.py", "-k",
                   "step_kernel_equals_generic_float32 or persistent_kernels_equal_generic or "
                   "scan_kernel_equals_generic"], cwd=tests, env=env, capture_output=True,
                  text=True, timeout=1500)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    csrc = tmp_path / "csrc"
    shutil.copytree(programs.CSRC, csrc)
    path = csrc / "cuda" / "step_kernel.cuh"
    text = path.read_text()
    assert text.count(OOB_WRITE[0]) == 1, f"update OOB_WRITE: not found in {path}"
    path.write_text(text.replace(*OOB_WRITE))
    script = (
        "import torch, sys\n"
        "from cuda_emulation import emulator\n"
        "from cuda_emulation import test_cuda_emulation as c\n"
        "from rnn_ablations.kernels.cuda import host, programs\n"
        f"d = emulator.EmulatedDevice(csrc={str(csrc)!r}, progs=[p for p in "
        "programs.all_programs() if p.name == 'step_forward[float32]'])\n"
        "x = c._layer('lstm', False, torch.float32, padded=False, mask=False)\n"
        "with emulator.installed(d):\n"
        "    host.plain_forward(x['v'].kernel_spec, False, x['proj'], x['w_hh'], x['h0'], "
        "x['c0'], x['bs'], x['mask'], True)\n")
    done = sp.run([sys.executable, "-c", script], cwd=tests, env=env, capture_output=True,
                  text=True, timeout=600)
    assert done.returncode != 0 and "heap-buffer-overflow" in done.stderr, done.stderr[-3000:]
    assert "step_kernel.cuh:" in done.stderr, done.stderr[-3000:]


if __name__ == "__main__":  # how often the race shows (from tests/):
    # python -m cuda_emulation.test_cuda_emulation_mutations
    import tempfile
    import pathlib
    n = int(os.environ.get("RUNS", "20"))
    with tempfile.TemporaryDirectory() as tmp:
        device = unbarriered_device(pathlib.Path(tmp))
        print(f"without the grid barrier: {wrong_runs(device, n)} of {n} runs wrong "
              f"(threads: {device.threads})")


BARRIER_COUNT = ("    target += gridDim.x;\n", "    target += gridDim.x + 1;\n")


def test_a_miscounted_grid_barrier_fails_instead_of_hanging(emulation_device, tmp_path):
    """A grid barrier that waits for one arrival more than the grid has never opens: the
    emulation's watchdog ends the wait, and the launch raises CudaDriverError naming it, in
    seconds (on a GPU the launch would hang)."""
    import time
    from rnn_ablations.kernels.cuda import driver
    csrc = tmp_path / "csrc"
    shutil.copytree(programs.CSRC, csrc)
    path = csrc / "cuda" / "persistent_kernel.cuh"
    text = path.read_text()
    assert text.count(BARRIER_COUNT[0]) == 1, f"update BARRIER_COUNT: not found in {path}"
    path.write_text(text.replace(*BARRIER_COUNT))
    progs = [p for p in programs.all_programs() if p.name == "persistent_forward[float32]"]
    device = emulator.EmulatedDevice(csrc=str(csrc), progs=progs, watchdog_s=2)
    x = checks._layer("lstm", False, torch.float32, T=3, B=2, H=8, padded=False, mask=False)
    start = time.monotonic()
    with emulator.installed(device), pytest.raises(driver.CudaDriverError,
                                                   match="lasted more than the emulation's "
                                                         "watchdog of 2 s"):
        host.persistent_forward(x["v"].kernel_spec, False, x["proj"], x["w_hh"], x["h0"],
                                x["c0"], x["bs"], x["mask"], False, 0, 0)
    assert time.monotonic() - start < 60
