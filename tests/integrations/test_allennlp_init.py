"""AllenNLP: every variant starts where AllenNLP's LSTM starts, role by role (see
``_init_roles.py``).

* BiDAF and DrQA (AllenNLP's ``lstm`` is ``nn.LSTM``): every variant's encoders, built from the
  shipped configs, have the distribution of AllenNLP's ``lstm``.
* Biaffine parser: ``stacked_bidirectional_<variant>`` built from the shipped config (its
  initializer included) is initialised like AllenNLP's ``stacked_bidirectional_lstm``
  (AugmentedLstm: block-orthogonal per gate block, biases 0 with forget gate 1), which the
  config's initializer leaves alone (``prevent_regexes``)."""
import contextlib
import json
import math

import pytest
import torch

from rnn_ablations import VARIANTS, AblatedRNN, get_variant

from _init_roles import ablated_roles, assert_same_distribution, augmented_lstm_roles, nn_lstm_roles
from conftest import REPO, requires_allennlp

pytestmark = requires_allennlp


def _allennlp():
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
    # the parser config's recurrent dropout: a cell that reads no h_{t-1} says it has no effect
    with (contextlib.nullcontext() if get_variant(variant).reads_hidden
          else pytest.warns(UserWarning, match=r"no h_\{t-1\} to drop")):
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

def test_parser_initializer_leaves_the_encoder_alone_with_or_without_prevent_regexes():
    """The shipped config's prevent_regexes and the stacked drop-in's stock names (the
    integration's initializers.py) each keep the nn.LSTM-style regexes off the encoder."""
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
    for n, p in model.encoder.named_parameters():
        assert torch.equal(p, before[n]), n

# The stock parser's initializer block (allennlp-models' biaffine parser) without the shipped
# configs' prevent_regexes: a user's config that changes one line (the encoder type).
STOCK_PARSER_INITIALIZER = {"regexes": [
    [".*projection.*weight", {"type": "xavier_uniform"}],
    [".*projection.*bias", {"type": "zero"}],
    [".*tag_bilinear.*weight", {"type": "xavier_uniform"}],
    [".*tag_bilinear.*bias", {"type": "zero"}],
    [".*weight_ih.*", {"type": "xavier_uniform"}],
    [".*weight_hh.*", {"type": "orthogonal"}],
    [".*bias_ih.*", {"type": "zero"}],
    [".*bias_hh.*", {"type": "lstm_hidden_bias"}]]}


def _initialized(variant, initializer, use_highway=True):
    from allennlp.common import Params
    from allennlp.nn import InitializerApplicator
    model = _parser_model(variant, use_highway)
    InitializerApplicator.from_params(Params(json.loads(json.dumps(initializer))))(model)
    return model


@pytest.mark.parametrize("variant", VARIANTS)
def test_stock_parser_initializer_treats_the_stacked_drop_in_as_the_stock_encoder(variant):
    """stacked_bidirectional_lstm -> stacked_bidirectional_<variant> in a stock config (no
    prevent_regexes): the nn.LSTM-style regexes match no AugmentedLstm parameter, so they leave
    the ablated encoder alone too, and it starts like AugmentedLstm."""
    from allennlp.modules.stacked_bidirectional_lstm import StackedBidirectionalLstm
    rnn = _initialized(variant, STOCK_PARSER_INITIALIZER).encoder.rnn
    for per_dir in rnn._param_names:
        for names in per_dir:
            for name in names[:2]:
                if name is not None:
                    _assert_block_orthogonal(getattr(rnn, name), rnn.hidden_size, f"{variant} {name}")
    reference = _parser_model("lstm", True, encoder_type="stacked_bidirectional_lstm")
    stacked = [m for m in reference.modules() if isinstance(m, StackedBidirectionalLstm)][0]
    assert_same_distribution(ablated_roles(rnn, sum_biases=True), augmented_lstm_roles(stacked),
                             f"parser {variant}, stock initializer")


def test_a_regex_naming_the_stock_encoder_s_parameters_reaches_the_same_roles():
    """A regex written for AugmentedLstm's names initialises the ablated parameters of the same
    role: state_linearity.weight is weight_hh, state_linearity.bias the bias, input_linearity
    weight_ih; prevent_regexes are read on those names too."""
    init = {"regexes": [[".*state_linearity.weight", {"type": "constant", "val": 0.5}],
                        [".*state_linearity.bias", {"type": "constant", "val": -2.0}],
                        [".*backward_layer_1.*input_linearity.*", {"type": "zero"}]],
            "prevent_regexes": [".*forward_layer_1.*"]}
    rnn = _initialized("ran", init).encoder.rnn
    assert torch.all(rnn.weight_hh_l0 == 0.5) and torch.all(rnn.weight_hh_l0_reverse == 0.5)
    assert torch.all(rnn.bias_l0 == -2.0)
    assert torch.all(rnn.weight_ih_l1_reverse == 0)
    assert not torch.all(rnn.weight_hh_l1 == 0.5)  # forward_layer_1: prevented
    assert torch.all(rnn.weight_hh_l1_reverse == 0.5)


@pytest.mark.parametrize("variant", ["srnn", "lstm_minus_srnn", "ran", "identity_ran",
                                     "lstm_minus_srnn_minus_hidden"])
def test_lstm_bias_regexes_reach_the_single_bias_gate_by_gate(variant):
    """BiDAF with the parser's stock initializer block, `lstm` -> <variant> by one line:
    nn.LSTM's bias_ih (zero) + bias_hh (lstm_hidden_bias: forget gate 1) sum to 0 with the
    forget gate at 1; the variant's single bias gets that sum gate by gate, as the stock LSTM's
    effective bias is."""
    env = dict(SQUAD_ENV, GLOVE_6B_100D="")
    config = _config("bidaf", variant, env)
    config["model"]["initializer"] = STOCK_PARSER_INITIALIZER
    model = _build_model(json.loads(json.dumps(config["model"])),
                         _vocab(["tokens", "token_characters"]))
    rnns = [m for m in model.modules() if isinstance(m, AblatedRNN)]
    assert rnns
    for rnn in rnns:
        H, blocks = rnn.hidden_size, rnn.variant.biased_blocks(rnn.highway)
        for per_dir in rnn._param_names:
            for names in per_dir:
                bias = getattr(rnn, names[2])
                for k, block in enumerate(blocks):
                    want = 1.0 if block == "f" else 0.0
                    assert torch.all(bias[k * H:(k + 1) * H] == want), (names[2], block)
