"""OpenNMT-py checkpoints with the rnn_ablations encoders: before OpenNMT-py copies a checkpoint's
tensors into a model, :func:`prepare_checkpoint` checks the checkpoint's ``-encoder_type``, and a
``variant_state`` entry (written by earlier versions of the package), against the model, for
``.pt`` and for safetensors checkpoints (:func:`install` patches OpenNMT-py's loaders)."""
from __future__ import annotations

import functools
import threading
from typing import Optional

import torch

from ...rnn import AblatedRNN
from ...variants import VARIANTS, get_variant
from .encoder_types import ENCODER_TYPES, OnmtUsageError
from .options import wrapped

__all__ = ["prepare_checkpoint", "install"]


def _variant_code(encoder_type) -> Optional[int]:
    """The ``Variant.code`` of one of our encoder types, None for any other type."""
    if encoder_type not in ENCODER_TYPES:
        return None
    return get_variant(ENCODER_TYPES[encoder_type][0]).code


def _describe(code: int, highway: bool) -> str:
    names = {get_variant(v).code: v for v in VARIANTS}
    return (repr(names[code]) if code in names else f"<unknown variant code {code}>") + \
        (" with highway" if highway else "")


def prepare_checkpoint(model, checkpoint) -> None:
    """Check ``checkpoint["model"]`` against ``model`` before OpenNMT-py loads it (OpenNMT-py
    copies tensors into the modules itself, so the check that
    :class:`~rnn_ablations.AblatedRNN` does in ``load_state_dict`` does not run there).

    * The checkpoint's ``-encoder_type`` names its variant: one of our types that differs from
      the module's variant is refused (:class:`OnmtUsageError`, a ``ValueError``, naming both).
    * A ``variant_state`` entry (earlier versions of the package saved one per encoder) must be
      an integer ``[variant code, highway]`` that agrees with the ``-encoder_type`` and with the
      module; it is then removed (the module has no such buffer, and OpenNMT-py's loader refuses
      keys it cannot place).  Checkpoints without it (this version's) load as they are.
    """
    state = checkpoint.get("model") if isinstance(checkpoint, dict) else None
    if not isinstance(state, dict):
        return
    encoder_type = getattr(checkpoint.get("opt"), "encoder_type", None)
    saved_code = _variant_code(encoder_type)
    for name, module in model.named_modules():
        if not isinstance(module, AblatedRNN):
            continue
        key = f"{name}.variant_state" if name else "variant_state"
        expected = module.variant_state
        if key not in state:
            filled = expected.clone()
            if saved_code is not None:
                filled[0] = saved_code
            value = filled
        else:
            value = state.pop(key)
        if (not isinstance(value, torch.Tensor) or value.numel() != 2 or value.is_floating_point()
                or value.is_complex()):
            raise OnmtUsageError(
                f"the checkpoint's {key} must be an integer tensor [variant code, highway] as "
                f"earlier versions of rnn_ablations saved it, got {getattr(value, 'shape', type(value).__name__)}; the "
                "checkpoint is damaged or was edited: train it again or restore the original file")
        code, highway = (int(v) for v in value.reshape(-1).tolist())
        if saved_code is not None and code != saved_code:
            raise OnmtUsageError(
                f"the checkpoint is inconsistent: its options say -encoder_type {encoder_type} "
                f"(variant {_describe(saved_code, False)}) but its weights {key} were saved from "
                f"variant {_describe(code, bool(highway))}; the file was edited or mixed from two "
                "checkpoints: use the checkpoint as onmt_train saved it")
        if (code, bool(highway)) != (int(expected[0]), bool(expected[1])):
            raise OnmtUsageError(
                f"cannot load the checkpoint's {key}, saved from variant "
                f"{_describe(code, bool(highway))}, into {name or 'the module'}, an encoder of "
                f"variant {_describe(int(expected[0]), bool(expected[1]))} (the shapes may match, "
                "the equations do not); build the model with the checkpoint's -encoder_type")


def _patch_load_state_dict(model_cls) -> None:
    original = model_cls.__dict__.get("load_state_dict")
    if original is None or wrapped(original):
        return

    @functools.wraps(original)
    def load_state_dict(self, checkpoint, *args, **kwargs):
        prepare_checkpoint(self, checkpoint)
        return original(self, checkpoint, *args, **kwargs)

    load_state_dict.__rnn_ablations_wrapped__ = True
    model_cls.load_state_dict = load_state_dict


class _WithoutKeys:
    """A ``safetensors.safe_open`` handle whose ``keys()`` leave out ``hidden``."""

    def __init__(self, handle, hidden):
        self._handle, self._hidden = handle, hidden

    def keys(self):
        return [k for k in self._handle.keys() if k not in self._hidden]

    def __getattr__(self, name):
        return getattr(self._handle, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return self._handle.__exit__(*exc) if hasattr(self._handle, "__exit__") else False


_safe_open_lock = threading.Lock()


def _patch_load_safe_state_dict(model_cls) -> None:
    """Safetensors checkpoints (``-save_format safetensors``) under the ``.pt`` rules
    (:func:`prepare_checkpoint`): a ``variant_state`` entry of earlier versions is checked
    against the model and then not loaded (OpenNMT-py's loader would refuse it as an extra key,
    or, had the module such a buffer, copy a wrong one in silently); a file without it loads as
    it is.  The variant itself is the checkpoint's ``-encoder_type``, with which OpenNMT-py built
    the model."""
    original = model_cls.__dict__.get("load_safe_state_dict")
    if original is None or wrapped(original):
        return

    @functools.wraps(original)
    def load_safe_state_dict(self, model_path, *args, **kwargs):
        from glob import glob

        import safetensors

        saved = {}
        for shard in glob(model_path + ".*.safetensors"):
            with safetensors.safe_open(shard, framework="pt", device="cpu") as f:
                for key in f.keys():
                    if key == "variant_state" or key.endswith(".variant_state"):
                        saved[key] = f.get_tensor(key)
        if not saved:
            return original(self, model_path, *args, **kwargs)
        prepare_checkpoint(self, {"model": dict(saved), "opt": None})  # refuses a wrong one
        unplaced = [k for k in saved if not any(
            isinstance(m, AblatedRNN) and k == (f"{n}.variant_state" if n else "variant_state")
            for n, m in self.named_modules())]
        if unplaced:
            raise OnmtUsageError(f"the safetensors checkpoint {model_path} holds {unplaced[0]}, but "
                             "the model has no rnn_ablations encoder there; build the model with "
                             "the checkpoint's -encoder_type")
        real = safetensors.safe_open
        with _safe_open_lock:  # the checked entries are not handed to OpenNMT-py's loader
            safetensors.safe_open = lambda *a, **k: _WithoutKeys(real(*a, **k), set(saved))
            try:
                return original(self, model_path, *args, **kwargs)
            finally:
                safetensors.safe_open = real

    load_safe_state_dict.__rnn_ablations_wrapped__ = True
    model_cls.load_safe_state_dict = load_safe_state_dict


def install() -> None:
    """Patch OpenNMT-py's checkpoint loaders (``BaseModel.load_state_dict`` and
    ``load_safe_state_dict``) to run :func:`prepare_checkpoint` first (idempotent)."""
    import onmt.models.model

    _patch_load_state_dict(onmt.models.model.BaseModel)
    _patch_load_safe_state_dict(onmt.models.model.BaseModel)
