"""Ctrl-C during training: finish the current window, checkpoint, then stop.

While :class:`DeferredInterrupt` is active, the first SIGINT only sets ``requested`` (the
training loop checks it between windows, writes a checkpoint and raises
:class:`TrainingInterrupted`, which the commands turn into a message with the ``--resume``
command); a second SIGINT raises ``KeyboardInterrupt`` at once (the last checkpoint stays
valid).
"""
from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path

from .checkpoints import CHECKPOINT

__all__ = ["TrainingInterrupted", "DeferredInterrupt"]

_logger = logging.getLogger(__name__)


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped :func:`~rnn_ablations.lm.trainer.train_lm` between two windows, after
    writing a checkpoint.

    ``run_dir``: the run directory; ``position``: ``(completed epochs, window, windows per
    epoch)`` of the checkpoint."""

    def __init__(self, run_dir: Path, position):
        self.run_dir = Path(run_dir)
        self.position = tuple(position)
        epoch, step, size = self.position
        super().__init__(f"interrupted: checkpoint {self.run_dir / CHECKPOINT} written at epoch "
                         f"{epoch + 1}, window {step}/{size}")


class DeferredInterrupt:
    """While active, the first SIGINT (Ctrl-C) only sets :attr:`requested`; a second one raises
    ``KeyboardInterrupt`` at once.  Installed only in the main thread, and only where SIGINT has
    Python's default handler."""

    def __init__(self, enabled: bool):
        self.enabled = enabled and threading.current_thread() is threading.main_thread()
        self.requested = False
        self._previous = None

    def _handle(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        _logger.warning("Ctrl-C: finishing this window, then writing a checkpoint "
                        "(press Ctrl-C again to stop at once)")

    def __enter__(self):
        if self.enabled and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc):
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None
        return False
