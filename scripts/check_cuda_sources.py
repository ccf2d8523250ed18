"""Compile every CUDA source of the kernel (``rnn_ablations/_build.py``: ``cuda_sources()``) with
``nvcc -c``, as ``setup.py`` builds ``rnn_ablations._C_cuda`` with a CUDA torch, but against the
headers of whatever torch is installed: a check that the CUDA kernels compile on a machine with
CUDA's compiler and no GPU (and a CPU torch, whose wheel ships the ATen/c10 CUDA headers).
Nothing is linked or loaded.

    python scripts/check_cuda_sources.py [--include DIR ...] [--arch sm_90]

The CUDA libraries' headers that torch's CUDA headers include (cuBLAS, cuBLASLt, cuSPARSE,
cuSOLVER) are not part of every toolkit install: ``--include`` names folders that hold them,
e.g. the ``nvidia/cu13/include`` folder of the unpacked wheels of
``pip download --no-deps nvidia-cublas nvidia-cusparse nvidia-cusolver``; CUDA_HOME's include
folder and the ``nvidia/*/include`` folders of installed pip packages are searched too.  A CPU
build of torch lacks one generated header of a CUDA build, ``c10/cuda/impl/cuda_cmake_macros.h``
(one line, ``#define C10_CUDA_BUILD_SHARED_LIBS``): it is written to a temporary folder for the
check.  Exit status 0 when every source compiled; each failure prints nvcc's errors.
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


#: headers of the CUDA libraries that torch's CUDA headers include
LIBRARY_HEADERS = ("cublas_v2.h", "cublasLt.h", "cusparse.h", "cusolverDn.h")


def _library_includes(explicit):
    """The folders (from ``explicit``, CUDA_HOME, installed nvidia pip packages) that hold the
    headers of LIBRARY_HEADERS, or raise SystemExit naming what is missing."""
    candidates = list(explicit or [])
    candidates.append(os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "include"))
    for site in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}:
        candidates += sorted(glob.glob(os.path.join(site, "nvidia", "*", "include")))
    chosen, missing = [], []
    for header in LIBRARY_HEADERS:
        where = next((c for c in candidates if os.path.isfile(os.path.join(c, header))), None)
        if where is None:
            missing.append(header)
        elif where not in chosen:
            chosen.append(where)
    if missing:
        raise SystemExit(f"no folder holds {', '.join(missing)}: pass --include with the include "
                         "folder of the unpacked wheels of `pip download --no-deps nvidia-cublas "
                         "nvidia-cusparse nvidia-cusolver`")
    return chosen


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--include", action="append", default=[],
                    help="a folder with CUDA library headers (repeatable)")
    ap.add_argument("--arch", default="sm_90", help="the GPU architecture to compile for")
    ap.add_argument("--nvcc", default=shutil.which("nvcc"), help="CUDA's compiler")
    args = ap.parse_args(argv)
    if not args.nvcc:
        ap.error("nvcc was not found on PATH: install CUDA's compiler or pass --nvcc")
    from torch.utils import cpp_extension

    from rnn_ablations import _build
    libraries = _library_includes(args.include)
    failed = []
    with tempfile.TemporaryDirectory() as out:
        generated = os.path.join(out, "generated")
        torch_include = cpp_extension.include_paths()[0]
        if not os.path.isfile(os.path.join(torch_include, "c10/cuda/impl/cuda_cmake_macros.h")):
            os.makedirs(os.path.join(generated, "c10/cuda/impl"))
            with open(os.path.join(generated, "c10/cuda/impl/cuda_cmake_macros.h"), "w") as f:
                f.write("#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n")
        includes = (cpp_extension.include_paths() + [sysconfig.get_paths()["include"], generated]
                    + libraries)
        flags = (cpp_extension.COMMON_NVCC_FLAGS
                 + ["-O3", "-std=c++20", f"-arch={args.arch}", "-DTORCH_EXTENSION_NAME=_C_cuda",
                    "-DTORCH_API_INCLUDE_EXTENSION_H", "--compiler-options", "-fPIC"]
                 + [f"-I{p}" for p in includes])
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
          f"sources compiled with {args.nvcc} for {args.arch} (library headers: "
          f"{', '.join(libraries)})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
