"""``csrc/common/`` holds only what the CPU and the CUDA kernels both compile: a header there
includes torch or ATen only inside ``#if !defined(__CUDACC_RTC__)`` (host code, which NVRTC never
sees), and every one of them is included by both sides."""
import re
from pathlib import Path

import rnn_ablations

CSRC = Path(rnn_ablations.__file__).resolve().parent / "csrc"
TORCH_INCLUDE = re.compile(r'#include\s*[<"](ATen|torch|c10|c10d)/')


def _includes(folder: str):
    text = "\n".join(p.read_text() for p in sorted((CSRC / folder).rglob("*"))
                     if p.suffix in (".h", ".cpp", ".cuh"))
    return text


def _unguarded_torch_includes(text: str):
    """The torch/ATen includes of ``text`` outside every ``#if !defined(__CUDACC_RTC__)`` block."""
    stack, found = [], []
    for n, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if s.startswith("#if"):
            stack.append("!defined(__CUDACC_RTC__)" in s.replace(" ", ""))
        elif s.startswith("#endif"):
            stack.pop()
        elif s.startswith("#else") and stack:
            stack[-1] = not stack[-1] and False
        elif TORCH_INCLUDE.match(s) and not any(stack):
            found.append(f"line {n}: {s}")
    return found


def test_the_layout_check_sees_an_unguarded_include():
    assert _unguarded_torch_includes('#include <ATen/ATen.h>\n')
    assert not _unguarded_torch_includes(
        '#if !defined(__CUDACC_RTC__)\n#include <c10/util/Exception.h>\n#endif\n')


def test_common_headers_include_no_torch():
    found = [f"{p.name}: {hit}" for p in sorted((CSRC / "common").glob("*"))
             for hit in _unguarded_torch_includes(p.read_text())]
    assert not found, ("csrc/common/ must compile under NVRTC (no torch headers); move a header "
                       f"that needs ATen to csrc/cpu/: {found}")


def test_common_headers_are_shared_by_both_kernels():
    cpu, cuda = _includes("cpu") + (CSRC / "bindings.cpp").read_text(), _includes("cuda")
    for header in sorted((CSRC / "common").glob("*.h")):
        assert header.name in cpu, f"common/{header.name} is not used by the CPU kernel"
        assert header.name in cuda, f"common/{header.name} is not used by the CUDA kernels"
