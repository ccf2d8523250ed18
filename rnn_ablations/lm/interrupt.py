"""Ctrl-C or SIGTERM during training: finish the current window, checkpoint, then stop.

While :class:`DeferredInterrupt` is active, the first SIGINT or SIGTERM (what batch schedulers,
``kill`` and ``docker stop`` send) only sets ``requested`` (the training loop checks it between
windows, writes a checkpoint and raises :class:`TrainingInterrupted`, which the commands turn
into a message with the ``--resume`` command); a second one raises ``KeyboardInterrupt`` at once
(the last checkpoint stays valid).
"""
from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path

from .checkpoints import CHECKPOINT

__all__ = ["TrainingInterrupted", "DeferredInterrupt", "exit_on_sigterm", "SigtermInterrupt",
           "interrupt_on_sigterm", "SigtermAsInterrupt"]

_logger = logging.getLogger(__name__)


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM stopped :func:`~rnn_ablations.lm.trainer.train_lm` between two windows, after
    writing a checkpoint.

    ``run_dir``: the run directory; ``position``: ``(completed epochs, window, windows per
    epoch)`` of the checkpoint; ``signal_name``: ``"Ctrl-C"`` or ``"SIGTERM"``."""

    def __init__(self, run_dir: Path, position, signal_name: str = "Ctrl-C"):
        self.run_dir = Path(run_dir)
        self.position = tuple(position)
        self.signal_name = signal_name
        epoch, step, size = self.position
        super().__init__(f"interrupted: checkpoint {self.run_dir / CHECKPOINT} written at epoch "
                         f"{epoch + 1}, window {step}/{size}")


def exit_on_sigterm(signum, frame):
    """A SIGTERM handler that exits through Python (``SystemExit(143)``), for a process that
    trains nothing yet; :class:`DeferredInterrupt` replaces it while training."""
    raise SystemExit(143)


class SigtermInterrupt(KeyboardInterrupt):
    """SIGTERM outside the training loop (e.g. during the final validation): raised like
    Ctrl-C's ``KeyboardInterrupt``, so that the commands print the ``--resume`` command for
    it too.  ``signal_name`` is ``"SIGTERM"``."""

    signal_name = "SIGTERM"


def interrupt_on_sigterm(signum, frame):
    """A SIGTERM handler that raises :class:`SigtermInterrupt` (what Ctrl-C does with
    ``KeyboardInterrupt``); :class:`DeferredInterrupt` replaces it while a run trains."""
    raise SigtermInterrupt("SIGTERM")


class SigtermAsInterrupt:
    """While active (main thread, SIGTERM at its default disposition, which would kill the
    process without a word), SIGTERM raises :class:`SigtermInterrupt`: every stage of a command
    (setup, training, the validation after ``--max-steps``, the results) ends through the
    command's interrupt path, which names the ``--resume`` command."""

    def __init__(self):
        self._previous = None

    def __enter__(self):
        if (threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL):
            self._previous = signal.signal(signal.SIGTERM, interrupt_on_sigterm)
        return self

    def __exit__(self, *exc):
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None
        return False


_NAMES = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM"}


class DeferredInterrupt:
    """While active, the first SIGINT (Ctrl-C) or SIGTERM only sets :attr:`requested` (and
    :attr:`signal_name`, ``"Ctrl-C"`` or ``"SIGTERM"``); a second one raises
    ``KeyboardInterrupt`` at once.  Installed only in the main thread, for SIGINT only where it
    has Python's default handler, for SIGTERM where it has the default disposition (which kills
    the process without a word), :func:`exit_on_sigterm` or :func:`interrupt_on_sigterm`."""

    def __init__(self, enabled: bool):
        self.enabled = enabled and threading.current_thread() is threading.main_thread()
        self.requested = False
        self.signal_name = ""
        self._previous = {}

    def _handle(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        self.signal_name = _NAMES.get(signum, f"signal {signum}")
        _logger.warning("%s: finishing this window, then writing a checkpoint (%s again stops "
                        "at once)", self.signal_name, self.signal_name)

    def __enter__(self):
        if not self.enabled:
            return self
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            self._previous[signal.SIGINT] = signal.signal(signal.SIGINT, self._handle)
        if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, exit_on_sigterm,
                                                 interrupt_on_sigterm):
            self._previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, self._handle)
        return self

    def __exit__(self, *exc):
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous = {}
        return False
