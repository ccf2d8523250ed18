"""``drqa_squad``: AllenNLP's SQuAD reader plus the DrQA document reader's hand-made token features."""
from typing import Any, Dict, Iterable, List, Optional, Tuple

import torch
from allennlp.common.checks import ConfigurationError
from allennlp.data.dataset_readers.dataset_reader import DatasetReader
from allennlp.data.fields import SequenceLabelField, TensorField
from allennlp.data.instance import Instance
from allennlp.data.token_indexers import TokenIndexer
from allennlp.data.tokenizers import Token, Tokenizer
from allennlp_models.rc.dataset_readers.squad import SquadReader

__all__ = ["DrQASquadReader", "MANUAL_FEATURES", "POS_NAMESPACE", "NER_NAMESPACE",
           "QUESTION_WORDS_NAMESPACE", "LEMMATIZERS", "passage_features", "lookup_lemmatizer"]

#: The columns of the ``passage_features`` tensor (Chen et al. 2017, §3.1): exact match of the
#: passage token with a question token in its original, lower-case and lemma form, and the
#: passage token's normalised term frequency in the passage.
MANUAL_FEATURES = ("exact_match_original", "exact_match_lowercase", "exact_match_lemma",
                   "term_frequency")
#: Vocabulary namespaces of the optional tag fields (padded, so an unseen tag maps to OOV).
POS_NAMESPACE = "drqa_pos"
NER_NAMESPACE = "drqa_ner"
#: Vocabulary namespace counting the question words (AllenNLP sorts a namespace built from
#: instances by frequency, so its first entries are the most frequent question words; the
#: ``drqa`` model fine-tunes the embeddings of the top ``tune_question_words`` of them).
QUESTION_WORDS_NAMESPACE = "drqa_question_words"
#: ``lemmatizer`` choices of the reader.
LEMMATIZERS = ("lookup", "tokenizer")
#: pip requirement of the lookup lemmatizer's tables.
LOOKUPS_REQUIREMENT = "spacy-lookups-data==1.0.5"


def lookup_lemmatizer():
    """spaCy's lookup lemmatizer for English (tables from ``spacy-lookups-data``; no trained
    pipeline needed): a function ``words -> lemmas`` (lower-cased words in, lower-case lemmas out).
    Raises ``ConfigurationError`` saying how to install the tables when they are missing."""
    import spacy
    from spacy.tokens import Doc
    nlp = spacy.blank("en")
    pipe = nlp.add_pipe("lemmatizer", config={"mode": "lookup"})
    try:
        nlp.initialize()
    except (ValueError, ImportError, OSError) as exc:
        raise ConfigurationError(
            f"drqa_squad: lemmatizer \"lookup\" needs spaCy's lookup tables: pip install "
            f"{LOOKUPS_REQUIREMENT} (or set the reader's \"lemmatizer\" to \"tokenizer\", which "
            f"uses the tokenizer's lemmas or the lower-cased word); spaCy said: {exc}") from exc

    def lemmatize(words: List[str]) -> List[str]:
        if not words:
            return []
        doc = pipe(Doc(nlp.vocab, words=[w.lower() for w in words]))
        return [(t.lemma_ or t.text).lower() for t in doc]

    return lemmatize


def _lemma(token) -> str:
    lemma = getattr(token, "lemma_", None)
    return (lemma or token.text).lower()


def passage_features(passage_tokens: List, question_tokens: List,
                     lemmatize=None) -> torch.Tensor:
    """``(len(passage_tokens), 4)`` float tensor with the :data:`MANUAL_FEATURES`.

    The lemma match uses ``lemmatize`` (``words -> lemmas``, e.g. :func:`lookup_lemmatizer`) when
    given; otherwise each token's ``lemma_`` where the tokenizer provides one, falling back to the
    lower-cased text (with a pipeline that has no lemmatizer, e.g. spaCy ``blank:en``, it then
    equals the lower-case match)."""
    q_original = {t.text for t in question_tokens}
    q_lower = {t.text.lower() for t in question_tokens}
    if lemmatize is not None:
        q_lemma = set(lemmatize([t.text for t in question_tokens]))
        p_lemmas = lemmatize([t.text for t in passage_tokens])
    else:
        q_lemma = {_lemma(t) for t in question_tokens}
        p_lemmas = [_lemma(t) for t in passage_tokens]
    counts: Dict[str, int] = {}
    for t in passage_tokens:
        key = t.text.lower()
        counts[key] = counts.get(key, 0) + 1
    n = max(len(passage_tokens), 1)
    rows = [[float(t.text in q_original), float(t.text.lower() in q_lower),
             float(lemma in q_lemma), counts[t.text.lower()] / n]
            for t, lemma in zip(passage_tokens, p_lemmas)]
    return torch.tensor(rows, dtype=torch.float32).reshape(len(passage_tokens), len(MANUAL_FEATURES))


