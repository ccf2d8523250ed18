"""Fair comparison, the tools: inside each framework every variant must start from the
initialisation that the framework gives its own LSTM (the papers change the recurrent cell and
nothing else).  The tests compare a model's recurrent parameters with the framework's LSTM
baseline built with the same seed *role by role*: gate weights (sigmoid blocks, input and
recurrent side), content weights (the LSTM's ``g``, the S-RNN's ``h``, the ablations' ``c``, the
highway projection), gate biases, forget-gate biases and content biases; each role against the
same role of the baseline (two-sample Kolmogorov-Smirnov test, bounds, or exact values where the
baseline's are constant).

Used by ``test_rnn_init.py`` (``AblatedRNN`` against ``torch.nn.LSTM``),
``test_allennlp_init.py`` (BiDAF, DrQA and the biaffine parser against AllenNLP's own LSTMs) and
``test_onmt_init.py`` (the Multi30k encoders against OpenNMT-py's ``brnn``)."""
import pytest
import torch

from rnn_ablations import AblatedRNN

GATES = {"i", "f", "o", "r"}
CONTENT = {"g", "h", "c", "hw"}


def _roles(layers, rec, inp, H, biased=None):
    """``layers``: ``[(w_ih, w_hh, [bias, ...]), ...]`` per layer and direction (``w_hh`` None for
    a cell that reads no h_{t-1}); ``rec`` / ``inp``: the block names of the recurrent and
    input-only rows; ``biased``: the blocks of the bias, in its order (default ``rec``).
    Returns ``{role: values}``."""
    biased = rec if biased is None else biased
    out = {}

    def add(role, t):
        out.setdefault(role, []).append(t.detach().reshape(-1).double())

    for w_ih, w_hh, biases in layers:
        for k, name in enumerate(rec + inp):
            role = "gate weights" if name in GATES else "content weights"
            add(role, w_ih[k * H:(k + 1) * H])
            if k < len(rec):
                add(role, w_hh[k * H:(k + 1) * H])
        for b in biases:
            for k, name in enumerate(biased):
                role = ("forget-gate biases" if name == "f" else
                        "gate biases" if name in GATES else "content biases")
                add(role, b[k * H:(k + 1) * H])
    return {role: torch.cat(ts) for role, ts in out.items()}

def ablated_roles(rnn: AblatedRNN, sum_biases: bool = False):
    """``sum_biases``: the LSTM's ``bias_ih + bias_hh`` as one bias (what the cell adds)."""
    rec, inp = rnn.variant.blocks(rnn.highway)
    layers = []
    for per_dir in rnn._param_names:
        for names in per_dir:
            biases = [getattr(rnn, n) for n in names[2:]]
            if sum_biases and len(biases) == 2:
                biases = [biases[0] + biases[1]]
            w_hh = getattr(rnn, names[1]) if names[1] is not None else None
            layers.append((getattr(rnn, names[0]), w_hh, biases))
    return _roles(layers, rec, inp, rnn.hidden_size, rnn.variant.biased_blocks(rnn.highway))

def nn_lstm_roles(lstm: torch.nn.LSTM):
    layers = []
    for layer in range(lstm.num_layers):
        for sfx in [""] + (["_reverse"] if lstm.bidirectional else []):
            s = f"_l{layer}{sfx}"
            layers.append((getattr(lstm, "weight_ih" + s), getattr(lstm, "weight_hh" + s),
                           [getattr(lstm, "bias_ih" + s), getattr(lstm, "bias_hh" + s)]))
    return _roles(layers, ("i", "f", "g", "o"), (), lstm.hidden_size)

def augmented_lstm_roles(stacked):
    """AllenNLP's StackedBidirectionalLstm (AugmentedLstm cells)."""
    layers = []
    for forward, backward in stacked.lstm_layers:
        for cell in (forward.cell, backward.cell):
            layers.append((cell.input_linearity.weight, cell.state_linearity.weight,
                           [cell.state_linearity.bias]))
    cell = stacked.lstm_layers[0][0].cell
    rec = ("i", "f", "g", "o", "r") if cell.use_highway else ("i", "f", "g", "o")
    inp = ("hw",) if cell.use_highway else ()
    return _roles(layers, rec, inp, cell.lstm_dim)

def assert_same_distribution(roles, baseline, what, bound=None):
    """Every role of ``roles`` comes from the distribution of the same role of ``baseline``."""
    scipy_stats = pytest.importorskip("scipy.stats", reason="scipy is needed for the KS tests")
    assert roles, what
    for role, values in roles.items():
        assert role in baseline, f"{what}: the baseline LSTM has no {role}"
        ref = baseline[role]
        if torch.all(ref == ref[0]):  # a constant in the baseline (e.g. forget bias 1)
            assert torch.all(values == ref[0]), f"{what}: {role} must all be {float(ref[0])}"
            continue
        assert values.std() > 0, f"{what}: {role} are constant"
        if bound is not None:
            assert values.abs().max() <= bound * (1 + 1e-6), f"{what}: {role} exceed ±{bound}"
            assert values.abs().max() > 0.8 * bound, f"{what}: {role} do not fill ±{bound}"
        p = scipy_stats.ks_2samp(values.numpy(), ref.numpy()).pvalue
        assert p > 1e-3, f"{what}: {role} differ from the LSTM's (KS p = {p:.2g})"
