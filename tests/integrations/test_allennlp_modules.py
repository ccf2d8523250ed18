"""In-process tests of the AllenNLP integration: registration, encoders (masks, state, equivalence
with AllenNLP's own LSTM), the parser config's initializer, DrQA (reader, model, predictor) and
bad inputs.  The real-CLI runs are in test_allennlp_cli.py."""
import contextlib
import json
import math
import os
import tempfile
from pathlib import Path

import pytest

_NLTK = Path(tempfile.gettempdir()) / "rnn_ablations_nltk_data"
(_NLTK / "tokenizers" / "punkt").mkdir(parents=True, exist_ok=True)
os.environ.setdefault("NLTK_DATA", str(_NLTK))  # nltk would try to download punkt at import

pytest.importorskip("allennlp", reason="AllenNLP is not installed (bash scripts/setup.sh installs it)")

import torch  # noqa: E402
from allennlp.common import Params  # noqa: E402
from allennlp.common.checks import ConfigurationError  # noqa: E402
from allennlp.data import DatasetReader, Vocabulary  # noqa: E402
from allennlp.data.batch import Batch  # noqa: E402
from allennlp.models import Model  # noqa: E402
from allennlp.modules import Seq2SeqEncoder, Seq2VecEncoder  # noqa: E402
from allennlp.predictors import Predictor  # noqa: E402
from allennlp.training.learning_rate_schedulers import LearningRateScheduler  # noqa: E402

import allennlp_models.rc  # noqa: E402,F401  (the CLI imports allennlp_models as a default plugin)
import allennlp_models.structured_prediction  # noqa: E402,F401
import rnn_ablations.integrations.allennlp as integration  # noqa: E402
from rnn_ablations import VARIANTS, get_variant  # noqa: E402
from rnn_ablations.integrations.allennlp.drqa import best_span_within  # noqa: E402
from rnn_ablations.integrations.allennlp.encoders import encoder_name  # noqa: E402
from rnn_ablations.integrations.allennlp.drqa_reader import passage_features  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "allennlp"
CONFIGS = REPO / "allennlp_configs"
#: the registered names, read from the table: AllenNLP owns ``lstm``, so ours is ``ablated_lstm``
NAMES = [encoder_name(v) for v in VARIANTS]


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: see conftest.one_thread


def _mask(lengths, T):
    return torch.arange(T).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)


# ----------------------------------------------------------------------------- registration
def test_every_name_is_registered_with_its_variant():
    assert integration.ENCODER_NAMES == dict(zip(NAMES, VARIANTS))
    for name, variant in integration.ENCODER_NAMES.items():
        for registry, table in ((Seq2SeqEncoder, integration.SEQ2SEQ_CLASSES),
                                (Seq2VecEncoder, integration.SEQ2VEC_CLASSES)):
            for full in (name, f"stacked_bidirectional_{name}"):
                cls = registry.by_name(full)
                assert cls is table[full] and cls.variant == variant, full
    # AllenNLP keeps its own "lstm"
    from allennlp.modules.seq2seq_encoders import LstmSeq2SeqEncoder
    assert Seq2SeqEncoder.by_name("lstm") is LstmSeq2SeqEncoder
    assert Seq2SeqEncoder.by_name("concat_layers") is integration.ConcatLayersSeq2SeqEncoder
    assert Model.by_name("drqa") is integration.DrQA
    assert DatasetReader.by_name("drqa_squad") is integration.DrQASquadReader
    assert Predictor.by_name("drqa") is integration.DrQAPredictor
    assert LearningRateScheduler.by_name("reduce_on_plateau_torch2") is integration.ReduceOnPlateauTorch2


