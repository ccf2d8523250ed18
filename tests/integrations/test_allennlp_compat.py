"""The torchvision stand-in (rnn_ablations.integrations.allennlp_compat), each case in a fresh
interpreter with the start-up hooks off, so that nothing else has installed it."""
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
COMPAT = REPO / "rnn_ablations" / "integrations" / "allennlp_compat.py"

# Load the module from its file, without importing the rnn_ablations package (and so torch).
PRELUDE = textwrap.dedent(f"""
    import importlib.util, sys
    spec = importlib.util.spec_from_file_location("allennlp_compat", {str(COMPAT)!r})
    compat = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(compat)
""")


def _python(code, extra_path=None, timeout=120):
    env = dict(os.environ, RNN_ABLATIONS_NO_HOOKS="1", PYTHONWARNINGS="ignore",
               OMP_NUM_THREADS="1")
    if extra_path:
        env["PYTHONPATH"] = os.pathsep.join([str(extra_path), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(code)], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def _has_real_torchvision():
    code = "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('torchvision') else 1)"
    return subprocess.run([sys.executable, "-c", code]).returncode == 0


@pytest.mark.skipif(_has_real_torchvision(), reason="a torchvision is installed; the stand-in case "
                    "is covered by the broken-torchvision test below")
def test_standin_when_torchvision_is_absent():
    out = _python("""
        import importlib.util
        assert "allennlp" not in sys.modules and "torch" not in sys.modules
        assert compat.install_torchvision_standin() is True
        assert "allennlp" not in sys.modules  # it never imports AllenNLP
        import torchvision, torchvision.ops.boxes as box_ops
        assert compat.is_standin(torchvision)
        assert torchvision.__spec__ is not None and torchvision.__spec__.name == "torchvision"
        assert importlib.util.find_spec("torchvision") is torchvision.__spec__
        assert torchvision.ops.boxes is box_ops
        try:
            torchvision.io
        except ImportError as exc:
            assert "torchvision.io needs the real torchvision" in str(exc), exc
        else:
            raise AssertionError("torchvision.io should raise")
        try:
            import torchvision.models
        except ModuleNotFoundError:
            pass
        else:
            raise AssertionError("unknown submodules must not import")
        assert compat.install_torchvision_standin() is True  # idempotent
        assert sys.modules["torchvision"] is torchvision
        print("ok")
    """)
    assert out.strip() == "ok"


def test_real_torchvision_is_left_alone(tmp_path):
    pkg = tmp_path / "torchvision"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("REAL = True\n")
    out = _python("""
        assert compat.install_torchvision_standin() is False
        import torchvision
        assert torchvision.REAL and not compat.is_standin()
        print("ok")
    """, extra_path=tmp_path)
    assert out.strip() == "ok"


def test_broken_torchvision_is_replaced_and_cleaned_up(tmp_path):
    pkg = tmp_path / "torchvision"
    (pkg / "ops").mkdir(parents=True)
    (pkg / "ops" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text(
        "import torchvision.ops\nraise RuntimeError('operator torchvision::nms does not exist')\n")
    out = _python("""
        assert compat.install_torchvision_standin() is True
        import torchvision, torchvision.ops
        assert compat.is_standin(torchvision) and compat.is_standin(torchvision.ops)
        print("ok")
    """, extra_path=tmp_path)
    assert out.strip() == "ok"


def test_never_raises():
    out = _python("""
        class Boom(dict):
            def get(self, *a):
                raise RuntimeError("boom")
        real = sys.modules
        compat.sys = type("S", (), {"modules": Boom(), "stderr": sys.stderr})()
        assert compat.install_torchvision_standin() is False
        print("ok")
    """)
    assert out.strip() == "ok"


def test_allennlp_imports_and_rnn_ablations_registers_after_it():
    """With the stand-in in place AllenNLP imports on this torch; importing rnn_ablations
    afterwards registers the AllenNLP integration (the guarded import in its __init__)."""
    pytest.importorskip("allennlp", reason="AllenNLP is not installed")
    nltk = Path(tempfile.gettempdir()) / "rnn_ablations_nltk_data"
    (nltk / "tokenizers" / "punkt").mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("NLTK_DATA", str(nltk))
    out = _python("""
        compat.install_torchvision_standin()
        import allennlp.models
        from allennlp.modules import Seq2SeqEncoder
        assert "ran" not in Seq2SeqEncoder.list_available()
        assert "rnn_ablations" not in sys.modules
        import rnn_ablations
        assert {"ran", "stacked_bidirectional_ablated_lstm"} <= set(Seq2SeqEncoder.list_available())
        print("ok")
    """, timeout=300)
    assert out.strip().endswith("ok")
