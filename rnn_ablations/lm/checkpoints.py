"""The files of a run directory: the checkpoint (verified on every read) and atomic writes.

A run directory (``rnn-ablations lm train --out RUN_DIR``) holds ``checkpoint.pt``,
``result.json``, ``train.log`` and, with ``--log-losses``, ``losses.json``.  The checkpoint holds
the parameters, the position (epoch and window), the carried state of the whole batch, the
dropout generator and torch's RNG, the partial epoch statistics and the log, so a resumed run
continues bit-identically.  Every file is written to a temporary file in the run directory,
flushed to disk and renamed over the old one (an interrupted write leaves the previous file
intact); a checkpoint carries a SHA-256 checksum of its contents (every tensor's bytes, shapes
and dtypes and every other value), which :func:`load_checkpoint` verifies: a damaged file is
refused instead of silently giving other numbers.
"""
from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import tempfile
from collections import OrderedDict
from pathlib import Path
from typing import Callable, Dict

import torch

from ..rnn import AblatedRNN
from .configs import LMConfig
from .model import LanguageModel

__all__ = ["CHECKPOINT", "RESULT", "LOG", "LOSSES", "RUN_FILES", "FORMAT", "CHECKSUM",
           "load_checkpoint", "verify_checkpoint", "save_checkpoint", "model_from_checkpoint",
           "load_model_state",
           "check_resume", "write_atomic", "write_json"]

_logger = logging.getLogger(__name__)

CHECKPOINT = "checkpoint.pt"
RESULT = "result.json"
LOG = "train.log"
LOSSES = "losses.json"
RUN_FILES = (CHECKPOINT, RESULT, LOG, LOSSES)
FORMAT = "rnn_ablations.lm/1"
#: key of the checksum in a checkpoint dict (SHA-256 of everything else, see :func:`_digest`)
CHECKSUM = "sha256"


def _feed(h, obj) -> None:
    """Hash ``obj`` (the checkpoint's value types) into ``h``, with a type tag before each value
    so that different structures never hash alike."""
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
        if t.numel():
            h.update(t.reshape(-1).view(torch.uint8).numpy())
    elif isinstance(obj, dict):
        h.update(f"D{len(obj)}".encode())
        for k in sorted(obj, key=repr):
            _feed(h, k)
            _feed(h, obj[k])
    elif isinstance(obj, (list, tuple)):
        h.update(f"{'L' if isinstance(obj, list) else 'U'}{len(obj)}".encode())
        for x in obj:
            _feed(h, x)
    elif obj is None or isinstance(obj, (bool, int, float, str)):
        h.update(f"{type(obj).__name__}:{obj!r};".encode())
    else:
        raise TypeError(f"cannot checksum a {type(obj).__name__} in a checkpoint")


def _digest(ckpt: Dict) -> str:
    h = hashlib.sha256()
    _feed(h, {k: v for k, v in ckpt.items() if k != CHECKSUM})
    return h.hexdigest()


def verify_checkpoint(ckpt: Dict, path) -> None:
    """Check the checksum of a loaded checkpoint dict; ``ValueError`` when its contents differ
    from what was written.  A checkpoint without a checksum is accepted with a warning."""
    stored = ckpt.get(CHECKSUM)
    if stored is None:
        _logger.warning("%s has no checksum (written by a version of rnn_ablations without "
                        "checksums); its integrity cannot be verified", path)
        return
    if _digest(ckpt) != stored:
        raise ValueError(
            f"{str(path)!r} is damaged: its contents do not match the SHA-256 checksum stored when "
            "it was written, so the file was changed or corrupted afterwards (disk, copy or "
            "transfer error). It is refused because it would give other numbers; restore the file "
            "from a good copy or train again (--overwrite)")


