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
           "passage_features"]

#: The columns of the ``passage_features`` tensor (Chen et al. 2017, §3.1): exact match of the
#: passage token with a question token in its original, lower-case and lemma form, and the
#: passage token's normalised term frequency in the passage.
MANUAL_FEATURES = ("exact_match_original", "exact_match_lowercase", "exact_match_lemma",
                   "term_frequency")
#: Vocabulary namespaces of the optional tag fields (padded, so an unseen tag maps to OOV).
POS_NAMESPACE = "drqa_pos"
NER_NAMESPACE = "drqa_ner"


def _lemma(token) -> str:
    lemma = getattr(token, "lemma_", None)
    return (lemma or token.text).lower()


def passage_features(passage_tokens: List, question_tokens: List) -> torch.Tensor:
    """``(len(passage_tokens), 4)`` float tensor with the :data:`MANUAL_FEATURES`.

    The lemma match uses each token's ``lemma_`` where the tokenizer provides one and falls back to
    the lower-cased text (so with a pipeline that has no lemmatizer, e.g. spaCy ``blank:en``, it
    equals the lower-case match)."""
    q_original = {t.text for t in question_tokens}
    q_lower = {t.text.lower() for t in question_tokens}
    q_lemma = {_lemma(t) for t in question_tokens}
    counts: Dict[str, int] = {}
    for t in passage_tokens:
        key = t.text.lower()
        counts[key] = counts.get(key, 0) + 1
    n = max(len(passage_tokens), 1)
    rows = [[float(t.text in q_original), float(t.text.lower() in q_lower),
             float(_lemma(t) in q_lemma), counts[t.text.lower()] / n] for t in passage_tokens]
    return torch.tensor(rows, dtype=torch.float32).reshape(len(passage_tokens), len(MANUAL_FEATURES))


@DatasetReader.register("drqa_squad")
class DrQASquadReader(SquadReader):
    """AllenNLP's ``squad`` reader (same arguments, same fields: ``question``, ``passage``,
    ``span_start``, ``span_end``, ``metadata``) plus the token features of DrQA's document reader:

    * ``passage_features``: ``(passage_len, 4)`` — exact match (original, lower-case, lemma) and
      normalised term frequency (see :data:`MANUAL_FEATURES`);
    * ``passage_pos_tags`` when ``pos_tags`` is true: the tokenizer's fine-grained POS tag
      (``tag_``) of each passage token, namespace ``drqa_pos``;
    * ``passage_ner_tags`` when ``ner_tags`` is true: the entity type (``ent_type_``, ``O``
      outside entities), namespace ``drqa_ner``.

    POS/NER need a tokenizer that provides them, e.g. ``{"type": "spacy", "language":
    "en_core_web_sm", "pos_tags": true, "ner": true}``; spaCy's ``blank:en`` (the only pipeline that
    works offline here) has none, so the configs leave both off.
    """

    def __init__(self, tokenizer: Tokenizer = None, token_indexers: Dict[str, TokenIndexer] = None,
                 passage_length_limit: int = None, question_length_limit: int = None,
                 skip_impossible_questions: bool = False, pos_tags: bool = False,
                 ner_tags: bool = False, **kwargs) -> None:
        super().__init__(tokenizer=tokenizer, token_indexers=token_indexers,
                         passage_length_limit=passage_length_limit,
                         question_length_limit=question_length_limit,
                         skip_impossible_questions=skip_impossible_questions, **kwargs)
        self.pos_tags = bool(pos_tags)
        self.ner_tags = bool(ner_tags)
        nlp = getattr(self._tokenizer, "spacy", None)  # a SpacyTokenizer's pipeline
        pipes = set(getattr(nlp, "pipe_names", ()) or ())
        if nlp is not None:
            for option, wanted, needed in (("pos_tags", self.pos_tags, {"tagger", "morphologizer"}),
                                           ("ner_tags", self.ner_tags, {"ner"})):
                if wanted and not pipes & needed:
                    raise ConfigurationError(
                        f"drqa_squad: {option}=true but the spaCy pipeline of the tokenizer has no "
                        f"{' or '.join(sorted(needed))} (it has: {', '.join(sorted(pipes)) or 'nothing'})"
                        f"; use e.g. \"tokenizer\": {{\"type\": \"spacy\", \"language\": "
                        f"\"en_core_web_sm\", \"pos_tags\": true, \"ner\": true}}, or set {option} "
                        f"to false")

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
        instance.add_field("passage_features", TensorField(passage_features(p_tokens, q_tokens)))
        if self.pos_tags:
            instance.add_field("passage_pos_tags", SequenceLabelField(
                self._tags(p_tokens, "tag_", "pos_tags", "NONE", True), passage_field,
                label_namespace=POS_NAMESPACE))
        if self.ner_tags:
            instance.add_field("passage_ner_tags", SequenceLabelField(
                self._tags(p_tokens, "ent_type_", "ner_tags", "O", False), passage_field,
                label_namespace=NER_NAMESPACE))
        return instance
