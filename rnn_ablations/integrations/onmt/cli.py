"""``rnn-ablations onmt-train`` / ``onmt-translate`` / ``onmt-build-vocab``: OpenNMT-py's own
commands with the package registered first (the encoders, the option checks, the fix that
lets `-beam_size 5 -replace_unk` run: :func:`rnn_ablations.integrations.onmt.register`).

Normally not needed: the start-up hook (``rnn_ablations_hooks.pth``) registers the encoders
whenever ``onmt`` is imported, so the plain ``onmt_train -encoder_type bran`` works.  These
wrappers are for interpreters that do not process ``.pth`` files (``python -S``, some embedded
or frozen setups, ``RNN_ABLATIONS_NO_HOOKS=1``).  Every argument after the sub-command is passed
to OpenNMT-py unchanged, ``-h`` included::

    python -S -m rnn_ablations.cli onmt-train -config $(rnn-ablations configs path multi30k_bran)
    rnn-ablations onmt-translate -model run/model_step_100.pt -src src.txt -output pred.txt \
        -beam_size 5 -replace_unk

``onmt-train`` also registers the encoders in the worker processes that multi-GPU training
spawns (they would not inherit a registration done here).
"""
from __future__ import annotations

import argparse
import functools
import importlib
import sys

from .encoder_types import INSTALL_HINT

#: sub-command -> (OpenNMT-py module with main(), the console script it stands for)
COMMANDS = {
    "onmt-train": ("onmt.bin.train", "onmt_train"),
    "onmt-translate": ("onmt.bin.translate", "onmt_translate"),
    "onmt-build-vocab": ("onmt.bin.build_vocab", "onmt_build_vocab"),
}


def _single_main_with_registration(opt, device_id):
    """Training entry of one (possibly spawned) worker: register, then OpenNMT's own."""
    from . import register

    register()
    from onmt.train_single import main

    return main(opt, device_id)


def run(command: str, onmt_args) -> int:
    """Run OpenNMT-py's ``command`` (a key of :data:`COMMANDS`) with ``onmt_args``."""
    if command not in COMMANDS:
        raise ValueError(f"unknown OpenNMT-py command {command!r}; valid: {', '.join(COMMANDS)}")
    module_name, prog = COMMANDS[command]
    try:
        import onmt  # noqa: F401  (the package must be complete before registering)
    except ImportError as exc:
        raise ValueError(f"OpenNMT-py cannot be imported ({exc}); install OpenNMT-py 3.5.1 with: "
                         f"{INSTALL_HINT}") from exc
    from . import register

    register()
    module = importlib.import_module(module_name)
    if module_name == "onmt.bin.train":
        # train() builds partial(single_main) from this module global, for spawned workers too
        module.single_main = _single_main_with_registration
    saved = sys.argv
    sys.argv = [prog] + list(onmt_args)
    try:
        result = module.main()
    finally:
        sys.argv = saved
    return int(result or 0)


def _func(command, args) -> int:
    return run(command, args.onmt_args)


def add_subparser(subparsers) -> None:
    for command, (_module, prog) in COMMANDS.items():
        parser = subparsers.add_parser(
            command,
            # '-' options belong to OpenNMT-py: this parser takes none of its own
            prefix_chars="+", add_help=False,
            help=f"{prog} with the rnn_ablations encoders registered (for python -S; "
                 f"`{command} -h` shows {prog}'s options)",
            description=f"Run OpenNMT-py's {prog} with every rnn_ablations encoder type "
                        f"registered; all arguments are passed to {prog}.")
        parser.add_argument("onmt_args", nargs=argparse.REMAINDER, metavar="ARGS",
                            help=f"arguments of {prog}")
        parser.set_defaults(func=functools.partial(_func, command))
