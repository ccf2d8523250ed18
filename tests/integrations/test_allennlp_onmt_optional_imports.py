"""Each framework integration imports without the other framework, and without its own.

AllenNLP's ``--include-package rnn_ablations`` imports every submodule of the package, the
OpenNMT-py adapter included; an installation with only one of the two frameworks must still work,
and using the missing one must say which pip command installs it.  Each case runs in a fresh
interpreter where one framework is hidden by a meta-path finder that refuses to import it.
"""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

HIDE_AND_WALK = textwrap.dedent('''
    import importlib, json, pkgutil, sys

    HIDDEN = sys.argv[1]

    class Hide:
        """What an environment without the framework does: the import fails."""
        def find_spec(self, name, path=None, target=None):
            if name == HIDDEN or name.startswith(HIDDEN + "."):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, Hide())

    def walk(package_name):
        """allennlp.common.util.import_module_and_submodules, without AllenNLP."""
        module = importlib.import_module(package_name)
        path = getattr(module, "__path__", [])
        path_string = "" if not path else path[0]
        for finder, name, _ in pkgutil.walk_packages(path):
            if path_string and finder.path != path_string:
                continue
            walk(f"{package_name}.{name}")

    if HIDDEN == "onmt":
        from allennlp.common.util import import_module_and_submodules
        import_module_and_submodules("rnn_ablations")  # what --include-package rnn_ablations does
    else:
        walk("rnn_ablations")
    out = {"walked": sorted(m for m in sys.modules if m.startswith("rnn_ablations"))}

    def error_of(call):
        try:
            call()
        except ImportError as exc:
            return str(exc)
        return None

    if HIDDEN == "onmt":
        import rnn_ablations.integrations.onmt as ours
        out["register"] = error_of(ours.register)
        out["encoder"] = error_of(lambda: ours.ENCODER_CLASSES["bran"]("ran", True, 1, 4))
        out["encoder_types"] = sorted(ours.ENCODER_TYPES)
        from allennlp.modules.seq2seq_encoders import Seq2SeqEncoder
        from allennlp.models import Model
        out["registered"] = [Seq2SeqEncoder.by_name("stacked_bidirectional_ran").__module__,
                             Model.by_name("drqa").__module__]
    else:
        import rnn_ablations.integrations.allennlp as ours
        out["name"] = error_of(lambda: ours.DrQA)
        out["from_import"] = error_of(
            lambda: exec("from rnn_ablations.integrations.allennlp import encoders"))
        out["require"] = error_of(ours.require_allennlp)
        import onmt.encoders
        out["registered"] = [onmt.encoders.str2enc["bran"].__module__]
    print("RESULT " + json.dumps(out))
''')


def _run_hidden(framework):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    env.pop("RNN_ABLATIONS_NO_HOOKS", None)
    proc = subprocess.run([sys.executable, "-c", HIDE_AND_WALK, framework], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def _names_pip_command(message, extra, package):
    assert message is not None, "no ImportError was raised"
    assert f'pip install "$PKG[{extra}]"' in message, message
    assert f"pip install --no-deps {package}" in message, message
    assert "scripts/setup.sh" not in message, message


def test_include_package_walk_without_onmt():
    pytest.importorskip("allennlp", reason="AllenNLP is not installed")
    pytest.importorskip("allennlp_models", reason="allennlp-models is not installed")
    out = _run_hidden("onmt")
    assert "rnn_ablations.integrations.onmt" in out["walked"]
    assert "rnn_ablations.integrations.allennlp.drqa" in out["walked"]
    assert out["registered"] == ["rnn_ablations.integrations.allennlp.encoders",
                                 "rnn_ablations.integrations.allennlp.drqa"]
    for key in ("register", "encoder"):
        _names_pip_command(out[key], "onmt", "OpenNMT-py==3.5.1")
    from rnn_ablations.variants import VARIANTS
    assert out["encoder_types"] == sorted(list(VARIANTS) + ["b" + v for v in VARIANTS])


def test_package_walk_without_allennlp():
    pytest.importorskip("onmt", reason="OpenNMT-py is not installed")
    out = _run_hidden("allennlp")
    assert "rnn_ablations.integrations.allennlp" in out["walked"]
    assert "rnn_ablations.integrations.onmt" in out["walked"]
    assert not any(m.startswith("rnn_ablations.integrations.allennlp.") for m in out["walked"])
    assert out["registered"] == ["rnn_ablations.integrations.onmt"]
    for key in ("name", "from_import", "require"):
        _names_pip_command(out[key], "allennlp", "allennlp==2.10.1")
