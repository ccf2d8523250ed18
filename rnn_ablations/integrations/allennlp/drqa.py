"""``drqa``: the document reader of DrQA (Chen et al., *Reading Wikipedia to Answer Open-Domain
Questions*, ACL 2017) as an AllenNLP ``Model``, with its recurrent encoders taken from the config.

Architecture (the paper's §3.1, in the notation of this file):

* word embeddings ``E(p_i)``, ``E(q_j)`` (``text_field_embedder``), dropout ``embedding_dropout``;
* aligned question embedding ``f_align(p_i) = Σ_j a_ij E(q_j)``,
  ``a_ij = softmax_j(α(E(p_i)) · α(E(q_j)))``, ``α`` = one dense ReLU layer of the embedding size;
* passage token features (``drqa_squad`` reader): exact match (original, lower-case, lemma) and
  term frequency; optional POS and NER tags, embedded with ``pos_tag_embedding_dim`` /
  ``ner_tag_embedding_dim`` (0 = not used);
* ``document_encoder`` over ``[E(p_i); f_align(p_i); features]`` and ``question_encoder`` over
  ``E(q_j)``: any ``Seq2SeqEncoder``; the DrQA configs use ``concat_layers`` of three
  bidirectional layers of the chosen variant (hidden 128, outputs of all layers concatenated,
  dropout on every layer's input);
* question self-attentive merge ``q = Σ_j b_j q_j``, ``b_j = softmax_j(w · q_j)``;
* bilinear start/end scores ``p_i W_s q`` and ``p_i W_e q``; the loss is the negative
  log-likelihood of the gold start plus that of the gold end; decoding takes the span
  ``i ≤ i' < i + max_span_length`` maximising ``P_start(i) · P_end(i')``.

Metrics: ``start_acc``, ``end_acc``, ``span_acc`` and the official SQuAD ``em`` and ``f1``
(allennlp-models' ``SquadEmAndF1``).

Word embeddings as in the paper and hitvoice/DrQA: ``tune_question_words = 1000`` fine-tunes the
embeddings of the 1000 most frequent question words of the training data (the reader counts them
into the vocabulary namespace ``drqa_question_words``) and keeps every other row fixed (their
gradient is zeroed; the token embedder must be ``"trainable": true``).
"""
from typing import Any, Dict, List, Optional

import torch
import torch.nn.functional as F
from allennlp.common.checks import ConfigurationError
from allennlp.data import TextFieldTensors, Vocabulary
from allennlp.models.model import Model
from allennlp.modules import Seq2SeqEncoder, TextFieldEmbedder
from allennlp.nn import InitializerApplicator, util
from allennlp.training.metrics import BooleanAccuracy, CategoricalAccuracy
from allennlp_models.rc.metrics import SquadEmAndF1

from .drqa_reader import MANUAL_FEATURES, NER_NAMESPACE, POS_NAMESPACE, QUESTION_WORDS_NAMESPACE

__all__ = ["DrQA", "best_span_within"]


def best_span_within(span_start_logits: torch.Tensor, span_end_logits: torch.Tensor,
                     mask: torch.Tensor, max_span_length: int) -> torch.Tensor:
    """``(B, 2)`` inclusive (start, end) maximising ``start_logit + end_logit`` over
    ``start ≤ end < start + max_span_length``, both inside ``mask``."""
    length = span_start_logits.shape[1]
    very_negative = torch.finfo(span_start_logits.dtype).min / 4
    start = span_start_logits.masked_fill(~mask, very_negative)
    end = span_end_logits.masked_fill(~mask, very_negative)
    scores = start.unsqueeze(2) + end.unsqueeze(1)  # (B, start, end)
    ones = torch.ones(length, length, dtype=torch.bool, device=scores.device)
    allowed = torch.triu(ones) & ~torch.triu(ones, diagonal=max_span_length)
    scores = scores.masked_fill(~allowed, 2 * very_negative)
    best = scores.view(scores.shape[0], -1).argmax(-1)
    return torch.stack([torch.div(best, length, rounding_mode="floor"), best % length], dim=-1)


