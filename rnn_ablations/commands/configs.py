"""``rnn-ablations configs``: the experiment configs shipped with the package.

``rnn-ablations configs`` lists them; ``rnn-ablations configs path NAME`` prints the path of one
(``onmt_toy_data``: the folder of the toy parallel data that ``toy_fixture`` reads through
``ONMT_TOY_DATA``; ``allennlp_toy_data``: a few examples in the format of each AllenNLP config's
reader, ``squad_tiny.json``, ``ud_tiny.conllu``, and 8-d vectors ``glove_tiny_8d.txt``), so that
an installed package runs them without a checkout::

    allennlp train $(rnn-ablations configs path bidaf_srnn) -s out --include-package rnn_ablations

In a wheel the configs are package data (``rnn_ablations/configs/{allennlp,onmt}/``, copied there
from the repository's ``allennlp_configs/`` and ``onmt_configs/`` by ``setup.py``); in a source
checkout (editable install, ``PYTHONPATH``) they are read from those top-level folders.
"""
from __future__ import annotations

import argparse
import difflib
from pathlib import Path
from typing import Dict, List

__all__ = ["config_files", "config_path", "add_subparser"]

_PACKAGE = Path(__file__).resolve().parent.parent
#: framework -> (folder inside the package, folder in a source checkout)
_FOLDERS = {
    "allennlp": (_PACKAGE / "configs" / "allennlp", _PACKAGE.parent / "allennlp_configs"),
    "onmt": (_PACKAGE / "configs" / "onmt", _PACKAGE.parent / "onmt_configs"),
}
_SUFFIXES = (".jsonnet", ".yaml")
#: data folders `configs path` also names: name -> (folder inside the package, in a checkout)
_DATA = {
    "onmt_toy_data": (_PACKAGE / "configs" / "onmt_toy_data",
                      _PACKAGE.parent / "tests" / "fixtures" / "onmt"),
    "allennlp_toy_data": (_PACKAGE / "configs" / "allennlp_toy_data",
                          _PACKAGE.parent / "tests" / "fixtures" / "allennlp"),
}


def config_files() -> Dict[str, Path]:
    """``{name: path}`` of every shipped config (name = file name without its suffix)."""
    found: Dict[str, Path] = {}
    for packaged, checkout in _FOLDERS.values():
        folder = packaged if packaged.is_dir() else checkout
        if not folder.is_dir():
            continue
        for f in sorted(folder.iterdir()):
            if f.suffix in _SUFFIXES:
                found[f.stem] = f
    return found


def config_path(name: str) -> Path:
    """The path of config ``name`` (with or without its suffix); ``ValueError`` listing the
    closest names when there is none."""
    files = config_files()
    if not files:
        raise FileNotFoundError("no configs found: this install has neither rnn_ablations/configs/ "
                                "nor a source checkout's allennlp_configs/ and onmt_configs/; "
                                "reinstall the package (`pip install rnn-ablations`)")
    if name in _DATA:
        packaged, checkout = _DATA[name]
        return packaged if packaged.is_dir() else checkout
    stem = name
    for suffix in _SUFFIXES:
        if stem.endswith(suffix):
            stem = stem[: -len(suffix)]
    if stem in files:
        return files[stem]
    close = difflib.get_close_matches(stem, list(files) + list(_DATA), n=5, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise ValueError(f"unknown config {name!r}{hint} (`rnn-ablations configs` lists all "
                     f"{len(files)})")


def _listing() -> List[str]:
    files = config_files()
    lines = []
    for framework, (packaged, checkout) in _FOLDERS.items():
        folder = packaged if packaged.is_dir() else checkout
        names = [n for n, p in files.items() if p.parent == folder]
        if names:
            lines.append(f"{framework} ({folder}):")
            lines.extend(f"  {n}" for n in names)
    for name, (packaged, checkout) in _DATA.items():
        lines.append(f"data: {name} ({packaged if packaged.is_dir() else checkout})")
    lines.append("`rnn-ablations configs path NAME` prints the path of one.")
    return lines


def _run(args: argparse.Namespace) -> int:
    if args.action is None:
        print("\n".join(_listing()))
        return 0
    if args.action != "path":
        raise ValueError(f"unknown action {args.action!r}: use `rnn-ablations configs` to list "
                         "the configs or `rnn-ablations configs path NAME`")
    if not args.name:
        raise ValueError("`rnn-ablations configs path` needs a config name, e.g. bidaf_srnn")
    print(config_path(args.name))
    return 0


def add_subparser(subparsers) -> None:
    p = subparsers.add_parser(
        "configs", help="list the shipped AllenNLP/OpenNMT-py configs, or print the path of one",
        description="Without arguments, list the configs shipped with the package; "
                    "`configs path NAME` prints the path of one (e.g. for "
                    "`allennlp train $(rnn-ablations configs path bidaf_srnn) ...`).")
    p.add_argument("action", nargs="?", choices=["path"], help="print the path of config NAME")
    p.add_argument("name", nargs="?", help="config name, e.g. bidaf_srnn or multi30k_bran")
    p.set_defaults(func=_run)
