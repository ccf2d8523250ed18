"""Start-up hooks of rnn_ablations, loaded from ``rnn_ablations_hooks.pth`` at interpreter start.

The ``.pth`` file (installed at the root of site-packages by ``setup.py``, removed by
``pip uninstall``) runs ``import rnn_ablations_hooks``.  This module imports nothing heavy and never
raises; it installs one meta-path finder that acts only when a host framework is imported:

* ``allennlp``: *before* it is imported, install the torchvision stand-in when the real
  torchvision cannot be imported (AllenNLP imports torchvision at module level; the PyPI
  torchvision is a CUDA build that does not load beside the CPU torch).  See
  :mod:`rnn_ablations.integrations.allennlp_compat`, which is loaded from its file here without
  importing the package ``rnn_ablations``: so that a later ``import rnn_ablations`` (AllenNLP's
  ``.allennlp_plugins`` file, ``--include-package``, a user's import) still runs the package's
  ``__init__``, which registers the AllenNLP encoders when AllenNLP is imported.  *After*
  ``allennlp`` has been imported, if ``rnn_ablations`` was imported before it, register the
  encoders then (:mod:`rnn_ablations.integrations.allennlp`): any import order registers them.
* ``onmt``: *after* it has been imported, register the encoders of every variant into
  ``onmt.encoders.str2enc`` (so the plain ``onmt_train -encoder_type ran`` and ``onmt_translate``
  work, in spawned training workers too) and make ``argparse.Namespace`` a torch safe global.
  See :mod:`rnn_ablations.integrations.onmt`.

``RNN_ABLATIONS_NO_HOOKS=1`` disables both.
"""
import os
import sys

_DONE = set()


def _warn(what, exc):
    try:
        sys.stderr.write(f"rnn_ablations: start-up hook for {what} failed: {exc!r}\n")
    except Exception:
        pass


def _before_allennlp():
    try:
        import importlib.util
        package = importlib.util.find_spec("rnn_ablations")  # finds it, does not import it
        if package is None or not package.submodule_search_locations:
            return
        path = os.path.join(list(package.submodule_search_locations)[0], "integrations",
                            "allennlp_compat.py")
        spec = importlib.util.spec_from_file_location("_rnn_ablations_allennlp_compat", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)  # standard library imports only
        module.install_torchvision_standin()
    except Exception as exc:  # never break the host program
        _warn("allennlp", exc)


def _after_allennlp():
    if "rnn_ablations" not in sys.modules:
        return  # `import rnn_ablations` (or AllenNLP's plugin loading) will register them
    try:
        import importlib
        importlib.import_module("rnn_ablations.integrations.allennlp")
    except Exception as exc:
        _warn("allennlp", exc)


def _after_onmt():
    try:
        from rnn_ablations.integrations.onmt import register
        register()
    except Exception as exc:
        _warn("onmt", exc)


class _Loader:
    def __init__(self, loader, after):
        self._loader, self._after = loader, after

    def create_module(self, spec):
        return self._loader.create_module(spec) if hasattr(self._loader, "create_module") else None

    def exec_module(self, module):
        self._loader.exec_module(module)
        self._after()

    def __getattr__(self, name):
        return getattr(self._loader, name)


class _Finder:
    """Meta-path finder that fires once per watched top-level package."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in ("allennlp", "onmt") or fullname in _DONE:
            return None
        _DONE.add(fullname)
        if fullname == "allennlp":
            _before_allennlp()
        try:
            import importlib.machinery
            spec = importlib.machinery.PathFinder.find_spec(fullname, path)
            if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
                return None
            spec.loader = _Loader(spec.loader,
                                  _after_allennlp if fullname == "allennlp" else _after_onmt)
            return spec
        except Exception as exc:
            _warn(fullname, exc)
            return None


def install():
    if os.environ.get("RNN_ABLATIONS_NO_HOOKS") == "1":
        return
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


try:
    install()
except Exception as _exc:  # pragma: no cover
    _warn("install", _exc)
