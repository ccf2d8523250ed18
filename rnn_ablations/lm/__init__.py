"""The papers' language-model experiment and the ablation study.

* :mod:`.configs` — the named hyper-parameter sets (Zaremba et al.'s small/medium/large, tiny,
  synthetic); :mod:`.data` — PTB-format reading and batching; :mod:`.synthetic` — the embedded
  default corpus; :mod:`.corpora` — corpus fingerprints and rebuilding a run's corpus;
  :mod:`.model` — the language model;
* :mod:`.evaluation` — perplexity; :mod:`.trainer` — the training loop; :mod:`.checkpoints` —
  the run directory's files, verified checkpoints, atomic writes; :mod:`.rundir` — the output
  folder of every command (resume / overwrite); :mod:`.interrupt` — Ctrl-C between windows;
  :mod:`.distributed` — device and ``torchrun``; :mod:`.graph_step` — the step as a CUDA graph;
* :mod:`.ablate` — all variants, one table; :mod:`.reproduce` — the papers' PTB table, runs in
  parallel processes (:mod:`.reproduce_child`), its tables and figure
  (:mod:`.reproduce_report`), timing (:mod:`.reproduce_timing`); :mod:`.params` — parameter
  counts; :mod:`.cli` — the ``lm``, ``ablate``, ``params`` and ``reproduce`` sub-commands.
"""
from .configs import CONFIGS, PAPER_LR_OVERRIDES, LMConfig, get_config
from .data import Corpus, Vocabulary, load_corpus
from .model import LanguageModel
from .synthetic import SyntheticSpec, synthetic_corpus
from .checkpoints import load_checkpoint, model_from_checkpoint
from .evaluation import evaluate
from .trainer import train_lm
from .ablate import run_ablation

__all__ = ["CONFIGS", "PAPER_LR_OVERRIDES", "LMConfig", "get_config", "Corpus", "Vocabulary",
           "load_corpus", "LanguageModel", "SyntheticSpec", "synthetic_corpus", "evaluate",
           "load_checkpoint", "model_from_checkpoint", "train_lm", "run_ablation"]
