"""``AblatedRNN`` state dicts record their variant in their metadata: a state dict of another
variant (or the same variant with another highway setting) is refused, even with
``strict=False``, before anything is loaded; an ``lstm`` state dict has ``nn.LSTM``'s keys and
loads into ``nn.LSTM`` strictly; ``nn.LSTM`` / ``nn.RNN`` state dicts and state dicts without
the record still load; the ``variant_state`` entry of earlier versions is checked and dropped, a
corrupt one refused."""
import io
import warnings

import pytest
import torch

from rnn_ablations import AblatedRNN, VARIANTS
from rnn_ablations.variants import get_variant

def test_state_dict_of_another_variant_is_refused():
    ran = AblatedRNN("ran", 3, 4)
    ident = AblatedRNN("identity_ran", 3, 4)  # same shapes
    with pytest.raises(ValueError, match="variant 'ran' into one of variant 'identity_ran'"):
        ident.load_state_dict(ran.state_dict())
    with pytest.raises(ValueError, match="variant 'ran' into one of variant 'identity_ran'"):
        ident.load_state_dict(ran.state_dict(), strict=False)
    before = [p.clone() for p in ident.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(before, ident.parameters()))  # nothing loaded
    hw = AblatedRNN("ran", 3, 4, highway=True)
    with pytest.raises(ValueError, match="'ran' with highway into one of variant 'ran'"):
        AblatedRNN("ran", 3, 4).load_state_dict(hw.state_dict(), strict=False)
    # the same variant round-trips, through torch.save / torch.load(weights_only=True) too
    buf = io.BytesIO()
    torch.save(ran.state_dict(), buf)
    buf.seek(0)
    again = AblatedRNN("tanh_ran", 3, 4)
    again.load_state_dict(torch.load(buf, weights_only=True))
    for a, b in zip(ran.parameters(), again.parameters()):
        assert torch.equal(a, b)

