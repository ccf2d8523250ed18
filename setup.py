"""Install rnn_ablations (and build its C++ CPU kernel).

The kernel needs torch at build time, so install without build isolation:
    pip install --no-build-isolation -e .
(``scripts/setup.sh`` does this, after installing the pinned torch).  When the kernel cannot be
built (no compiler), set ``RNN_ABLATIONS_NO_KERNEL=1``: the package then runs its generic
PyTorch path, which computes the same numbers more slowly.
"""
import os
import platform

from setuptools import find_packages, setup

ext_modules, cmdclass = [], {}
if os.environ.get("RNN_ABLATIONS_NO_KERNEL", "0") != "1":
    from torch.utils.cpp_extension import BuildExtension, CppExtension

    def _cpu_flags():
        flags = ["-O3", "-fno-math-errno", "-fno-trapping-math"]
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

    ext_modules = [
        CppExtension(
            "rnn_ablations._C",
            ["rnn_ablations/csrc/ablated_rnn.cpp"],
            extra_compile_args=_cpu_flags(),
        )
    ]
    cmdclass = {"build_ext": BuildExtension.with_options(use_ninja=False)}

setup(
    name="rnn_ablations",
    version="0.1.0",
    description="LSTM ablations (S-RNN, LSTM−S-RNN, RAN) as fast drop-ins for torch.nn.LSTM, "
    "with AllenNLP and OpenNMT-py integrations",
    packages=find_packages(include=["rnn_ablations", "rnn_ablations.*"]),
    package_data={"rnn_ablations": ["csrc/*.cpp"]},
    python_requires=">=3.10",
    install_requires=["torch>=2.1", "numpy"],
    ext_modules=ext_modules,
    cmdclass=cmdclass,
    entry_points={"console_scripts": ["rnn-ablations=rnn_ablations.cli:main"]},
)