@pytest.mark.parametrize("name", NAMES)
def test_encoders_take_the_lstm_and_stacked_lstm_arguments(name):
    x = torch.randn(3, 5, 3)
    mask = _mask([5, 2, 4], 5)
    enc = Seq2SeqEncoder.from_params(Params({
        "type": name, "input_size": 3, "hidden_size": 4, "num_layers": 2, "bias": True,
        "dropout": 0.25, "bidirectional": True, "stateful": False}))
    rnn = enc.rnn
    assert (rnn.variant.name, rnn.num_layers, rnn.dropout, rnn.bidirectional, rnn.batch_first) == \
        (integration.ENCODER_NAMES[name], 2, 0.25, True, True)
    assert (enc.get_input_dim(), enc.get_output_dim(), enc.is_bidirectional()) == (3, 8, True)
    assert enc(x, mask).shape == (3, 5, 8)

    # the parser configs' recurrent dropout; a cell that reads no h_{t-1} says it has no effect
    reads_hidden = get_variant(integration.ENCODER_NAMES[name]).reads_hidden
    with (contextlib.nullcontext() if reads_hidden
          else pytest.warns(UserWarning, match=r"no h_\{t-1\} to drop")):
        stacked = Seq2SeqEncoder.from_params(Params({
            "type": f"stacked_bidirectional_{name}", "input_size": 3, "hidden_size": 4,
            "num_layers": 3, "recurrent_dropout_probability": 0.3,
            "layer_dropout_probability": 0.2, "use_highway": True}))
    rnn = stacked.rnn
    assert (rnn.num_layers, rnn.bidirectional, rnn.recurrent_dropout, rnn.dropout, rnn.highway) == \
        (3, True, 0.3, 0.2, True)
    assert stacked.get_output_dim() == 8  # 2·hidden, as AllenNLP's stacked_bidirectional_lstm
    stacked.eval()
    assert stacked(x, mask).shape == (3, 5, 8)

    vec = Seq2VecEncoder.from_params(Params({"type": name, "input_size": 3, "hidden_size": 4,
                                             "bidirectional": True}))
    assert vec(x, mask).shape == (3, 8) and vec.get_output_dim() == 8
    svec = Seq2VecEncoder.from_params(Params({"type": f"stacked_bidirectional_{name}",
                                              "input_size": 3, "hidden_size": 4, "num_layers": 2}))
    assert svec(x, mask).shape == (3, 8)


# ----------------------------------------------------------------------------- semantics
def test_ablated_lstm_equals_allennlp_lstm_under_masks():
    """Same weights -> the same outputs as AllenNLP's own lstm (nn.LSTM, sorted and packed), for
    Seq2Seq and Seq2Vec, with ragged rows and a row that is entirely padding."""
    kwargs = {"input_size": 4, "hidden_size": 5, "num_layers": 2, "bidirectional": True}
    x = torch.randn(4, 6, 4)
    mask = _mask([6, 3, 0, 5], 6)
    for registry in (Seq2SeqEncoder, Seq2VecEncoder):
        ref = registry.from_params(Params({"type": "lstm", **kwargs}))
        ours = registry.from_params(Params({"type": "ablated_lstm", **kwargs}))
        ours.rnn.load_state_dict(ref._module.state_dict())
        expected, got = ref(x, mask), ours(x, mask)
        assert got.shape == expected.shape
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
        assert bool((got[2] == 0).all())  # the all-padding row


@pytest.mark.parametrize("variant", ["srnn", "ran", "identity_ran"])
def test_each_row_is_encoded_as_if_alone(variant):
    enc = Seq2SeqEncoder.from_params(Params({"type": variant, "input_size": 3, "hidden_size": 4,
                                             "bidirectional": True}))
    vec = Seq2VecEncoder.from_params(Params({"type": variant, "input_size": 3, "hidden_size": 4,
                                             "bidirectional": True}))
    vec.rnn.load_state_dict(enc.rnn.state_dict())
    lengths = [5, 2, 0, 4]
    x = torch.randn(4, 5, 3)
    out, final = enc(x, _mask(lengths, 5)), vec(x, _mask(lengths, 5))
    for b, n in enumerate(lengths):
        if n == 0:
            assert bool((out[b] == 0).all()) and bool((final[b] == 0).all())
            continue
        alone, (h, _) = enc.rnn(x[b:b + 1, :n])
        torch.testing.assert_close(out[b, :n], alone[0], atol=1e-6, rtol=1e-5)
        assert bool((out[b, n:] == 0).all())
        torch.testing.assert_close(final[b], torch.cat([h[-2, 0], h[-1, 0]]), atol=1e-6, rtol=1e-5)


def test_stateful_encoder_continues_from_the_previous_batch():
    enc = Seq2SeqEncoder.from_params(Params({"type": "ran", "input_size": 3, "hidden_size": 4,
                                             "stateful": True}))
    x1, x2 = torch.randn(2, 4, 3), torch.randn(2, 3, 3)
    m1, m2 = _mask([4, 2], 4), _mask([3, 0], 3)  # row 1 of the 2nd batch is padding only
    enc(x1, m1)
    h1, c1 = enc._states
    out2 = enc(x2, m2)
    ref, _ = enc.rnn(x2[:1], (h1[:, :1], c1[:, :1]))
    torch.testing.assert_close(out2[0], ref[0], atol=1e-6, rtol=1e-5)
    h2, c2 = enc._states
    torch.testing.assert_close(h2[:, 1], h1[:, 1])  # the padding-only row keeps its state
    assert not torch.allclose(h2[:, 0], h1[:, 0])
    with pytest.raises(ValueError, match="mask"):
        enc(x2, None)


