"""Install rnn_ablations (and build its C++ CPU kernel).

The kernel needs torch at build time, so install without build isolation:
    pip install --no-build-isolation -e .
(``scripts/setup.sh`` does this, after installing the pinned torch).  When the kernel cannot be
built (no compiler), set ``RNN_ABLATIONS_NO_KERNEL=1``: the package then runs its generic
PyTorch path, which computes the same numbers more slowly.

With a CUDA build of torch and CUDA's compiler (``nvcc``, found through ``CUDA_HOME``), the CUDA
kernel ``rnn_ablations._C_cuda`` is built as well (``RNN_ABLATIONS_NO_CUDA=1`` skips it); with
the CPU wheel this project pins, it is not.
"""
import os
import platform

from setuptools import find_packages, setup

ext_modules, cmdclass = [], {}
_cpu_kernel = os.environ.get("RNN_ABLATIONS_NO_KERNEL", "0") != "1"
_cuda_kernel = False
if os.environ.get("RNN_ABLATIONS_NO_CUDA", "0") != "1":
    import torch
    from torch.utils.cpp_extension import CUDA_HOME

    _cuda_kernel = torch.version.cuda is not None and CUDA_HOME is not None
if _cpu_kernel or _cuda_kernel:
    from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension

    def _cpu_flags():
        # -fopenmp: ATen's parallel_for is a header template, parallel only when the extension
        # is compiled with OpenMP; it then runs in torch's own OpenMP team (the wheel's
        # libgomp.so.1, already loaded by `import torch`, has the same soname).
        flags = ["-O3", "-fno-math-errno", "-fno-trapping-math", "-fopenmp"]
        if platform.machine() in ("x86_64", "AMD64"):
            try:
                with open("/proc/cpuinfo") as f:
                    info = f.read()
            except OSError:
                info = ""
            # The kernel is built on the machine that runs it (an editable/venv install), so the
            # vector ISA of this machine is used when it has it.
            if " avx2" in info and " fma" in info:
                flags += ["-mavx2", "-mfma"]
        return flags

    if _cpu_kernel:
        ext_modules.append(CppExtension(
            "rnn_ablations._C",
            ["rnn_ablations/csrc/ablated_rnn.cpp", "rnn_ablations/csrc/scan.cpp"],
            depends=["rnn_ablations/csrc/common.h"],
            extra_compile_args=_cpu_flags(),
            extra_link_args=["-fopenmp"],
        ))
    if _cuda_kernel:
        ext_modules.append(CUDAExtension(
            "rnn_ablations._C_cuda",
            ["rnn_ablations/csrc/ablated_rnn_cuda.cu", "rnn_ablations/csrc/scan_cuda.cu"],
            depends=["rnn_ablations/csrc/common.h"],
            extra_compile_args={"cxx": ["-O3"], "nvcc": ["-O3"]},
            libraries=["cublas"],
        ))
    cmdclass = {"build_ext": BuildExtension.with_options(use_ninja=False)}

from setuptools.command.build_py import build_py as _build_py


class build_py(_build_py):
    """Also place ``rnn_ablations_hooks.pth`` at the root of the wheel (= of site-packages), so
    that it is installed and uninstalled with the package (normal and editable installs)."""

    _PTH = "rnn_ablations_hooks.pth"

    def run(self):
        super().run()
        self.copy_file(self._PTH, os.path.join(self.build_lib, self._PTH), preserve_mode=0)

    def get_outputs(self, include_bytecode=1):
        return super().get_outputs(include_bytecode) + [os.path.join(self.build_lib, self._PTH)]

    def get_output_mapping(self):
        mapping = dict(super().get_output_mapping())
        mapping[os.path.join(self.build_lib, self._PTH)] = self._PTH
        return mapping


cmdclass["build_py"] = build_py

try:  # editable installs (PEP 660) build their wheel without build_py's outputs at the root
    from setuptools.command.editable_wheel import editable_wheel as _editable_wheel

    class editable_wheel(_editable_wheel):
        def _install_namespaces(self, installation_dir, pth_prefix):
            super()._install_namespaces(installation_dir, pth_prefix)
            import shutil
            shutil.copyfile(build_py._PTH, os.path.join(installation_dir, build_py._PTH))

    cmdclass["editable_wheel"] = editable_wheel
except ImportError:  # pragma: no cover - very old setuptools
    pass

setup(
    name="rnn_ablations",
    version="0.1.0",
    description="LSTM ablations (S-RNN, LSTM−S-RNN, RAN) as fast drop-ins for torch.nn.LSTM, "
    "with AllenNLP and OpenNMT-py integrations",
    packages=find_packages(include=["rnn_ablations", "rnn_ablations.*"]),
    py_modules=["rnn_ablations_hooks"],
    package_data={"rnn_ablations": ["csrc/*.cpp", "csrc/*.cu", "csrc/*.h"]},
    python_requires=">=3.10",
    install_requires=["torch>=2.1", "numpy"],
    ext_modules=ext_modules,
    cmdclass=cmdclass,
    entry_points={"console_scripts": ["rnn-ablations=rnn_ablations.cli:main"]},
)
