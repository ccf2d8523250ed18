"""How the C++ CPU kernel ``rnn_ablations._C`` is built, in one place for both ways of building it:

* at install time by ``setup.py``, when torch can be imported in the build environment (``pip
  install --no-build-isolation .``, ``scripts/setup.sh``); the module then records the torch
  version it was compiled against (``_C.torch_version``);
* on first use by :mod:`rnn_ablations.kernels.loader` otherwise (a plain ``pip install .``, whose
  isolated build environment has no torch, or a torch upgraded after the install): this file is
  then run as a script, in a subprocess, to compile the kernel into a cache directory.

This module imports nothing from ``rnn_ablations`` (running it must not import the package,
whose import would try to load the kernel being built).  The flags carry no ``-march``/``-mavx2``:
the vector code is compiled per instruction set (``csrc/cpu/vec_portable.cpp``, ``vec_avx2.cpp``,
``vec_avx512.cpp``, each with GCC target pragmas) and chosen at run time
(``csrc/cpu/vec_kernels.cpp``), so one build runs on every x86-64 CPU.

The sources (``csrc/``): ``common/`` what the CPU and CUDA kernels share (the kernel spec, the
element-wise maths: free of torch headers, they compile under g++ and NVRTC alike), ``cpu/`` the
CPU kernel (with its tensors' checks, ``layer_tensors.h``), ``cuda/`` the CUDA kernels, and ``bindings.cpp`` the CPU module's Python bindings.  The files include each other by
relative path, so no include directory is configured.
"""
from __future__ import annotations

import argparse
import glob
import os
import platform
import sys
from typing import Dict, List

#: the package folder (``rnn_ablations/``), which holds ``csrc/`` and the installed module
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CSRC = os.path.join(HERE, "csrc")


def _files(folders, pattern: str) -> List[str]:
    return sorted(p for folder in folders for p in glob.glob(os.path.join(CSRC, folder, pattern)))


#: C++ files compiled inside another one (``csrc/cpu/layers.cpp`` includes them), not on their
#: own: they share most of their compile time (the torch headers, the step templates)
INCLUDED_SOURCES = ("cpu/layer_directions.cpp", "cpu/layer_pipelined.cpp", "cpu/layer_plain.cpp")


def _included(path: str) -> bool:
    return os.path.relpath(path, CSRC).replace(os.sep, "/") in INCLUDED_SOURCES


def cpu_sources() -> List[str]:
    """The CPU kernel's C++ files the compiler runs on (``csrc/*.cpp``, ``csrc/common/*.cpp``,
    ``csrc/cpu/*.cpp`` but :data:`INCLUDED_SOURCES`), sorted."""
    return [p for p in _files(("", "common", "cpu"), "*.cpp") if not _included(p)]


def cpu_headers() -> List[str]:
    """What :func:`cpu_sources` include: the headers and :data:`INCLUDED_SOURCES`, sorted."""
    return sorted(_files(("", "common", "cpu"), "*.h")
                  + [p for p in _files(("", "common", "cpu"), "*.cpp") if _included(p)])


def cuda_sources() -> List[str]:
    """The CUDA kernels' files (``csrc/cuda/*.cu``), sorted."""
    return _files(("cuda",), "*.cu")


def cuda_headers() -> List[str]:
    return _files(("common", "cuda"), "*.h")


def cpu_compile_args() -> List[str]:
    # -fopenmp: ATen's parallel_for is a header template, parallel only when the extension is
    # compiled with OpenMP; it then runs in torch's own OpenMP team (the wheel's libgomp.so.1,
    # already loaded by `import torch`, has the same soname).  -g0: no debug info in the module
    # (it was 12.6 MB with it).
    args = ["-O3", "-fno-math-errno", "-fno-trapping-math", "-fopenmp", "-g0"]
    if platform.system() == "Darwin":  # pragma: no cover - not tested: Apple's clang has no -fopenmp
        args.remove("-fopenmp")
    return args


def cpu_link_args() -> List[str]:
    if platform.system() == "Darwin":  # pragma: no cover
        return []
    return ["-fopenmp", "-Wl,--strip-debug"]


def cpu_define_macros(torch_version: str) -> List[tuple]:
    # The values are passed as one argument each (no shell), so the quotes make C string
    # literals.  The module reports both (`torch_version`, `sources_digest`), so that the loader
    # can refuse a module built for another torch or from other sources.
    # The last two make an include of <ATen/ATen.h> or <ATen/Functions.h> (every operator's
    # declarations, ~10 s of compiler time per file on a 2-core EPYC, most of the build's) a
    # compile error: each file includes <ATen/core/Tensor.h> and the ATen/ops/*.h headers of the
    # free functions it calls, as torch's own sources do under these two macros.
    return [("RNN_ABLATIONS_TORCH_VERSION", '"%s"' % torch_version),
            ("RNN_ABLATIONS_SOURCES_DIGEST", '"%s"' % sources_digest()),
            ("AT_PER_OPERATOR_HEADERS", None), ("TORCH_ASSERT_ONLY_METHOD_OPERATORS", None)]


