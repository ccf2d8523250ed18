"""DrQA as hitvoice/DrQA and Chen et al. 2017: the lemma exact match from spaCy's lookup
lemmatizer, POS/NER tags from a spaCy pipeline named in the config (a small one is trained here),
clear errors when either is missing, fine-tuning of the top question words only, and dropout on
the RNN output."""
import importlib.util
import json
import os
import tempfile
from pathlib import Path

import pytest

_NLTK = Path(tempfile.gettempdir()) / "rnn_ablations_nltk_data"
(_NLTK / "tokenizers" / "punkt").mkdir(parents=True, exist_ok=True)
os.environ.setdefault("NLTK_DATA", str(_NLTK))
pytest.importorskip("allennlp", reason="AllenNLP is not installed (bash scripts/setup.sh installs it)")

import torch  # noqa: E402
from allennlp.common import Params  # noqa: E402
from allennlp.common.checks import ConfigurationError  # noqa: E402
from allennlp.data import DatasetReader, Vocabulary  # noqa: E402
from allennlp.data.batch import Batch  # noqa: E402
from allennlp.data.tokenizers import Token  # noqa: E402
from allennlp.models import Model  # noqa: E402
from allennlp.modules import Seq2SeqEncoder  # noqa: E402

import allennlp_models.rc  # noqa: E402,F401
import rnn_ablations.integrations.allennlp  # noqa: E402,F401
from rnn_ablations.integrations.allennlp import drqa_reader  # noqa: E402
from rnn_ablations.integrations.allennlp.drqa_reader import (  # noqa: E402
    QUESTION_WORDS_NAMESPACE, lookup_lemmatizer, passage_features)

REPO = Path(__file__).resolve().parents[2]
SQUAD = REPO / "tests" / "fixtures" / "allennlp" / "squad_tiny.json"
def blank():
    return {"type": "spacy", "language": "blank:en"}  # a fresh dict: Params pops its keys


HAVE_LOOKUPS = importlib.util.find_spec("spacy_lookups_data") is not None
needs_lookups = pytest.mark.skipif(not HAVE_LOOKUPS, reason="spacy-lookups-data is not installed "
                                   "(pip install -c requirements/constraints.txt spacy-lookups-data)")
pytestmark = pytest.mark.usefixtures("one_thread")


# ----------------------------------------------------------------------------- lemma match
@needs_lookups
def test_lookup_lemmatizer_gives_a_real_lemma_match():
    lemmatize = lookup_lemmatizer()
    assert lemmatize(["Cats", "were", "running", "went", "Mice"]) == ["cat", "be", "run", "go",
                                                                     "mouse"]
    passage = [Token(t) for t in "The mice went home".split()]
    question = [Token(t) for t in "where does a mouse go".split()]
    feats = passage_features(passage, question, lemmatize)
    # original / lower-case / lemma: "mice" and "went" match only by lemma
    assert feats[1, :3].tolist() == [0.0, 0.0, 1.0]
    assert feats[2, :3].tolist() == [0.0, 0.0, 1.0]
    assert feats[3, :3].tolist() == [0.0, 0.0, 0.0]
    # without a lemmatizer blank:en falls back to the lower-case match: no lemma match there
    assert passage_features(passage, question)[1, 2] == 0.0


def test_missing_lookup_tables_say_how_to_install_them(monkeypatch):
    import spacy.pipeline.lemmatizer as spacy_lemmatizer

    def no_tables(*args, **kwargs):
        raise ValueError("[E955] Can't find table(s) lemma_lookup for language 'en'")

    monkeypatch.setattr(spacy_lemmatizer, "load_lookups", no_tables)
    with pytest.raises(ConfigurationError, match=r"pip install spacy-lookups-data==1\.0\.5 .*"
                                                 r"\"tokenizer\""):
        DatasetReader.from_params(Params({"type": "drqa_squad", "tokenizer": blank(),
                                          "lemmatizer": "lookup"}))
    with pytest.raises(ConfigurationError, match="lemmatizer must be one of lookup, tokenizer"):
        DatasetReader.from_params(Params({"type": "drqa_squad", "tokenizer": blank(),
                                          "lemmatizer": "wordnet"}))


