"""OpenNMT-py 3.5.1 encoders for every variant of :mod:`rnn_ablations.variants`.

After :func:`register` (which the start-up hook ``rnn_ablations_hooks`` runs automatically right
after ``onmt`` is imported) the plain OpenNMT-py commands accept these encoder types::

    onmt_train -config my.yaml -encoder_type bran        # or `encoder_type: bran` in the YAML

====================  ===========================  ===================================
encoder type          variant                      direction
====================  ===========================  ===================================
``lstm``              LSTM (our implementation)    unidirectional
``srnn``              LSTM − GATES (S-RNN)         unidirectional
``lstm_minus_srnn``   LSTM − S-RNN                 unidirectional
``ran``               LSTM − S-RNN − OUT (RAN)     unidirectional
``identity_ran``      identity RAN                 unidirectional
``lstm_minus_srnn_    LSTM − S-RNN − HIDDEN        unidirectional
minus_hidden``
``blstm`` ...         the same cells               bidirectional (``b`` + the variant
                                                   name), like OpenNMT's ``brnn``
====================  ===========================  ===================================

(The list is the variant table's: a variant added there gets both encoder types.)

The encoder honours ``-enc_layers``, ``-enc_hid_size`` (``-hidden_size``), ``-dropout`` (between
layers and on the source embeddings, and ``-dropout_steps`` through ``update_dropout``) and
``-bridge``; the ``rnn_type`` option only selects the *decoder* cell (and how many states the
bridge maps).  Bidirectional encoders use ``enc_hid_size / 2`` units per direction and join the
two directions of every layer before handing the state to the decoder, exactly like OpenNMT's
``brnn`` + ``_fix_enc_hidden``.  The final state is always ``(h, c)``, each
``(enc_layers, batch, enc_hid_size)`` (``c`` is a copy of ``h`` for ``srnn``); the GRU decoder
uses ``h``.

Initialisation: OpenNMT re-initialises every parameter after building the model (``-param_init``
uniform, ``U(±0.1)`` by default, or ``-param_init_glorot``).  By default every encoder type keeps
exactly that init, as OpenNMT's own ``brnn``/``rnn`` encoders do, so every variant starts from the
distribution the LSTM starts from.  The option ``-ablated_init`` (added to ``onmt_train``'s model
options, so it is saved in the checkpoint) lets the user ask for something else; it acts on a new
model only (never after ``-train_from``) and only on our encoder types (``brnn`` never gets it):

* ``onmt`` (default): keep OpenNMT's initialisation for everything.
* ``gate_bias``: keep OpenNMT's initialisation, then set the forget-gate bias to 1 in every variant
  that has a forget gate, ``lstm`` included (:meth:`AblatedRNN.set_forget_bias_`: for ``lstm``
  ``bias_ih``'s forget slice 1 and ``bias_hh``'s 0); the other bias entries keep OpenNMT's init;
  ``srnn`` has no forget gate and is unchanged.
* ``variant``: :meth:`AblatedRNN.reset_parameters` for the whole recurrent stack (``nn.LSTM``'s
  rule, every weight and bias ``U(±1/√H)``, for every variant); the embeddings and the bridge
  keep OpenNMT's init.

Without OpenNMT-py this package still imports (AllenNLP's ``--include-package rnn_ablations``
imports every submodule); constructing an encoder, :func:`register` and the option checks then
raise an ``ImportError`` naming the pip command that installs OpenNMT-py (:func:`require_onmt`).

:func:`register` (idempotent; the start-up hook runs it right after ``onmt`` is imported):

* ``onmt.encoders.str2enc[type] = class`` for every type of :data:`ENCODER_TYPES`
  (``register_encoder`` refuses duplicates, so the dict is filled directly; :mod:`.encoder`);
* ``-ablated_init`` is added to ``onmt.opts.model_opts`` (shown by ``onmt_train -h`` and saved
  with the model options in the checkpoint) and the ``-encoder_type`` help lists ours;
  ``ArgumentParser.validate_model_opts`` first runs :func:`check_model_opts` (an unknown
  ``-encoder_type`` lists the valid ones; with our encoders the encoder and decoder hidden sizes
  must match and an RNN decoder may not have more layers than the encoder);
  ``ArgumentParser._validate_data`` first replaces ``${NAME}`` in the corpora's paths by the
  environment variable ``NAME`` (:func:`expand_data_paths`); ``onmt.model_builder.build_model``
  refuses a ``-train_from`` whose ``-encoder_type`` differs from the checkpoint's
  (:func:`check_train_from`; OpenNMT-py would silently keep the checkpoint's) and applies
  ``-ablated_init`` after OpenNMT's init (:mod:`.options`);
* OpenNMT-py's checkpoint loaders first run :func:`prepare_checkpoint` (refuses a checkpoint of
  another variant; checks and drops the ``variant_state`` entry of earlier versions;
  :mod:`.checkpoints`);
* the input-feeding RNN decoder returns a decoding step's attention batch-first, as OpenNMT-py's
  searches index it, so that ``onmt_translate -beam_size 5 -replace_unk`` (the papers'
  evaluation) runs (:mod:`.translate`; OpenNMT-py 3.5.1 fails there with ``IndexError``);
* an uncaught :class:`OnmtUsageError` (what the checks above raise) is printed as one line
  ``onmt_train: error: ...`` instead of a traceback (``sys.excepthook``);
* ``torch.serialization.add_safe_globals([argparse.Namespace])`` (OpenNMT-py 3.5.1 checkpoints
  contain one and torch ≥ 2.6 loads ``weights_only``).

``rnn-ablations onmt-train`` / ``onmt-translate`` / ``onmt-build-vocab`` (:mod:`.cli`) run
OpenNMT-py's commands with all this done first, for interpreters without the start-up hook.

The package imports neither torch nor OpenNMT-py until one of its names is used (``rnn-ablations
--help`` imports :mod:`.cli`); the first such use imports :mod:`.encoder`, which imports
OpenNMT-py (whose start-up hook then registers everything).
"""
from __future__ import annotations

