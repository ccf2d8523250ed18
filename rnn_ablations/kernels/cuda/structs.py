"""The CUDA kernels' by-value arguments as ctypes Structures, with the layout of the C structs in
``csrc/common/kernel_spec.h`` (KernelSpec, ScanSpec), ``csrc/cuda/scan_kernel.cuh`` (Dims,
Strides) and ``csrc/cuda/persistent_kernel.cuh`` (PersistentArgs, PersistentBackwardArgs), and
the decoders that fill the spec structs from ``Variant.kernel_spec``.

The decoders read the code exactly as ``decode_kernel_spec`` / ``decode_scan_spec`` in
``kernel_spec.h`` do (the CPU kernel's; ``tests/kernels/test_nvrtc_kernels.py`` compares them on every
variant and on refused codes) and refuse what those refuse, with the same reasons.  The layouts
are checked by probes that compile only when they agree: NVRTC for each struct's size and
alignment on the device (``layout_probe``), the host C++ compiler for each field's offset
(``host_layout_probe``).
"""
from __future__ import annotations

import ctypes
from typing import Dict, List, Tuple

from ...variants import (SPEC_FIELDS, SPEC_GATED, SPEC_KNOWN_BITS, SPEC_OUT_CONTENT,
                         SPEC_OUTPUT_MASK, SPEC_RULE_NAMES, SPEC_TAG, SPEC_TAG_MASK)

__all__ = ["KernelSpec", "ScanSpec", "Dims", "Strides", "persistent_args",
           "persistent_backward_args", "decode_kernel_spec", "decode_scan_spec",
           "check_kernel_spec", "check_scan_spec", "CHUNK_STEPS", "layout_probe", "host_layout_probe",
           "kernel_spec_blocks", "scan_spec_blocks"]

# common/kernel_spec.h's encoding is rnn_ablations/variants.py's (SPEC_*), read under its names
SCAN_BLOCKS = ("i", "f", "o", "r", "content", "hw")  # ScanBlock order


def output_has_gate(out: int) -> bool:
    """kernel_spec.h output_has_gate: the rule reads an output gate o (a block of its own)."""
    return out in SPEC_GATED

#: persistent_kernel.cuh kChunkSteps: steps per launch (active row counts in the parameters)
CHUNK_STEPS = 1024


class KernelSpec(ctypes.Structure):
    _fields_ = [("output", ctypes.c_int), ("memory", ctypes.c_bool),
                ("content_recurrent", ctypes.c_bool), ("content_tanh", ctypes.c_bool),
                ("highway", ctypes.c_bool), ("R", ctypes.c_int64), ("X", ctypes.c_int64),
                ("content_block", ctypes.c_int64), ("out_gate_block", ctypes.c_int64)]


class ScanSpec(ctypes.Structure):
    _fields_ = [("output", ctypes.c_int), ("highway", ctypes.c_bool), ("G", ctypes.c_int64),
                ("block", ctypes.c_int64 * len(SCAN_BLOCKS))]


class Dims(ctypes.Structure):
    _fields_ = [(n, ctypes.c_int64) for n in ("T", "B", "D", "H", "G")]


class Strides(ctypes.Structure):
    _fields_ = [(n, ctypes.c_int64) for n in ("p_st", "p_sb", "o_st", "o_sb", "g_st", "g_sb")]


_P = ctypes.c_void_p


class PersistentArgs(ctypes.Structure):
    """PersistentArgs<T, A> (the same layout for every T, A: pointers only)."""
    _fields_ = [("ks", KernelSpec)] + [(n, ctypes.c_int) for n in (
        "H", "B", "P", "U", "bt", "t0", "steps", "n_after")] + [(n, _P) for n in (
            "proj", "w_hh", "h0", "c0", "mask", "out", "cs", "gates", "hin", "h_n", "c_n",
            "barrier")] + [("n", ctypes.c_uint16 * CHUNK_STEPS)]


class PersistentBackwardArgs(ctypes.Structure):
    """PersistentBackwardArgs<T, A>."""
    _fields_ = [("ks", KernelSpec)] + [(n, ctypes.c_int) for n in (
        "H", "B", "P", "U", "bt", "t_hi", "steps")] + [(n, _P) for n in (
            "proj", "w_hh", "gates", "cs", "c0", "hin", "g_out", "mask", "dproj", "dh", "dc",
            "barrier")] + [("n", ctypes.c_uint16 * CHUNK_STEPS)]


def persistent_args() -> PersistentArgs:
    return PersistentArgs()


def persistent_backward_args() -> PersistentBackwardArgs:
    return PersistentBackwardArgs()


