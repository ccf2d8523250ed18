"""The ``rnn-ablations`` command.  Each sub-command lives in its own module and adds itself with
``add_subparser(subparsers)``; modules are imported lazily so that ``--help`` stays fast and a
missing optional framework only disables its own sub-commands."""
from __future__ import annotations

import argparse
import importlib
import sys
from typing import List, Optional

# (module, attribute) pairs; each attribute is a function add_subparser(subparsers) -> None
SUBCOMMAND_MODULES = [
    "rnn_ablations.commands.speed",
    "rnn_ablations.lm.cli",
    "rnn_ablations.visualize",
    "rnn_ablations.integrations.onmt_cli",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rnn-ablations",
        description="LSTM ablations (S-RNN, LSTM−S-RNN, RAN): ablation study, language model, "
                    "parameter and speed tables, visualisations, framework wrappers.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in SUBCOMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name and (exc.name == name or name.startswith(exc.name + ".")):
                continue  # that sub-command is not part of this build
            raise
        module.add_subparser(sub)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        result = args.func(args)
    except (ValueError, FileNotFoundError, FileExistsError) as exc:
        print(f"rnn-ablations {args.command}: error: {exc}", file=sys.stderr)
        return 2
    return int(result or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
