"""Names in the prose point at what exists: every file path (``rnn_ablations/...py``,
``csrc/...``, ``kernels/...``, a bare ``name.cu``), every ``rnn_ablations.module.name``, every
``module.name`` of the package's modules written as code, and every Sphinx role's target
(``:func:`name```) named in docstrings and comments of the package's Python and C++ sources and
in README.md, CONTRIBUTING.md and docs/*.md exists (read with ``ast``, nothing is imported)."""
from __future__ import annotations

import ast
import io
import os
import re
import subprocess
import tokenize
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "rnn_ablations"

#: headers and files of other projects (the compiler's, torch's, CUDA's, AllenNLP's)
EXTERNAL = re.compile(r"^(ATen|c10|torch|allennlp|onmt)/|^(immintrin|cuda|cuda_fp16|cuda_bf16|"
                      r"cooperative_groups|Python|nvrtc|cublas_v2)\.h$")
EXT = r"(?:py|cpp|cuh|cu|h)"
PATH_RE = re.compile(r"(?<![\w/.$<-])((?:[\w.-]+/)*[\w-]+\.%s)(?![\w/(])" % EXT)
CODE_RE = re.compile(r"``([^`]+)``|`([^`]+)`")
ROLE_RE = re.compile(r":(?:func|class|data|meth|mod|attr|exc):`~?([\w.]+)`")
DOTTED_RE = re.compile(r"(?<![\w.\"'])(rnn_ablations(?:\.\w+)+)")
SHORT_RE = re.compile(r"(?<![\w./])([a-z_]\w*)\.(?!(?:py|cpp|cuh|cu|h|md|txt|json|so)\b)"
                      r"([A-Za-z_]\w*)(?:\.([A-Za-z_]\w*))?(?![\w/])")


@lru_cache(maxsize=None)
def _files():
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    if out.returncode:
        pytest.skip("not a git checkout: the tracked files cannot be listed")
    return tuple(out.stdout.split())


@lru_cache(maxsize=None)
def _modules():
    """``{dotted module name: path}`` of the package."""
    found = {}
    for f in _files():
        if f.startswith("rnn_ablations/") and f.endswith(".py"):
            parts = f[:-3].split("/")
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = ROOT / f
    return found


@lru_cache(maxsize=None)
def _names(path: Path):
    """Top-level names of a module (functions, classes, assignments, imports, ``__getattr__``
    names it spells out), and every class's members, as ``{name: set of member names}``."""
    tree = ast.parse(path.read_text())
    names = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names[node.name] = set()
        elif isinstance(node, ast.ClassDef):
            members = set()
            for item in ast.walk(node):
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    members.add(item.name)
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    members.add(item.target.id)
                elif isinstance(item, ast.Assign):
                    members |= {t.id for t in item.targets if isinstance(t, ast.Name)}
                elif isinstance(item, ast.Attribute) and isinstance(item.value, ast.Name) \
                        and item.value.id == "self":
                    members.add(item.attr)
            names[node.name] = members
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        names[n.id] = set()
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                names[(alias.asname or alias.name).split(".")[0]] = set()
        elif isinstance(node, (ast.If, ast.Try)):
            for sub in ast.walk(node):
                if isinstance(sub, (ast.FunctionDef, ast.ClassDef)):
                    names.setdefault(sub.name, set())
                elif isinstance(sub, (ast.Import, ast.ImportFrom)):
                    for alias in sub.names:
                        names[(alias.asname or alias.name).split(".")[0]] = set()
                elif isinstance(sub, ast.Assign):
                    for t in sub.targets:
                        if isinstance(t, ast.Name):
                            names[t.id] = set()
    if "__getattr__" in names:  # module attributes served by __getattr__: its string constants
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and node.value.isidentifier():
                names.setdefault(node.value, set())
    return names


def _resolve(dotted: str) -> bool:
    """Whether ``rnn_ablations.a.b.c`` is a module, or a module's name (and member)."""
    modules = _modules()
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        module = ".".join(parts[:cut])
        if module in modules:
            rest = parts[cut:]
            if not rest:
                return True
            names = _names(modules[module])
            if rest[0] not in names:
                # a submodule's name (a package's __init__ need not import it)
                return f"{module}.{rest[0]}" in modules
            return len(rest) == 1 or rest[1] in names[rest[0]] or not names[rest[0]]
    return False


@lru_cache(maxsize=None)
def _by_basename():
    table = {}
    for name, path in _modules().items():
        table.setdefault(name.rsplit(".", 1)[-1], []).append(name)
    return table


#: module base names also common as variable names or other libraries' modules: ``module.name``
#: with these is read only as ``rnn_ablations.…`` or a Sphinx role
_AMBIGUOUS = {"rnn_ablations", "cli", "core", "data", "model", "configs", "params", "cuda",
              "plot", "lm", "commands", "integrations", "visualize", "kernels", "variants",
              "settings", "model", "scan", "ops", "build", "cache", "driver", "nvrtc", "export",
              "plan", "functional", "analysis", "checkpoints", "trainer", "interrupt",
              "distributed", "evaluation", "synthetic", "rundir", "corpora", "schedulers",
              "predictors", "encoders", "loaders", "embedded", "machine", "speed", "aliases",
              "validation", "reproduce", "ablate", "onmt", "allennlp", "host", "main", "rnn",
              "encoder", "options", "translate"}

#: compiled modules (built, not tracked): the CPU kernel
BUILT = {"rnn_ablations._C"}


def _resolve_short(first: str, second: str, third) -> bool:
    for module in _by_basename().get(first, []):
        if _resolve(f"{module}.{second}" + (f".{third}" if third else "")):
            return True
        if third and _resolve(f"{module}.{second}"):
            return True
    return False