import importlib
import sys

from .encoder_types import CLASS_NAMES as _CLASS_NAMES

__all__ = [
    "AblatedRNNEncoder", "ENCODER_TYPES", "ENCODER_CLASSES", "INIT_CHOICES", "DEFAULT_INIT",
    "register", "is_registered", "check_model_opts", "check_train_from", "encoder_type_for",
    "require_onmt", "INSTALL_HINT", "ONMT_IMPORT_ERROR", "prepare_checkpoint", "CLASS_NAMES",
    "expand_data_paths", "OnmtUsageError",
]

#: the public names and the module of the package that defines each
_HOMES = {
    "ENCODER_TYPES": "encoder_types", "INIT_CHOICES": "encoder_types",
    "DEFAULT_INIT": "encoder_types", "INSTALL_HINT": "encoder_types", "CLASS_NAMES": "encoder_types",
    "OnmtUsageError": "encoder_types", "encoder_type_for": "encoder_types",
    "require_onmt": "encoder_types",
    "check_model_opts": "options", "check_train_from": "options", "expand_data_paths": "options",
    "prepare_checkpoint": "checkpoints",
    "AblatedRNNEncoder": "encoder", "ENCODER_CLASSES": "encoder", "ONMT_IMPORT_ERROR": "encoder",
    "is_registered": "encoder",
}
# the per-type encoder classes (AblatedBiRanEncoder, ...)
_HOMES.update({name: "encoder" for name in _CLASS_NAMES.values()})
__all__ += list(_CLASS_NAMES.values())


def register() -> None:
    """Register every encoder type into OpenNMT-py and install the patches listed in the
    package's docstring (idempotent, safe to call again)."""
    encoder = sys.modules.get(f"{__name__}.encoder")
    if encoder is not None and not getattr(encoder, "_READY", False):
        # .encoder is being imported and has just imported `onmt`, whose start-up hook calls
        # this: its classes do not exist yet, so it registers when its import completes
        encoder._REGISTER_WHEN_READY = True
        return
    from .encoder import register_now

    register_now()


def __getattr__(name):
    # the names live in the package's modules, imported at first use: torch and OpenNMT-py
    # are imported only when an encoder, a check or the registration is used
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
