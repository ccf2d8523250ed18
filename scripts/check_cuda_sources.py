"""Compile every CUDA source of the kernel (``rnn_ablations/_build.py``: ``cuda_sources()``) with
``nvcc -c``, as ``setup.py`` builds ``rnn_ablations._C_cuda`` with a CUDA torch, but against the
headers of whatever torch is installed: a check that the CUDA kernels compile on a machine with
CUDA's compiler and no GPU (and a CPU torch, whose wheel ships the ATen/c10 CUDA headers).
Nothing is linked or loaded.

    python scripts/check_cuda_sources.py [--cublas-include DIR] [--arch sm_90]

cuBLAS's headers are not part of every toolkit install: ``--cublas-include`` (or the variable
``CUBLAS_INCLUDE``) names a folder with ``cublas_v2.h``; by default CUDA_HOME's include folder
is used, then the include folder of the ``nvidia-cublas`` pip package if it is installed or
unpacked there.  Exit status 0 when every source compiled; each failure prints nvcc's errors.
"""
from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _cublas_include(explicit):
    candidates = [explicit, os.environ.get("CUBLAS_INCLUDE")]
    cuda_home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    candidates.append(os.path.join(cuda_home, "include"))
    for site in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}:
        candidates += glob.glob(os.path.join(site, "nvidia", "*", "include"))
    for c in candidates:
        if c and os.path.isfile(os.path.join(c, "cublas_v2.h")):
            return c
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cublas-include", help="folder holding cublas_v2.h")
    ap.add_argument("--arch", default="sm_90", help="the GPU architecture to compile for")
    ap.add_argument("--nvcc", default=shutil.which("nvcc"), help="CUDA's compiler")
    args = ap.parse_args(argv)
    if not args.nvcc:
        ap.error("nvcc was not found on PATH: install CUDA's compiler or pass --nvcc")
    from torch.utils import cpp_extension

    from rnn_ablations import _build
    cublas = _cublas_include(args.cublas_include)
    if cublas is None:
        ap.error("no folder with cublas_v2.h: pass --cublas-include (e.g. the include folder "
                 "of an unpacked `pip download nvidia-cublas` wheel)")
    includes = cpp_extension.include_paths() + [sysconfig.get_paths()["include"], cublas]
    flags = (cpp_extension.COMMON_NVCC_FLAGS + ["-O3", "-std=c++17", f"-arch={args.arch}",
                                                "-DTORCH_EXTENSION_NAME=_C_cuda",
                                                "-DTORCH_API_INCLUDE_EXTENSION_H",
                                                "--compiler-options", "-fPIC"]
             + [f"-I{p}" for p in includes])
    failed = []
    with tempfile.TemporaryDirectory() as out:
        for src in _build.cuda_sources():
            t0 = time.perf_counter()
            obj = os.path.join(out, Path(src).stem + ".o")
            proc = subprocess.run([args.nvcc, "-c", src, "-o", obj] + flags,
                                  capture_output=True, text=True)
            took = time.perf_counter() - t0
            rel = os.path.relpath(src, REPO)
            if proc.returncode == 0:
                print(f"ok      {rel} ({took:.0f} s)")
            else:
                failed.append(rel)
                print(f"FAILED  {rel} ({took:.0f} s)\n{proc.stderr[-4000:]}")
    print(f"{len(_build.cuda_sources()) - len(failed)} of {len(_build.cuda_sources())} CUDA "
          f"sources compiled with {args.nvcc} for {args.arch} (cuBLAS headers: {cublas})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
