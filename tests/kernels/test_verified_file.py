"""A compiled file is checked as a whole ELF file before it is mapped (rnn_ablations/kernels/
verified_file.py): a kernel module cut short, with the size and SHA-256 of its record rewritten
to match, is refused with a reason by the CPU kernel's loader instead of killing the process
with SIGBUS when it is loaded (the CUDA cache's CUBINs: tests/kernels/test_cuda_cache_sharing.py)."""
import json
import os
import shutil

import pytest
import torch

from rnn_ablations.kernels import loader, verified_file


def _a_shared_library():
    path = torch._C.__file__  # an extension module: an ELF shared library
    with open(path, "rb") as f:
        if f.read(4) != b"\x7fELF":
            pytest.skip("this platform's extension modules are not ELF files")
    return path


def test_a_whole_library_passes_and_a_cut_one_is_named():
    with open(_a_shared_library(), "rb") as f:
        data = f.read()
    assert verified_file.elf_problem(data) is None
    for keep in (len(data) * 3 // 4, len(data) // 2, 200, 20):
        why = verified_file.elf_problem(data[:keep], "the module")
        assert why is not None and why.startswith("the module"), keep
    assert "not an ELF file" in verified_file.elf_problem(b"MZ" + data[2:])


def test_the_loader_refuses_a_cut_module_whose_record_was_rewritten(tmp_path):
    src = _a_shared_library()
    with open(src, "rb") as f:
        data = f.read()
    name = "_C.cpython-test.so"
    cut = data[:len(data) * 2 // 3]
    (tmp_path / name).write_bytes(cut)
    size, sha = verified_file.digest(cut)
    (tmp_path / loader.RECORD).write_text(json.dumps({"module": name, "size": size,
                                                      "sha256": sha}))
    path, why = loader.cached_module(str(tmp_path))
    assert path is None and "truncated" in why, why
    # the whole module with its own record is accepted
    (tmp_path / name).write_bytes(data)
    size, sha = verified_file.digest(data)
    (tmp_path / loader.RECORD).write_text(json.dumps({"module": name, "size": size,
                                                      "sha256": sha}))
    assert loader.cached_module(str(tmp_path)) == (str(tmp_path / name), None)