def test_concat_layers_concatenates_every_layer():
    enc = Seq2SeqEncoder.from_params(Params({"type": "concat_layers", "layers": [
        {"type": "ran", "input_size": 3, "hidden_size": 2, "bidirectional": True},
        {"type": "srnn", "input_size": 4, "hidden_size": 3, "bidirectional": True}]}))
    x, mask = torch.randn(2, 5, 3), _mask([5, 3], 5)
    out = enc(x, mask)
    assert enc.get_output_dim() == 10 and out.shape == (2, 5, 10)
    first = enc.layers[0](x, mask)
    torch.testing.assert_close(out[..., :4], first)
    torch.testing.assert_close(out[..., 4:], enc.layers[1](first, mask))


# ----------------------------------------------------------------------------- bad inputs
def test_bad_encoder_configurations_fail_clearly():
    with pytest.raises(ConfigurationError, match="rann"):
        Seq2SeqEncoder.from_params(Params({"type": "rann", "input_size": 3, "hidden_size": 4}))
    with pytest.raises(ConfigurationError, match="'ran'.*hidden_size must be a positive integer, got 0"):
        Seq2SeqEncoder.from_params(Params({"type": "ran", "input_size": 3, "hidden_size": 0}))
    with pytest.raises(ConfigurationError, match="stacked_bidirectional_srnn.*dropout"):
        Seq2SeqEncoder.from_params(Params({"type": "stacked_bidirectional_srnn", "input_size": 3,
                                           "hidden_size": 4, "num_layers": 2,
                                           "layer_dropout_probability": 1.5}))
    with pytest.raises(ConfigurationError, match="layer 1 has input_size 5 but layer 0 outputs 4"):
        Seq2SeqEncoder.from_params(Params({"type": "concat_layers", "layers": [
            {"type": "ran", "input_size": 3, "hidden_size": 2, "bidirectional": True},
            {"type": "ran", "input_size": 5, "hidden_size": 2}]}))
    enc = Seq2SeqEncoder.from_params(Params({"type": "ran", "input_size": 3, "hidden_size": 4}))
    with pytest.raises(ValueError, match="input_size"):
        enc(torch.randn(2, 4, 7), _mask([4, 4], 4))
    with pytest.raises(ValueError, match="left-aligned"):
        enc(torch.randn(2, 4, 3), torch.tensor([[True] * 4, [False, False, True, True]]))


def test_a_hidden_size_that_does_not_fit_the_model_is_named():
    """BiDAF's phrase layer with hidden 50 no longer matches the 200-d attention (AllenNLP's own
    check); DrQA's encoders are checked by the model and the message says what to set."""
    overrides = {"model.phrase_layer.hidden_size": 50}
    params = _config("bidaf_ran.jsonnet", overrides, SQUAD_TRAIN="x", SQUAD_DEV="x", GLOVE_6B_100D="")
    vocab = Vocabulary()
    with pytest.raises(ConfigurationError, match="modeling layer input dim must match 4 \\* encoding dim, but got 800 and 400"):
        Model.from_params(vocab=vocab, params=params.pop("model"))

    params = _config("drqa_srnn.jsonnet", {"model.text_field_embedder.token_embedders.tokens.embedding_dim": 10},
                     SQUAD_TRAIN="x", SQUAD_DEV="x", GLOVE_840B_300D="")
    with pytest.raises(ConfigurationError, match="input size 624 .* 44 features.*set the document"):
        Model.from_params(vocab=vocab, params=params.pop("model"))


def _config(name, overrides, **env):
    return Params.from_file(str(CONFIGS / name), params_overrides=json.dumps(overrides), ext_vars=env)


def test_a_missing_data_variable_is_named():
    env = {"SQUAD_TRAIN": "x", "GLOVE_840B_300D": ""}
    saved = os.environ.pop("SQUAD_DEV", None)
    try:
        with pytest.raises(RuntimeError, match="undefined external variable: SQUAD_DEV"):
            Params.from_file(str(CONFIGS / "drqa_ran.jsonnet"), ext_vars=env)
    finally:
        if saved is not None:
            os.environ["SQUAD_DEV"] = saved


