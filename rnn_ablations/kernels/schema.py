"""The kernels' operators, their arguments written once.

Every computing entry point of the kernels is a PyTorch operator (namespace ``rnn_ablations``,
``kernels/ops.py`` for the CPU, ``kernels/cuda/ops.py`` for CUDA) and a method of every kernel
class (``kernels/interface.py``: ``CpuKernel``, ``CudaKernel``, ``GraphedKernel``,
``PersistentKernel``).  :data:`SCHEMAS` holds each operator's arguments and results in
``torch.library``'s schema syntax; the operators are defined from it, and the kernel classes'
methods and the interface's protocols take their parameters from it (:func:`entry`), so that
they forward by position and name no argument they do not read.  Changing an argument of an
operator is then an edit of its C++ entry point (declaration, definition), of its row here, and
of the code that reads the argument (``tests/kernels/test_schema.py`` counts the places).

The operators of the directions of a bidirectional layer take their base operator's arguments
as lists (one tensor per direction, ``batch_sizes`` shared); the persistent CUDA operators take
the step kernel's arguments and then the grid; ``plain_forward_`` is ``plain_forward`` writing
the gate activations into ``proj``.  The argument meanings are documented in ``kernels/ops.py``.
"""
from __future__ import annotations

import re
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

__all__ = ["SCHEMAS", "ENTRIES", "Argument", "arguments", "positions", "entry_arguments",
           "entry", "complete"]


class Argument(NamedTuple):
    """One argument of a schema: its type as the schema writes it (``Tensor``, ``Tensor[]``,
    ``Tensor?``, ``Tensor(a0!)`` …), its name, and its default (``NO_DEFAULT`` when it has
    none)."""
    type: str
    name: str
    default: object

    @property
    def tensor(self) -> bool:
        return self.type.startswith("Tensor") and "[]" not in self.type

    @property
    def tensors(self) -> bool:
        return self.type.startswith("Tensor[]")


NO_DEFAULT = object()

_PLAIN_FORWARD = ("SymInt spec, bool highway, Tensor proj, Tensor w_hh, Tensor h0, Tensor c0, "
                  "Tensor batch_sizes, Tensor rec_mask, bool train")
_PLAIN_BACKWARD = ("SymInt spec, bool highway, Tensor g_out, Tensor g_hn, Tensor g_cn, "
                   "Tensor gates, Tensor cs, Tensor hin, Tensor out, Tensor proj, Tensor w_hh, "
                   "Tensor h0, Tensor c0, Tensor batch_sizes, Tensor rec_mask")
_PIPELINED_FORWARD = ("SymInt spec, bool highway, Tensor x, Tensor w_ih, Tensor bias, "
                      "Tensor w_hh, Tensor h0, Tensor c0, Tensor batch_sizes, Tensor rec_mask, "
                      "bool train, SymInt chunk")
_PIPELINED_BACKWARD = ("SymInt spec, bool highway, Tensor g_out, Tensor g_hn, Tensor g_cn, "
                       "Tensor gates, Tensor cs, Tensor hin, Tensor xo, Tensor out, Tensor x, "
                       "Tensor w_ih, Tensor w_hh, Tensor h0, Tensor c0, Tensor batch_sizes, "
                       "Tensor rec_mask, bool need_dx, bool need_dw, bool need_bias, "
                       "SymInt chunk")
_GRID = "SymInt blocks, SymInt batch_tile"


def _results(n: int) -> str:
    return "(" + ", ".join(["Tensor"] * n) + ")"


def _lists(args: str) -> str:
    """``args`` with every tensor but ``batch_sizes`` a list (one tensor per direction)."""
    return re.sub(r"\bTensor (?!batch_sizes\b)", "Tensor[] ", args)


#: operator -> its schema (``(arguments) -> results``), as ``torch.library`` defines it
SCHEMAS: Dict[str, str] = {
    "plain_forward": f"({_PLAIN_FORWARD}) -> {_results(6)}",
    "plain_forward_": "({}) -> {}".format(_PLAIN_FORWARD.replace("Tensor proj", "Tensor(a2!) proj"),
                                          _results(5)),
    "plain_backward": f"({_PLAIN_BACKWARD}) -> {_results(4)}",
    "pipelined_forward": f"({_PIPELINED_FORWARD}) -> {_results(7)}",
    "pipelined_backward": f"({_PIPELINED_BACKWARD}) -> {_results(6)}",
    # (a fixed tuple: functionalization does not take a list result from a mutating operator)
    "plain_directions_forward_": "({}) -> {}".format(
        _lists(_PLAIN_FORWARD).replace("Tensor[] proj", "Tensor(a2!) proj_0, Tensor(a3!) proj_1"),
        _results(10)),
    "plain_directions_backward": f"({_lists(_PLAIN_BACKWARD)}) -> Tensor[]",
    "pipelined_directions_forward": f"({_lists(_PIPELINED_FORWARD)}) -> Tensor[]",
    "pipelined_directions_backward": f"({_lists(_PIPELINED_BACKWARD)}) -> Tensor[]",
    "scan_forward": ("(SymInt spec, bool highway, Tensor proj, Tensor h0, Tensor c0, "
                     "Tensor batch_sizes, bool save, Tensor? bias=None) -> " + _results(4)),
    "scan_backward": ("(SymInt spec, bool highway, Tensor g_out, Tensor g_hn, Tensor g_cn, "
                      "Tensor proj, Tensor c0, Tensor cs, Tensor batch_sizes, Tensor? bias=None, "
                      "bool bias_grad=False) -> " + _results(3)),
    "weight_grad": "(Tensor g, Tensor x) -> Tensor",
    # CUDA only: the step kernel's arguments, then the grid (0 = automatic)
    "persistent_forward": f"({_PLAIN_FORWARD}, {_GRID}) -> {_results(6)}",
    "persistent_backward": f"({_PLAIN_BACKWARD}, {_GRID}) -> {_results(4)}",
}

