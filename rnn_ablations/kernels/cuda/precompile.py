"""Compile the CUDA kernels ahead of their first use, and say how long each took.

    python -m rnn_ablations.kernels.cuda.precompile [--all] [--arch sm_XY[,sm_XY...]] [--jobs N]
                                                   [--force]

Without ``--arch`` the programs are compiled for the architecture of every visible CUDA device
(``CUDA_VISIBLE_DEVICES`` applied; each distinct architecture once) into the disk cache that the
first call would fill (``RNN_ABLATIONS_CACHE``, see :mod:`rnn_ablations.kernels.cuda.cache`);
``--arch sm_80,sm_90`` (or ``--arch`` repeated) compiles for those architectures, with or
without a GPU (e.g. to fill a cache shared by the machines of a cluster, or to check the
sources).  By default every instantiation a model of the table can call is compiled; ``--all``
is the same set (kept for scripts that name it).  ``--force`` compiles even what the cache holds
(the times are then the cold first-use times).  Prints, per architecture, one row per
instantiation (seconds, where it came from) and the total; exits 1 if any program failed.  The
package's import builds the CPU kernel on its first use: ``RNN_ABLATIONS_NO_KERNEL=1 python -m
rnn_ablations.kernels.cuda.precompile`` skips that (the switch keeps the kernels from running in
that process; this command compiles the CUDA programs all the same), e.g. to run it beside the
CPU kernel's build.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import os
import sys
import time
from typing import List, Optional

# cache, nvrtc and programs are imported by the functions that compile: the command line's
# parser (add_arguments) is built without them

__all__ = ["main", "precompile"]


def _local_archs() -> List[int]:
    """The distinct compute capabilities of the visible CUDA devices (90 for 9.0), in order."""
    import torch
    if torch.version.cuda is None:
        raise SystemExit("precompile: this torch has no CUDA (torch " + torch.__version__ +
                         "); name the architecture(s): --arch sm_90 (or --arch sm_80,sm_90)")
    if not torch.cuda.is_available() or torch.cuda.device_count() < 1:
        raise SystemExit("precompile: no CUDA device is visible; name the architecture(s): "
                         "--arch sm_90 (or --arch sm_80,sm_90)")
    archs = []
    for device in range(torch.cuda.device_count()):
        major, minor = torch.cuda.get_device_capability(device)
        if major * 10 + minor not in archs:
            archs.append(major * 10 + minor)
    return archs


def _parse_one(text: str, whole: str) -> int:
    t = text.strip().lower()
    for prefix in ("sm_", "compute_"):
        if t.startswith(prefix):
            t = t[len(prefix):]
    if not t.isdigit() or len(t) < 2:
        raise argparse.ArgumentTypeError(f"--arch {whole!r}: give architectures as sm_XY, "
                                         "e.g. sm_80 or sm_80,sm_90")
    return int(t)


def _parse_arch(text: str) -> List[int]:
    """``sm_80``, ``sm_80,sm_90`` or ``80,90`` -> [80, 90]."""
    parts = [p for p in text.split(",") if p.strip()]
    if not parts:
        raise argparse.ArgumentTypeError(f"--arch {text!r}: give architectures as sm_XY, "
                                         "e.g. sm_80 or sm_80,sm_90")
    return [_parse_one(p, text) for p in parts]


def precompile(arch: int, jobs: int = 1, force: bool = False, out=None) -> int:
    """Compile every program for ``arch``; print the table (to ``out``, default the current
    ``sys.stdout``); return the number of failures."""
    out = sys.stdout if out is None else out
    from . import cache, nvrtc
    from .programs import all_programs
    progs = all_programs()
    target, cubin = cache.target_for(arch)
    print(f"NVRTC {'.'.join(map(str, nvrtc.version()))}, target {target} "
          f"({'CUBIN' if cubin else 'PTX, compiled by the driver at load'}), cache "
          f"{cache.cache_dir()}", file=out)

    def one(p):
        start = time.perf_counter()
        try:
            _, source = cache.lookup(p, arch, quiet=True, force=force)
            return (p, time.perf_counter() - start,
                    "compiled" if source == "compiled" else "cache", None)
        except nvrtc.NvrtcError as exc:
            return p, time.perf_counter() - start, "FAILED", str(exc)

    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        results = list(pool.map(one, progs))
    wall = time.perf_counter() - start
    print(f"{'instantiation':48s} {'seconds':>8s}  source", file=out)
    failures = 0
    for p, sec, how, err in results:
        print(f"{p.name:48s} {sec:8.2f}  {how}", file=out)
        if err:
            failures += 1
            print(err, file=out)
    total = sum(r[1] for r in results)
    print(f"{len(results)} instantiations, {failures} failed; {total:.1f} s of compile time, "
          f"{wall:.1f} s wall with {max(1, jobs)} job(s)", file=out)
    return failures


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The options of this command, on ``ap`` (this module's parser and ``rnn-ablations kernels
    precompile-cuda``'s: one definition, so both read them alike)."""
    ap.add_argument("--all", action="store_true",
                    help="every instantiation (the default set)")
    ap.add_argument("--arch", type=_parse_arch, action="append", default=None,
                    help="target architecture(s), e.g. sm_90 or sm_80,sm_90; may be repeated "
                         "(default: those of every visible GPU)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                    help="programs compiled at once (default: the CPU count)")
    ap.add_argument("--force", action="store_true",
                    help="compile even what the cache holds (cold times)")


def run(args: argparse.Namespace, ap: argparse.ArgumentParser) -> int:
    """Compile for the parsed ``args`` (of :func:`add_arguments`); a wrong value is reported by
    ``ap.error`` (the usage of the command that was run)."""
    if args.jobs < 1:
        ap.error("--jobs must be >= 1")
    if args.arch is not None:
        archs: List[int] = []
        for group in args.arch:
            archs += [a for a in group if a not in archs]
    else:
        archs = _local_archs()
    from . import nvrtc
    failed = 0
    for arch in archs:
        try:
            failed += precompile(arch, args.jobs, args.force)
        except nvrtc.NvrtcError as exc:
            print(f"precompile: sm_{arch}: {exc}", file=sys.stderr)
            failed += 1
    if len(archs) > 1:
        print(f"architectures {', '.join(f'sm_{a}' for a in archs)}: "
              f"{'all compiled' if not failed else f'{failed} failure(s)'}")
    return 1 if failed else 0


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rnn_ablations.kernels.cuda.precompile",
                                 description=__doc__.split("\n\n")[0])
    add_arguments(ap)
    return run(ap.parse_args(argv), ap)


if __name__ == "__main__":
    sys.exit(main())
