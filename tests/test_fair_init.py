"""Fair comparison: inside each framework every variant starts from the initialisation that the
framework gives its own LSTM (issue 17; ``DESIGN.md``, "Fair comparison").

* ``AblatedRNN`` with no options: ``torch.nn.LSTM``'s rule for every variant (every weight and
  bias ``U(±1/√H)``); ``forget_bias`` is an explicit option applied alike to ``lstm``.
* BiDAF and DrQA (AllenNLP ``lstm`` = ``nn.LSTM``): every variant's encoders, built from the real
  configs, have the distribution of AllenNLP's ``lstm`` role by role.
* Biaffine parser: ``stacked_bidirectional_<variant>`` built from the real config (its initializer
  included) is initialised like AllenNLP's ``stacked_bidirectional_lstm`` (AugmentedLstm:
  block-orthogonal per gate block, biases 0 with forget gate 1), which the config's initializer
  leaves alone.
* Multi30k NMT: every encoder type built from ``multi30k_<type>.yaml`` has the distribution of
  OpenNMT's ``brnn`` (``param_init`` U(±0.1)).

"Role by role": gate weights (sigmoid blocks, input and recurrent side), content weights (the
LSTM's ``g``, the S-RNN's ``h``, the ablations' ``c``, the highway projection), gate biases,
forget-gate biases and content biases; each role is compared with the same role of the
framework's LSTM baseline built with the same seed (two-sample Kolmogorov-Smirnov test, bounds,
or exact values where the baseline's are constant).
"""
import json
import math
from pathlib import Path

import pytest
import torch

from rnn_ablations import VARIANTS, AblatedRNN, get_variant

scipy_stats = pytest.importorskip("scipy.stats", reason="scipy is needed for the KS tests")

REPO = Path(__file__).resolve().parents[1]
GATES = {"i", "f", "o", "r"}
CONTENT = {"g", "h", "c", "hw"}


# --------------------------------------------------------------------------- roles
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


# --------------------------------------------------------------------------- AblatedRNN itself
@pytest.mark.parametrize("highway", [False, True])
@pytest.mark.parametrize("variant", VARIANTS)
def test_default_init_is_nn_lstm_rule_for_every_variant(variant, highway):
    torch.manual_seed(0)
    H = 16
    rnn = AblatedRNN(variant, 24, H, num_layers=2, bidirectional=True, highway=highway)
    bound = 1 / math.sqrt(H)
    for name, p in rnn.named_parameters():
        assert p.abs().max() <= bound, name
        assert p.std() > 0.5 * bound / math.sqrt(3), f"{name} is (nearly) constant"
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(24, H, num_layers=2, bidirectional=True)
    assert_same_distribution(ablated_roles(rnn), nn_lstm_roles(lstm), variant, bound)


@pytest.mark.parametrize("variant", VARIANTS)
def test_forget_bias_option_is_applied_alike_to_every_variant(variant):
    H = 6
    rnn = AblatedRNN(variant, 5, H, num_layers=2, bidirectional=True, forget_bias=1.5)
    roles = ablated_roles(rnn)
    if not get_variant(variant).has_memory:
        assert "forget-gate biases" not in roles  # no forget gate: nothing to set
    else:
        for layer in range(2):
            for direction in range(2):
                b = rnn.layer_parameters(layer, direction)[2]  # lstm: bias_ih + bias_hh
                assert torch.equal(b[H:2 * H].detach(), torch.full((H,), 1.5))
    for role in ("gate biases", "content biases"):
        if role in roles:  # the other entries keep the uniform rule
            assert roles[role].abs().max() <= 1 / math.sqrt(H) and roles[role].std() > 0.05
    # reset_parameters re-applies the option
    with torch.no_grad():
        for p in rnn.parameters():
            p.zero_()
    rnn.reset_parameters()
    if get_variant(variant).has_memory:
        assert torch.equal(rnn.layer_parameters(0, 1)[2][H:2 * H].detach(), torch.full((H,), 1.5))
    assert "forget_bias=1.5" in repr(rnn)


@pytest.mark.parametrize("bad", [True, "1", float("nan"), float("inf")])
def test_forget_bias_must_be_a_finite_number(bad):
    with pytest.raises(ValueError, match="forget_bias must be None"):
        AblatedRNN("ran", 3, 4, forget_bias=bad)
    with pytest.raises(ValueError, match="needs bias=True"):
        AblatedRNN("ran", 3, 4, bias=False, forget_bias=1.0)


# --------------------------------------------------------------------------- AllenNLP
def _allennlp():
    pytest.importorskip("allennlp", reason="AllenNLP is not installed (bash scripts/setup.sh)")
    _jsonnet = pytest.importorskip("_jsonnet", reason="the jsonnet package is not installed")
    import allennlp_models.rc  # noqa: F401
    import allennlp_models.structured_prediction  # noqa: F401
    import rnn_ablations.integrations.allennlp  # noqa: F401
    return _jsonnet


