"""``rnn-ablations kernels``: compile the kernels ahead of first use (Dockerfiles, shared caches).

``rnn-ablations kernels build`` compiles the CPU kernel ``rnn_ablations._C`` for the installed
torch into the cache (``RNN_ABLATIONS_CACHE``, default ``~/.cache/rnn_ablations``) unless the
package was installed with one or the cache already holds it, and says which; what the first
layer call that runs on the CPU kernel would otherwise do (:mod:`rnn_ablations.kernels.loader`;
the import and the other commands load no kernel).  Without a compiler it fails with one line
that says so and what to install (a build that failed before in the same environment is tried
again here).  ``rnn-ablations kernels precompile-cuda [--arch
sm_XY] [--jobs N] [--all] [--force]`` is ``python -m rnn_ablations.kernels.cuda.precompile``: the
NVRTC programs of the CUDA kernels, compiled into their cache.
"""
from __future__ import annotations

import sys
from typing import List

__all__ = ["add_subparser", "build"]

_SOURCES = {
    "installed": "installed with the package",
    "cache": "already in the cache",
    "compiled": "compiled now into the cache",
}


def build(out=None) -> int:
    """Load or compile the CPU kernel; print where it is.  Returns 0, or 1 when it cannot be
    had (the reason printed in one line on stderr)."""
    from .. import _env

    out = out or sys.stdout
    if _env.kernel_disabled():
        raise ValueError(f"{_env.kernel_switch_set()} is set, which turns the compiled kernel off; "
                         "unset it to build the kernel")
    from ..kernels import loader, registry

    # loading it is the build (the first-use path, its messages and its lock); a failure is
    # said once, below, without the advice to run this command
    registry.load_cpu_kernel(report=False, retry_failed=True)
    cpu = registry.cpu_kernel()
    if cpu is None:
        failure = loader.last_failure
        if failure is None:  # switched off for the CPU (RNN_ABLATIONS_NO_CPU_KERNEL)
            why = str(registry.cpu_kernel_error())
        else:
            installed, what, fix = failure
            why = (f"the CPU kernel is not available ({installed}; {what}). To fix: "
                   f"{fix.replace(loader.THEN_BUILD, '')}; until then layers run on the generic "
                   "PyTorch path (same numbers, slower)")
        print(f"rnn-ablations kernels build: error: {' '.join(why.split())}", file=sys.stderr)
        return 1
    import torch

    source = registry.cpu_kernel_source()
    where = _SOURCES.get(source, source)
    if source == "compiled" and loader.last_load_seconds is not None:
        where += f" in {loader.last_load_seconds:.0f} s"
    print(f"CPU kernel for torch {torch.__version__}: {cpu.raw.__file__} ({where}; vector "
          f"path {registry.kernel_isa()})", file=out)
    return 0


def _build(args) -> int:
    return build()


def _precompile(args) -> int:
    from ..kernels.cuda import precompile

    return precompile.run(args, args.precompile_parser)


def add_subparser(subparsers) -> None:
    p = subparsers.add_parser(
        "kernels", help="compile the CPU kernel (and the CUDA kernels) ahead of first use",
        description="Compile the kernels ahead of first use (a Dockerfile step, a shared cache: "
                    "RNN_ABLATIONS_CACHE names the folder).")
    sub = p.add_subparsers(dest="kernels_action", metavar="ACTION")
    sub.required = True
    b = sub.add_parser(
        "build", help="compile the CPU kernel for the installed torch into the cache",
        description="Compile the CPU kernel rnn_ablations._C for the installed torch into the "
                    "cache (RNN_ABLATIONS_CACHE) unless the install or the cache holds it; print "
                    "its path and where it came from.")
    b.set_defaults(func=_build)
    c = sub.add_parser(
        "precompile-cuda",
        help="compile the CUDA kernels' NVRTC programs into their cache "
             "(python -m rnn_ablations.kernels.cuda.precompile)",
        description="python -m rnn_ablations.kernels.cuda.precompile: compile the CUDA kernels' "
                    "NVRTC programs into their cache (~/.cache/rnn_ablations/cuda/).")
    from ..kernels.cuda import precompile
    precompile.add_arguments(c)  # the module's own options (--arch repeated or listed)
    c.set_defaults(func=_precompile, precompile_parser=c)