STRUCTS: Dict[str, type] = {"KernelSpec": KernelSpec, "ScanSpec": ScanSpec, "Dims": Dims,
                            "Strides": Strides, "PersistentArgs": PersistentArgs,
                            "PersistentBackwardArgs": PersistentBackwardArgs}


def _check_tag(code: int, who: str) -> None:
    if (code & SPEC_TAG_MASK) != SPEC_TAG or (code & ~SPEC_KNOWN_BITS) != 0:
        raise RuntimeError(f"{who}: unknown kernel spec {code} (pass Variant.kernel_spec from "
                           "rnn_ablations/variants.py, not a variant id or Variant.code)")
    if (code & SPEC_OUTPUT_MASK) not in SPEC_RULE_NAMES:
        raise RuntimeError(f"{who}: kernel spec {code}: output rule {code & SPEC_OUTPUT_MASK} is "
                           "not one of kernel_spec.h's (OutputRule); a new rule is numbered there "
                           "and in rnn_ablations/variants.py SPEC_OUTPUT (CONTRIBUTING.md, "
                           "'Adding an element-wise rule')")


def decode_kernel_spec(code: int, highway: bool, who: str) -> KernelSpec:
    """kernel_spec.h decode_kernel_spec: the step kernels' view of ``code``, or RuntimeError."""
    code, highway = int(code), bool(highway)
    _check_tag(code, who)
    s = KernelSpec()
    s.output = code & SPEC_OUTPUT_MASK
    s.memory = (code & SPEC_FIELDS["memory"]) != 0
    s.content_recurrent = (code & SPEC_FIELDS["content_input_only"]) == 0
    s.content_tanh = (code & SPEC_FIELDS["content_tanh"]) != 0
    s.highway = highway
    if not code & SPEC_FIELDS["reads_hidden"]:
        raise RuntimeError(
            f"{who}: kernel spec {code} is a cell whose gates read no h_{{t-1}} (such as "
            "lstm_minus_srnn_minus_hidden); it has no step kernel and runs through scan_forward "
            "/ scan_backward (rnn_ablations/kernels/scan.py)")
    if s.memory != (s.output != SPEC_OUT_CONTENT):
        need = ("needs a cell without memory (h_t = c~_t is the S-RNN's rule); give the variant "
                "an output rule o_tanh, tanh or identity" if s.memory else
                "needs a memory cell; a cell without memory outputs its content (output rule "
                "'srnn')")
        raise RuntimeError(f"{who}: kernel spec {code}: output rule "
                           f"'{SPEC_RULE_NAMES[s.output]}' {need}")
    if not s.memory and not s.content_recurrent:
        raise RuntimeError(f"{who}: kernel spec {code}: a cell without memory whose content "
                           "reads x_t only has no recurrence at all; it has no step kernel (run "
                           "it on the generic path)")
    if not s.content_recurrent and s.content_tanh:
        raise RuntimeError(f"{who}: kernel spec {code}: an input-only content with tanh is not "
                           "implemented by the step kernels (they read the input-only blocks as "
                           "they are); add that element-wise rule to each kernel family (see "
                           "CONTRIBUTING.md) or use content_activation='identity'")
    hw = 1 if highway else 0
    if s.memory:
        s.content_block = 2 if s.content_recurrent else 0
        gates = 2 + (1 if s.content_recurrent else 0)
        has_o = output_has_gate(s.output)
        s.out_gate_block = gates if has_o else -1
        s.R = gates + (1 if has_o else 0) + hw
    else:
        s.content_block = 0
        s.out_gate_block = -1
        s.R = 1 + hw
    s.X = (0 if s.content_recurrent else 1) + hw
    return s


def check_kernel_spec(code: int, highway: bool, R: int, X: int, who: str) -> KernelSpec:
    """kernel_spec.h check_kernel_spec: decode, then check the block layout (R, X)."""
    s = decode_kernel_spec(code, highway, who)
    if R != s.R or X != s.X:
        raise RuntimeError(f"{who}: kernel spec {code}{' with highway' if highway else ''} "
                           f"needs {s.R} recurrent and {s.X} input-only blocks of H rows, got "
                           f"{R} and {X}")
    return s


def kernel_spec_blocks(s: KernelSpec) -> Tuple[List[str], List[str]]:
    """kernel_spec.h kernel_spec_blocks: the block roles in weight order (recurrent, input-only)."""
    rec, inp = [], []
    if s.memory:
        rec += ["i", "f"]
    (rec if s.content_recurrent else inp).append("content")
    if s.out_gate_block >= 0:
        rec.append("o")
    if s.highway:
        rec.append("r")
        inp.append("hw")
    return rec, inp


