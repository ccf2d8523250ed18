"""The variant table drives every implementation: the kernels' view of each variant (its kernel
spec, decoded by the C++ side for the step kernels and for the element-wise scan) is derived from
the table and agrees with it."""
import pytest
import torch

from rnn_ablations import AblatedRNN, VARIANTS, get_variant
from conftest import requires_kernel


def _table_view(v, highway):
    """What the kernels must index, from the table alone: block roles in weight order."""
    rec, inp = v.blocks(highway)

    def role(name):
        return "content" if name == v.content_block else name
    return [role(b) for b in rec], [role(b) for b in inp]


def _kernel_view(v, highway):
    """The C++ decoder's view of ``v``: the step kernels' (describe_kernel_spec) for a cell that
    reads h_{t-1}, else the element-wise scan's (describe_scan_spec); each refuses the other's
    cells, naming the kernel that runs them."""
    from rnn_ablations import _C
    if not v.has_step_kernel:  # reads no h_{t-1}: the step kernels refuse it, the scan runs it
        with pytest.raises(RuntimeError, match="has no step kernel.*scan"):
            _C.describe_kernel_spec(v.kernel_spec, highway)
        return _C.describe_scan_spec(v.kernel_spec, highway)
    with pytest.raises(RuntimeError, match=r"read h_\{t-1\}; it runs on the step kernels"):
        _C.describe_scan_spec(v.kernel_spec, highway)
    return _C.describe_kernel_spec(v.kernel_spec, highway)


@requires_kernel
@pytest.mark.parametrize("highway", [False, True])
@pytest.mark.parametrize("name", VARIANTS)
def test_kernel_view_of_every_variant_matches_the_table(name, highway):
    v = get_variant(name)
    view = _kernel_view(v, highway)
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
    codes = [get_variant(n).code for n in VARIANTS]
    assert len(set(codes)) == len(codes), codes  # each row its own state-dict number
    # the shipped rows keep the numbers their state dicts hold (a new row takes an unused one)
    shipped = {"lstm": 0, "srnn": 1, "lstm_minus_srnn": 2, "ran": 3, "identity_ran": 4,
               "lstm_minus_srnn_minus_hidden": 5}
    assert {n: get_variant(n).code for n in shipped} == shipped


def test_rules_are_table_fields():
    for name in VARIANTS:
        v = get_variant(name)
        assert v.accepts_single_h0 == (not v.has_memory)
        assert v.uses_lstm_bias_names() == v.lstm_parameter_names
    assert [n for n in VARIANTS if get_variant(n).lstm_parameter_names] == ["lstm"]
    with pytest.raises(ValueError, match="must be a tuple"):
        AblatedRNN("ran", 3, 4)(torch.randn(2, 1, 3), torch.zeros(1, 1, 4))
    AblatedRNN("srnn", 3, 4)(torch.randn(2, 1, 3), torch.zeros(1, 1, 4))


# --------------------------------------------------------------------------- toy variants
import re  # noqa: E402
from pathlib import Path  # noqa: E402

from rnn_ablations import use_backend  # noqa: E402
from rnn_ablations.variants import VARIANTS_TABLE, Variant  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _toy(name, code, **fields):
    base = dict(paper_name=name, context_independent_content=True, equations="toy")
    base.update(fields)
    return Variant(name=name, code=code, **base)


#: rows built from the table's fields alone: a copy of ``ran`` (same spec, so the same kernel), and
#: combinations no shipped variant has (step kernels), and a −HIDDEN cell with a tanh output (scan)
TOYS = [
    _toy("toy_ran", 101, recurrent=("i", "f"), input_only=("c",), content_block="c",
         has_memory=True, output="tanh"),
    _toy("toy_lstm_identity_out", 102, recurrent=("i", "f", "g"), content_block="g",
         content_activation="tanh", has_memory=True, output="identity",
         context_independent_content=False),
    _toy("toy_linear_srnn", 103, recurrent=("h",), content_block="h", has_memory=False,
         output="content", context_independent_content=False),
    _toy("toy_ran_minus_hidden", 104, recurrent=(), input_only_biased=("i", "f"),
         input_only=("c",), content_block="c", has_memory=True, output="tanh"),
]


@pytest.fixture
def toy_table(monkeypatch):
    for v in TOYS:
        monkeypatch.setitem(VARIANTS_TABLE, v.name, v)
    return {v.name: v for v in TOYS}


