"""AllenNLP integration: importing this package registers, in AllenNLP's registries,

* ``Seq2SeqEncoder`` and ``Seq2VecEncoder`` for every variant: ``ablated_lstm`` (our LSTM; AllenNLP
  owns ``lstm``), ``srnn``, ``lstm_minus_srnn``, ``ran``, ``identity_ran`` with ``torch.nn.LSTM``'s
  keyword arguments, and ``stacked_bidirectional_<name>`` with ``stacked_bidirectional_lstm``'s
  (:mod:`.encoders`); plus the ``concat_layers`` ``Seq2SeqEncoder`` (DrQA's stacked RNN);
* the ``drqa`` ``Model`` (:mod:`.drqa`), its ``drqa_squad`` ``DatasetReader``
  (:mod:`.drqa_reader`) and ``drqa`` ``Predictor`` (:mod:`.predictors`);
* the ``reduce_on_plateau_torch2`` learning-rate scheduler (:mod:`.schedulers`): AllenNLP's
  ``reduce_on_plateau`` fails on torch 2.x, the BiDAF configs use this one.

``allennlp train config.jsonnet --include-package rnn_ablations`` imports it (AllenNLP imports every
submodule of the named package).  ``import rnn_ablations`` alone does not need AllenNLP: it imports
this package only when ``allennlp`` is already imported.  The torchvision stand-in that AllenNLP
needs on a CPU-only torch is installed before AllenNLP loads by the start-up hook
(:mod:`rnn_ablations.integrations.allennlp_compat`).
"""
from rnn_ablations.integrations.allennlp_compat import install_torchvision_standin

install_torchvision_standin()  # no-op when the hook already ran or torchvision works

from .encoders import (  # noqa: E402
    ENCODER_NAMES, SEQ2SEQ_CLASSES, SEQ2VEC_CLASSES, STACKED_ENCODER_NAMES,
    AblatedSeq2SeqEncoder, AblatedSeq2VecEncoder, ConcatLayersSeq2SeqEncoder,
    StackedBidirectionalAblatedSeq2SeqEncoder, StackedBidirectionalAblatedSeq2VecEncoder,
    encoder_name, run_masked,
)
from .drqa_reader import DrQASquadReader  # noqa: E402
from .drqa import DrQA  # noqa: E402
from .predictors import DrQAPredictor  # noqa: E402
from .schedulers import ReduceOnPlateauTorch2  # noqa: E402

__all__ = [
    "ENCODER_NAMES", "STACKED_ENCODER_NAMES", "SEQ2SEQ_CLASSES", "SEQ2VEC_CLASSES",
    "AblatedSeq2SeqEncoder", "AblatedSeq2VecEncoder", "StackedBidirectionalAblatedSeq2SeqEncoder",
    "StackedBidirectionalAblatedSeq2VecEncoder", "ConcatLayersSeq2SeqEncoder", "encoder_name",
    "run_masked", "DrQASquadReader", "DrQA", "DrQAPredictor", "ReduceOnPlateauTorch2",
]