# ----------------------------------------------------------------------------- POS / NER
TRAIN = [("The cat sat on the mat", ["DT", "NN", "VBD", "IN", "DT", "NN"], []),
         ("Paris is a big city", ["NNP", "VBZ", "DT", "JJ", "NN"], [(0, 5, "GPE")]),
         ("Hochreiter wrote the paper", ["NNP", "VBD", "DT", "NN"], [(0, 10, "PERSON")])]


@pytest.fixture(scope="module")
def small_pipeline(tmp_path_factory):
    """A tiny tagger + NER pipeline, trained here until it reproduces its training sentences."""
    import spacy
    from spacy.training import Example
    spacy.util.fix_random_seed(0)
    nlp = spacy.blank("en")
    nlp.add_pipe("tagger")
    nlp.add_pipe("ner")
    examples = [Example.from_dict(nlp.make_doc(text), {"tags": tags, "entities": ents})
                for text, tags, ents in TRAIN]
    optimizer = nlp.initialize(lambda: examples)
    for _ in range(60):
        nlp.update(examples, sgd=optimizer, drop=0.0)
    path = tmp_path_factory.mktemp("spacy") / "small_pipeline"
    nlp.to_disk(path)
    return path


def test_pos_and_ner_from_the_pipeline_named_in_the_config(small_pipeline):
    reader = DatasetReader.from_params(Params({
        "type": "drqa_squad", "tokenizer": blank(), "pos_tags": True, "ner_tags": True,
        "tagger_pipeline": str(small_pipeline)}))
    instance = reader.text_to_instance("Who wrote the paper?", "Hochreiter wrote the paper")
    assert instance["passage_pos_tags"].labels == ["NNP", "VBD", "DT", "NN"]
    assert instance["passage_ner_tags"].labels == ["PERSON", "O", "O", "O"]
    instance = reader.text_to_instance("Where is the cat?", "The cat sat on the mat")
    assert instance["passage_pos_tags"].labels == ["DT", "NN", "VBD", "IN", "DT", "NN"]
    assert instance["passage_ner_tags"].labels == ["O"] * 6
    # only NER asked: no POS field
    reader = DatasetReader.from_params(Params({
        "type": "drqa_squad", "tokenizer": blank(), "ner_tags": True,
        "tagger_pipeline": str(small_pipeline)}))
    instance = reader.text_to_instance("Is Paris big?", "Paris is a big city")
    assert "passage_pos_tags" not in instance.fields
    assert instance["passage_ner_tags"].labels == ["GPE", "O", "O", "O", "O"]


def test_a_missing_pipeline_says_how_to_install_it_or_switch_the_features_off(tmp_path):
    with pytest.raises(ConfigurationError) as info:
        DatasetReader.from_params(Params({
            "type": "drqa_squad", "tokenizer": blank(), "pos_tags": True, "ner_tags": True,
            "tagger_pipeline": "en_core_web_not_installed"}))
    message = str(info.value)
    assert "python -m spacy download en_core_web_not_installed" in message
    assert '"pos_tags": false' in message and '"ner_tags": false' in message
    with pytest.raises(ConfigurationError, match="both false"):
        DatasetReader.from_params(Params({"type": "drqa_squad", "tokenizer": blank(),
                                          "tagger_pipeline": "en_core_web_sm"}))


def test_a_pipeline_without_ner_is_refused_for_ner_tags(tmp_path):
    import spacy
    nlp = spacy.blank("en")
    nlp.add_pipe("sentencizer")
    nlp.to_disk(tmp_path / "no_ner")
    with pytest.raises(ConfigurationError, match="ner_tags=true but the spaCy pipeline .* has no ner"):
        DatasetReader.from_params(Params({"type": "drqa_squad", "tokenizer": blank(),
                                          "ner_tags": True, "tagger_pipeline": str(tmp_path / "no_ner")}))


# ----------------------------------------------------------------------------- top question words
def _model(vocab, tune, trainable=True):
    layer = {"type": "ran", "hidden_size": 3, "bidirectional": True}
    return Model.from_params(vocab=vocab, params=Params({
        "type": "drqa",
        "text_field_embedder": {"token_embedders": {"tokens": {
            "type": "embedding", "embedding_dim": 5, "trainable": trainable}}},
        "document_encoder": {"type": "concat_layers", "layers": [dict(layer, input_size=14)]},
        "question_encoder": {"type": "concat_layers", "layers": [dict(layer, input_size=5)]},
        "tune_question_words": tune}))