def _load_tagger(name: str, pos_tags: bool, ner_tags: bool):
    import spacy
    try:
        nlp = spacy.load(name, exclude=["parser", "lemmatizer", "senter", "textcat"])
    except (OSError, IOError) as exc:
        raise ConfigurationError(
            f"drqa_squad: the spaCy pipeline {name!r} (\"tagger_pipeline\", for the POS/NER "
            f"features) is not installed: install it with `python -m spacy download {name}` (or "
            f"pip install its wheel), or switch the features off: \"pos_tags\": false, "
            f"\"ner_tags\": false, no \"tagger_pipeline\", and the model's "
            f"\"pos_tag_embedding_dim\"/\"ner_tag_embedding_dim\" 0 (the document encoder's "
            f"input_size shrinks by as much)") from exc
    pipes = set(nlp.pipe_names)
    for option, wanted, needed in (("pos_tags", pos_tags, {"tagger", "morphologizer"}),
                                   ("ner_tags", ner_tags, {"ner"})):
        if wanted and not pipes & needed:
            raise ConfigurationError(
                f"drqa_squad: {option}=true but the spaCy pipeline {name!r} has no "
                f"{' or '.join(sorted(needed))} (it has: {', '.join(sorted(pipes)) or 'nothing'}); "
                f"use a pipeline that has it (e.g. en_core_web_sm), or set {option} to false")
    return nlp


