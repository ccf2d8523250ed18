"""The package's imports, every statement walked (those inside functions included): no module
imports itself through others (no cycle), and nothing on the kernel side imports the run layer
or the settings' users above it.

A name imported from a package (``from rnn_ablations import AblatedRNN``) counts as an import of
the module that defines it, which the package's ``__init__.py`` re-exports; a package's
``__init__.py`` is a node of its own for what it does itself.
"""
import ast
from pathlib import Path

import rnn_ablations

ROOT = Path(rnn_ablations.__file__).parent
PACKAGE = "rnn_ablations"

#: the run layer: what decides how a layer runs and carries it out, and the modules above it
RUN_LAYER = {"rnn_ablations.rnn", "rnn_ablations.dispatch", "rnn_ablations.plan",
             "rnn_ablations.aliases", "rnn_ablations.analysis"}
#: the kernel side: the kernels/ package (loading the compiled modules, their operators, autograd
#: Functions, the projection, the scan and the CUDA mechanisms) and the ground floor it may read
#: (the settings, the table and its reference path, the environment switch)
KERNEL_SIDE_MODULES = {"rnn_ablations.settings", "rnn_ablations.functional",
                       "rnn_ablations.variants", "rnn_ablations._env"}


def _kernel_side(module: str) -> bool:
    return module in KERNEL_SIDE_MODULES or module.startswith("rnn_ablations.kernels")


def _modules():
    found = {}
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        parts = list(rel.parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        found[".".join(parts)] = (path, is_package)
    return found


MODULES = _modules()


def _absolute(module: str, is_package: bool, level: int, name) -> str:
    if level == 0:
        return name or ""
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    if level > 1:
        base = base[:len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def _reexports(package: str):
    """``name -> module`` for the names the package's ``__init__.py`` imports from its modules."""
    path, _ = MODULES[package]
    names = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            source = _absolute(package, True, node.level, node.module)
            for alias in node.names:
                target = f"{source}.{alias.name}"
                names[alias.asname or alias.name] = target if target in MODULES else source
    return names


def _resolve(target: str, name: str = None) -> str:
    """The module that an import of ``name`` from ``target`` (or of ``target``) reads."""
    if name is not None and f"{target}.{name}" in MODULES:
        return f"{target}.{name}"
    if name is not None and target in MODULES and MODULES[target][1]:
        again = _reexports(target).get(name)
        if again is not None and again != target:
            return _resolve(again) if again in MODULES else _resolve(*again.rsplit(".", 1))
    return target


def _edges():
    edges = {}
    for module, (path, is_package) in MODULES.items():
        out = edges.setdefault(module, {})
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == PACKAGE:
                        out.setdefault(_resolve(alias.name), node.lineno)
            elif isinstance(node, ast.ImportFrom):
                source = _absolute(module, is_package, node.level, node.module)
                if source.split(".")[0] != PACKAGE:
                    continue
                for alias in node.names:
                    target = _resolve(source, alias.name)
                    if target != module:
                        out.setdefault(target, node.lineno)
    return {m: {t: line for t, line in out.items() if t in MODULES} for m, out in edges.items()}


def _cycles(edges):
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, found = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


EDGES = _edges()


def test_the_walk_sees_the_lazy_imports():
    """The walk reads imports inside functions too (a check of the test itself)."""
    assert "rnn_ablations.kernels.build" in EDGES["rnn_ablations.kernels.loader"]
    assert EDGES["rnn_ablations.rnn"], "rnn.py imports the run layer"
    assert "rnn_ablations.rnn" in EDGES["rnn_ablations.integrations.onmt.encoder"]


def test_no_import_cycle_inside_the_package():
    cycles = _cycles(EDGES)
    described = ["; ".join(f"{a} -> {b} (line {EDGES[a][b]})" for a in comp for b in comp
                           if b in EDGES[a]) for comp in cycles]
    assert not cycles, "import cycles:\n" + "\n".join(described)


def test_the_kernel_side_does_not_import_the_run_layer():
    climbing = [f"{a} -> {b} (line {line})" for a, out in EDGES.items() if _kernel_side(a)
                for b, line in out.items() if not _kernel_side(b)]
    assert not climbing, "imports from the kernel side up to the run layer:\n" + \
        "\n".join(climbing)
    assert RUN_LAYER.isdisjoint(m for m in MODULES if _kernel_side(m))


def test_the_settings_and_the_table_import_nothing_above_them():
    assert set(EDGES["rnn_ablations.settings"]) <= {"rnn_ablations._env"}
    assert set(EDGES["rnn_ablations.variants"]) == set()
