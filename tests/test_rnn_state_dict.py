"""``AblatedRNN`` state dicts record their variant (``variant_state``): a state dict of another
variant (or the same variant with another highway setting) is refused, even with
``strict=False``, before anything is loaded; ``nn.LSTM`` / ``nn.RNN`` state dicts and state
dicts without the record still load; a corrupt record is refused."""
import io

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

def test_state_dict_without_variant_still_loads():
    """nn.LSTM / nn.RNN state dicts, and AblatedRNN ones without `variant_state`."""
    ours = AblatedRNN("lstm", 3, 4, num_layers=2)
    ours.load_state_dict(torch.nn.LSTM(3, 4, num_layers=2).state_dict())  # strict
    srnn = AblatedRNN("srnn", 3, 4)
    srnn.load_state_dict(torch.nn.RNN(3, 4).state_dict())
    old = {k: v for k, v in AblatedRNN("ran", 3, 4).state_dict().items() if k != "variant_state"}
    AblatedRNN("ran", 3, 4).load_state_dict(old)
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
    sd = mh.state_dict()
    sd["variant_state"] = torch.tensor([get_variant("lstm_minus_srnn").code, int(highway)])
    with pytest.raises(ValueError, match="variant 'lstm_minus_srnn'.* into one of variant "
                                         "'lstm_minus_srnn_minus_hidden'"):
        mh.load_state_dict(sd)

def test_corrupt_variant_state_is_refused():
    sd = AblatedRNN("ran", 3, 4).state_dict()
    sd["variant_state"] = torch.tensor([42, 0])
    with pytest.raises(ValueError, match="unknown variant code 42"):
        AblatedRNN("ran", 3, 4).load_state_dict(sd)
    sd["variant_state"] = torch.tensor([0.5, 1.0])
    with pytest.raises(ValueError, match="integer tensor"):
        AblatedRNN("ran", 3, 4).load_state_dict(sd)