@DatasetReader.register("drqa_squad")
class DrQASquadReader(SquadReader):
    """AllenNLP's ``squad`` reader (same arguments, same fields: ``question``, ``passage``,
    ``span_start``, ``span_end``, ``metadata``) plus the token features of DrQA's document reader:

    * ``passage_features``: ``(passage_len, 4)`` — exact match (original, lower-case, lemma) and
      normalised term frequency (see :data:`MANUAL_FEATURES`);
    * ``passage_pos_tags`` when ``pos_tags`` is true: the fine-grained POS tag (``tag_``) of each
      passage token, namespace ``drqa_pos``;
    * ``passage_ner_tags`` when ``ner_tags`` is true: the entity type (``ent_type_``, ``O``
      outside entities), namespace ``drqa_ner``;
    * ``question_words``: the question's words in namespace ``drqa_question_words`` (only counted
      into the vocabulary, for the model's ``tune_question_words``).

    # Parameters (beyond the ``squad`` reader's)
    lemmatizer : `str`, optional (default = `"tokenizer"`)
        ``"lookup"`` (the DrQA configs): spaCy's lookup lemmatizer (``spacy-lookups-data``; works
        with any tokenizer and without a trained pipeline), for the lemma match of Chen et al.
        2017; ``"tokenizer"``: the tokenizer's ``lemma_``, else the lower-cased word (with
        ``blank:en``, which has no lemmatizer, the lemma match then equals the lower-case match).
    tagger_pipeline : `str`, optional (default = `None`)
        A spaCy pipeline (package name or path) that tags the (already tokenised) passage for
        ``pos_tags`` / ``ner_tags``, e.g. ``"en_core_web_sm"``.  When it is not installed the
        reader stops and says how to install it or how to switch the features off.  Without it
        the tags come from the tokenizer (a ``spacy`` tokenizer with ``pos_tags`` / ``ner``).
    """

    def __init__(self, tokenizer: Tokenizer = None, token_indexers: Dict[str, TokenIndexer] = None,
                 passage_length_limit: int = None, question_length_limit: int = None,
                 skip_impossible_questions: bool = False, pos_tags: bool = False,
                 ner_tags: bool = False, lemmatizer: str = "tokenizer",
                 tagger_pipeline: Optional[str] = None, **kwargs) -> None:
        super().__init__(tokenizer=tokenizer, token_indexers=token_indexers,
                         passage_length_limit=passage_length_limit,
                         question_length_limit=question_length_limit,
                         skip_impossible_questions=skip_impossible_questions, **kwargs)
        self.pos_tags = bool(pos_tags)
        self.ner_tags = bool(ner_tags)
        if lemmatizer not in LEMMATIZERS:
            raise ConfigurationError(f"drqa_squad: lemmatizer must be one of "
                                     f"{', '.join(LEMMATIZERS)}, got {lemmatizer!r}")
        self._lemmatize = lookup_lemmatizer() if lemmatizer == "lookup" else None
        self._tagger = None
        if tagger_pipeline is not None:
            if not (self.pos_tags or self.ner_tags):
                raise ConfigurationError(
                    f"drqa_squad: tagger_pipeline {tagger_pipeline!r} is given but pos_tags and "
                    "ner_tags are both false; turn one on or drop tagger_pipeline")
            self._tagger = _load_tagger(tagger_pipeline, self.pos_tags, self.ner_tags)
            return
        nlp = getattr(self._tokenizer, "spacy", None)  # a SpacyTokenizer's pipeline
        pipes = set(getattr(nlp, "pipe_names", ()) or ())
        if nlp is not None:
            for option, wanted, needed in (("pos_tags", self.pos_tags, {"tagger", "morphologizer"}),
                                           ("ner_tags", self.ner_tags, {"ner"})):
                if wanted and not pipes & needed:
                    raise ConfigurationError(
                        f"drqa_squad: {option}=true but the spaCy pipeline of the tokenizer has no "
                        f"{' or '.join(sorted(needed))} (it has: {', '.join(sorted(pipes)) or 'nothing'})"
                        f"; name a pipeline that has it with the reader's \"tagger_pipeline\" "
                        f"(e.g. \"en_core_web_sm\"), or set {option} to false")

    def _tag_with_pipeline(self, tokens: List) -> List:
        """Run ``tagger_pipeline`` on the passage's own tokenisation; returns spaCy tokens."""
        from spacy.tokens import Doc
        nlp = self._tagger
        doc = Doc(nlp.vocab, words=[t.text for t in tokens])
        for _name, proc in nlp.pipeline:
            doc = proc(doc)
        return list(doc)

    def _tags(self, tokens: List, attribute: str, option: str, outside: str,
              check: bool) -> List[str]:
        tags = [getattr(t, attribute, None) for t in tokens]
        if check and tokens and not any(tags):
            raise ConfigurationError(
                f"drqa_squad: {option}=true but the tokenizer gives no '{attribute}' for the "
                f"passage; use a spaCy pipeline that has it, e.g. \"tokenizer\": {{\"type\": "
                f"\"spacy\", \"language\": \"en_core_web_sm\", \"pos_tags\": true, \"ner\": true}}, "
                f"or set {option} to false")
        return [tag or outside for tag in tags]

    def text_to_instance(self, question_text: str, passage_text: str, is_impossible: bool = None,
                         char_spans: Iterable[Tuple[int, int]] = None,
                         answer_texts: List[str] = None, passage_tokens: List[Token] = None,
                         additional_metadata: Dict[str, Any] = None) -> Optional[Instance]:
        instance = super().text_to_instance(
            question_text, passage_text, is_impossible=is_impossible, char_spans=char_spans,
            answer_texts=answer_texts, passage_tokens=passage_tokens,
            additional_metadata=additional_metadata)
        if instance is None:
            return None
        passage_field = instance["passage"]
        p_tokens, q_tokens = passage_field.tokens, instance["question"].tokens
        instance.add_field("passage_features", TensorField(
            passage_features(p_tokens, q_tokens, self._lemmatize)))
        tagged = p_tokens
        if self._tagger is not None and (self.pos_tags or self.ner_tags):
            tagged = self._tag_with_pipeline(p_tokens)
        if self.pos_tags:
            instance.add_field("passage_pos_tags", SequenceLabelField(
                self._tags(tagged, "tag_", "pos_tags", "NONE", True), passage_field,
                label_namespace=POS_NAMESPACE))
        if self.ner_tags:
            instance.add_field("passage_ner_tags", SequenceLabelField(
                self._tags(tagged, "ent_type_", "ner_tags", "O", False), passage_field,
                label_namespace=NER_NAMESPACE))
        instance.add_field("question_words", SequenceLabelField(
            [t.text for t in q_tokens], instance["question"],
            label_namespace=QUESTION_WORDS_NAMESPACE))
        return instance
