"""``reduce_on_plateau_torch2``: AllenNLP's ``reduce_on_plateau`` learning-rate scheduler for torch 2.x.

AllenNLP 2.10.1's ``reduce_on_plateau`` passes ``verbose=`` to
``torch.optim.lr_scheduler.ReduceLROnPlateau``, which recent torch releases no longer accept
(``TypeError: ... unexpected keyword argument 'verbose'``).  This is the same scheduler with the
same arguments, less ``verbose``; the BiDAF configs (whose original uses ``reduce_on_plateau``) use
it.  AllenNLP's own registration is left untouched.
"""
from typing import List, Union

import torch
from allennlp.training.learning_rate_schedulers.learning_rate_scheduler import (
    LearningRateScheduler, _PyTorchLearningRateSchedulerWithMetricsWrapper)
from allennlp.training.optimizers import Optimizer

__all__ = ["ReduceOnPlateauTorch2"]


@LearningRateScheduler.register("reduce_on_plateau_torch2")
class ReduceOnPlateauTorch2(_PyTorchLearningRateSchedulerWithMetricsWrapper):
    """``torch.optim.lr_scheduler.ReduceLROnPlateau`` (steps on the validation metric), with the
    arguments of AllenNLP's ``reduce_on_plateau`` except ``verbose``."""

    def __init__(self, optimizer: Optimizer, mode: str = "min", factor: float = 0.1,
                 patience: int = 10, threshold_mode: str = "rel", threshold: float = 1e-4,
                 cooldown: int = 0, min_lr: Union[float, List[float]] = 0,
                 eps: float = 1e-8) -> None:
        super().__init__(torch.optim.lr_scheduler.ReduceLROnPlateau(
            optimizer=optimizer, mode=mode, factor=factor, patience=patience,
            threshold_mode=threshold_mode, threshold=threshold, cooldown=cooldown, min_lr=min_lr,
            eps=eps))
