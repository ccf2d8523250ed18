"""CONTRIBUTING.md's "Adding an element-wise rule", executed as far as it can be without compiling
new C++: the places it lists exist, the count it states is that list, and they are the only places
that name an output rule (no kernel does: every family runs ``csrc/common/elementwise.h``); rows
built from the table's fields go to the kernel that has their rules (step kernels, element-wise
scan, or neither: the generic path) and compute what the generic path computes."""
import itertools
import re
from pathlib import Path

import pytest
import torch

from conftest import requires_kernel
from rnn_ablations import AblatedRNN, VARIANTS, get_variant, use_backend
from rnn_ablations.kernels.scan import scan_applies
from rnn_ablations.variants import OUTPUT_RULES, VARIANTS_TABLE, Variant

ROOT = Path(__file__).resolve().parents[1]
CSRC = ROOT / "rnn_ablations" / "csrc"
TEXT = (ROOT / "CONTRIBUTING.md").read_text()


def _places():
    """(file, [names]) of each row of CONTRIBUTING.md's list of output-rule places."""
    m = re.search(r"<!-- output-rule places[^>]*-->\n(.*?)<!-- end of output-rule places -->",
                  TEXT, re.S)
    assert m, "CONTRIBUTING.md has no list of output-rule places between its markers"
    rows = []
    for line in m.group(1).strip().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] == "file" or set(cells[0]) <= set("-: "):
            continue  # the header and its rule
        path = re.fullmatch(r"`([^`]+)`", cells[0])
        assert path and len(cells) == 3, f"not a row of file | place | what: {line!r}"
        rows.append((path.group(1), re.findall(r"`([^`]+)`", cells[1])))
    return rows


PLACES = _places()
LISTED = {path for path, _ in PLACES}


def _defines(path: str, name: str) -> bool:
    text = (ROOT / path).read_text()
    if path.endswith(".py"):
        return re.search(rf"^(def\s+{name}\s*\(|{name}\s*[:=])", text, re.M) is not None
    # C++: a type or keyword, then the name, then a parameter list, an enum base or a body
    return re.search(rf"[\w*&]\s+{name}\s*[(:{{]", text) is not None


def _sources():
    return sorted(p for p in CSRC.rglob("*") if p.suffix in (".h", ".cpp", ".cu", ".cuh"))


def _rel(p: Path) -> str:
    return p.relative_to(ROOT).as_posix()


def test_the_stated_count_is_the_list():
    after = re.search(r"changes \*\*(\d+) places in (\d+) files\*\*", TEXT)
    assert after, "CONTRIBUTING.md states no count of places for a new output rule"
    assert (int(after.group(1)), int(after.group(2))) == (len(PLACES), len(LISTED))


@pytest.mark.parametrize("path,names", PLACES, ids=[f"{p}:{','.join(n)}" for p, n in PLACES])
def test_every_listed_place_exists(path, names):
    assert (ROOT / path).is_file(), f"{path} is listed in CONTRIBUTING.md but does not exist"
    assert names, f"the row of {path} names no function or constant"
    for name in names:
        assert _defines(path, name), f"CONTRIBUTING.md lists {name} in {path}; it is not defined there"


def _output_enumerators():
    """The names of OutputRule's values, read from kernel_spec.h (the one place they are
    numbered)."""
    header = (CSRC / "common" / "kernel_spec.h").read_text()
    body = re.search(r"enum OutputRule\s*:\s*int\s*\{(.*?)\};", header, re.S)
    assert body, "kernel_spec.h has no enum OutputRule"
    names = re.findall(r"\b(k\w+)\s*=", body.group(1))
    assert len(names) == len(OUTPUT_RULES)  # one per rule of the table
    return names


def test_only_the_listed_places_name_an_output_rule():
    """No kernel branches on a particular output rule: the enumerators appear in the listed C++
    files only, every switch on a rule is kernel_spec.h's, and among the Python modules only the
    listed ones compare a variant's output rule."""
    names = re.compile(r"\b(" + "|".join(_output_enumerators()) + r")\b")
    naming = {_rel(p) for p in _sources() if names.search(p.read_text())}
    assert naming and naming <= LISTED, f"files that name an output rule but are not listed: " \
                                        f"{sorted(naming - LISTED)}"
    switching = {_rel(p) for p in _sources()
                 if re.search(r"switch\s*\([^)]*output", p.read_text())}
    assert switching == {"rnn_ablations/csrc/common/kernel_spec.h"}, switching
    comparing = {p.relative_to(ROOT).as_posix() for p in (ROOT / "rnn_ablations").rglob("*.py")
                 # (whether a cell has memory, output rule "content" or not, is no rule's own)
                 if re.search(r"\.output\s*(==|!=|\bin\b)(?!\s*SPEC_OUT_CONTENT\b)", p.read_text())}
    assert comparing <= LISTED, f"modules that compare an output rule but are not listed: " \
                                f"{sorted(comparing - LISTED)}"


