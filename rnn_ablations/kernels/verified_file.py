"""Checks of a compiled file before it is mapped or handed to a loader: the CPU kernel module
(:mod:`rnn_ablations.kernels.loader`, ``dlopen``) and a CUDA program's CUBIN
(:mod:`rnn_ablations.kernels.cuda.cache`, ``cuModuleLoadData``).

A size and SHA-256 recorded beside a file say that it is the file that was written; they cannot
say that the file was whole when it was recorded, and a record can be rewritten together with
the file.  A loader that maps an ELF file whose headers point past its end reads beyond it and
kills the process (SIGBUS for a mapped file, a fault for a buffer).  :func:`elf_problem` reads
the ELF headers (the file header, every program header and section header) and says which one
points outside the file, so that such a file is refused with a reason and replaced instead.
"""
from __future__ import annotations

import hashlib
import struct
from typing import Optional, Tuple

__all__ = ["elf_problem", "digest", "record_problem"]

_ELF_MAGIC = b"\x7fELF"


def elf_problem(data: bytes, what: str = "the file") -> Optional[str]:
    """Why ``data`` is not a whole ELF file (a header or a segment or section that lies
    outside its ``len(data)`` bytes), or None when every one lies inside it."""
    n = len(data)
    if n < 16 or data[:4] != _ELF_MAGIC:
        return f"{what} is not an ELF file (its first bytes are not \\x7fELF)"
    cls, order = data[4], data[5]
    if cls not in (1, 2) or order not in (1, 2):
        return f"{what} has an unknown ELF class or byte order ({cls}, {order})"
    e = "<" if order == 1 else ">"
    wide = cls == 2
    head = struct.Struct(e + ("HHIQQQIHHHHHH" if wide else "HHIIIIIHHHHHH"))
    if n < 16 + head.size:
        return f"{what} is {n} bytes, shorter than its ELF header"
    (_type, _machine, _version, _entry, phoff, shoff, _flags, _ehsize, phentsize, phnum,
     shentsize, shnum, _shstrndx) = head.unpack_from(data, 16)
    if phnum:
        if phoff + phnum * phentsize > n:
            return (f"{what} is {n} bytes, its program headers end at byte "
                    f"{phoff + phnum * phentsize} (truncated)")
        ph = struct.Struct(e + ("IIQQQQQQ" if wide else "IIIIIIII"))
        for i in range(phnum):
            f = ph.unpack_from(data, phoff + i * phentsize)
            offset, filesz = (f[2], f[5]) if wide else (f[1], f[4])
            if offset + filesz > n:
                return (f"{what} is {n} bytes, its segment {i} ends at byte {offset + filesz} "
                        "(truncated)")
    if shnum:
        if shoff + shnum * shentsize > n:
            return (f"{what} is {n} bytes, its section headers end at byte "
                    f"{shoff + shnum * shentsize} (truncated)")
        sh = struct.Struct(e + ("IIQQQQIIQQ" if wide else "IIIIIIIIII"))
        for i in range(shnum):
            f = sh.unpack_from(data, shoff + i * shentsize)
            kind, offset, size = f[1], f[4], f[5]
            if kind != 8 and offset + size > n:  # 8: SHT_NOBITS (no bytes in the file)
                return (f"{what} is {n} bytes, its section {i} ends at byte {offset + size} "
                        "(truncated)")
    return None


def digest(data: bytes) -> Tuple[int, str]:
    """``(size, SHA-256 hex digest)`` of ``data``."""
    return len(data), hashlib.sha256(data).hexdigest()


def record_problem(path: str, size: int, sha256: str) -> Optional[str]:
    """Why the file ``path`` is not the one its record describes (another size or SHA-256), or
    is not a whole ELF file, or None: the one check of the kernel loader's module records."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) != size:
        return f"{path} is {len(data)} bytes, its record says {size} (truncated or overwritten)"
    if hashlib.sha256(data).hexdigest() != sha256:
        return f"{path} does not match the SHA-256 in its record (overwritten or damaged)"
    return elf_problem(data, path) if path.endswith(".so") else None