def decode_scan_spec(code: int, highway: bool, who: str) -> ScanSpec:
    """kernel_spec.h decode_scan_spec: the element-wise scan's view of ``code``."""
    code, highway = int(code), bool(highway)
    _check_tag(code, who)
    if code & SPEC_FIELDS["reads_hidden"]:
        raise RuntimeError(f"{who}: kernel spec {code} is a cell whose gates read h_{{t-1}}; it "
                           "runs on the step kernels (forward / backward, "
                           "rnn_ablations/dispatch.py), not on the element-wise scan")
    output = code & SPEC_OUTPUT_MASK
    if not code & SPEC_FIELDS["memory"] or output == SPEC_OUT_CONTENT:
        raise RuntimeError(f"{who}: kernel spec {code}: a cell without memory whose content "
                           "reads x_t only has no recurrence; the element-wise scan runs a "
                           "memory c_t = i*c~ + f*c_{t-1} (run this cell on the generic path)")
    if not code & SPEC_FIELDS["content_input_only"]:
        raise RuntimeError(f"{who}: kernel spec {code}: a recurrent content reads h_{{t-1}}; "
                           "give the spec the bit 'reads h_{t-1}' (Variant.kernel_spec sets "
                           "it) and run the step kernels")
    if code & SPEC_FIELDS["content_tanh"]:
        raise RuntimeError(f"{who}: kernel spec {code}: a tanh of the content is not implemented "
                           "by the element-wise scan (it reads c~_t = W_cx x_t as it is); add "
                           "that element-wise rule (CONTRIBUTING.md, 'Adding an element-wise "
                           "rule') or use content_activation='identity'")
    s = ScanSpec()
    s.output = output
    s.highway = highway
    k = 0
    block = {}
    for role in SCAN_BLOCKS:
        present = (role in ("i", "f", "content") or (role == "o" and output_has_gate(output))
                   or (role in ("r", "hw") and highway))
        block[role] = k if present else -1
        k += 1 if present else 0
    for i, role in enumerate(SCAN_BLOCKS):
        s.block[i] = block[role]
    s.G = k
    return s


def check_scan_spec(code: int, highway: bool, G: int, H: int, D: int, who: str) -> ScanSpec:
    s = decode_scan_spec(code, highway, who)
    if G != s.G:
        raise RuntimeError(f"{who}: kernel spec {code}{' with highway' if highway else ''} reads "
                           f"{s.G} blocks of H = {H} columns per direction ({s.G * H * D} "
                           f"columns for D = {D}), proj has {G * H * D}")
    return s


def scan_spec_blocks(s: ScanSpec) -> List[str]:
    order = [""] * s.G
    for i, role in enumerate(SCAN_BLOCKS):
        if s.block[i] >= 0:
            order[s.block[i]] = role
    return order


def _c_name(name: str) -> str:
    return "rnn_ablations::" + name + ("<float, float>" if name.startswith("Persistent") else "")


def layout_probe() -> str:
    """A device source that NVRTC compiles only if every Structure here has the size and the
    alignment of its C struct on the device."""
    lines = ['#include "cuda/scan_kernel.cuh"', '#include "cuda/persistent_kernel.cuh"']
    for name, cls in STRUCTS.items():
        c = _c_name(name)
        lines.append(f"static_assert(sizeof({c}) == {ctypes.sizeof(cls)} && alignof({c}) == "
                     f"{ctypes.alignment(cls)}, \"{name}: size differs from the launcher's\");")
    return "\n".join(lines) + "\n"


def host_layout_probe() -> str:
    """A C++ source that the host compiler compiles only if every field of every Structure here
    is at its C struct's offset (the structs are plain data, laid out alike on host and device:
    ``cuda/kernel_args.cuh`` and ``kernel_spec.h``'s plain part, read as NVRTC reads them)."""
    lines = ["#include <cstddef>", "#include <cstdint>", "#define __CUDACC_RTC__ 1",
             '#include "cuda/kernel_args.cuh"']
    for i, (name, cls) in enumerate(STRUCTS.items()):
        lines.append(f"typedef {_c_name(name)} S{i};")
        lines.append(f"static_assert(sizeof(S{i}) == {ctypes.sizeof(cls)}, "
                     f"\"{name}: size differs from the launcher's\");")
        for field, _ in cls._fields_:
            lines.append(f"static_assert(offsetof(S{i}, {field}) == {getattr(cls, field).offset},"
                         f" \"{name}.{field}: offset differs from the launcher's\");")
    return "\n".join(lines) + "\n"
