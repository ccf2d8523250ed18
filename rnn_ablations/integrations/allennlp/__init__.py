"""AllenNLP integration: importing this package registers, in AllenNLP's registries,

* ``Seq2SeqEncoder`` and ``Seq2VecEncoder`` for every variant: ``ablated_lstm`` (our LSTM; AllenNLP
  owns ``lstm``), ``srnn``, ``lstm_minus_srnn``, ``ran``, ``identity_ran`` with ``torch.nn.LSTM``'s
  keyword arguments, and ``stacked_bidirectional_<name>`` with ``stacked_bidirectional_lstm``'s
  (:mod:`.encoders`); plus the ``concat_layers`` ``Seq2SeqEncoder`` (DrQA's stacked RNN);
* the ``drqa`` ``Model`` (:mod:`.drqa`), its ``drqa_squad`` ``DatasetReader``
  (:mod:`.drqa_reader`) and ``drqa`` ``Predictor`` (:mod:`.predictors`);
* the ``reduce_on_plateau_torch2`` learning-rate scheduler (:mod:`.schedulers`): AllenNLP's
  ``reduce_on_plateau`` fails on torch 2.x, the BiDAF configs use this one;
* and it makes a config's ``initializer`` treat a ``stacked_bidirectional_<variant>`` encoder
  as the ``stacked_bidirectional_lstm`` it replaces (:mod:`.initializers`), and a config whose
  ``"sparse": true`` embeddings this torch cannot clip (``"grad_norm"``) stop before training
  with one line saying to set ``"sparse": false`` (:mod:`.trainer_checks`), and a loaded
  archive keeps its encoders' variant record (:mod:`.archives`).

``allennlp train config.jsonnet --include-package rnn_ablations`` imports it (AllenNLP imports every
submodule of the named package).  ``import rnn_ablations`` alone does not need AllenNLP: it imports
this package only when ``allennlp`` is already imported.  Without AllenNLP (or allennlp-models)
this package still imports, exposes no submodules, and each of its names raises an
``ImportError`` naming the pip command that installs AllenNLP (:data:`INSTALL_HINT`).  The torchvision stand-in that AllenNLP
needs on a CPU-only torch is installed before AllenNLP loads by the start-up hook
(:mod:`rnn_ablations.integrations.allennlp_compat`).
"""
import importlib as _importlib

from rnn_ablations.integrations import ALLENNLP_INSTALL_HINT as INSTALL_HINT
from rnn_ablations.integrations.allennlp_compat import install_torchvision_standin

__all__ = [
    "ENCODER_NAMES", "STACKED_ENCODER_NAMES", "SEQ2SEQ_CLASSES", "SEQ2VEC_CLASSES",
    "AblatedSeq2SeqEncoder", "AblatedSeq2VecEncoder", "StackedBidirectionalAblatedSeq2SeqEncoder",
    "StackedBidirectionalAblatedSeq2VecEncoder", "ConcatLayersSeq2SeqEncoder", "encoder_name",
    "run_masked", "DrQASquadReader", "DrQA", "DrQAPredictor", "ReduceOnPlateauTorch2",
]


install_torchvision_standin()  # no-op when the hook already ran or torchvision works

try:
    _importlib.import_module("allennlp")
    _importlib.import_module("allennlp_models")
    ALLENNLP_IMPORT_ERROR = None
except ImportError as _exc:
    ALLENNLP_IMPORT_ERROR = _exc

if ALLENNLP_IMPORT_ERROR is None:
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
    from .initializers import install as _install_initializers  # noqa: E402
    from .trainer_checks import install as _install_trainer_checks  # noqa: E402
    from .archives import install as _install_archives  # noqa: E402

    _install_initializers()  # a config's initializer treats a stacked drop-in as the stock one
    _install_trainer_checks()  # "sparse": true with grad_norm: one line before training
    _install_archives()  # a loaded archive keeps its encoders' variant record
else:
    # Without AllenNLP this package imports but exposes nothing: its submodules subclass
    # AllenNLP's classes, so the package hides them (an empty __path__) from tools that import
    # every submodule of rnn_ablations (OpenNMT-py users, documentation builders), and every
    # name raises an ImportError that says how to install AllenNLP.
    __path__ = []

    def __getattr__(name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise _missing(f"rnn_ablations.integrations.allennlp.{name}")


def _missing(what: str) -> ImportError:
    error = ImportError(
        f"{what} needs AllenNLP 2.10.1 and allennlp-models 2.10.1, which cannot be imported here "
        f"({ALLENNLP_IMPORT_ERROR}); install them with: {INSTALL_HINT}")
    error.__cause__ = ALLENNLP_IMPORT_ERROR
    return error


def require_allennlp() -> None:
    """Raise ``ImportError`` saying how to install AllenNLP when it cannot be imported."""
    if ALLENNLP_IMPORT_ERROR is not None:
        raise _missing("the AllenNLP integration of rnn_ablations")
