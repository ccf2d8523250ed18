"""OpenNMT-py's safetensors checkpoints (``-save_format safetensors``, loaded by
``BaseModel.load_safe_state_dict``) follow the ``.pt`` rules: a ``variant_state`` entry of an
earlier version is checked against the model (a wrong one refused with the variant named) and
then not loaded; a file without it loads as it is."""
import pytest
import torch

onmt = pytest.importorskip("onmt", reason="OpenNMT-py is not installed")
safetensors_torch = pytest.importorskip("safetensors.torch", reason="safetensors is not installed")

from rnn_ablations import AblatedRNN  # noqa: E402
from rnn_ablations.integrations import onmt as integration  # noqa: E402
from rnn_ablations.variants import get_variant  # noqa: E402


class _Model(onmt.models.model.BaseModel):
    def __init__(self, variant):
        super().__init__(None, None)
        self.encoder = torch.nn.Module()
        self.encoder.rnn = AblatedRNN(variant, 3, 4, bidirectional=True)
        self.generator = torch.nn.Linear(8, 5)


def _save(model, path, extra=None):
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    state.update(extra or {})
    safetensors_torch.save_file(state, str(path) + ".0.safetensors")


@pytest.fixture(autouse=True)
def _registered():
    integration.register()


def _equal(a, b):
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_without_variant_state_loads(tmp_path):
    torch.manual_seed(0)
    src, dst = _Model("ran"), _Model("ran")
    _save(src, tmp_path / "m")
    dst.load_safe_state_dict(str(tmp_path / "m"))
    assert _equal(src, dst)


def test_variant_state_of_earlier_versions_is_checked_then_dropped(tmp_path):
    torch.manual_seed(0)
    src, dst = _Model("ran"), _Model("ran")
    _save(src, tmp_path / "m",
          {"encoder.rnn.variant_state": torch.tensor([get_variant("ran").code, 0])})
    dst.load_safe_state_dict(str(tmp_path / "m"))   # OpenNMT-py alone: "Extra keys ..."
    assert _equal(src, dst)
    assert "variant_state" not in dict(dst.named_buffers())


def test_wrong_variant_state_is_refused_before_anything_loads(tmp_path):
    torch.manual_seed(0)
    src, dst = _Model("ran"), _Model("ran")
    before = {k: v.clone() for k, v in dst.state_dict().items()}
    _save(src, tmp_path / "m",   # identity_ran: the same shapes as ran, other equations
          {"encoder.rnn.variant_state": torch.tensor([get_variant("identity_ran").code, 0])})
    with pytest.raises(ValueError, match="variant 'identity_ran'.*encoder of variant 'ran'"):
        dst.load_safe_state_dict(str(tmp_path / "m"))
    assert all(torch.equal(before[k], v) for k, v in dst.state_dict().items())
    _save(src, tmp_path / "f", {"encoder.rnn.variant_state": torch.tensor([0.5, 0.0])})
    with pytest.raises(ValueError, match="must be an integer tensor"):
        dst.load_safe_state_dict(str(tmp_path / "f"))