def test_a_copy_of_a_row_gets_the_same_kernel():
    assert TOYS[0].kernel_spec == get_variant("ran").kernel_spec
    assert len({v.kernel_spec for v in TOYS}) == len(TOYS)


@requires_kernel
@pytest.mark.parametrize("highway", [False, True])
def test_scan_predicate_agrees_with_the_scan_decoder(highway):
    """rnn_ablations.kernels.scan.scan_applies (which sends a layer to the scan kernels) is True exactly
    for the specs the C++ scan decoder accepts: every row of the table, the toys, and cells that
    read no h_{t-1} but have a rule the scan lacks (a tanh content, no memory)."""
    from rnn_ablations import _C
    from rnn_ablations.kernels.scan import scan_applies
    extra = [_toy("toy_tanh_content_minus_hidden", 120, recurrent=(), input_only_biased=("i", "f"),
                  input_only=("c",), content_block="c", content_activation="tanh",
                  has_memory=True, output="tanh"),
             _toy("toy_feedforward", 121, recurrent=(), input_only=("c",), content_block="c",
                  has_memory=False, output="content")]
    rows = [get_variant(n) for n in VARIANTS] + TOYS + extra
    for v in rows:
        try:
            _C.describe_scan_spec(v.kernel_spec, highway)
            accepted = True
        except RuntimeError:
            accepted = False
        assert scan_applies(v) == accepted, v.name
    assert any(scan_applies(v) for v in rows) and not all(scan_applies(v) for v in rows)


@requires_kernel
@pytest.mark.parametrize("highway", [False, True])
@pytest.mark.parametrize("toy", [v.name for v in TOYS])
def test_toy_variants_run_on_every_path_and_agree(toy_table, toy, highway):
    """A row built from the table alone runs on the generic path and on the compiled kernels
    (step kernel or scan), forward and backward, padded and bidirectional, and they agree."""
    from rnn_ablations import _C
    v = toy_table[toy]
    view = _kernel_view(v, highway)
    assert (view["recurrent"], view["input_only"]) == _table_view(v, highway)
    torch.manual_seed(0)
    m = AblatedRNN(toy, 4, 6, num_layers=2, bidirectional=True, highway=highway).double()
    assert m.variant_state.tolist() == [v.code, int(highway)]
    x = torch.randn(7, 3, 4, dtype=torch.float64, requires_grad=True)
    results = {}
    for backend in ("generic", "kernel"):
        with use_backend(backend):
            out, (h, c) = m(x, lengths=[7, 5, 2])
            grads = torch.autograd.grad((out * torch.linspace(-1, 1, 12, dtype=torch.float64)).sum()
                                        + h.sum() + 2 * c.sum(), [x, *m.parameters()])
        results[backend] = [out, h, c, *grads]
    for a, b in zip(results["generic"], results["kernel"]):
        torch.testing.assert_close(a, b)
    # float32: the vectorised kernels against the generic path
    m32 = m.float()
    with use_backend("kernel"):
        out32 = m32(x.detach().float(), lengths=[7, 5, 2])[0]
    torch.testing.assert_close(out32.double(), results["generic"][0].detach(), atol=1e-5, rtol=1e-4)


def test_a_rule_no_kernel_has_is_refused_with_what_to_do():
    with pytest.raises(ValueError, match="no rule for a tanh of an input-only content.*CONTRIBUTING"):
        _toy("toy_tanh_input_content", 105, recurrent=("i", "f"), input_only=("c",),
             content_block="c", content_activation="tanh", has_memory=True, output="tanh")
    with pytest.raises(ValueError, match="read the blocks in the order.*reorder"):
        _toy("toy_reordered", 106, recurrent=("f", "i"), input_only=("c",), content_block="c",
             has_memory=True, output="tanh")
    with pytest.raises(ValueError, match="needs exactly"):
        _toy("toy_missing_o", 107, recurrent=("i", "f"), input_only=("c",), content_block="c",
             has_memory=True, output="o_tanh")


@requires_kernel
def test_contributing_recipe_runs(monkeypatch, capsys):
    """CONTRIBUTING.md's recipe for adding a variant is executed as written (its table entry is
    undone after the test)."""
    text = (ROOT / "CONTRIBUTING.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) == 1
    monkeypatch.setattr("rnn_ablations.variants.VARIANTS_TABLE", dict(VARIANTS_TABLE))
    exec(compile(blocks[0], "CONTRIBUTING.md", "exec"), {})
    assert "lstm_identity_out: kernel == generic" in capsys.readouterr().out
