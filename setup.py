"""Build rnn_ablations (metadata in pyproject.toml; this file builds the C++ kernels).

* ``pip install .`` / ``pip wheel .`` / ``python -m build``: pip builds in an isolated
  environment without torch, so the wheel is pure Python and the CPU kernel is compiled on first
  use, for the torch then installed, into a cache directory (``rnn_ablations/kernels/loader.py``).
* ``pip install --no-build-isolation .`` (``scripts/setup.sh``): torch is importable here, so the
  CPU kernel ``rnn_ablations._C`` is compiled now against the installed torch (the module records
  that torch version; after a torch upgrade the package compiles a fresh one on first use).
  ``RNN_ABLATIONS_NO_KERNEL=1`` skips it.

Nothing CUDA is built here: the CUDA kernels' device sources (``rnn_ablations/csrc/cuda/*.cuh``)
are package data, compiled at first use by NVRTC, the runtime compiler that a CUDA build of torch
already loads (``rnn_ablations/kernels/cuda``); no CUDA toolkit or nvcc is needed.
"""
import importlib.util
import os

from setuptools import setup

try:
    import torch  # noqa: F401  (absent in pip's isolated build environment)
    _have_torch = True
except ImportError:
    _have_torch = False


def _load_build_module():
    # rnn_ablations/kernels/build.py without importing the package (which needs torch at import).
    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.util.spec_from_file_location(
        "_rnn_ablations_build", os.path.join(here, "rnn_ablations", "kernels", "build.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ext_modules, cmdclass = [], {}
_cpu_kernel = _have_torch and os.environ.get("RNN_ABLATIONS_NO_KERNEL", "0") != "1"
if _cpu_kernel:
    from torch.utils.cpp_extension import BuildExtension, is_ninja_available

    _here = os.path.dirname(os.path.abspath(__file__))
    _build = _load_build_module()
    ext_modules.append(_build.cpu_extension(relative_to=_here))
    # the CPU module's size and SHA-256 are recorded beside it (_build.INSTALLED_RECORD): the
    # loader maps no module that does not match (a truncated one would kill the process).  ninja
    # (when on the PATH) compiles the files in parallel, as the first-use build does; setuptools
    # alone, one by one.
    cmdclass = {"build_ext": _build.recording_build_ext(
        BuildExtension.with_options(use_ninja=is_ninja_available()))}

from setuptools.command.build_py import build_py as _build_py


# The configs live in the repository's top-level allennlp_configs/ and onmt_configs/; the wheel
# carries them as package data in rnn_ablations/configs/{allennlp,onmt}/ (`rnn-ablations configs`
# finds either), the toy parallel data of onmt_configs/toy_fixture.yaml in
# rnn_ablations/configs/onmt_toy_data/ (`rnn-ablations configs path onmt_toy_data`), and a few
# examples in each AllenNLP reader's format (SQuAD JSON, CoNLL-U, GloVe text) in
# rnn_ablations/configs/allennlp_toy_data/ (`rnn-ablations configs path allennlp_toy_data`).
_CONFIG_DIRS = {"allennlp_configs": "allennlp", "onmt_configs": "onmt",
                os.path.join("tests", "fixtures", "onmt"): "onmt_toy_data",
                os.path.join("tests", "fixtures", "allennlp"): "allennlp_toy_data"}
_CONFIG_SUFFIXES = (".jsonnet", ".yaml", ".txt", ".json", ".jsonl", ".conllu")


class build_py(_build_py):
    """Also place ``rnn_ablations_hooks.pth`` at the root of the wheel (= of site-packages), so
    that it is installed and uninstalled with the package (normal and editable installs), and
    copy the configs into the package."""

    _PTH = "rnn_ablations_hooks.pth"

    def _extra(self):
        """(built path, source path) of the files this class adds."""
        pairs = [(os.path.join(self.build_lib, self._PTH), self._PTH)]
        for src_dir, name in _CONFIG_DIRS.items():
            if not os.path.isdir(src_dir):
                continue
            for f in sorted(os.listdir(src_dir)):
                if f.endswith(_CONFIG_SUFFIXES):
                    pairs.append((os.path.join(self.build_lib, "rnn_ablations", "configs", name, f),
                                  os.path.join(src_dir, f)))
        return pairs

    def run(self):
        super().run()
        for dst, src in self._extra():
            self.mkpath(os.path.dirname(dst))
            self.copy_file(src, dst, preserve_mode=0)

    def get_outputs(self, include_bytecode=1):
        return super().get_outputs(include_bytecode) + [dst for dst, _ in self._extra()]

    def get_output_mapping(self):
        mapping = dict(super().get_output_mapping())
        mapping.update(dict(self._extra()))
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

# Name, version, dependencies, extras, entry points and package data: pyproject.toml.
setup(ext_modules=ext_modules, cmdclass=cmdclass)
