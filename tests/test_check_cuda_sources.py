"""scripts/check_cuda_sources.py (compiles every CUDA source with nvcc, no GPU needed): its
argument checks and the compiler calls it makes, with a stand-in compiler that records them.
The real compilation takes minutes per file; it is run by hand where nvcc is installed."""
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from rnn_ablations import _build

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "check_cuda_sources.py"


def _run(*args, env=None):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          env=env, timeout=300)


def _headers(tmp_path):
    inc = tmp_path / "include"
    inc.mkdir()
    for h in ("cublas_v2.h", "cublasLt.h", "cusparse.h", "cusolverDn.h"):
        (inc / h).write_text("")
    return inc


def _fake_nvcc(tmp_path, rc):
    log = tmp_path / "calls.txt"
    nvcc = tmp_path / "nvcc"
    nvcc.write_text(f"#!/bin/sh\necho \"$@\" >> {log}\nexit {rc}\n")
    nvcc.chmod(nvcc.stat().st_mode | stat.S_IEXEC)
    return nvcc, log


def test_without_library_headers_it_names_them(tmp_path):
    nvcc, _ = _fake_nvcc(tmp_path, 0)
    env = dict(os.environ, CUDA_HOME=str(tmp_path / "no_cuda"))
    proc = _run("--nvcc", str(nvcc), "--include", str(tmp_path), env=env)
    if proc.returncode == 0:
        pytest.skip("an installed nvidia pip package provides the library headers")
    assert proc.returncode != 0 and "cublas_v2.h" in proc.stderr + proc.stdout and "--include" in proc.stderr + proc.stdout


def test_every_source_is_compiled_with_the_torch_and_library_headers(tmp_path):
    nvcc, log = _fake_nvcc(tmp_path, 0)
    inc = _headers(tmp_path)
    proc = _run("--nvcc", str(nvcc), "--include", str(inc), "--arch", "sm_80")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    calls = log.read_text().splitlines()
    sources = _build.cuda_sources()
    assert len(calls) == len(sources) > 0
    for call, src in zip(calls, sources):
        assert call.startswith(f"-c {src} "), call
        assert f"-I{inc}" in call and "-arch=sm_80" in call and "-DTORCH_EXTENSION_NAME=_C_cuda" in call
    assert f"{len(sources)} of {len(sources)} CUDA sources compiled" in proc.stdout


def test_a_failing_compile_fails_the_check(tmp_path):
    nvcc, _ = _fake_nvcc(tmp_path, 1)
    proc = _run("--nvcc", str(nvcc), "--include", str(_headers(tmp_path)))
    assert proc.returncode == 1
    assert "FAILED" in proc.stdout and "0 of" in proc.stdout