def _config(family, variant, env):
    _jsonnet = _allennlp()
    path = REPO / "allennlp_configs" / f"{family}_{variant}.jsonnet"
    return json.loads(_jsonnet.evaluate_file(str(path), ext_vars=env))


def _vocab(namespaces):
    from allennlp.data import Vocabulary
    vocab = Vocabulary()
    for ns in namespaces:
        vocab.add_tokens_to_namespace([f"{ns}{i}" for i in range(6)], ns)
    return vocab


def _build_model(model_config, vocab, seed=3):
    from allennlp.common import Params
    from allennlp.models import Model
    torch.manual_seed(seed)
    return Model.from_params(vocab=vocab, params=Params(model_config))


def _encoder_roles(module):
    """Roles of every recurrent encoder inside an AllenNLP model, in module order."""
    from allennlp.modules.stacked_bidirectional_lstm import StackedBidirectionalLstm
    found = []
    for m in module.modules():
        if isinstance(m, AblatedRNN):
            found.append(ablated_roles(m))
        elif isinstance(m, torch.nn.LSTM):
            found.append(nn_lstm_roles(m))
        elif isinstance(m, StackedBidirectionalLstm):
            found.append(augmented_lstm_roles(m))
    return found


def _with_encoder_type(config, lstm_type):
    """The config with every rnn_ablations LSTM encoder replaced by AllenNLP's own."""
    text = json.dumps(config)
    return json.loads(text.replace('"type": "ablated_lstm"', f'"type": "{lstm_type}"')
                      .replace('"type": "stacked_bidirectional_ablated_lstm"',
                               f'"type": "stacked_bidirectional_{lstm_type}"'))


SQUAD_ENV = {"SQUAD_TRAIN": "x", "SQUAD_DEV": "x"}


@pytest.mark.parametrize("variant", VARIANTS)
def test_bidaf_every_variant_starts_like_allennlp_lstm(variant):
    env = dict(SQUAD_ENV, GLOVE_6B_100D="")
    config = _config("bidaf", variant, env)
    baseline = _with_encoder_type(_config("bidaf", "lstm", env), "lstm")
    vocab = _vocab(["tokens", "token_characters"])
    model = _build_model(config["model"], vocab)
    reference = _build_model(baseline["model"], vocab)
    ours, theirs = _encoder_roles(model), _encoder_roles(reference)
    assert len(ours) == len(theirs) == 3  # phrase layer, modeling layer, span end encoder
    assert all(isinstance(m, torch.nn.LSTM) for m in reference.modules()
               if isinstance(m, (torch.nn.LSTM, AblatedRNN)))
    for k, (o, t) in enumerate(zip(ours, theirs)):
        H = [m for m in model.modules() if isinstance(m, AblatedRNN)][k].hidden_size
        assert_same_distribution(o, t, f"bidaf {variant} encoder {k}", 1 / math.sqrt(H))


@pytest.mark.parametrize("variant", VARIANTS)
def test_drqa_every_variant_starts_like_allennlp_lstm(variant):
    env = dict(SQUAD_ENV, GLOVE_840B_300D="")
    config = _config("drqa", variant, env)
    baseline = _with_encoder_type(_config("drqa", "lstm", env), "lstm")
    vocab = _vocab(["tokens", "drqa_question_words", "drqa_pos", "drqa_ner"])
    model = _build_model(config["model"], vocab)
    reference = _build_model(baseline["model"], vocab)
    ours, theirs = _encoder_roles(model), _encoder_roles(reference)
    assert len(ours) == len(theirs) == 6  # 3 document + 3 question layers
    rnns = [m for m in model.modules() if isinstance(m, AblatedRNN)]
    for k, (o, t) in enumerate(zip(ours, theirs)):
        assert_same_distribution(o, t, f"drqa {variant} layer {k}", 1 / math.sqrt(rnns[k].hidden_size))


def _parser_model(variant, use_highway, encoder_type=None, seed=3):
    config = _config("biaffine_parser", variant, {"UD_TRAIN": "x", "UD_DEV": "x",
                                                  "GLOVE_6B_100D": ""})
    model = config["model"]
    model["text_field_embedder"]["token_embedders"]["tokens"]["embedding_dim"] = 12
    model["pos_tag_embedding"]["embedding_dim"] = 4
    model["encoder"].update(input_size=16, hidden_size=8, num_layers=2, use_highway=use_highway)
    model.update(arc_representation_dim=10, tag_representation_dim=6)
    if encoder_type is not None:
        model["encoder"]["type"] = encoder_type
    return _build_model(model, _vocab(["tokens", "pos", "head_tags"]), seed)


