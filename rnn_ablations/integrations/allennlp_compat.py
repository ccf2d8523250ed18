"""Compatibility shim that lets AllenNLP 2.10.1 import on a CPU-only torch without torchvision.

AllenNLP imports ``torchvision`` at module level (``allennlp/data/image_loader.py`` and
``allennlp/modules/vision/region_detector.py``, the latter as ``import torchvision.ops.boxes``),
although only its vision models use it.  The torchvision wheel on PyPI is a CUDA build that does
not load beside the CPU torch, so on such a machine ``import allennlp`` (and therefore the
``allennlp`` command) fails before any plugin could step in.

:func:`install_torchvision_standin` puts a small stand-in package into :data:`sys.modules` *when,
and only when, the real torchvision cannot be imported*.  It is called by
:mod:`rnn_ablations_hooks` (loaded from ``rnn_ablations_hooks.pth`` at interpreter start) the
moment ``allennlp`` is first imported, before AllenNLP's own code runs.

The stand-in:

* is a real module object with a proper ``__spec__`` (``transformers`` calls
  ``importlib.util.find_spec("torchvision")``, which raises ``ValueError`` for a module whose
  ``__spec__`` is ``None``) and an empty ``__path__``, so ``import torchvision.<anything else>``
  fails with the usual ``ModuleNotFoundError``;
* provides the submodules imported at module level (``torchvision.ops``, ``torchvision.ops.boxes``);
* has no distribution metadata, so ``transformers`` reports torchvision as *not available* and
  never uses it;
* raises an ``ImportError`` that says what happened on any other attribute access (e.g.
  ``torchvision.io.read_image`` in AllenNLP's image loader): AllenNLP's text models work, its vision
  models do not.

This module must never raise from :func:`install_torchvision_standin`, and it never imports
AllenNLP (importing AllenNLP is what triggers the call).
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import types

__all__ = ["install_torchvision_standin", "is_standin", "STANDIN_MODULES"]

#: The modules of the stand-in: AllenNLP imports these at module level.
STANDIN_MODULES = ("torchvision", "torchvision.ops", "torchvision.ops.boxes")

_MARKER = "__rnn_ablations_standin__"

_MESSAGE = (
    "torchvision is not usable in this environment (it is not installed, or the installed build "
    "does not load beside this torch), so rnn_ablations installed a stand-in module to let AllenNLP "
    "import; AllenNLP's text models work, but {what} needs the real torchvision: install a "
    "torchvision build that matches torch {torch_version}"
)


class _StandinModule(types.ModuleType):
    """A module whose unknown attributes raise a clear ``ImportError``."""

    def __getattr__(self, name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        what = f"{self.__name__}.{name}"
        try:
            torch_version = sys.modules["torch"].__version__
        except Exception:
            torch_version = "(unknown)"
        raise ImportError(_MESSAGE.format(what=what, torch_version=torch_version))


def _make_module(name: str, is_package: bool) -> types.ModuleType:
    module = _StandinModule(name)
    spec = importlib.machinery.ModuleSpec(name, loader=None, is_package=is_package)
    module.__spec__ = spec
    module.__loader__ = None
    module.__package__ = name if is_package else name.rpartition(".")[0]
    if is_package:
        module.__path__ = []
        spec.submodule_search_locations = []
    module.__file__ = None
    module.__doc__ = ("Stand-in for torchvision installed by "
                      "rnn_ablations.integrations.allennlp_compat (the real torchvision cannot be "
                      "imported here).")
    setattr(module, _MARKER, True)
    return module


def is_standin(module=None) -> bool:
    """True when ``module`` (default: ``sys.modules["torchvision"]``) is this stand-in."""
    if module is None:
        module = sys.modules.get("torchvision")
    return bool(module is not None and module.__dict__.get(_MARKER, False))


def _real_torchvision_importable() -> bool:
    """Try the real torchvision; clean up whatever a failed import left behind."""
    try:
        if importlib.util.find_spec("torchvision") is None:
            return False
    except (ImportError, ValueError):
        return False
    before = set(sys.modules)
    try:
        import torchvision  # noqa: F401
        return True
    except Exception:  # a broken CUDA build raises RuntimeError/OSError, not ImportError
        for name in set(sys.modules) - before:
            if name == "torchvision" or name.startswith("torchvision."):
                sys.modules.pop(name, None)
        return False


def install_torchvision_standin() -> bool:
    """Install the stand-in when the real torchvision cannot be imported.

    Returns True when the stand-in is (now or already) in place, False when the real torchvision
    is used or nothing could be done.  Never raises.
    """
    try:
        existing = sys.modules.get("torchvision")
        if existing is not None:
            return is_standin(existing)
        if _real_torchvision_importable():
            return False
        modules = {name: _make_module(name, is_package=(name != "torchvision.ops.boxes"))
                   for name in STANDIN_MODULES}
        for name, module in modules.items():
            parent, _, child = name.rpartition(".")
            if parent:
                # set directly: the parent's __getattr__ only sees attributes that are missing
                modules[parent].__dict__[child] = module
        for name, module in modules.items():
            sys.modules.setdefault(name, module)
        return True
    except Exception as exc:  # never break the host program
        try:
            sys.stderr.write(f"rnn_ablations: could not install the torchvision stand-in: {exc!r}\n")
        except Exception:
            pass
        return False
