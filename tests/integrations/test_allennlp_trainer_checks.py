"""A config with ``"sparse": true`` embeddings and ``"grad_norm"`` (allennlp-models' parser
config) stops when its trainer is built, with one line naming the embedding and saying to set
``"sparse": false`` (torch 2.x's ``clip_grad_norm_`` cannot take sparse gradients; training would
stop at the first batch with a ``NotImplementedError`` and a list of dispatch keys)."""
import pytest
import torch

pytest.importorskip("allennlp", reason="AllenNLP is not installed (bash scripts/setup.sh)")
pytest.importorskip("allennlp_models", reason="allennlp-models is not installed")

from allennlp.common.checks import ConfigurationError  # noqa: E402
from allennlp.data import Vocabulary  # noqa: E402
from allennlp.data.data_loaders import SimpleDataLoader  # noqa: E402
from allennlp.models import Model  # noqa: E402
from allennlp.modules.token_embedders import Embedding  # noqa: E402
from allennlp.training import GradientDescentTrainer  # noqa: E402

import rnn_ablations.integrations.allennlp  # noqa: E402,F401  (what --include-package imports)
from rnn_ablations.integrations.allennlp.trainer_checks import sparse_gradients_clip  # noqa: E402


class _Tagger(Model):
    def __init__(self, sparse: bool):
        super().__init__(Vocabulary())
        self.embedder = Embedding(embedding_dim=3, num_embeddings=5, sparse=sparse)


def _trainer(sparse: bool, grad_norm):
    model = _Tagger(sparse)
    return GradientDescentTrainer(model, torch.optim.SGD(model.parameters(), lr=0.1),
                                  SimpleDataLoader([], batch_size=1), grad_norm=grad_norm)


def test_this_torch_cannot_clip_sparse_gradients():
    assert not sparse_gradients_clip()      # torch 2.x: the failure the check prevents


def test_sparse_embedding_with_grad_norm_stops_in_one_line():
    with pytest.raises(ConfigurationError) as info:
        _trainer(True, 5.0)
    message = str(info.value.message if hasattr(info.value, "message") else info.value)
    assert "\n" not in message
    assert message.startswith('set "sparse": false in the config\'s embedding (embedder)')
    assert '"grad_norm"' in message


@pytest.mark.parametrize("sparse,grad_norm", [(True, None), (True, False), (False, 5.0)])
def test_the_configs_that_train_are_left_alone(sparse, grad_norm):
    _trainer(sparse, grad_norm)