def _assert_block_orthogonal(w, H, what):
    for k in range(w.shape[0] // H):
        block = w[k * H:(k + 1) * H].detach().double()  # H x d with H <= d: orthonormal rows
        torch.testing.assert_close(block @ block.T, torch.eye(H, dtype=torch.float64),
                                   atol=1e-5, rtol=0, msg=lambda s: f"{what} block {k}: {s}")


@pytest.mark.parametrize("use_highway", [True, False], ids=["highway", "no_highway"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_parser_every_variant_starts_like_augmented_lstm(variant, use_highway):
    """The config's initializer leaves the encoder alone; the encoder starts as AllenNLP's
    stacked_bidirectional_lstm (AugmentedLstm) does, for every variant."""
    from allennlp.modules.stacked_bidirectional_lstm import StackedBidirectionalLstm
    model = _parser_model(variant, use_highway)
    rnn = model.encoder.rnn
    assert isinstance(rnn, AblatedRNN) and rnn.highway == use_highway
    H = rnn.hidden_size
    for per_dir in rnn._param_names:
        for names in per_dir:
            for name in names[:2]:  # weight_ih, weight_hh: one orthogonal block per gate
                if name is None:  # no weight_hh: the cell reads no h_{t-1}
                    continue
                _assert_block_orthogonal(getattr(rnn, name), H, f"{variant} {name}")
    reference = _parser_model("lstm", use_highway, encoder_type="stacked_bidirectional_lstm")
    stacked = [m for m in reference.modules() if isinstance(m, StackedBidirectionalLstm)]
    assert len(stacked) == 1
    for fwd, bwd in stacked[0].lstm_layers:  # what AllenNLP itself does
        for cell in (fwd.cell, bwd.cell):
            _assert_block_orthogonal(cell.input_linearity.weight, H, "AugmentedLstm input")
            _assert_block_orthogonal(cell.state_linearity.weight, H, "AugmentedLstm state")
    roles, baseline = ablated_roles(rnn, sum_biases=True), augmented_lstm_roles(stacked[0])
    assert_same_distribution(roles, baseline, f"parser {variant}")
    if get_variant(variant).has_memory:  # a memory cell has a forget gate
        assert torch.all(roles["forget-gate biases"] == 1)
    for role in ("gate biases", "content biases"):
        if role in roles:
            assert torch.all(roles[role] == 0), role


def test_parser_initializer_would_touch_the_encoder_without_prevent_regexes():
    """The reason for prevent_regexes: without it the nn.LSTM-style regexes match our names."""
    _allennlp()
    from allennlp.common import Params
    from allennlp.nn import InitializerApplicator
    config = _config("biaffine_parser", "ran", {"UD_TRAIN": "x", "UD_DEV": "x",
                                                "GLOVE_6B_100D": ""})
    init = dict(config["model"]["initializer"])
    assert init["prevent_regexes"] == ["^encoder\\."]
    model = _parser_model("ran", True)
    before = {n: p.detach().clone() for n, p in model.encoder.named_parameters()}
    InitializerApplicator.from_params(Params(json.loads(json.dumps(init))))(model)
    for n, p in model.encoder.named_parameters():
        assert torch.equal(p, before[n]), n
    del init["prevent_regexes"]
    InitializerApplicator.from_params(Params(init))(model)
    assert not all(torch.equal(p, before[n]) for n, p in model.encoder.named_parameters())


# --------------------------------------------------------------------------- OpenNMT
def _onmt_model(enc_type, seed=3):
    onmt = pytest.importorskip("onmt", reason="OpenNMT-py is not installed (bash scripts/setup.sh)")
    import onmt.model_builder as mb
    from onmt.bin.train import _get_parser
    from onmt.inputters.inputter import dict_to_vocabs
    from onmt.utils.parse import ArgumentParser
    import rnn_ablations.integrations.onmt  # noqa: F401  (registers the encoder types)
    assert onmt.encoders.str2enc
    config = REPO / "onmt_configs" / f"multi30k_{enc_type}.yaml"
    opt, unknown = _get_parser().parse_known_args(
        ["-config", str(config), "-hidden_size", "16", "-word_vec_size", "8"])
    assert not unknown
    ArgumentParser.update_model_opts(opt)
    ArgumentParser.validate_model_opts(opt)
    specials = ["<unk>", "<blank>", "<s>", "</s>"]
    vocabs = dict_to_vocabs({"src": specials + [f"s{i}" for i in range(10)],
                             "tgt": specials + [f"t{i}" for i in range(10)],
                             "data_task": "seq2seq"})
    torch.manual_seed(seed)
    return mb.build_model(opt, opt, vocabs, None, -1), opt


@pytest.mark.parametrize("variant", VARIANTS)
def test_multi30k_every_encoder_type_starts_like_brnn(variant):
    model, opt = _onmt_model("b" + variant)
    assert opt.ablated_init == "onmt"
    reference, ref_opt = _onmt_model("brnn")
    assert isinstance(reference.encoder.rnn, torch.nn.LSTM)
    bound = ref_opt.param_init
    assert bound == 0.1
    assert_same_distribution(ablated_roles(model.encoder.rnn), nn_lstm_roles(reference.encoder.rnn),
                             f"onmt b{variant}", bound)