@pytest.mark.parametrize("bidirectional", [False, True])
def test_lstm_state_dict_loads_into_nn_lstm_strictly(bidirectional):
    torch.manual_seed(0)
    ours = AblatedRNN("lstm", 3, 4, num_layers=2, bidirectional=bidirectional)
    lstm = torch.nn.LSTM(3, 4, num_layers=2, bidirectional=bidirectional)
    assert list(ours.state_dict()) == list(lstm.state_dict())
    lstm.load_state_dict(ours.state_dict(), strict=True)
    x = torch.randn(5, 2, 3)
    (out, (h, c)), (ref, (h_ref, c_ref)) = ours(x), lstm(x)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(h, h_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(c, c_ref, atol=1e-5, rtol=1e-5)
    assert ours.proj_size == lstm.proj_size == 0
    assert "lengths" in AblatedRNN.forward.__doc__


def test_variant_in_the_metadata_of_a_nested_state_dict():
    outer = torch.nn.Sequential(torch.nn.Linear(3, 3), AblatedRNN("ran", 3, 4))
    sd = outer.state_dict()
    assert sd._metadata["1"][AblatedRNN.METADATA_VARIANT] == "ran"
    assert not any("variant_state" in k for k in sd)
    other = torch.nn.Sequential(torch.nn.Linear(3, 3), AblatedRNN("identity_ran", 3, 4))
    with pytest.raises(ValueError, match="variant 'ran' into one of variant 'identity_ran'"):
        other.load_state_dict(sd)
    # a plain dict copy has no metadata: its shapes are the only check, which the load says
    with pytest.warns(UserWarning, match="without a variant record"):
        other.load_state_dict(dict(sd))


def test_state_dict_without_variant_still_loads():
    """nn.LSTM / nn.RNN state dicts, and AblatedRNN ones without `variant_state`."""
    ours = AblatedRNN("lstm", 3, 4, num_layers=2)
    ours.load_state_dict(torch.nn.LSTM(3, 4, num_layers=2).state_dict())  # strict
    srnn = AblatedRNN("srnn", 3, 4)
    srnn.load_state_dict(torch.nn.RNN(3, 4).state_dict())
    old = dict(AblatedRNN("ran", 3, 4).state_dict())
    with pytest.warns(UserWarning, match="without a variant record"):
        AblatedRNN("ran", 3, 4).load_state_dict(old)
    # the entry of earlier versions: checked, then dropped (strict loading does not see it);
    # the variant is then checked, so nothing is said
    old["variant_state"] = torch.tensor([get_variant("ran").code, 0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        AblatedRNN("ran", 3, 4).load_state_dict(dict(old))
    assert "variant_state" not in AblatedRNN("ran", 3, 4).state_dict()
    assert AblatedRNN("ran", 3, 4).variant_state.tolist() == [get_variant("ran").code, 0]
    # integer buffer: dtype conversions leave it alone
    assert AblatedRNN("ran", 3, 4).double().half().variant_state.dtype == torch.int64

@pytest.mark.parametrize("highway", [False, True])
def test_every_variant_records_its_own_code(highway):
    """variant_state holds Variant.code (not the kernels' spec, which may change with the
    kernels); no two variants share one."""
    codes = {}
    for name in VARIANTS:
        v = get_variant(name)
        m = AblatedRNN(name, 3, 4, highway=highway)
        assert m.variant_state.tolist() == [v.code, int(highway)]
        codes[v.code] = name
        again = AblatedRNN(name, 3, 4, highway=highway)
        again.load_state_dict(m.state_dict())  # round trip
    assert len(codes) == len(VARIANTS)
    mh = AblatedRNN("lstm_minus_srnn_minus_hidden", 3, 4, highway=highway)
    sd = dict(mh.state_dict())
    sd["variant_state"] = torch.tensor([get_variant("lstm_minus_srnn").code, int(highway)])
    with pytest.raises(ValueError, match="variant 'lstm_minus_srnn'.* into one of variant "
                                         "'lstm_minus_srnn_minus_hidden'"):
        mh.load_state_dict(sd)

def test_corrupt_variant_state_is_refused():
    sd = dict(AblatedRNN("ran", 3, 4).state_dict())
    sd["variant_state"] = torch.tensor([42, 0])
    with pytest.raises(ValueError, match="unknown variant code 42"):
        AblatedRNN("ran", 3, 4).load_state_dict(sd)
    sd["variant_state"] = torch.tensor([0.5, 1.0])
    with pytest.raises(ValueError, match="integer tensor"):
        AblatedRNN("ran", 3, 4).load_state_dict(sd)


def test_variant_record_lost_with_the_metadata_warns_and_variant_state_keeps_the_check(tmp_path):
    """dict(sd) and safetensors drop the state dict's metadata: ran's weights fit identity_ran,
    so loading them says that the variant cannot be checked; the variant_state tensor, stored
    as a key, survives those formats and refuses the other variant."""
    import warnings
    ran, identity = AblatedRNN("ran", 3, 4), AblatedRNN("identity_ran", 3, 4)
    assert "'identity_ran'" in ran.shape_twins() and "'ran'" in identity.shape_twins()
    assert "'srnn' with highway" in ran.shape_twins()  # h, r recurrent + hw: ran's i, f + c
    with pytest.warns(UserWarning, match=r"fit .*'ran'.* as well.*variant_state"):
        identity.load_state_dict(dict(ran.state_dict()))
    plain = dict(ran.state_dict(), variant_state=ran.variant_state)
    with pytest.raises(ValueError, match="variant 'ran' into one of variant 'identity_ran'"):
        identity.load_state_dict(plain)
    safetensors = pytest.importorskip("safetensors.torch")
    path = tmp_path / "ran.safetensors"
    safetensors.save_file(plain, str(path))
    with pytest.raises(ValueError, match="variant 'ran' into one of variant 'identity_ran'"):
        identity.load_state_dict(safetensors.load_file(str(path)))
    with warnings.catch_warnings():  # its own: loads, the variant checked (nothing to say)
        warnings.simplefilter("error")
        AblatedRNN("ran", 3, 4).load_state_dict(safetensors.load_file(str(path)))
    with warnings.catch_warnings():  # shapes no other variant has: nothing to say
        warnings.simplefilter("error")
        AblatedRNN("lstm", 3, 4).load_state_dict(dict(torch.nn.LSTM(3, 4).state_dict()))
        AblatedRNN("srnn", 3, 4).load_state_dict(dict(AblatedRNN("srnn", 3, 4).state_dict()))
