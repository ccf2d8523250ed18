"""The cell spec has one encoding (``rnn_ablations/variants.py``: ``SPEC_OUTPUT``,
``SPEC_FIELDS``, ``SPEC_OUTPUT_MASK``, ``SPEC_TAG``, ``SPEC_TAG_MASK``): the C++ header's
constants (``csrc/common/kernel_spec.h``) equal it, the CUDA launcher's constants
(``kernels/cuda/structs.py``, ``kernels/cuda/programs.py``) are derived from it, and no Python
module spells the output codes out a second time."""
import re
from pathlib import Path

from rnn_ablations import variants
from rnn_ablations.variants import output_flags
from rnn_ablations.kernels.cuda import programs, structs

PACKAGE = Path(variants.__file__).parent
HEADER = PACKAGE / "csrc" / "common" / "kernel_spec.h"


def _header_constants():
    text = HEADER.read_text()
    enum = re.search(r"enum OutputRule : int \{([^}]*)\}", text).group(1)
    rules = {name: int(value) for name, value in re.findall(r"(kOut\w+) = (\d+)", enum)}
    bits = {}
    for name, expr in re.findall(r"constexpr int64_t (kSpec\w+) = ([^;]+);", text):
        expr = re.sub(r"int64_t\{(\w+)\}", r"\1", expr)
        if "|" not in expr:
            bits[name] = eval(expr, {})  # a literal or a shift of literals
    names = dict(re.findall(r"case (kOut\w+): return \"(\w+)\";", text))
    return rules, bits, names


def test_the_header_matches_the_variant_table_encoding():
    rules, bits, names = _header_constants()
    assert {names[k]: v for k, v in rules.items()} == variants.SPEC_OUTPUT
    assert bits == {"kSpecOutputMask": variants.SPEC_OUTPUT_MASK,
                    "kSpecContentInputOnly": variants.SPEC_FIELDS["content_input_only"],
                    "kSpecContentTanh": variants.SPEC_FIELDS["content_tanh"],
                    "kSpecMemory": variants.SPEC_FIELDS["memory"],
                    "kSpecReadsHidden": variants.SPEC_FIELDS["reads_hidden"],
                    "kSpecTag": variants.SPEC_TAG, "kSpecTagMask": variants.SPEC_TAG_MASK}
    # the output rule's bits and the fields do not overlap
    fields = list(variants.SPEC_FIELDS.values()) + [variants.SPEC_OUTPUT_MASK,
                                                    variants.SPEC_TAG_MASK]
    for a in range(len(fields)):
        for b in range(a + 1, len(fields)):
            assert fields[a] & fields[b] == 0


def test_the_cuda_launcher_derives_its_constants():
    assert variants.SPEC_RULE_NAMES == {c: n for n, c in variants.SPEC_OUTPUT.items()}
    assert {c for c in variants.SPEC_RULE_NAMES if structs.output_has_gate(c)} == \
        {variants.SPEC_OUTPUT[n] for n in ("o_tanh",)}
    assert set(variants.SPEC_MEMORY_RULES.values()) == set(variants.OUTPUT_RULES) - {"content"}
    scans = {p.out for p in programs.all_programs() if p.family.startswith("scan")}
    assert scans == set(variants.SPEC_MEMORY_RULES)
    for name, variant in variants.VARIANTS_TABLE.items():
        code = variant.kernel_spec & variants.SPEC_OUTPUT_MASK
        assert variants.SPEC_RULE_NAMES[code] == variant.output, name
        if variant.reads_hidden:  # the step kernels' decoder
            spec = structs.decode_kernel_spec(variant.kernel_spec, False, "test")
            assert variants.SPEC_RULE_NAMES[spec.output] == variant.output, name


def test_one_name_per_spec_constant():
    """The spec's constants are defined in variants.py only: no module of the package binds a
    name of its own to one of them (an alias such as ``RULE_NAMES = SPEC_RULE_NAMES``)."""
    import ast
    from pathlib import Path
    names = {n for n in vars(variants) if n.startswith("SPEC_")}
    package = Path(variants.__file__).parent
    aliases = []
    for path in package.rglob("*.py"):
        if path == package / "variants.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                value = node.value
                if isinstance(value, ast.Subscript):
                    value = value.value
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if isinstance(value, ast.Name) and value.id in names:
                    aliases += [f"{path.relative_to(package).as_posix()}: {t.id}"
                                for t in targets if isinstance(t, ast.Name)]
    # (programs.RULES: the name the CUDA emulation's tests read)
    assert aliases == ["kernels/cuda/programs.py: RULES"], aliases


def test_output_flags_follow_the_header_rules():
    """variants.output_flags says what kernel_spec.h's output_has_gate / output_reads_tanh say."""
    text = HEADER.read_text()
    rules, _, names = _header_constants()
    code_of = {names[k]: v for k, v in rules.items()}

    def reads(function):
        body = re.search(function + r"\(int out\) \{(.*?)\}", text, re.S).group(1)
        return {n for n, k in ((names[k], k) for k in rules) if re.search(rf"\b{k}\b", body)}

    gated, tanh = reads("output_has_gate"), reads("output_reads_tanh")
    for rule in variants.OUTPUT_RULES:
        assert output_flags(rule) == (rule in gated, rule in tanh), rule
        assert structs.output_has_gate(code_of[rule]) == (rule in gated), rule


def test_no_second_copy_of_the_output_codes():
    pattern = re.compile(r"[\"']o_tanh[\"']\s*:\s*1|1\s*:\s*[\"']o_tanh[\"']")
    copies = [str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
              if pattern.search(p.read_text())]
    assert copies == ["variants.py"], copies