def _path_exists(ref: str, source: str) -> bool:
    files = set(_files())
    bases = ["", "rnn_ablations/", "rnn_ablations/kernels/", "rnn_ablations/csrc/",
             str(Path(source).parent) + "/"]
    if any(os.path.normpath(base + ref) in files for base in bases):
        return True
    if "/" not in ref:
        return any(Path(f).name == ref for f in files)
    return any(f.endswith("/" + ref) for f in files)


def _python_prose(path: Path):
    """``(line, text)`` of a module's docstrings (every string that is a statement of its own)
    and comments."""
    text = path.read_text()
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) \
                and isinstance(node.value.value, str):
            for i, line in enumerate(node.value.value.splitlines()):
                yield node.lineno + i, line


def _cpp_prose(path: Path):
    text = path.read_text()
    for m in re.finditer(r"//[^\n]*|/\*.*?\*/", text, re.S):
        start = text.count("\n", 0, m.start()) + 1
        for i, line in enumerate(m.group(0).splitlines()):
            yield start + i, line


def _sources():
    for f in _files():
        if f.startswith("rnn_ablations/") and f.endswith(".py"):
            yield f, _python_prose(ROOT / f), _module_of(f)
        elif f.startswith("rnn_ablations/csrc/") and f.endswith((".h", ".cpp", ".cuh", ".cu")):
            yield f, _cpp_prose(ROOT / f), None
        elif f in ("README.md", "CONTRIBUTING.md") or (f.startswith("docs/") and
                                                        f.endswith(".md")):
            yield f, enumerate((ROOT / f).read_text().splitlines(), 1), None


def _module_of(f: str):
    return {str(p.relative_to(ROOT)): m for m, p in _modules().items()}.get(f)


def stale_names():
    """Every name in the prose that points at nothing, as ``file:line: name``."""
    stale = set()
    for source, lines, module in _sources():
        markdown = source.endswith(".md")
        for n, line in lines:
            for m in PATH_RE.finditer(line):
                ref = m.group(1)
                if EXTERNAL.search(ref) or "://" in line[:m.start()]:
                    continue
                if "/" not in ref and not markdown and not ref.startswith(("_", "csrc")) \
                        and ref.count(".") > 1:
                    continue
                if not _path_exists(ref, source):
                    stale.add(f"{source}:{n}: {ref}")
            for m in DOTTED_RE.finditer(line):
                ref = m.group(1).rstrip(".")
                if ref not in BUILT and not _resolve(ref):
                    stale.add(f"{source}:{n}: {ref}")
            if module is not None:
                for m in ROLE_RE.finditer(line):
                    ref = m.group(1)
                    if ref.startswith("."):  # relative to the module's package
                        package = (module if _modules()[module].name == "__init__.py"
                                   else module.rsplit(".", 1)[0])
                        ok = _resolve(package + ref)
                    elif ref.split(".")[0] in _AMBIGUOUS - {"rnn_ablations"} \
                            or ref.split(".")[0] not in _by_basename() and "." in ref \
                            and ref.split(".")[0] != "rnn_ablations":
                        ok = True  # another library's name, or one this check cannot place
                    elif "." in ref:
                        ok = (_resolve(ref) or _resolve("rnn_ablations." + ref)
                              or _resolve(module.rsplit(".", 1)[0] + "." + ref)
                              or _resolve(module + "." + ref)
                              or _resolve_short(*(ref.split(".") + [None])[:3])
                              or not ref.startswith(("rnn_ablations", ".")) and
                              ref.split(".")[0] not in _by_basename())
                    else:
                        names = _names(_modules()[module])
                        ok = (ref in names or _resolve(module + "." + ref)
                              or ref in _names(_modules()["rnn_ablations"])  # the package's
                              or (ROOT / f"{ref}.py").exists()  # a top-level module
                              or any(ref in members for members in names.values()))  # a member
                    if not ok:
                        stale.add(f"{source}:{n}: {ref}")
            for span in CODE_RE.finditer(line):
                code = span.group(1) or span.group(2)
                for m in SHORT_RE.finditer(code):
                    first, second, third = m.groups()
                    if first in _by_basename() and first not in _AMBIGUOUS:
                        if not _resolve_short(first, second, third):
                            stale.add(f"{source}:{n}: {m.group(0)}")
    return sorted(stale)


#: names this test knows to be stale in a file it may not fix (``file: name``): each entry must
#: still be found, so the list only shrinks
KNOWN_STALE: dict = {}


def test_every_named_file_and_function_exists():
    stale = stale_names()
    known = [s for s in stale if s.split(": ", 1)[1] in KNOWN_STALE.get(s.split(":", 1)[0], ())]
    for source, names in KNOWN_STALE.items():
        for name in names:
            assert any(s.startswith(source + ":") and s.endswith(": " + name) for s in known), \
                f"{source}: {name} is no longer stale: remove it from KNOWN_STALE"
    rest = [s for s in stale if s not in known]
    assert not rest, "names that point at nothing:\n" + "\n".join(rest)


def test_a_stale_name_is_found(tmp_path, monkeypatch):
    """The check finds a moved file, a moved function and a role's missing target."""
    doc = ROOT / "rnn_ablations" / "kernels" / "interface.py"
    fake = ('"""See ``kernels/cuda/spec.py``, ``dispatch.run_layers``, '
            'rnn_ablations.kernels.scan.run_scan_layer and :func:`no_such_function`."""\n')
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: fake if self == doc
                        else Path.open(self).read())
    got = [s for s in stale_names() if s.startswith("rnn_ablations/kernels/interface.py")]
    for name in ("kernels/cuda/spec.py", "dispatch.run_layers",
                 "rnn_ablations.kernels.scan.run_scan_layer", "no_such_function"):
        assert any(s.endswith(": " + name) for s in got), (name, got)