def test_every_kernel_family_runs_the_shared_templates():
    """The kernels named in the recipe call elementwise.h's rules (so a rule added there reaches
    them all): the step kernels cell_output and cell_grad, the three scans the scan elements."""
    callers = {
        "cpu/vec_impl.h": ("cell_output", "cell_grad", "with_output_rule"),
        "cuda/forward_element.cuh": ("cell_output",),
        "cuda/backward_element.cuh": ("cell_grad",),
        "cpu/scan_rows_impl.h": ("scan_forward_element", "scan_backward_element",
                                 "with_output_rule"),
        "cuda/scan_kernel.cuh": ("scan_forward_element", "scan_backward_element"),
    }
    for path, called in callers.items():
        text = (CSRC / path).read_text()
        for name in called:
            assert re.search(rf"\b{name}\b\s*(<[^;()]*>)?\s*\(", text), f"{path} does not call {name}"
    # both CPU lane types run those row loops
    for path in ("cpu/scan.cpp", "cpu/scan_rows_avx2.cpp"):
        text = (CSRC / path).read_text()
        assert '#include "scan_rows_impl.h"' in text, f"{path} does not include the row loops"
        assert re.search(r"\brun_(forward|backward)_rows\s*<", text), f"{path} runs no row loop"
    # the scan has no numbering of its own
    assert not re.search(r"\bScanOutput\b|\bscan_layout\s*\(|OUTPUT_CODES",
                         "".join(p.read_text() for p in _sources())
                         + (ROOT / "rnn_ablations" / "kernels" / "scan.py").read_text())


# ------------------------------------------------------------ a rule that is not an output rule
def _rule_places():
    """(file, [names]) of each row of CONTRIBUTING.md's list of non-output rule places."""
    m = re.search(r"<!-- non-output rule places[^>]*-->\n(.*?)<!-- end of non-output rule places -->",
                  TEXT, re.S)
    assert m, "CONTRIBUTING.md has no list of non-output rule places between its markers"
    rows = []
    for line in m.group(1).strip().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] == "file" or set(cells[0]) <= set("-: "):
            continue
        path = re.fullmatch(r"`([^`]+)`", cells[0])
        place = re.fullmatch(r"`([^`]+)`", cells[1])
        assert path and place and len(cells) == 3, f"not a row of file | place | what: {line!r}"
        rows.append((path.group(1), place.group(1)))
    return rows


RULE_PLACES = _rule_places()


def _defines_anywhere(path: str, name: str) -> bool:
    """``name`` is defined in ``path``: a function, method, class or constant (Python), or a
    function, struct or constant (C++)."""
    text = (ROOT / path).read_text()
    if path.endswith(".py"):
        return re.search(rf"^\s*(def\s+{name}\s*\(|class\s+{name}\b|{name}\s*[:=])", text,
                         re.M) is not None
    return re.search(rf"([\w*&]\s+{name}\s*[(:{{=]|struct\s+{name}\b)", text) is not None


def test_the_non_output_rule_count_is_the_list():
    stated = re.search(r"A new content activation is \*\*(\d+) edits in (\d+) files\*\*",
                       TEXT)
    assert stated, "CONTRIBUTING.md states no count of places for a new non-output rule"
    assert len(set(RULE_PLACES)) == len(RULE_PLACES), "a place is listed twice"
    assert (int(stated.group(1)), int(stated.group(2))) == (
        len(RULE_PLACES), len({p for p, _ in RULE_PLACES}))


@pytest.mark.parametrize("path,name", RULE_PLACES, ids=[f"{p}:{n}" for p, n in RULE_PLACES])
def test_every_listed_non_output_place_exists(path, name):
    assert (ROOT / path).is_file(), f"{path} is listed in CONTRIBUTING.md but does not exist"
    assert _defines_anywhere(path, name), \
        f"CONTRIBUTING.md lists {name} in {path}; it is not defined there"


#: how the sources read the content activation: the row's field, the decoded flag, the bit,
#: the template argument of the shared maths
_READS_ACTIVATION = re.compile(r"\bcontent_activation\b|\bcontent_tanh\b|\bkSpecContentTanh\b|"
                               r"\bContentTanh\b|SPEC_FIELDS\[\"content_tanh\"\]")


def test_only_the_listed_files_read_the_content_activation():
    """Every source file of the package that reads the content activation (the row's field, the
    decoded flag or its bit) is in the list, so a new activation added at the listed places
    reaches every reader: the list misses no file (as it missed the CUDA launcher's decoder and
    the export loop's layout before they were listed)."""
    pkg = ROOT / "rnn_ablations"
    reading = {p.relative_to(ROOT).as_posix() for p in pkg.rglob("*")
               if p.suffix in (".py", ".h", ".cpp", ".cu", ".cuh")
               and "__pycache__" not in p.parts and _READS_ACTIVATION.search(p.read_text())}
    listed = {p for p, _ in RULE_PLACES}
    assert reading and reading <= listed, \
        f"files that read the content activation but are not listed: {sorted(reading - listed)}"
    assert listed <= reading, f"listed files that do not read it: {sorted(listed - reading)}"