def sources_digest() -> str:
    """SHA-256 (16 hex digits) of what the CPU module is compiled from: its C++ sources and
    headers, this file and the compiler flags.  Empty when the sources are absent."""
    import hashlib

    files = cpu_sources() + cpu_headers()
    if not files:
        return ""
    h = hashlib.sha256()
    for path in files + [os.path.abspath(__file__)]:
        h.update(os.path.relpath(path, HERE).encode())
        with open(path, "rb") as f:
            h.update(f.read())
    h.update(" ".join(cpu_compile_args() + cpu_link_args()).encode())
    return h.hexdigest()[:16]


def cpu_extension(name: str = "rnn_ablations._C", relative_to: str = ""):
    """The ``CppExtension`` of the CPU kernel (imports torch)."""
    import torch
    from torch.utils.cpp_extension import CppExtension

    def rel(p):
        return os.path.relpath(p, relative_to) if relative_to else p

    return CppExtension(
        name,
        [rel(p) for p in cpu_sources()],
        depends=[rel(p) for p in cpu_headers()],
        define_macros=cpu_define_macros(torch.__version__),
        extra_compile_args=cpu_compile_args(),
        extra_link_args=cpu_link_args(),
    )


#: The record written beside the module installed inside the package (by ``setup.py``'s
#: ``build_ext``, also ``--inplace``): its file name, size and SHA-256, and the torch it was built
#: for.  The loader maps the module only when it matches (a truncated shared library kills the
#: process with SIGBUS when it is loaded).
INSTALLED_RECORD = "_C.build.json"


def file_digest(path: str):
    """``(size in bytes, SHA-256 hex digest)`` of a file."""
    import hashlib

    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
            size += len(block)
    return size, h.hexdigest()


def write_installed_record(module_path: str, torch_version: str) -> str:
    """Write :data:`INSTALLED_RECORD` beside ``module_path`` (flushed, then renamed into place);
    returns its path."""
    import json

    folder = os.path.dirname(os.path.abspath(module_path))
    size, sha = file_digest(module_path)
    record = {"module": os.path.basename(module_path), "size": size, "sha256": sha,
              "torch": torch_version, "sources": sources_digest()}
    final = os.path.join(folder, INSTALLED_RECORD)
    temp = final + ".tmp"
    with open(temp, "w") as f:
        json.dump(record, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temp, final)
    return final


def recording_build_ext(base):
    """``base`` (a ``build_ext`` command class) that also writes :data:`INSTALLED_RECORD` beside
    the CPU kernel it builds."""

    class build_ext_with_record(base):
        def build_extension(self, ext):
            super().build_extension(ext)
            if ext.name.split(".")[-1] == "_C":
                import torch

                write_installed_record(self.get_ext_fullpath(ext.name), torch.__version__)

        def copy_extensions_to_source(self):  # --inplace / editable: the module beside the sources
            super().copy_extensions_to_source()
            import torch

            build_py = self.get_finalized_command("build_py")
            for ext in self.extensions:
                if ext.name.split(".")[-1] == "_C":
                    fullname = self.get_ext_fullname(ext.name)
                    package_dir = build_py.get_package_dir(fullname.rpartition(".")[0])
                    write_installed_record(
                        os.path.join(package_dir, os.path.basename(self.get_ext_filename(fullname))),
                        torch.__version__)

        def get_outputs(self):
            outputs = list(super().get_outputs())
            for ext in self.extensions:
                if ext.name.split(".")[-1] == "_C":
                    outputs.append(os.path.join(os.path.dirname(self.get_ext_fullpath(ext.name)),
                                                INSTALLED_RECORD))
            return outputs

    return build_ext_with_record


def fingerprint() -> Dict[str, str]:
    """What the compiled module depends on: the cache key of a first-use build."""
    import torch

    return {
        "sources": sources_digest(),
        "torch": torch.__version__,
        "torch_git": getattr(torch.version, "git_version", "") or "",
        "python": "%s-%d.%d" % (sys.implementation.cache_tag, *sys.version_info[:2]),
        "machine": platform.machine(),
    }


def build_into(out_dir: str, build_temp: str) -> str:
    """Compile the kernel as ``_C`` into ``out_dir`` (setuptools; ninja is used when present, not
    needed); returns the path of the module."""
    from setuptools import setup
    from torch.utils.cpp_extension import BuildExtension, is_ninja_available

    ext = cpu_extension(name="_C")
    setup(
        name="rnn_ablations_kernel",
        ext_modules=[ext],
        # ninja (when installed) compiles the files in parallel; setuptools alone, one by one.
        cmdclass={"build_ext": BuildExtension.with_options(use_ninja=is_ninja_available())},
        script_args=["-q", "build_ext", "--build-lib", out_dir, "--build-temp", build_temp],
    )
    built = [f for f in os.listdir(out_dir) if f.startswith("_C") and f.endswith((".so", ".pyd"))]
    if not built:
        raise RuntimeError(f"the build wrote no module into {out_dir}")
    return os.path.join(out_dir, built[0])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="compile rnn_ablations' CPU kernel into a folder")
    parser.add_argument("--out", required=True)
    parser.add_argument("--build-temp", required=True)
    a = parser.parse_args()
    print(build_into(a.out, a.build_temp))
