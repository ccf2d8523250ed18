"""The CUDA kernels' instantiations: one NVRTC program per (kernel, cell rules, dtype), its
source, its entry point and the parameter list the launcher packs.

A program is the device header of its family (``csrc/cuda/*.cuh``) and one name expression, the
template instantiation NVRTC compiles (``rnn_ablations::scan_forward_kernel<float, float, 1,
false>``).  The families:

=====================  ==================================  ====================================
family                 instantiated per                    entry point (csrc/cuda/)
=====================  ==================================  ====================================
``step_forward``       dtype (4)                           ``step_forward_kernel`` (step_kernel.cuh)
``step_backward``      dtype (4)                           ``step_backward_kernel``
``scan_forward``       dtype x output rule x highway (24)  ``scan_forward_kernel`` (scan_kernel.cuh)
``scan_backward``      dtype x output rule x highway (24)  ``scan_backward_kernel``
``persistent_forward`` dtype but float64 (3)               ``persistent_forward_kernel``
``persistent_backward`` dtype but float64 (3)              ``persistent_backward_kernel``
=====================  ==================================  ====================================

The step kernels read the cell rules from their ``KernelSpec`` argument (uniform branches), the
scans have the output rule and highway as template arguments (no branch in their loop over T).

``PARAMS`` gives each family's parameters as symbolic C types (``T`` the storage type, ``A`` its
accumulation type): the launcher packs its arguments from this list, and the tests compile a
probe asserting that the kernel's real parameter list is this one (``signature_probe``).
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
from typing import Dict, List, Optional, Tuple

from ...variants import SPEC_MEMORY_RULES

__all__ = ["Program", "DTYPES", "FAMILIES", "PARAMS", "all_programs", "program",
           "source_files", "sources_digest", "CSRC", "signature_probe"]

#: the package's C++/CUDA sources (NVRTC's include path)
CSRC = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", "csrc"))

#: torch dtype name -> (storage type T, accumulation type A) in the device sources
DTYPES: Dict[str, Tuple[str, str]] = {
    "float64": ("double", "double"),
    "float32": ("float", "float"),
    "bfloat16": ("rnn_ablations::BFloat16", "float"),
    "float16": ("rnn_ablations::Half", "float"),
}

#: (the scan is instantiated for a memory cell's output rules: variants.SPEC_MEMORY_RULES;
#: ``RULES`` is that table under the name tests/cuda_emulation reads)
RULES: Dict[int, str] = SPEC_MEMORY_RULES

#: family -> (header, kernel template)
FAMILIES: Dict[str, Tuple[str, str]] = {
    "step_forward": ("cuda/step_kernel.cuh", "rnn_ablations::step_forward_kernel"),
    "step_backward": ("cuda/step_kernel.cuh", "rnn_ablations::step_backward_kernel"),
    "scan_forward": ("cuda/scan_kernel.cuh", "rnn_ablations::scan_forward_kernel"),
    "scan_backward": ("cuda/scan_kernel.cuh", "rnn_ablations::scan_backward_kernel"),
    "persistent_forward": ("cuda/persistent_kernel.cuh",
                           "rnn_ablations::persistent_forward_kernel"),
    "persistent_backward": ("cuda/persistent_kernel.cuh",
                            "rnn_ablations::persistent_backward_kernel"),
}

#: family -> its kernel's parameters, as (name, symbolic C type); ``T*`` / ``A*`` pointers,
#: ``int64`` (int64_t), structs by value (their ctypes twins: structs.py)
PARAMS: Dict[str, List[Tuple[str, str]]] = {
    "step_forward": [
        ("ks", "KernelSpec"), ("n", "int64"), ("H", "int64"), ("xo_stride", "int64"),
        ("gates", "A*"), ("xo", "const T*"), ("c_prev", "const A*"), ("c_out", "A*"),
        ("h_out", "T*"), ("h_pre_out", "A*")],
    "step_backward": [
        ("ks", "KernelSpec"), ("n", "int64"), ("H", "int64"), ("P", "int64"),
        ("gates", "const A*"), ("xo", "const T*"), ("c_cur", "const A*"),
        ("c_prev", "const A*"), ("h_pre", "const A*"), ("dh", "const A*"),
        ("g_out", "const T*"), ("dc", "A*"), ("da", "T*")],
    "scan_forward": [
        ("sp", "ScanSpec"), ("n", "Dims"), ("z", "Strides"), ("len", "const int64*"),
        ("proj", "const T*"), ("bias", "const T*"), ("h0", "const T*"), ("c0", "const T*"),
        ("out", "T*"), ("h_n", "T*"), ("c_n", "T*"), ("cs", "A*")],
    "scan_backward": [
        ("sp", "ScanSpec"), ("n", "Dims"), ("z", "Strides"), ("len", "const int64*"),
        ("g_out", "const T*"), ("g_hn", "const T*"), ("g_cn", "const T*"),
        ("proj", "const T*"), ("bias", "const T*"), ("c0", "const T*"), ("cs", "const A*"),
        ("dproj", "T*"), ("dc0", "T*"), ("dbias_rows", "A*")],
    "persistent_forward": [("a", "PersistentArgs")],
    "persistent_backward": [("a", "PersistentBackwardArgs")],
}


@dataclasses.dataclass(frozen=True)
class Program:
    """One instantiation: ``family`` (FAMILIES), ``dtype`` (DTYPES), and for the scans the
    output rule ``out`` (``variants.SPEC_MEMORY_RULES``) and ``highway``."""

    family: str
    dtype: str
    out: Optional[int] = None
    highway: Optional[bool] = None

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise ValueError(f"unknown CUDA kernel family {self.family!r}; one of "
                             f"{sorted(FAMILIES)}")
        if self.dtype not in DTYPES or (self.family.startswith("persistent")
                                        and self.dtype == "float64"):
            raise ValueError(f"the {self.family} kernel has no {self.dtype} instantiation")
        scan = self.family.startswith("scan")
        if scan != (self.out is not None) or scan != (self.highway is not None):
            raise ValueError(f"{self.family}: the output rule and highway are template "
                             "arguments of the scans only")
        if scan and self.out not in SPEC_MEMORY_RULES:
            raise ValueError(f"{self.family}: output rule {self.out} has no scan instantiation "
                             f"(one of {sorted(SPEC_MEMORY_RULES)})")

    @property
    def name(self) -> str:
        """A short readable name: ``scan_forward[float32,o_tanh,highway]``."""
        parts = [self.dtype]
        if self.out is not None:
            parts.append(SPEC_MEMORY_RULES[self.out])
            if self.highway:
                parts.append("highway")
        return f"{self.family}[{','.join(parts)}]"

    @property
    def header(self) -> str:
        return FAMILIES[self.family][0]

    @property
    def expression(self) -> str:
        """The name expression NVRTC instantiates and lowers."""
        t, a = DTYPES[self.dtype]
        args = [t, a]
        if self.out is not None:
            args += [str(self.out), "true" if self.highway else "false"]
        return f"{FAMILIES[self.family][1]}<{', '.join(args)}>"

    @property
    def source(self) -> str:
        return f'#include "{self.header}"\n'

    @property
    def params(self) -> List[Tuple[str, str]]:
        return PARAMS[self.family]

    def c_params(self) -> List[str]:
        """The parameter list as C types of this instantiation (for the signature probe)."""
        t, a = DTYPES[self.dtype]
        out = []
        for _, sym in self.params:
            if sym in ("PersistentArgs", "PersistentBackwardArgs"):
                out.append(f"rnn_ablations::{sym}<{t}, {a}>")
                continue
            if sym in ("KernelSpec", "ScanSpec", "Dims", "Strides"):
                out.append(f"rnn_ablations::{sym}")
                continue
            const = sym.startswith("const ")
            base = sym[len("const "):] if const else sym
            ptr = base.endswith("*")
            base = base.rstrip("*")
            c = {"T": t, "A": a, "int64": "int64_t", "int32": "int"}[base]
            out.append(("const " if const else "") + c + ("*" if ptr else ""))
        return out


def program(family: str, dtype: str, out: Optional[int] = None,
            highway: Optional[bool] = None) -> Program:
    return Program(family, dtype, out, highway)


def all_programs() -> List[Program]:
    """Every instantiation (what ``precompile --all`` and the NVRTC tests compile)."""
    progs = []
    for dtype in DTYPES:
        progs += [Program("step_forward", dtype), Program("step_backward", dtype)]
        for fam in ("scan_forward", "scan_backward"):
            for out in SPEC_MEMORY_RULES:
                for hw in (False, True):
                    progs.append(Program(fam, dtype, out, hw))
        if dtype != "float64":
            progs += [Program("persistent_forward", dtype), Program("persistent_backward", dtype)]
    return progs


def source_files() -> List[str]:
    """The files NVRTC reads (the device headers and the shared headers they include)."""
    cuda = sorted(os.path.join(CSRC, "cuda", f) for f in os.listdir(os.path.join(CSRC, "cuda"))
                  if f.endswith(".cuh"))
    return cuda + [os.path.join(CSRC, "common", "kernel_spec.h"),
                   os.path.join(CSRC, "common", "elementwise.h")]


_digest: Optional[str] = None


def sources_digest() -> str:
    """SHA-256 of the device sources (names and contents): part of every cache key."""
    global _digest
    if _digest is None:
        h = hashlib.sha256()
        for path in source_files():
            h.update(os.path.relpath(path, CSRC).encode() + b"\0")
            with open(path, "rb") as f:
                h.update(f.read() + b"\0")
        _digest = h.hexdigest()
    return _digest


def signature_probe(progs: List[Program]) -> str:
    """A device source that compiles only if each program's kernel has exactly the parameter
    list the launcher packs (``Program.c_params``)."""
    headers = sorted({p.header for p in progs})
    lines = [f'#include "{h}"' for h in headers]
    lines += ["template <typename X, typename Y> struct rnn_same { static constexpr bool v = false; };",
              "template <typename X> struct rnn_same<X, X> { static constexpr bool v = true; };"]
    for i, p in enumerate(progs):
        sig = ", ".join(p.c_params())
        lines.append(f"static_assert(rnn_same<decltype({p.expression}), void({sig})>::v, "
                     f"\"{p.name}: the kernel's parameters are not the launcher's\");")
    return "\n".join(lines) + "\n"
