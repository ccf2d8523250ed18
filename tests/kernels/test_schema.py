"""The schema table (rnn_ablations.kernels.schema): the operators are defined from it, the kernel
classes and the interface take their parameters from it, and an argument of ``plain_backward`` is
written only at the places CONTRIBUTING.md lists ("Changing a kernel entry point's arguments"),
counted here in the package's sources as CONTRIBUTING.md's recipes are counted."""
import ast
import inspect
import re
from pathlib import Path

import pytest
import torch

from conftest import requires_kernel
from rnn_ablations.kernels import interface, ops, schema
from rnn_ablations.kernels.cuda import graphs, ops as cuda_ops, recurrence

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "rnn_ablations"
TEXT = (ROOT / "CONTRIBUTING.md").read_text()

#: the arguments of plain_backward, as the schema names them; the C++ entry and the CUDA
#: implementation spell the incoming gradients grad_* (the same arguments)
ARGS = [a.name for a in schema.arguments("plain_backward")]


def _same(names):
    return [re.sub(r"^grad_", "g_", n) for n in names] == ARGS


def _python_places(path: Path, text: str):
    """(place, line) of every function of ``text`` whose parameters are exactly plain_backward's
    arguments, and of every string that writes them as a schema's argument list."""
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            a = node.args
            names = [p.arg for p in a.posonlyargs + a.args + a.kwonlyargs if p.arg != "self"]
            if _same(names):
                found.append((getattr(node, "name", "<lambda>"), node.lineno))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            written = re.findall(r"(?:^|,)\s*[\w\[\]?!()]+ (\w+)(?:=[^,]*)?\s*(?=,|$)", node.value)
            if _same(written):
                found.append(("schema", node.lineno))
    return found


def _cpp_places(text: str):
    """(function, line) of every C++ declaration or definition of ``plain_backward`` (typed
    parameters: not a call)."""
    found = []
    for m in re.finditer(r"\bplain_backward\s*\(([^()]*)\)", text):
        params = [p.strip() for p in m.group(1).split(",")]
        if all(len(p.split()) >= 2 for p in params):
            names = [re.findall(r"\w+", p)[-1] for p in params]
            if _same(names):
                found.append(("plain_backward", text.count("\n", 0, m.start()) + 1))
    return found


def places(root: Path):
    """Every place under ``root``/rnn_ablations where plain_backward's arguments are written:
    ``[(file, name, line)]``."""
    out = []
    for path in sorted((root / "rnn_ablations").rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.suffix == ".py":
            out += [(rel, name, n) for name, n in _python_places(path, path.read_text())]
        elif path.suffix in (".h", ".cpp", ".cuh", ".cu"):
            out += [(rel, name, n) for name, n in _cpp_places(path.read_text())]
    return out


def _listed():
    m = re.search(r"<!-- argument places[^>]*-->\n(.*?)<!-- end of argument places -->", TEXT,
                  re.S)
    assert m, "CONTRIBUTING.md has no list of the places an entry point's arguments are written"
    rows = set()
    for line in m.group(1).strip().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] == "file" or set(cells[0]) <= set("-: "):
            continue
        path, place = re.fullmatch(r"`([^`]+)`", cells[0]), re.fullmatch(r"`([^`]+)`", cells[1])
        assert path and place and len(cells) == 3, f"not a row of file | place | what: {line!r}"
        rows.add((path.group(1), place.group(1)))
    return rows


def test_plain_backward_arguments_are_written_at_the_listed_places_only():
    listed = _listed()
    written = [(f, "_PLAIN_BACKWARD" if n == "schema" else n) for f, n, _ in places(ROOT)]
    found = set(written)
    assert len(found) == len(written), f"written twice in one file: {sorted(written)}"
    assert found == listed, (f"written but not listed: {sorted(found - listed)}; "
                             f"listed but not written: {sorted(listed - found)}")
    stated = re.search(r"written in \*\*(\d+) places in (\d+) files\*\*", TEXT)
    assert stated, "CONTRIBUTING.md states no count of the places"
    assert (int(stated.group(1)), int(stated.group(2))) == (
        len(listed), len({f for f, _ in listed}))


