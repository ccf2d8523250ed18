"""``AblatedRNN`` where code written for ``torch.nn.LSTM`` meets it: the autocast policy,
``torch.jit.script`` of a model that holds one, ``isinstance`` checks, ``proj_size`` and
``torch.compile``'s dynamic shapes; each against ``nn.LSTM`` or the eager float32 result."""
import pytest
import torch
from torch import nn

from rnn_ablations import VARIANTS, AblatedRNN


# ----------------------------------------------------------------------------- autocast
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("bidirectional", [False, True])
def test_cpu_autocast_returns_the_autocast_dtype(variant, bidirectional):
    """lstm is on CPU autocast's lower-precision list: nn.LSTM returns bfloat16, so does every
    variant, within bfloat16's tolerance of float32, with float32 gradients for the parameters."""
    torch.manual_seed(0)
    rnn = AblatedRNN(variant, 5, 7, num_layers=2, bidirectional=bidirectional)
    x = torch.randn(4, 3, 5)
    want, (wh, wc) = rnn(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, (h, c) = rnn(x)
    assert out.dtype == h.dtype == c.dtype == torch.bfloat16
    for got, ref in ((out, want), (h, wh), (c, wc)):
        torch.testing.assert_close(got.float(), ref, atol=3e-2, rtol=3e-2)
    out.float().sum().backward()
    assert rnn.weight_ih_l0.grad.dtype == torch.float32
    assert rnn.weight_ih_l0.grad.abs().sum() > 0


def test_cpu_autocast_leaves_float64_alone():
    rnn = AblatedRNN("ran", 3, 4).double()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, (h, c) = rnn(torch.randn(2, 1, 3, dtype=torch.float64))
    assert out.dtype == h.dtype == c.dtype == torch.float64


# ----------------------------------------------------------------------------- TorchScript
class _Tagger(nn.Module):
    def __init__(self, variant):
        super().__init__()
        self.rnn = AblatedRNN(variant, 5, 7, num_layers=2, bidirectional=True, batch_first=True)
        self.out = nn.Linear(14, 3)

    def forward(self, x):
        out, (h, c) = self.rnn(x)
        return self.out(out), h, c


@pytest.mark.parametrize("variant", ["lstm", "ran", "lstm_minus_srnn_minus_hidden"])
def test_script_a_model_around_the_traced_rnn(variant):
    """The alternative the torch.jit.script error names: trace the RNN, script the model around
    it; the scripted model runs other lengths and batch sizes with the eager numbers."""
    torch.manual_seed(0)
    model = _Tagger(variant).eval()
    eager = _Tagger(variant).eval()
    eager.load_state_dict(model.state_dict())
    with pytest.raises(RuntimeError, match=r"torch\.jit\.trace\(model\.rnn, \(torch\.randn\(1, 2, 5\),\)\)"):
        torch.jit.script(model)
    model.rnn = torch.jit.trace(model.rnn, (torch.randn(1, 2, 5),))
    scripted = torch.jit.script(model)
    for shape in ((3, 9, 5), (1, 1, 5)):
        x = torch.randn(*shape)
        with torch.no_grad():
            for got, want in zip(scripted(x), eager(x)):
                torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


# ----------------------------------------------------------------------------- isinstance
def test_not_an_rnnbase_and_the_documented_test_accepts_both():
    """AblatedRNN is no nn.RNNBase (whose flat weights are _VF's LSTM layout); the documented
    test, isinstance(m, (nn.RNNBase, AblatedRNN)), accepts both, and the attributes code written
    for nn.RNNBase reads are there with nn.LSTM's values for an lstm of the same arguments."""
    ours, theirs = AblatedRNN("lstm", 4, 6, num_layers=2), nn.LSTM(4, 6, num_layers=2)
    assert not isinstance(ours, nn.RNNBase)
    assert "RNNBase" in AblatedRNN.__doc__
    for m in (ours, theirs):
        assert isinstance(m, (nn.RNNBase, AblatedRNN))
    for name in ("input_size", "hidden_size", "num_layers", "bias", "batch_first", "dropout",
                 "bidirectional", "proj_size", "_flat_weights_names"):
        assert getattr(ours, name) == getattr(theirs, name), name
    assert [[w.shape for w in ws] for ws in ours.all_weights] == \
        [[w.shape for w in ws] for ws in theirs.all_weights]
    ours.flatten_parameters()


# ----------------------------------------------------------------------------- torch.compile
def _frames(dynamic, shapes, mark=False):
    """Dynamo's graph count (CompileCounter: no code generation) over calls with ``shapes``,
    each checked against eager."""
    import torch._dynamo
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    counter = CompileCounter()
    rnn = AblatedRNN("ran", 13, 4, bidirectional=True)
    compiled = torch.compile(rnn, backend=counter, fullgraph=True, dynamic=dynamic)
    counts = []
    for i, (T, B) in enumerate(shapes):
        x = torch.randn(T, B, 13)  # 13: no size of the first call equals another (duck sizing)
        if mark and i == 0:
            torch._dynamo.mark_dynamic(x, 0)
            torch._dynamo.mark_dynamic(x, 1)
        with torch.no_grad():
            torch.testing.assert_close(compiled(x)[0], rnn(x)[0])
        counts.append(counter.frame_count)
    return counts


SHAPES = [(5, 3), (7, 3), (7, 6), (12, 2), (30, 9)]


def test_compile_dynamic_is_one_graph_from_the_first_call():
    """README: torch.compile(model, dynamic=True) (or mark_dynamic on the first input's T and B
    dims) gives one graph for every T and B (>= 2) on the same side of the plan's thresholds."""
    assert _frames(True, SHAPES) == [1] * len(SHAPES)
    assert _frames(None, SHAPES, mark=True) == [1] * len(SHAPES)


def test_compile_default_recompiles_once_per_dynamic_dim():
    """README: with torch.compile's default (dynamic=None) dynamo compiles the first shape
    exactly, again with T dynamic on a new T, again with B dynamic on a new B: three graphs,
    then none for further sizes."""
    assert _frames(None, SHAPES) == [1, 2, 3, 3, 3]


def _float_symbols(rnn, x):
    """The float symbols dynamo's trace of ``rnn`` under dynamic=True creates, each as the
    attribute it was made from (a backend that reads the trace's shape environment, no code
    generation)."""
    import torch._dynamo
    from torch._guards import TracingContext

    torch._dynamo.reset()
    seen = []

    def backend(gm, example_inputs):
        env = TracingContext.get().fake_mode.shape_env
        seen.extend(src.name for s in env.backed_var_to_val if not s.is_integer
                    for src in env.var_to_sources.get(s, [])[:1])
        return gm

    with torch.no_grad():
        torch.manual_seed(1)
        got = torch.compile(rnn, backend=backend, fullgraph=True, dynamic=True)(x)[0]
        torch.manual_seed(1)
        torch.testing.assert_close(got, rnn(x)[0])
    return seen


@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_compile_dynamic_reads_no_dropout_float(mode, dropout):
    """torch.compile(dynamic=True) makes a module's float attributes symbolic (and the first
    compile then traces twice, to specialize them): the forward reads the dropout settings
    from booleans and integers, so no float symbol enters the trace, with dropout or without,
    in training or in eval mode; compiled and eager draw the same masks."""
    torch.manual_seed(0)
    x = torch.randn(5, 3, 6)
    rnn = AblatedRNN("ran", 6, 4, num_layers=2, bidirectional=True, dropout=dropout,
                     recurrent_dropout=dropout / 2).train(mode == "train")
    assert _float_symbols(rnn, x) == []


def test_compiled_model_follows_a_dropout_set_later():
    """Assigning ``dropout`` after construction (OpenNMT-py's update_dropout does) turns it on
    in the next compiled call: dynamo guards on the boolean and recompiles."""
    import torch._dynamo
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    counter = CompileCounter()
    rnn = AblatedRNN("ran", 6, 4, num_layers=2)
    compiled = torch.compile(rnn, backend=counter, dynamic=True)
    x = torch.randn(5, 3, 6)
    torch.testing.assert_close(compiled(x)[0], rnn(x)[0])
    rnn.dropout = 0.5
    assert rnn._dropout_on and rnn.dropout == 0.5
    torch.manual_seed(1)
    got = compiled(x)[0]
    torch.manual_seed(1)
    torch.testing.assert_close(got, rnn(x)[0])
    assert counter.frame_count == 2
    assert not torch.allclose(got, rnn.eval()(x)[0])  # dropout did act
    with pytest.raises(ValueError, match=r"dropout.*\[0, 1\)"):
        rnn.dropout = 1.5


# ----------------------------------------------------------------------------- proj_size
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("batch_first", [False, True])
def test_proj_size_lstm_is_nn_lstm(bidirectional, batch_first):
    """proj_size on lstm: nn.LSTM's state dict keys (weight_hr_l{k}) in its order, loaded
    strictly both ways, and its outputs, states and gradients, padded (PackedSequence) too."""
    from torch.nn.utils.rnn import pack_padded_sequence
    torch.manual_seed(0)
    ref = nn.LSTM(5, 7, num_layers=2, bidirectional=bidirectional, proj_size=3,
                  batch_first=batch_first).double()
    ours = AblatedRNN("lstm", 5, 7, num_layers=2, bidirectional=bidirectional, proj_size=3,
                      batch_first=batch_first).double()
    assert list(ours.state_dict()) == list(ref.state_dict())
    assert ours._flat_weights_names == ref._flat_weights_names
    ours.load_state_dict(ref.state_dict())
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(4, 6, 5, dtype=torch.float64)
    batch = 4 if batch_first else 6
    h0 = torch.randn(2 * (1 + bidirectional), batch, 3, dtype=torch.float64)
    c0 = torch.randn(2 * (1 + bidirectional), batch, 7, dtype=torch.float64)
    for inputs in ((x,), (x, (h0, c0))):
        got, want = ours(*inputs), ref(*inputs)
        for g, w in ((got[0], want[0]), (got[1][0], want[1][0]), (got[1][1], want[1][1])):
            torch.testing.assert_close(g, w)
    lengths = torch.tensor([6, 3, 1, 5]) if batch_first else torch.tensor([4, 2, 1, 3, 4, 2])
    packed = pack_padded_sequence(x, lengths, batch_first=batch_first, enforce_sorted=False)
    got, want = ours(packed), ref(packed)
    torch.testing.assert_close(got[0].data, want[0].data)
    torch.testing.assert_close(got[1], want[1])
    (got[0].data.sum() + got[1][0].sum()).backward()
    (want[0].data.sum() + want[1][0].sum()).backward()
    for (name, p), q in zip(ours.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=name)


@pytest.mark.parametrize("variant", ["lstm_minus_srnn", "lstm_minus_srnn_minus_hidden"])
def test_proj_size_other_gated_variants(variant):
    """The other variants with h_t = o_t*tanh(c_t): h_t and the next layer's input have
    proj_size entries (shapes), and the float64 gradients are autograd's (gradcheck)."""
    torch.manual_seed(0)
    rnn = AblatedRNN(variant, 3, 4, num_layers=2, bidirectional=True, proj_size=2).double()
    x = torch.randn(3, 2, 3, dtype=torch.float64, requires_grad=True)
    out, (h, c) = rnn(x, lengths=[3, 2])
    assert out.shape == (3, 2, 4) and h.shape == (4, 2, 2) and c.shape == (4, 2, 4)
    assert rnn.weight_ih_l1.shape[1] == 4  # 2 directions x proj_size
    torch.autograd.gradcheck(lambda inp: rnn(inp, lengths=[3, 2])[0], (x,))


@pytest.mark.parametrize("variant", ["srnn", "ran", "identity_ran"])
def test_proj_size_refused_without_an_output_gate(variant):
    with pytest.raises(ValueError, match=r"proj_size projects h_t = o_t\*tanh\(c_t\).*'lstm'"):
        AblatedRNN(variant, 3, 4, proj_size=2)
    with pytest.raises(ValueError, match="smaller than hidden_size"):
        AblatedRNN("lstm", 3, 4, proj_size=4)
    with pytest.raises(ValueError, match="highway"):
        AblatedRNN("lstm", 3, 4, proj_size=2, highway=True)


# ----------------------------------------------------------------------------- README install
def test_readme_installs_from_a_wheel_or_checkout():
    """The package is on no index: the README's install lines name a wheel or a checkout
    (`$PKG`), and the blocks that use a checkout's .venv/ say so (a checkout, or what changes
    from an install)."""
    from pathlib import Path
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert 'pip install "rnn-ablations[' not in text
    assert 'pip install "$PKG[allennlp]"' in text and "package is on no index" in text
    for block_start in ("<!-- readme-test slow -->", "<!-- readme-test -->\n```bash\nexport ONMT"):
        before = text[:text.index(block_start)].rstrip().rsplit("\n\n", 1)[-1]
        assert ".venv/" in before and ("checkout" in before or "from an install" in before), before


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_compile_dynamic_language_model_reads_no_dropout_float(mode):
    """The language model keeps its dropout as the RNN does (validation.Probability): no float
    symbol in a dynamic trace, and compiled and eager draw the same masks."""
    from rnn_ablations.lm.model import LanguageModel

    torch.manual_seed(0)
    lm = LanguageModel("ran", 11, 6, 2, dropout=0.3).train(mode == "train")
    # (torch's nn.Embedding keeps its norm_type as a float: that one symbol is torch's own)
    assert _float_symbols(lm, torch.randint(0, 11, (5, 3))) == [
        "L['self']._modules['embedding'].norm_type"]
    lm.dropout = 0.5
    assert lm._dropout_on and lm._dropout_ratio == (1, 2)
    with pytest.raises(ValueError, match="dropout must be a number in"):
        lm.dropout = 1.0
