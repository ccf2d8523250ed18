"""``rnn-ablations explain``: the run plan of every layer call of a forward, for a shape,
without running it (:func:`rnn_ablations.explain` on an :class:`~rnn_ablations.AblatedRNN` of
that shape and an input that holds no memory)::

    rnn-ablations explain --variant lstm --input-size 64 --hidden-size 64 --steps 1000 \\
        --batch 1000 --no-grad
    rnn-ablations explain --variant ran --input-size 650 --hidden-size 650 --layers 2 \\
        --bidirectional --dtype bfloat16
"""
from __future__ import annotations

import argparse

__all__ = ["explain_shape", "add_subparser"]

DTYPES = ("float32", "float64", "bfloat16", "float16")


def explain_shape(variant: str, input_size: int, hidden_size: int, layers: int = 1,
                  bidirectional: bool = False, batch: int = 32, steps: int = 35,
                  dtype: str = "float32", no_grad: bool = False, device: str = "cpu",
                  highway: bool = False, proj_size: int = 0, threads: int = 0):
    """The :class:`rnn_ablations.explanation.Explanation` of one forward of an ``AblatedRNN``
    of that shape on a ``(steps, batch, input_size)`` input (an expanded zero: no memory),
    with a gradient wanted unless ``no_grad``; ``threads`` > 0 sets torch's threads for it."""
    import torch

    from ..explanation import explain
    from ..rnn import AblatedRNN

    for label, value in (("--input-size", input_size), ("--hidden-size", hidden_size),
                         ("--layers", layers), ("--batch", batch), ("--steps", steps)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{label} must be a positive integer, got {value!r}")
    if dtype not in DTYPES:
        raise ValueError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    torch_dtype = getattr(torch, dtype)
    model = AblatedRNN(variant, input_size, hidden_size, num_layers=layers,
                       bidirectional=bidirectional, highway=highway, proj_size=proj_size,
                       device=device, dtype=torch_dtype).eval()
    x = torch.zeros((), dtype=torch_dtype, device=device).expand(steps, batch, input_size)
    old = torch.get_num_threads()
    try:
        if threads > 0:
            torch.set_num_threads(threads)
        with torch.set_grad_enabled(not no_grad):
            return explain(model, x)
    finally:
        torch.set_num_threads(old)


def _run(args) -> int:
    got = explain_shape(args.variant, args.input_size, args.hidden_size, args.layers,
                        args.bidirectional, args.batch, args.steps, args.dtype, args.no_grad,
                        args.device, args.highway, args.proj_size, args.threads)
    print(got)
    return 0


def add_subparser(subparsers) -> None:
    p = subparsers.add_parser(
        "explain", help="how each layer call of a forward runs (the run plan in words)",
        description="Print the run plan of every layer call of one forward of an AblatedRNN of "
                    "the given shape (path and reason, runner, schedule, dtype path, input "
                    "projection, step GEMM, streaming, CUDA recurrence and first-use check), "
                    "under this process's settings and kernels, without running the layers.")
    p.add_argument("--variant", required=True, help="a variant name or alias")
    p.add_argument("--input-size", type=int, required=True, help="d_in")
    p.add_argument("--hidden-size", type=int, required=True, help="H")
    p.add_argument("--layers", type=int, default=1, help="number of layers (default 1)")
    p.add_argument("--bidirectional", action="store_true")
    p.add_argument("--highway", action="store_true")
    p.add_argument("--proj-size", type=int, default=0, help="nn.LSTM's proj_size (default 0)")
    p.add_argument("--batch", type=int, default=32, help="B (default 32)")
    p.add_argument("--steps", type=int, default=35, help="T (default 35)")
    p.add_argument("--dtype", choices=DTYPES, default="float32")
    p.add_argument("--no-grad", action="store_true",
                   help="a no-gradient forward (inference); default: a gradient is wanted")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N] (default cpu)")
    p.add_argument("--threads", type=int, default=0,
                   help="torch's intra-op threads for the plan (default: as set)")
    p.set_defaults(func=_run)