# ----------------------------------------------------------------------------- initializer
def _parser(variant_name, use_highway):
    overrides = {
        "model.text_field_embedder.token_embedders.tokens.embedding_dim": 96,
        "model.pos_tag_embedding.embedding_dim": 4, "model.encoder.input_size": 100,
        "model.encoder.hidden_size": 8, "model.encoder.num_layers": 2,
        "model.encoder.use_highway": use_highway,
        "model.arc_representation_dim": 6, "model.tag_representation_dim": 4}
    variant = get_variant("lstm" if variant_name == "ablated_lstm" else variant_name).name
    name = f"biaffine_parser_{variant}.jsonnet"
    params = _config(name, overrides, UD_TRAIN=str(FIXTURES / "ud_tiny.conllu"),
                     UD_DEV=str(FIXTURES / "ud_tiny.conllu"), GLOVE_6B_100D="")
    reader = DatasetReader.from_params(params.pop("dataset_reader"))
    vocab = Vocabulary.from_instances(reader.read(str(FIXTURES / "ud_tiny.conllu")))
    # the parser config's recurrent dropout: a cell that reads no h_{t-1} says it has no effect
    with (contextlib.nullcontext() if get_variant(variant).reads_hidden
          else pytest.warns(UserWarning, match=r"no h_\{t-1\} to drop")):
        return Model.from_params(vocab=vocab, params=params.pop("model"))


