"""The output folder of a command (a run, an ablation study, a reproduction): refuse to clobber
results, continue them (``resume``) or discard them (``overwrite``).

One helper for every command that writes into ``--out``: a folder that already holds any of the
command's files is refused unless ``resume`` (continue; the manifest must agree) or ``overwrite``
(those files are deleted, nothing else); the temporary files of a write that was killed before
its rename are removed; the folder is created.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, Optional, Sequence

__all__ = ["prepare_out", "check_out_path"]


def check_out_path(out: Path) -> None:
    """Refuse an ``--out`` that is a file, or that lies under one (one message instead of an
    ``OSError`` from ``mkdir`` or the first write)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"--out {str(out)!r} exists and is not a directory; choose "
                              "another --out")
    for parent in out.parents:
        if parent.exists():
            if not parent.is_dir():
                raise FileExistsError(f"--out {str(out)!r} lies under {str(parent)!r}, which is a "
                                      "file, not a directory; choose another --out")
            break


def prepare_out(out: Path, *, resume: bool, overwrite: bool, files: Sequence[str], what: str,
                manifest: Optional[str] = None, new_manifest: Optional[Dict] = None,
                same_keys: Sequence[str] = ()) -> None:
    """Make ``out`` ready for a command whose files (paths relative to ``out``) are ``files``.

    ``what`` names its contents in messages ("a run", "ablation results", …).  With ``resume``,
    ``out`` must exist and, when ``manifest`` (a JSON file in ``out``) is there, its values of
    ``same_keys`` must equal those of ``new_manifest``.  With ``overwrite``, the existing
    ``files`` (and ``manifest``) are deleted."""
    out = Path(out)
    if resume and overwrite:
        raise ValueError("give either --resume or --overwrite, not both")
    check_out_path(out)
    if resume and not out.exists():
        raise FileNotFoundError(
            f"--resume: the run directory {str(out)!r} does not exist, so there is nothing to "
            "continue; check the path given to --out, or drop --resume to start anew")
    owned = list(files) + ([manifest] if manifest else [])
    existing = [f for f in owned if (out / f).exists()]
    if existing and not resume and not overwrite:
        tops = sorted({Path(f).parts[0] for f in existing})
        raise FileExistsError(
            f"{str(out)!r} already holds {what} ({', '.join(tops[:6])}"
            f"{', …' if len(tops) > 6 else ''}); pass --resume to continue it (finished parts "
            "are reused) or --overwrite to discard it and start again")
    if resume and manifest and (out / manifest).exists() and new_manifest is not None:
        old = json.loads((out / manifest).read_text())
        for key in same_keys:
            if old.get(key) != new_manifest.get(key):
                raise ValueError(
                    f"--resume: {str(out)!r} was run with a different {key.replace('_', ' ')} "
                    f"({old.get(key)!r} there, {new_manifest.get(key)!r} now); use the same "
                    "settings or --overwrite")
    if overwrite:
        for f in existing:
            (out / f).unlink()
    for f in owned:   # temporary files of a write that was killed before its rename
        folder = (out / f).parent
        if folder.is_dir():
            for tmp in folder.glob(f".{Path(f).name}.*.tmp"):
                tmp.unlink()
    out.mkdir(parents=True, exist_ok=True)