def test_the_count_sees_a_wrapper_that_writes_the_arguments_out(tmp_path):
    """A kernel method written out (as the wrappers were before they forwarded by name) is a
    place; one that forwards ``*args`` or takes its parameters from the table is not."""
    written = ("class Wrapper:\n    def plain_backward(self, " + ", ".join(ARGS) + "):\n"
               "        return self.ext.plain_backward(" + ", ".join(ARGS) + ")\n")
    forwarding = ("class Forwarding:\n    def plain_backward(self, *args):\n"
                  "        return self.ext.plain_backward(*args)\n")
    assert _python_places(tmp_path, written) == [("plain_backward", 2)]
    assert _python_places(tmp_path, forwarding) == []
    cpp = ("std::vector<at::Tensor> plain_backward(int64_t spec, bool highway, "
           + ", ".join(f"at::Tensor {n}" for n in ARGS[2:]) + ");\n"
           "auto r = plain_backward(" + ", ".join(ARGS) + ");\n")
    assert _cpp_places(cpp) == [("plain_backward", 1)]


def _params(fn):
    return [(p.name, p.default) for p in inspect.signature(fn).parameters.values()
            if p.name != "self"]


def _entry_params(method):
    return [(a.name, inspect.Parameter.empty if a.default is schema.NO_DEFAULT else a.default)
            for a in schema.entry_arguments(method)]


@pytest.mark.parametrize("cls", [ops.CpuKernel, cuda_ops.CudaKernel, graphs.GraphedKernel,
                                 recurrence.PersistentKernel, *interface.PROTOCOLS],
                         ids=lambda c: c.__name__)
def test_every_kernel_method_has_the_tables_parameters(cls):
    methods = [n for n, v in vars(cls).items() if inspect.isfunction(v) and not n.startswith("_")]
    assert methods
    for name in methods:
        assert name in schema.ENTRIES, f"{cls.__name__}.{name} is not an entry of the table"
        assert _params(getattr(cls, name)) == _entry_params(name), (cls.__name__, name)


def test_each_entry_takes_its_operators_arguments():
    """A kernel method's parameters are its operator's (lists for the directions), then its own
    (``in_place``); the operators of the directions and the persistent ones are derived from
    the step operators."""
    base = [(a.name, a.default) for a in schema.arguments("plain_backward")]
    assert [(a.name, a.default) for a in schema.arguments("persistent_backward")] == base + [
        ("blocks", schema.NO_DEFAULT), ("batch_tile", schema.NO_DEFAULT)]
    directions = schema.arguments("plain_directions_backward")
    assert [a.name for a in directions] == ARGS
    assert [a.type for a in directions if a.name != "batch_sizes"][2:] == ["Tensor[]"] * 12
    assert [a.name for a in schema.entry_arguments("plain_directions_forward")] == [
        a.name for a in schema.arguments("plain_forward")] + ["in_place"]


def test_a_call_is_completed_from_the_schema():
    bias_at = schema.positions("scan_backward")["bias"]
    args = tuple(range(bias_at))
    assert schema.complete("scan_backward", args) == args + (None, False)
    assert schema.complete("scan_backward", args, {"bias_grad": True}) == args + (None, True)
    with pytest.raises(TypeError, match="'x' is missing"):
        schema.complete("weight_grad", (1,))
    with pytest.raises(TypeError, match="unknown argument"):
        schema.complete("weight_grad", (1, 2), {"y": 3})


@requires_kernel
@pytest.mark.parametrize("name", ops.OPERATORS)
def test_the_defined_operators_have_the_tables_schemas(name):
    from rnn_ablations.kernels import registry
    registry.cpu_kernel()
    got = str(getattr(torch.ops.rnn_ablations, name).default._schema)
    assert got == "rnn_ablations::" + name + schema.SCHEMAS[name]
