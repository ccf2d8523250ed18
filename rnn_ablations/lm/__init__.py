"""The papers' language-model experiment and the ablation study.

* :mod:`.configs` — the named hyper-parameter sets (Zaremba et al.'s small/medium/large, tiny,
  synthetic); :mod:`.data` — PTB-format reading and batching; :mod:`.synthetic` — the embedded
  default corpus; :mod:`.model` — the language model; :mod:`.trainer` — training, evaluation,
  checkpoints, ``torchrun``; :mod:`.ablate` — all variants, one table; :mod:`.params` — parameter
  counts; :mod:`.cli` — the ``lm``, ``ablate`` and ``params`` sub-commands.
"""
from .configs import CONFIGS, PAPER_LR_OVERRIDES, LMConfig, get_config
from .data import Corpus, Vocabulary, load_corpus
from .model import LanguageModel
from .synthetic import SyntheticSpec, synthetic_corpus
from .trainer import evaluate, load_checkpoint, train_lm
from .ablate import run_ablation

__all__ = ["CONFIGS", "PAPER_LR_OVERRIDES", "LMConfig", "get_config", "Corpus", "Vocabulary",
           "load_corpus", "LanguageModel", "SyntheticSpec", "synthetic_corpus", "evaluate",
           "load_checkpoint", "train_lm", "run_ablation"]
