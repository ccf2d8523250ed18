"""The ``rnn-ablations`` command.  Each sub-command lives in its own module and adds itself with
``add_subparser(subparsers)``; modules are imported lazily so that ``--help`` stays fast and a
missing optional framework only disables its own sub-commands."""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
from typing import Dict, List, Optional, Tuple

from .integrations import ALLENNLP_INSTALL_HINT, ONMT_INSTALL_HINT, extra_hint

# (module, attribute) pairs; each attribute is a function add_subparser(subparsers) -> None
SUBCOMMAND_MODULES = [
    "rnn_ablations.commands.configs",
    "rnn_ablations.commands.variants",
    "rnn_ablations.commands.speed",
    "rnn_ablations.commands.kernels",
    "rnn_ablations.commands.explain",
    "rnn_ablations.lm.cli",
    "rnn_ablations.visualize",
    "rnn_ablations.integrations.onmt.cli",
]


_ONMT_HINT = (ONMT_INSTALL_HINT + "; OpenNMT-py's own pins cannot be met with torch 2.x "
              "(README, From a config name to a run)")
_ALLENNLP_HINT = ALLENNLP_INSTALL_HINT + " (README, From a config name to a run)"
#: what each optional extra provides: top-level module -> how to install it
_EXTRAS: Dict[str, str] = {
    "tqdm": extra_hint("lm"),
    "matplotlib": extra_hint("lm") + "  (or [viz])",
    "onmt": _ONMT_HINT,
    "allennlp": _ALLENNLP_HINT,
    "allennlp_models": _ALLENNLP_HINT,
}
#: sub-command -> (modules it needs before it starts, the extra that provides them)
_NEEDS: Dict[str, Tuple[Tuple[str, ...], str]] = {
    "ablate": (("tqdm", "matplotlib"), extra_hint("lm")),
    "lm": (("tqdm",), extra_hint("lm")),
    "visualize": (("matplotlib",), extra_hint("viz")),
    "onmt-train": (("onmt",), _ONMT_HINT),
    "onmt-translate": (("onmt",), _ONMT_HINT),
    "onmt-build-vocab": (("onmt",), _ONMT_HINT),
}


def missing_extra(command: str) -> Optional[str]:
    """An error message when ``command`` needs a package that is not installed, else None."""
    modules, hint = _NEEDS.get(command, ((), ""))
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if not missing:
        return None
    return (f"`rnn-ablations {command}` needs {' and '.join(missing)}, which "
            f"{'is' if len(missing) == 1 else 'are'} not installed: {hint}")


def _version() -> str:
    """``rnn-ablations X.Y.Z (torch A.B.C, Python D.E.F)``, without importing the package."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        own = version("rnn-ablations")
    except PackageNotFoundError:  # a checkout on PYTHONPATH: read it from the package
        import re
        from pathlib import Path
        init = (Path(__file__).resolve().parent / "__init__.py").read_text()
        own = re.search(r'^__version__ = "([^"]+)"', init, re.M).group(1)
    try:
        torch_version = version("torch")
    except PackageNotFoundError:
        torch_version = "not installed"
    python = ".".join(str(v) for v in sys.version_info[:3])
    return f"rnn-ablations {own} (torch {torch_version}, Python {python})"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rnn-ablations",
        description="LSTM ablations (S-RNN, LSTM−S-RNN, RAN): ablation study, language model, "
                    "parameter and speed tables, visualisations, framework wrappers.")
    parser.add_argument("--version", action="version", version=_version())
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
    missing = missing_extra(args.command)
    if missing:  # before a long run, not at its end
        print(f"rnn-ablations {args.command}: error: {missing}", file=sys.stderr)
        return 2
    try:
        result = args.func(args)
    except (ValueError, FileNotFoundError, FileExistsError) as exc:
        print(f"rnn-ablations {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        top = (exc.name or "").split(".")[0]
        if top not in _EXTRAS:
            raise
        print(f"rnn-ablations {args.command}: error: {top} is not installed: {_EXTRAS[top]}",
              file=sys.stderr)
        return 2
    except BrokenPipeError:
        # the reader of the output went away (`rnn-ablations explain ... | head`): stop quietly,
        # as other command-line tools do; stdout is pointed at devnull so that Python's flush
        # at exit does not raise again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return int(result or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