# --------------------------------------------------------------------------- rows from the fields
def _row(name, code, output, activation, reads_hidden, content_recurrent):
    """A row in the order the kernels read (CONTRIBUTING.md), from the table's field values;
    None where the table refuses the combination."""
    memory = output != "content"
    gates = (("i", "f") + (("o",) if output == "o_tanh" else ())) if memory else ()
    if content_recurrent:  # (reads h_{t-1})
        fields = dict(recurrent=gates[:2] + ("g",) + gates[2:], content_block="g")
    elif reads_hidden:
        fields = dict(recurrent=gates, input_only=("c",), content_block="c")
    else:
        fields = dict(recurrent=(), input_only_biased=gates, input_only=("c",), content_block="c")
    try:
        return Variant(name=name, paper_name=name, code=code, content_activation=activation,
                       has_memory=memory, output=output,
                       context_independent_content=not content_recurrent,
                       equations="a row of the recipe's test", **fields)
    except ValueError:
        return None


def _rows():
    activations = sorted({get_variant(n).content_activation for n in VARIANTS})
    outputs = list(OUTPUT_RULES)
    assert {get_variant(n).output for n in VARIANTS} <= set(outputs)
    sources = [(True, True), (True, False), (False, False)]  # (reads h_{t-1}, content recurrent)
    rows = []
    for k, (output, activation, (reads, recurrent)) in enumerate(
            itertools.product(outputs, activations, sources)):
        v = _row(f"recipe_{output}_{activation}_{k}", 300 + k, output, activation, reads,
                 recurrent)
        if v is not None:
            rows.append(v)
    return rows


ROWS = _rows()


def test_the_rows_cover_every_kernel():
    assert any(v.has_step_kernel for v in ROWS)
    assert any(scan_applies(v) for v in ROWS)
    assert any(not v.has_step_kernel and not scan_applies(v) for v in ROWS)  # generic only
    shipped = {get_variant(n).kernel_spec for n in VARIANTS}
    assert shipped <= {v.kernel_spec for v in ROWS}  # the table's own rows are among them


def _accepts(describe, v, highway):
    try:
        return describe(v.kernel_spec, highway)
    except RuntimeError:
        return None


@requires_kernel
@pytest.mark.parametrize("highway", [False, True])
def test_each_row_goes_to_the_kernel_that_has_its_rules(highway):
    from rnn_ablations import _C
    for v in ROWS:
        step = _accepts(_C.describe_kernel_spec, v, highway)
        scan = _accepts(_C.describe_scan_spec, v, highway)
        assert (step is not None) == v.has_step_kernel, v.name
        assert (scan is not None) == scan_applies(v), v.name
        assert step is None or scan is None, v.name
        for view in (step, scan):
            if view is not None:
                assert view["output"] == v.output, v.name
                rec, inp = v.blocks(highway)
                role = {v.content_block: "content"}
                assert view["recurrent"] == [role.get(b, b) for b in rec], v.name
                assert view["input_only"] == [role.get(b, b) for b in inp], v.name


@requires_kernel
@pytest.mark.parametrize("highway", [False, True])
@pytest.mark.parametrize("name", [v.name for v in ROWS
                                  if scan_applies(v) and v.kernel_spec not in
                                  {get_variant(n).kernel_spec for n in VARIANTS}])
def test_a_new_scan_row_runs_on_the_scan_kernel(monkeypatch, name, highway):
    """A cell that reads no h_{t-1} with an output rule no shipped variant gives it runs on the
    element-wise scan (no code but the row) and agrees with the generic path, forward and
    backward, padded and bidirectional."""
    v = next(r for r in ROWS if r.name == name)
    monkeypatch.setitem(VARIANTS_TABLE, v.name, v)
    torch.manual_seed(0)
    m = AblatedRNN(v.name, 4, 5, num_layers=2, bidirectional=True, highway=highway).double()
    x = torch.randn(6, 3, 4, dtype=torch.float64, requires_grad=True)
    import rnn_ablations.dispatch as dispatch_module
    reference = dispatch_module.generic_directions
    results = {}
    for backend in ("generic", "kernel"):
        def only_generic(*args, _backend=backend):
            assert _backend == "generic", "the kernel backend ran the generic path"
            return reference(*args)
        monkeypatch.setattr(dispatch_module, "generic_directions", only_generic)
        with use_backend(backend):
            out, (h, c) = m(x, lengths=[6, 4, 1])
            grads = torch.autograd.grad(out.square().sum() + h.sum() + 2 * c.sum(),
                                        [x, *m.parameters()])
        results[backend] = [out, h, c, *grads]
    for a, b in zip(results["generic"], results["kernel"]):
        torch.testing.assert_close(a, b)