def test_only_the_most_frequent_question_words_are_fine_tuned():
    reader = DatasetReader.from_params(Params({"type": "drqa_squad", "tokenizer": blank()}))
    instances = list(reader.read(str(SQUAD)))
    vocab = Vocabulary.from_instances(instances)
    counts = {}
    for inst in instances:
        for t in inst["question"].tokens:
            counts[t.text] = counts.get(t.text, 0) + 1
    top = sorted(counts.values(), reverse=True)
    k = 4
    model = _model(vocab, k)
    tuned_words = {vocab.get_token_from_index(i, "tokens") for i in model.tuned_word_indices}
    assert len(tuned_words) == k
    assert all(counts[w] >= top[k - 1] for w in tuned_words)  # the k most frequent ones
    ranked = vocab.get_index_to_token_vocabulary(QUESTION_WORDS_NAMESPACE)
    assert counts[ranked[2]] == top[0]  # the namespace is sorted by frequency

    weight = model._embedder.token_embedder_tokens.weight
    before = weight.detach().clone()
    batch = Batch(instances)
    batch.index_instances(vocab)
    optimizer = torch.optim.Adamax(model.parameters(), lr=0.1)
    for _ in range(2):
        optimizer.zero_grad()
        model(**batch.as_tensor_dict())["loss"].backward()
        optimizer.step()
    changed = (weight.detach() != before).any(dim=1).nonzero().squeeze(1).tolist()
    assert changed and set(changed) <= set(model.tuned_word_indices)

    with pytest.raises(ConfigurationError, match="\"trainable\" to true"):
        _model(vocab, k, trainable=False)
    with pytest.raises(ConfigurationError, match="tune_question_words must be an integer"):
        _model(vocab, -1)
    empty = Vocabulary()  # not built from drqa_squad instances: no question-word counts
    empty.add_tokens_to_namespace(["who", "wrote"], "tokens")
    with pytest.raises(ConfigurationError, match="drqa_question_words"):
        _model(empty, k)


def test_dropout_on_the_rnn_output():
    enc = Seq2SeqEncoder.from_params(Params({
        "type": "concat_layers", "dropout": 0.5, "dropout_output": True,
        "layers": [{"type": "ran", "input_size": 4, "hidden_size": 8, "bidirectional": True}]}))
    x, mask = torch.randn(3, 6, 4), torch.ones(3, 6, dtype=torch.bool)
    enc.eval()
    clean = enc(x, mask)
    torch.manual_seed(0)
    enc.train()
    dropped = enc(x, mask)
    assert (dropped == 0).float().mean() > 0.3  # output dropped (input dropout alone zeros none)
    from rnn_ablations.integrations.allennlp.encoders import ConcatLayersSeq2SeqEncoder
    with pytest.raises(ConfigurationError, match="dropout_output must be true or false"):
        ConcatLayersSeq2SeqEncoder(list(enc.layers), dropout_output="yes")
    assert clean.shape == dropped.shape


def test_drqa_configs_name_every_feature():
    _jsonnet = pytest.importorskip("_jsonnet")
    config = json.loads(_jsonnet.evaluate_file(
        str(REPO / "allennlp_configs" / "drqa_ran.jsonnet"),
        ext_vars={"SQUAD_TRAIN": "x", "SQUAD_DEV": "x", "GLOVE_840B_300D": ""}))
    reader, model = config["dataset_reader"], config["model"]
    assert reader["lemmatizer"] == "lookup" and reader["tagger_pipeline"] == "en_core_web_sm"
    assert reader["pos_tags"] and reader["ner_tags"]
    assert model["tune_question_words"] == 1000
    assert model["text_field_embedder"]["token_embedders"]["tokens"]["trainable"] is True
    for enc in ("document_encoder", "question_encoder"):
        assert model[enc]["dropout_output"] is True and model[enc]["dropout"] == 0.3
    doc_in = model["document_encoder"]["layers"][0]["input_size"]
    assert doc_in == 2 * 300 + 4 + model["pos_tag_embedding_dim"] + model["ner_tag_embedding_dim"]
    assert drqa_reader.LOOKUPS_REQUIREMENT in (REPO / "requirements" / "constraints.txt").read_text()