#: the CPU kernel's operators, and the CUDA kernel's (the persistent ones are CUDA only)
CPU_OPERATORS = tuple(n for n in SCHEMAS if not n.startswith("persistent"))
CUDA_OPERATORS = ("plain_forward", "plain_backward", "scan_forward", "scan_backward",
                  "persistent_forward", "persistent_backward")

#: kernel method (``kernels/interface.py``) -> (its arguments: an operator's, or that
#: operator's with lists for the directions; the method's own arguments after them)
ENTRIES: Dict[str, Tuple[str, str]] = {
    "plain_forward": ("plain_forward", "bool in_place=False"),
    "plain_backward": ("plain_backward", ""),
    "pipelined_forward": ("pipelined_forward", ""),
    "pipelined_backward": ("pipelined_backward", ""),
    "plain_directions_forward": ("lists of plain_forward", "bool in_place=False"),
    "plain_directions_backward": ("plain_directions_backward", ""),
    "pipelined_directions_forward": ("pipelined_directions_forward", ""),
    "pipelined_directions_backward": ("pipelined_directions_backward", ""),
    "scan_forward": ("scan_forward", ""),
    "scan_backward": ("scan_backward", ""),
    "weight_grad": ("weight_grad", ""),
    "persistent_forward": ("persistent_forward", ""),
    "persistent_backward": ("persistent_backward", ""),
}

_ARGUMENT = re.compile(r"^(\S+) (\w+)(?:=(\S+))?$")
_DEFAULTS = {"None": None, "False": False, "True": True}


def _parse(args: str) -> Tuple[Argument, ...]:
    out = []
    for text in (a.strip() for a in args.split(",") if a.strip()):
        m = _ARGUMENT.match(text)
        if m is None:
            raise ValueError(f"not an argument of a schema: {text!r} (write 'Type name' or "
                             "'Type name=default')")
        default = NO_DEFAULT if m.group(3) is None else _DEFAULTS.get(m.group(3), m.group(3))
        out.append(Argument(m.group(1), m.group(2), default))
    return tuple(out)


def _schema_arguments(name: str) -> str:
    schema = SCHEMAS[name]
    return schema[1:schema.index(") -> ")]


_ARGUMENTS: Dict[str, Tuple[Argument, ...]] = {n: _parse(_schema_arguments(n)) for n in SCHEMAS}


def arguments(name: str) -> Tuple[Argument, ...]:
    """The arguments of operator ``name``, in order."""
    return _ARGUMENTS[name]


def positions(name: str) -> Dict[str, int]:
    """Operator (or kernel method) ``name``'s argument name -> its position."""
    args = _ARGUMENTS[name] if name in _ARGUMENTS else entry_arguments(name)
    return {a.name: i for i, a in enumerate(args)}


def entry_arguments(method: str) -> Tuple[Argument, ...]:
    """The parameters of the kernel method ``method`` (after ``self``)."""
    base, own = ENTRIES[method]
    if base.startswith("lists of "):
        args = _parse(_lists(_schema_arguments(base[len("lists of "):])))
    else:
        args = _ARGUMENTS[base]
    return tuple(Argument(a.type.split("(")[0], a.name, a.default) for a in args) + _parse(own)


def complete(name: str, args: Sequence, kwargs: Optional[dict] = None) -> tuple:
    """``args`` and ``kwargs`` of a call of operator ``name`` as the full positional tuple (the
    defaults filled in)."""
    schema = _ARGUMENTS[name]
    if len(args) == len(schema) and not kwargs:
        return tuple(args)
    kwargs = dict(kwargs or {})
    out = list(args)
    for a in schema[len(args):]:
        if a.name in kwargs:
            out.append(kwargs.pop(a.name))
        elif a.default is not NO_DEFAULT:
            out.append(a.default)
        else:
            raise TypeError(f"rnn_ablations::{name}: argument {a.name!r} is missing")
    if kwargs:
        raise TypeError(f"rnn_ablations::{name}: unknown argument(s) {sorted(kwargs)}")
    return tuple(out)


def entry(method: str, implementation: Optional[Callable] = None, doc: str = "",
          returns: Optional[str] = None) -> Callable:
    """A function ``method(self, <the parameters of ENTRIES[method]>)`` that returns
    ``implementation(self, args)`` with ``args`` the tuple of its parameters (defaults filled
    in), or the expression ``returns`` (``{first}``: the first tensor parameter's name,
    ``{args}``: the parameters, ``{name}``: the method's: a call written out as by hand, with
    no call in between); without either (a protocol's declaration) it returns ``None``.  The
    parameters are real (names, defaults): ``inspect.signature`` and keyword calls see them."""
    params = entry_arguments(method)
    names = [p.name for p in params]
    signature = ", ".join(p.name if p.default is NO_DEFAULT else f"{p.name}={p.default!r}"
                          for p in params)
    packed = ", ".join(names) + ("," if len(names) == 1 else "")
    if returns is not None:
        first = next(p.name for p in params if p.type.startswith("Tensor"))
        body = "return " + returns.format(first=first, args=", ".join(names), name=method)
    elif implementation is not None:
        body = f"return _implementation(self, ({packed}))"
    else:
        body = "return None"
    source = f"def {method}(self, {signature}):\n    {body}\n"
    namespace = {"_implementation": implementation}
    exec(compile(source, f"<rnn_ablations.kernels.schema: {method}>", "exec"), namespace)
    fn = namespace[method]
    fn.__doc__ = doc or None
    fn.__module__ = __name__
    return fn