@Model.register("drqa")
class DrQA(Model):
    """DrQA's document reader (see the module docstring).

    # Parameters
    vocab : `Vocabulary`
    text_field_embedder : `TextFieldEmbedder`
        Embeds the question and passage ``TextField``s (the same embedder for both).
    document_encoder : `Seq2SeqEncoder`
        Its input size must be ``2·E + 4 + pos_tag_embedding_dim + ner_tag_embedding_dim`` with
        ``E`` the embedder's output dim (the model checks this and says what to set).
    question_encoder : `Seq2SeqEncoder`
        Its input size must be ``E``.
    embedding_dropout : `float`, optional (default = `0.3`)
        Dropout on the word embeddings of passage and question.
    pos_tag_embedding_dim, ner_tag_embedding_dim : `int`, optional (default = `0`)
        Size of the embeddings of the reader's ``passage_pos_tags`` / ``passage_ner_tags``
        (reader options ``pos_tags`` / ``ner_tags``); 0 = the model does not use them.
    max_span_length : `int`, optional (default = `15`)
        Longest answer span considered at decoding (the paper's 15 tokens).
    tune_question_words : `int`, optional (default = `0`)
        Fine-tune only the word embeddings of this many most frequent question words (the paper:
        1000); 0 = the embedder's own ``trainable`` decides for every row.
    initializer : `InitializerApplicator`, optional
    """

    default_predictor = "drqa"

    def __init__(self, vocab: Vocabulary, text_field_embedder: TextFieldEmbedder,
                 document_encoder: Seq2SeqEncoder, question_encoder: Seq2SeqEncoder,
                 embedding_dropout: float = 0.3, pos_tag_embedding_dim: int = 0,
                 ner_tag_embedding_dim: int = 0, max_span_length: int = 15,
                 tune_question_words: int = 0,
                 initializer: InitializerApplicator = InitializerApplicator(),
                 **kwargs) -> None:
        super().__init__(vocab, **kwargs)
        for name, value in (("pos_tag_embedding_dim", pos_tag_embedding_dim),
                            ("ner_tag_embedding_dim", ner_tag_embedding_dim)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigurationError(f"drqa: {name} must be an integer >= 0, got {value!r}")
        if isinstance(max_span_length, bool) or not isinstance(max_span_length, int) \
                or max_span_length < 1:
            raise ConfigurationError(f"drqa: max_span_length must be a positive integer, got "
                                     f"{max_span_length!r}")
        if isinstance(embedding_dropout, bool) or not isinstance(embedding_dropout, (int, float)) \
                or not 0 <= embedding_dropout < 1:
            raise ConfigurationError(f"drqa: embedding_dropout must be in [0, 1), got "
                                     f"{embedding_dropout!r}")
        self._embedder = text_field_embedder
        emb = text_field_embedder.get_output_dim()
        self._pos_embedding = (torch.nn.Embedding(vocab.get_vocab_size(POS_NAMESPACE),
                                                  pos_tag_embedding_dim)
                               if pos_tag_embedding_dim else None)
        self._ner_embedding = (torch.nn.Embedding(vocab.get_vocab_size(NER_NAMESPACE),
                                                  ner_tag_embedding_dim)
                               if ner_tag_embedding_dim else None)
        n_feat = len(MANUAL_FEATURES)
        doc_in = 2 * emb + n_feat + pos_tag_embedding_dim + ner_tag_embedding_dim
        if document_encoder.get_input_dim() != doc_in:
            raise ConfigurationError(
                f"drqa: document_encoder has input size {document_encoder.get_input_dim()} but the "
                f"passage representation has {doc_in} features = 2 × {emb} (word embedding + aligned "
                f"question embedding) + {n_feat} (exact match ×3, term frequency) + "
                f"{pos_tag_embedding_dim} (POS) + {ner_tag_embedding_dim} (NER); set the document "
                f"encoder's (first layer's) input_size to {doc_in}")
        if question_encoder.get_input_dim() != emb:
            raise ConfigurationError(
                f"drqa: question_encoder has input size {question_encoder.get_input_dim()} but the "
                f"question word embeddings have {emb} features; set the question encoder's (first "
                f"layer's) input_size to {emb}")
        self._document_encoder = document_encoder
        self._question_encoder = question_encoder
        self._align_projection = torch.nn.Linear(emb, emb)
        q_dim, p_dim = question_encoder.get_output_dim(), document_encoder.get_output_dim()
        self._question_attention = torch.nn.Linear(q_dim, 1)
        self._start_bilinear = torch.nn.Linear(q_dim, p_dim)
        self._end_bilinear = torch.nn.Linear(q_dim, p_dim)
        self._dropout = torch.nn.Dropout(embedding_dropout)
        self._max_span_length = max_span_length
        self._tune_question_words(vocab, text_field_embedder, tune_question_words)
        self._span_start_accuracy = CategoricalAccuracy()
        self._span_end_accuracy = CategoricalAccuracy()
        self._span_accuracy = BooleanAccuracy()
        self._squad_metrics = SquadEmAndF1()
        initializer(self)

    def _tune_question_words(self, vocab: Vocabulary, embedder, top_k) -> None:
        """Zero the gradient of every word-embedding row but those of the ``top_k`` most frequent
        question words (the namespace is sorted by frequency when built from instances)."""
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
            raise ConfigurationError(f"drqa: tune_question_words must be an integer >= 0, got "
                                     f"{top_k!r}")
        self.tuned_word_indices = None
        if top_k == 0:
            return
        embedding = getattr(embedder, "token_embedder_tokens", None)
        weight = getattr(embedding, "weight", None)
        if weight is None or weight.dim() != 2:
            raise ConfigurationError("drqa: tune_question_words needs a text_field_embedder with an "
                                     "\"embedding\" token embedder under the key \"tokens\"")
        if not weight.requires_grad:
            raise ConfigurationError("drqa: tune_question_words > 0 fine-tunes some word "
                                     "embeddings: set the \"tokens\" embedder's \"trainable\" to "
                                     "true (the other rows are kept fixed by the model)")
        words = vocab.get_index_to_token_vocabulary(QUESTION_WORDS_NAMESPACE)
        special = {vocab._padding_token, vocab._oov_token}
        ranked = [words[i] for i in sorted(words) if words[i] not in special]
        if not ranked:
            raise ConfigurationError(
                f"drqa: tune_question_words > 0 but the vocabulary has no {QUESTION_WORDS_NAMESPACE!r} "
                "namespace; build the vocabulary from data read by the drqa_squad reader")
        oov = vocab.get_token_index(vocab._oov_token, "tokens")
        rows = sorted({vocab.get_token_index(w, "tokens") for w in ranked[:top_k]} - {oov})
        mask = torch.zeros(weight.shape[0], 1, dtype=weight.dtype)
        mask[rows] = 1.0
        self.register_buffer("_tuned_rows", mask, persistent=False)
        self.tuned_word_indices = rows
        weight.register_hook(lambda grad: grad * self._tuned_rows.to(grad.dtype))

    def _tag_embedding(self, embedding, tags, name: str, option: str):
        if embedding is None:
            if tags is not None:
                raise ConfigurationError(
                    f"drqa: the reader gives {name} but the model's {option} is 0; set {option} > 0 "
                    f"to use them, or turn the reader option off")
            return None
        if tags is None:
            raise ConfigurationError(
                f"drqa: {option} > 0 but the reader gives no {name}; set the drqa_squad reader's "
                f"{'pos_tags' if 'pos' in name else 'ner_tags'} to true")
        return embedding(tags)

    def forward(self, question: TextFieldTensors, passage: TextFieldTensors,
                passage_features: torch.Tensor = None, passage_pos_tags: torch.Tensor = None,
                passage_ner_tags: torch.Tensor = None, question_words: torch.Tensor = None,
                span_start: torch.IntTensor = None,
                span_end: torch.IntTensor = None,
                metadata: List[Dict[str, Any]] = None) -> Dict[str, Any]:
        if passage_features is None:
            raise ConfigurationError("drqa: the instances have no 'passage_features'; read the data "
                                     "with the 'drqa_squad' dataset reader")
        q_mask = util.get_text_field_mask(question)
        p_mask = util.get_text_field_mask(passage)
        q_emb = self._dropout(self._embedder(question))
        p_emb = self._dropout(self._embedder(passage))

        # aligned question embedding
        p_proj = F.relu(self._align_projection(p_emb))
        q_proj = F.relu(self._align_projection(q_emb))
        align = util.masked_softmax(p_proj.bmm(q_proj.transpose(1, 2)), q_mask.unsqueeze(1))
        aligned = align.bmm(q_emb)

        parts = [p_emb, aligned, passage_features.to(p_emb.dtype)]
        for emb in (self._tag_embedding(self._pos_embedding, passage_pos_tags, "passage_pos_tags",
                                        "pos_tag_embedding_dim"),
                    self._tag_embedding(self._ner_embedding, passage_ner_tags, "passage_ner_tags",
                                        "ner_tag_embedding_dim")):
            if emb is not None:
                parts.append(emb)
        encoded_passage = self._document_encoder(torch.cat(parts, dim=-1), p_mask)
        encoded_question = self._question_encoder(q_emb, q_mask)

        # question self-attentive merge
        q_weights = util.masked_softmax(self._question_attention(encoded_question).squeeze(-1), q_mask)
        merged_question = util.weighted_sum(encoded_question, q_weights)

        span_start_logits = encoded_passage.bmm(
            self._start_bilinear(merged_question).unsqueeze(-1)).squeeze(-1)
        span_end_logits = encoded_passage.bmm(
            self._end_bilinear(merged_question).unsqueeze(-1)).squeeze(-1)
        span_start_logits = util.replace_masked_values(
            span_start_logits, p_mask, util.min_value_of_dtype(span_start_logits.dtype))
        span_end_logits = util.replace_masked_values(
            span_end_logits, p_mask, util.min_value_of_dtype(span_end_logits.dtype))
        best_span = best_span_within(span_start_logits, span_end_logits, p_mask,
                                     self._max_span_length)
        output: Dict[str, Any] = {
            "span_start_logits": span_start_logits,
            "span_start_probs": util.masked_softmax(span_start_logits, p_mask),
            "span_end_logits": span_end_logits,
            "span_end_probs": util.masked_softmax(span_end_logits, p_mask),
            "best_span": best_span,
        }
        if span_start is not None and span_end is not None:
            start, end = span_start.squeeze(-1), span_end.squeeze(-1)
            loss = F.nll_loss(util.masked_log_softmax(span_start_logits, p_mask), start)
            loss = loss + F.nll_loss(util.masked_log_softmax(span_end_logits, p_mask), end)
            output["loss"] = loss
            self._span_start_accuracy(span_start_logits, start)
            self._span_end_accuracy(span_end_logits, end)
            self._span_accuracy(best_span, torch.stack([start, end], -1))
        if metadata is not None:
            output["best_span_str"] = []
            output["question_tokens"], output["passage_tokens"] = [], []
            spans = best_span.detach().cpu().tolist()
            predicted, gold = [], []
            for i, meta in enumerate(metadata):
                offsets = meta["token_offsets"]
                s, e = spans[i]
                text = meta["original_passage"][offsets[s][0]:offsets[e][1]]
                output["best_span_str"].append(text)
                output["question_tokens"].append(meta["question_tokens"])
                output["passage_tokens"].append(meta["passage_tokens"])
                answers = meta.get("answer_texts", [])
                if answers:
                    predicted.append(text)
                    gold.append(answers)
            # One call per batch (not per instance): in distributed training the metric does one
            # all-reduce per call, so every worker must make the same number of calls.
            self._squad_metrics(predicted, gold)
        return output

    def get_metrics(self, reset: bool = False) -> Dict[str, float]:
        em, f1 = self._squad_metrics.get_metric(reset)
        return {
            "start_acc": self._span_start_accuracy.get_metric(reset),
            "end_acc": self._span_end_accuracy.get_metric(reset),
            "span_acc": self._span_accuracy.get_metric(reset),
            "em": em,
            "f1": f1,
        }