@pytest.mark.parametrize("use_highway", [True, False])
@pytest.mark.parametrize("name", NAMES)
def test_parser_initializer_gives_each_variant_its_documented_init(name, use_highway):
    """After AllenNLP's InitializerApplicator (the parser config's regexes, kept off the encoder by
    its prevent_regexes) every variant's encoder is initialised like AllenNLP's own
    stacked_bidirectional_lstm (AugmentedLstm): weight_ih and weight_hh block-orthogonal, one
    orthogonal H-row block per gate/content block; biases 0 with the forget gate at 1 (for the
    nn.LSTM-style lstm: bias_ih's forget slice 1, bias_hh 0); the S-RNN's bias 0.
    LSTM − S-RNN − HIDDEN has no weight_hh: its weight_ih blocks (i, f, o, c, + r, hw) are
    block-orthogonal and its gate bias (i, f, o, + r) 0 with the forget gate at 1, the rule of the
    other gated cells."""
    torch.manual_seed(1)
    model = _parser(name, use_highway)
    rnn = model.encoder.rnn
    H = rnn.hidden_size
    v = rnn.variant
    rec = v.biased_blocks(use_highway)  # the blocks of the bias, in its order
    params = {k: p.detach() for k, p in rnn.named_parameters()}
    for layer in range(rnn.num_layers):
        for sfx in (f"_l{layer}", f"_l{layer}_reverse"):
            w_hh = params.get("weight_hh" + sfx)
            assert (w_hh is not None) == v.reads_hidden
            for w in (params["weight_ih" + sfx], w_hh):
                if w is None:
                    continue
                for k in range(w.shape[0] // H):
                    block = w[k * H:(k + 1) * H]  # H x d_in (d_in >= H): orthonormal rows
                    torch.testing.assert_close(block @ block.t(), torch.eye(H), atol=1e-5, rtol=0)
            expected = torch.zeros(len(rec) * H)
            if "f" in rec:
                f = rec.index("f")
                expected[f * H:(f + 1) * H] = 1.0
            if v.uses_lstm_bias_names(use_highway):
                assert torch.equal(params["bias_ih" + sfx], expected)
                assert bool((params["bias_hh" + sfx] == 0).all())
                assert "bias" + sfx not in params
            else:
                assert not any(k.startswith("bias_ih") or k.startswith("bias_hh") for k in params)
                assert torch.equal(params["bias" + sfx], expected)


# ----------------------------------------------------------------------------- DrQA
def test_drqa_reader_features():
    from allennlp.data.tokenizers import Token
    passage = [Token(t) for t in "The cat sat . the Dog ran".split()]
    question = [Token(t) for t in "where did the Cat go".split()]
    feats = passage_features(passage, question)
    assert feats.shape == (7, 4)
    # original / lower-case / lemma (falls back to lower-case) / term frequency
    assert feats[0].tolist() == pytest.approx([0.0, 1.0, 1.0, 2 / 7])
    assert feats[1].tolist() == pytest.approx([0.0, 1.0, 1.0, 1 / 7])
    assert feats[4].tolist() == pytest.approx([1.0, 1.0, 1.0, 2 / 7])
    assert feats[5].tolist() == pytest.approx([0.0, 0.0, 0.0, 1 / 7])
    lemma_p, lemma_q = Token("ran", lemma_="run"), Token("runs", lemma_="run")
    assert passage_features([lemma_p], [lemma_q])[0, :3].tolist() == [0.0, 0.0, 1.0]

    reader = DatasetReader.from_params(Params({"type": "drqa_squad",
                                               "tokenizer": {"type": "spacy", "language": "blank:en"}}))
    instances = list(reader.read(str(FIXTURES / "squad_tiny.json")))
    assert len(instances) == 9
    inst = instances[0]
    assert inst["passage_features"].tensor.shape == (len(inst["passage"].tokens), 4)
    with pytest.raises(ConfigurationError, match="pos_tags=true.*tagger"):
        DatasetReader.from_params(Params({"type": "drqa_squad", "pos_tags": True,
                                          "tokenizer": {"type": "spacy", "language": "blank:en"}}))


def test_best_span_within_is_the_brute_force_argmax():
    torch.manual_seed(3)
    start, end = torch.randn(5, 9), torch.randn(5, 9)
    mask = _mask([9, 4, 1, 7, 9], 9)
    for max_len in (1, 3, 15):
        best = best_span_within(start, end, mask, max_len)
        for b in range(5):
            n = int(mask[b].sum())
            cands = [(float(start[b, i] + end[b, j]), i, j) for i in range(n)
                     for j in range(i, min(n, i + max_len))]
            _, i, j = max(cands)
            assert best[b].tolist() == [i, j]


def _drqa(variant="ran", **model_overrides):
    reader = DatasetReader.from_params(Params({"type": "drqa_squad",
                                               "tokenizer": {"type": "spacy", "language": "blank:en"}}))
    instances = list(reader.read(str(FIXTURES / "squad_tiny.json")))
    vocab = Vocabulary.from_instances(instances)
    layer = {"type": variant, "hidden_size": 3, "bidirectional": True}
    config = {
        "type": "drqa",
        "text_field_embedder": {"token_embedders": {"tokens": {"type": "embedding", "embedding_dim": 5}}},
        "document_encoder": {"type": "concat_layers", "dropout": 0.3,
                             "layers": [dict(layer, input_size=14), dict(layer, input_size=6)]},
        "question_encoder": {"type": "concat_layers", "layers": [dict(layer, input_size=5)]},
        **model_overrides}
    return reader, instances, vocab, Model.from_params(vocab=vocab, params=Params(config))


def test_drqa_trains_and_decodes():
    reader, instances, vocab, model = _drqa()
    batch = Batch(instances)
    batch.index_instances(vocab)
    tensors = batch.as_tensor_dict()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    losses = []
    for _ in range(15):
        optimizer.zero_grad()
        out = model(**tensors)
        out["loss"].backward()
        optimizer.step()
        losses.append(float(out["loss"].detach()))
    assert losses[-1] < 0.5 * losses[0]  # it fits 9 questions
    model.get_metrics(reset=True)
    model.eval()
    out = model(**tensors)
    spans = out["best_span"]
    assert bool(((spans[:, 1] - spans[:, 0]) < 15).all()) and bool((spans[:, 1] >= spans[:, 0]).all())
    metrics = model.get_metrics(reset=True)
    assert set(metrics) == {"start_acc", "end_acc", "span_acc", "em", "f1"}
    assert metrics["f1"] > 0.5
    assert len(out["best_span_str"]) == 9

    predictor = Predictor.by_name("drqa")(model, reader)
    answer = predictor.predict(question="Who introduced the Long Short-Term Memory network?",
                               passage=instances[0]["metadata"]["original_passage"])
    assert isinstance(answer["best_span_str"], str) and answer["best_span_str"]
    with pytest.raises(ValueError, match="'question' and 'passage'.*passage"):
        predictor.predict_json({"question": "Who?"})


def test_drqa_checks_its_configuration():
    with pytest.raises(ConfigurationError, match="question_encoder has input size 4 .* 5 features"):
        _drqa(question_encoder={"type": "ran", "input_size": 4, "hidden_size": 3})
    with pytest.raises(ConfigurationError, match="max_span_length"):
        _drqa(max_span_length=0)
    reader, instances, vocab, model = _drqa()
    batch = Batch(instances[:2])
    batch.index_instances(vocab)
    tensors = batch.as_tensor_dict()
    tensors.pop("passage_features")
    with pytest.raises(ConfigurationError, match="drqa_squad"):
        model(**tensors)