def load_checkpoint(path) -> Dict:
    """Load and verify (format and checksum) a checkpoint file or a run directory's
    ``checkpoint.pt``."""
    p = Path(path)
    if p.is_dir():
        p = p / CHECKPOINT
    if not p.is_file():
        raise FileNotFoundError(f"no checkpoint at {str(p)!r}; a run directory written by "
                                "`rnn-ablations lm train --out DIR` contains checkpoint.pt")
    try:
        ckpt = torch.load(p, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unpickling failure means "not ours"
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise ValueError(f"{str(p)!r} could not be read as an rnn-ablations checkpoint: it is "
                         f"damaged, truncated or another kind of file ({type(exc).__name__}: "
                         f"{first})") from exc
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        raise ValueError(f"{str(p)!r} is not an rnn-ablations language-model checkpoint "
                         f"(expected format {FORMAT!r})")
    verify_checkpoint(ckpt, p)
    return ckpt


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return   # not supported here (e.g. Windows); the rename itself is atomic
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomic(path: Path, write: Callable) -> None:
    """``write(binary file)`` into a temporary file beside ``path``, flush it to disk, then
    rename it over ``path``: readers see the old file or the new one, never a partial one."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(exc, OSError) and not exc.filename:  # a full disk: name the file
            raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from exc
        raise
    _fsync_dir(path.parent)


def write_json(obj, path: Path) -> None:
    """``obj`` as indented JSON, written atomically."""
    write_atomic(path, lambda f: f.write((json.dumps(obj, indent=2) + "\n").encode()))


def save_checkpoint(ckpt: Dict, path: Path) -> None:
    """Add the checksum and write atomically."""
    ckpt = dict(ckpt)
    ckpt[CHECKSUM] = _digest(ckpt)
    # serialised in memory first, then written: a failed write (a full disk) is then the
    # operating system's OSError (ENOSPC, with the file's name) instead of torch's
    # "[enforce fail at inline_container.cc]" RuntimeError from inside its zip writer
    buffer = io.BytesIO()
    torch.save(ckpt, buffer)
    write_atomic(path, lambda f: f.write(buffer.getbuffer()))


def load_model_state(model: LanguageModel, ckpt: Dict) -> None:
    """Load ``ckpt["model"]`` into ``model`` with the checkpoint's ``variant`` as the variant
    record of every :class:`~rnn_ablations.AblatedRNN` layer.  The state dict's own record (its
    metadata) is gone from the checkpoints the trainer writes (it saves a copy moved to the CPU)
    and from any copy or cast (``{k: v.float() ...}``); without a record a ``ran`` or
    ``identity_ran`` layer could only check its shapes, which both share, and would warn."""
    state = ckpt["model"]
    metadata = dict(getattr(state, "_metadata", None) or {})
    for name, module in model.named_modules():
        if isinstance(module, AblatedRNN):
            record = dict(metadata.get(name, {}))
            record.setdefault(AblatedRNN.METADATA_VARIANT, ckpt["variant"])
            record.setdefault(AblatedRNN.METADATA_HIGHWAY, module.highway)
            metadata[name] = record
    recorded = OrderedDict(state)
    recorded._metadata = metadata
    model.load_state_dict(recorded)


def model_from_checkpoint(ckpt: Dict, device=None) -> LanguageModel:
    """The trained model of a loaded checkpoint, on ``device`` (default: the CPU)."""
    cfg = LMConfig.from_dict(ckpt["config"])
    model = LanguageModel(ckpt["variant"], len(ckpt["vocab"]), cfg.hidden_size, cfg.num_layers,
                          cfg.dropout, cfg.init_scale, cfg.forget_bias)
    load_model_state(model, ckpt)
    return model.to(device or "cpu")


def check_resume(ckpt: Dict, variant: str, cfg: LMConfig, seed: int, fingerprint: str,
                 path: Path) -> None:
    """Refuse to continue ``ckpt`` with another variant, config, seed or corpus."""
    if ckpt["variant"] != variant:
        raise ValueError(
            f"the checkpoint in {str(path)!r} is from variant {ckpt['variant']!r}, not {variant!r}; "
            "resume it with the same --variant, or use another --out (or --overwrite to discard it)")
    if ckpt["config"] != cfg.to_dict():
        diff = sorted(k for k, v in cfg.to_dict().items() if ckpt["config"].get(k) != v)
        raise ValueError(
            f"the checkpoint in {str(path)!r} was trained with config {ckpt['config']['name']!r} "
            f"and different values of {', '.join(diff)}; resume with the same config "
            "(or --overwrite to start again)")
    if ckpt["seed"] != seed:
        raise ValueError(f"the checkpoint in {str(path)!r} was trained with --seed {ckpt['seed']}, "
                         f"not {seed}; resume with the same seed (or --overwrite)")
    if ckpt["corpus"]["fingerprint"] != fingerprint:
        raise ValueError(f"the checkpoint in {str(path)!r} was trained on different data "
                         f"({ckpt['corpus']['source']}); resume with the same --data (or --overwrite)")
