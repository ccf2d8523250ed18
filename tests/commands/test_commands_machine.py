"""``rnn_ablations.commands.machine``: the machine description every results file records."""
import json
import platform

import pytest
import torch

import rnn_ablations as ra
from rnn_ablations.commands import machine


def test_cpu_info_names_the_cpu_its_flags_and_the_kernel_path():
    info = machine.cpu_info()
    assert set(info) >= {"model", "cores", "threads", "avx2", "fma", "avx512f", "avx512_flags",
                         "vector_flags", "kernel_isa", "kernel_isas"}
    assert info["model"] and info["cores"] >= 1 and info["threads"] == torch.get_num_threads()
    assert info["kernel_isa"] == ra.kernel_isa() and info["kernel_isas"] == ra.supported_kernel_isas()
    assert info["avx512f"] == ("avx512f" in info["avx512_flags"])
    assert set(info["vector_flags"]) <= set(machine.VECTOR_FLAGS)
    try:
        flags = open("/proc/cpuinfo").read().split("flags", 1)[1].split("\n", 1)[0].split()
    except (OSError, IndexError):
        pytest.skip("no /proc/cpuinfo to compare with")
    assert info["avx2"] == ("avx2" in flags) and info["avx512f"] == ("avx512f" in flags)


def test_cpu_info_without_lscpu_reads_proc_cpuinfo(monkeypatch):
    try:
        text = open("/proc/cpuinfo").read()
    except OSError:
        pytest.skip("no /proc/cpuinfo")
    model = next((ln.split(":", 1)[1].strip() for ln in text.splitlines()
                  if ln.startswith("model name")), None)
    if model is None:
        pytest.skip("/proc/cpuinfo names no model on this CPU")
    monkeypatch.setattr(machine, "_lscpu", lambda: "")
    info = machine.cpu_info()
    assert info["model"] == model
    assert info["avx2"] == (" avx2" in text)


def test_cpu_info_with_neither_names_the_platform(monkeypatch):
    monkeypatch.setattr(machine, "_lscpu", lambda: "")
    real_open = open

    def no_proc(path, *args, **kwargs):
        if str(path) == "/proc/cpuinfo":
            raise OSError("no /proc here")
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", no_proc)
    info = machine.cpu_info()
    assert info["model"] == (platform.processor() or platform.machine())
    assert not info["avx2"] and not info["avx512f"] and info["vector_flags"] == []


def test_describe_is_one_line_with_everything_a_reader_needs():
    info = dict(machine.cpu_info(), model="Some CPU", avx512f=False, avx2=True, fma=True,
                cores=2, threads=2, kernel_isa="avx2")
    line = machine.describe(info)
    assert "\n" not in line
    assert line.startswith("Some CPU (no AVX-512, AVX2+FMA), 2 cores, torch ")
    assert "(2 threads, CPU capability " in line and line.endswith("kernel vector path avx2")
    assert "(AVX-512, AVX2+FMA)" in machine.describe(dict(info, avx512f=True))
    assert "(no AVX-512)" in machine.describe(dict(info, avx2=False))


def test_machine_info_is_json_ready():
    info = machine.machine_info()
    again = json.loads(json.dumps(info))
    assert again["machine"] == machine.describe(info["cpu"])
    assert again["torch"] == torch.__version__ and again["python"] == platform.python_version()
    assert "gpu" not in again


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_gpu_info_without_a_gpu_says_so():
    with pytest.raises(ValueError, match="no CUDA device"):
        machine.gpu_info("cuda")
    with pytest.raises(ValueError, match="no CUDA device"):
        machine.machine_info("cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_gpu_info_names_the_gpu():
    info = machine.machine_info("cuda")
    assert info["gpu"]["gpu"] == torch.cuda.get_device_name()
    assert info["machine"].startswith(info["gpu"]["gpu"]) and "; host " in info["machine"]


def test_call_peak_memory_sees_a_call_that_frees_what_it_took():
    """The call's own peak, though it frees its 64 MiB before returning, and not what the
    process held before (the high-water mark is reset first)."""
    import torch
    from rnn_ablations.commands.machine import call_peak_memory, peak_memory
    held = torch.ones(16 * 2**20)  # 64 MiB the process holds before the call

    def burst():
        t = torch.ones(16 * 2**20)  # 64 MiB, touched, then freed
        return float(t[-1])
    got = call_peak_memory(burst)
    assert 60 * 2**20 < got < 100 * 2**20, got / 2**20
    assert peak_memory() >= got
    del held
