"""The variant table drives every implementation: the step kernels' view of each variant (its
kernel spec, decoded by the C++ side) is derived from the table and agrees with it."""
import pytest
import torch

from rnn_ablations import AblatedRNN, VARIANTS, get_variant
from rnn_ablations.dispatch import kernel_available

needs_kernel = pytest.mark.skipif(not kernel_available(), reason="compiled CPU kernel not built")


def _table_view(v, highway):
    """What the kernels must index, from the table alone: block roles in weight order."""
    rec, inp = v.blocks(highway)

    def role(name):
        return "content" if name == v.content_block else name
    return [role(b) for b in rec], [role(b) for b in inp]


@needs_kernel
@pytest.mark.parametrize("highway", [False, True])
@pytest.mark.parametrize("name", VARIANTS)
def test_kernel_view_of_every_variant_matches_the_table(name, highway):
    from rnn_ablations import _C
    v = get_variant(name)
    if not v.has_step_kernel:  # reads no h_{t-1}: the step kernels refuse it, the scan runs it
        with pytest.raises(RuntimeError, match="has no step kernel.*scan"):
            _C.describe_kernel_spec(v.kernel_spec, highway)
        return
    view = _C.describe_kernel_spec(v.kernel_spec, highway)
    rec, inp = _table_view(v, highway)
    assert (view["recurrent"], view["input_only"]) == (rec, inp)
    assert len(view["recurrent"]) == v.num_recurrent(highway)
    assert len(view["input_only"]) == v.num_input_only(highway)
    assert view["memory"] == v.has_memory
    assert view["output"] == v.output
    assert view["content_activation"] == v.content_activation
    assert view["content_recurrent"] == (v.content_block in v.recurrent)


def test_specs_are_distinct_and_codes_stable():
    """Each step-kernel variant has its own spec except where the equations agree; the state
    dict code (Variant.code) is a separate, stable number."""
    specs = {}
    for name in VARIANTS:
        v = get_variant(name)
        specs.setdefault(v.kernel_spec, []).append(name)
    assert all(len(names) == 1 for names in specs.values()), specs
    assert [get_variant(n).code for n in VARIANTS] == list(range(len(VARIANTS)))


def test_rules_are_table_fields():
    for name in VARIANTS:
        v = get_variant(name)
        assert v.accepts_single_h0 == (not v.has_memory)
        assert v.uses_lstm_bias_names() == v.lstm_parameter_names
    assert [n for n in VARIANTS if get_variant(n).lstm_parameter_names] == ["lstm"]
    with pytest.raises(ValueError, match="must be a tuple"):
        AblatedRNN("ran", 3, 4)(torch.randn(2, 1, 3), torch.zeros(1, 1, 4))
    AblatedRNN("srnn", 3, 4)(torch.randn(2, 1, 3), torch.zeros(1, 1, 4))
