"""``drqa`` predictor: ``{"question": ..., "passage": ...}`` → the DrQA model's answer span."""
from allennlp.common.util import JsonDict
from allennlp.data import Instance
from allennlp.predictors.predictor import Predictor
from allennlp_models.rc.predictors.bidaf import ReadingComprehensionPredictor

__all__ = ["DrQAPredictor"]


@Predictor.register("drqa")
class DrQAPredictor(ReadingComprehensionPredictor):
    """Reads JSON lines ``{"question": "...", "passage": "..."}`` (as AllenNLP's
    ``reading_comprehension`` predictor) and runs them through the ``drqa_squad`` reader, so the
    passage features are computed as in training.  The answer is under ``best_span_str``."""

    def _json_to_instance(self, json_dict: JsonDict) -> Instance:
        missing = [key for key in ("question", "passage") if not isinstance(json_dict.get(key), str)]
        if missing:
            raise ValueError(f"drqa predictor: each input line must be a JSON object with string "
                             f"fields 'question' and 'passage'; missing or not a string: "
                             f"{', '.join(missing)}")
        if not json_dict["passage"].strip():
            raise ValueError("drqa predictor: 'passage' is empty")
        if not json_dict["question"].strip():
            raise ValueError("drqa predictor: 'question' is empty")
        instance = self._dataset_reader.text_to_instance(json_dict["question"], json_dict["passage"])
        if instance is None or "passage_features" not in instance.fields:
            raise ValueError("drqa predictor: the archive's dataset reader must be 'drqa_squad'")
        return instance
