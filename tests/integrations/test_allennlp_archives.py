"""A state dict read by AllenNLP's ``read_state_dict`` (``Model.load``: ``allennlp predict``,
``evaluate``, ``rnn-ablations visualize`` of an archive) keeps the variant record that the saved
file holds: a ``ran`` / ``identity_ran`` encoder loads without the warning that its shapes fit
the other variant too, and one saved from the other variant is refused."""
import warnings

import pytest
import torch

pytest.importorskip("allennlp", reason="AllenNLP is not installed (bash scripts/setup.sh)")
pytest.importorskip("allennlp_models", reason="allennlp-models is not installed")

import rnn_ablations.integrations.allennlp  # noqa: E402,F401  (what --include-package imports)
from allennlp.nn import util  # noqa: E402

from rnn_ablations import AblatedRNN  # noqa: E402


def _model(variant):
    torch.manual_seed(0)
    model = torch.nn.Module()
    model.encoder = torch.nn.Module()
    model.encoder._module = AblatedRNN(variant, 3, 4, bidirectional=True)
    return model


def test_the_record_survives_allennlps_reader(tmp_path):
    path = tmp_path / "best.th"
    torch.save(_model("ran").state_dict(), path)
    state = util.read_state_dict(path)
    assert state._metadata["encoder._module"][AblatedRNN.METADATA_VARIANT] == "ran"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _model("ran").load_state_dict(state)
    with pytest.raises(ValueError, match="saved from an AblatedRNN of variant 'ran'"):
        _model("identity_ran").load_state_dict(util.read_state_dict(path))


def test_a_file_without_metadata_reads_as_before(tmp_path):
    path = tmp_path / "weights.th"
    torch.save(dict(_model("lstm").state_dict()), path)
    state = util.read_state_dict(path)
    assert getattr(state, "_metadata", None) is None and len(state) == 8
