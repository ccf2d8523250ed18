"""The AllenNLP encoders with an empty batch: every encoder name, Seq2Seq and Seq2Vec,
plain and stacked, on every code path, forward and backward: empty outputs of the right shapes
and zero gradients, as ``torch.nn.LSTM`` (AllenNLP's own ``lstm`` refuses an empty batch)."""
import contextlib
import os
import tempfile
from pathlib import Path

import pytest

_NLTK = Path(tempfile.gettempdir()) / "rnn_ablations_nltk_data"
(_NLTK / "tokenizers" / "punkt").mkdir(parents=True, exist_ok=True)
os.environ.setdefault("NLTK_DATA", str(_NLTK))  # nltk would try to download punkt at import

pytest.importorskip("allennlp", reason="AllenNLP is not installed (bash scripts/setup.sh installs it)")

import torch  # noqa: E402
from allennlp.common import Params  # noqa: E402
from allennlp.modules import Seq2SeqEncoder, Seq2VecEncoder  # noqa: E402

import rnn_ablations as ra  # noqa: E402
import rnn_ablations.integrations.allennlp as integration  # noqa: E402
from rnn_ablations import use_backend, use_pipeline  # noqa: E402

BACKENDS = ["pipelined", "plain", "generic"] if ra.kernel_available() else ["generic"]
NAMES = list(integration.ENCODER_NAMES)

pytestmark = pytest.mark.usefixtures("one_thread")


@contextlib.contextmanager
def path(name):
    backend = "generic" if name == "generic" else "kernel"
    with use_backend(backend), use_pipeline("always" if name == "pipelined" else "never"):
        yield


def _encoders(name, registry):
    yield registry.from_params(Params({"type": name, "input_size": 3, "hidden_size": 4,
                                       "num_layers": 2, "bidirectional": True}))
    # recurrent dropout where it acts: on a cell that reads h_{t-1}
    reads_hidden = ra.get_variant(integration.ENCODER_NAMES[name]).reads_hidden
    yield registry.from_params(Params({"type": f"stacked_bidirectional_{name}", "input_size": 3,
                                       "hidden_size": 4, "num_layers": 2,
                                       "recurrent_dropout_probability": 0.3 if reads_hidden else 0.0,
                                       "layer_dropout_probability": 0.2, "use_highway": True}))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("seq_len", [6, 2])
def test_encoders_on_an_empty_batch(backend, name, seq_len):
    # (AllenNLP's own lstm refuses an empty batch: "Cannot pack empty tensors"; the shapes are
    # those of nn.LSTM's output and final state)
    for registry, expected in ((Seq2SeqEncoder, (0, seq_len, 8)), (Seq2VecEncoder, (0, 8))):
        x = torch.randn(0, seq_len, 3, requires_grad=True)
        mask = torch.ones(0, seq_len, dtype=torch.bool)
        for enc in _encoders(name, registry):
            enc.train()
            with path(backend):
                out = enc(x, mask)
                assert out.shape == expected, (registry.__name__, name)
                out.sum().backward()
            assert x.grad.shape == x.shape
            for pname, p in enc.named_parameters():
                assert p.grad is not None and p.grad.shape == p.shape and not p.grad.any(), pname
            x.grad = None
