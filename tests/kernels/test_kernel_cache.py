"""The first-use kernel cache (``rnn_ablations.kernels.loader``): a module in the cache is loaded
only when it matches the size and SHA-256 recorded beside it; a truncated or overwritten one is
compiled again (or, without a compiler, the package warns, says what happened and how to fix it,
and runs its generic path), and ``import rnn_ablations`` never dies.

The end-to-end tests compile a real module through the first-use path once for the whole file
(1-3 minutes of CPU; a rebuild of the same sources only links), in a subprocess where the module
built at install time is hidden, as after a plain ``pip install .``.
"""
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from rnn_ablations.kernels import loader as _kernel_loader

ROOT = Path(__file__).resolve().parents[2]

# Run in a child process: no kernel module from the install (a `None` entry in sys.modules makes
# its import fail), so the package finds its kernel in RNN_ABLATIONS_CACHE.  Prints one JSON line:
# where the kernel came from, and the largest difference, over every variant of the table, between
# the kernel and the generic path (forward outputs and input gradients).
CHILD = r"""
import json, sys
sys.modules["rnn_ablations._C"] = None
import torch
import rnn_ablations as ra
from rnn_ablations.kernels import registry

torch.manual_seed(0)
worst = 0.0
for variant in ra.VARIANTS:
    m = ra.AblatedRNN(variant, 5, 7, num_layers=2, bidirectional=True)
    x = torch.randn(6, 3, 5)
    results = []
    for name in ("kernel", "generic"):
        xi = x.clone().requires_grad_(True)
        with ra.use_backend(name if ra.kernel_available() else "generic"):
            out, _ = m(xi)
        out.sum().backward()
        results.append((out.detach(), xi.grad))
    for a, b in zip(*results):
        worst = max(worst, (a - b).abs().max().item())
print(json.dumps({"source": registry.cpu_kernel_source(), "error": registry.cpu_kernel_error(),
                  "file": getattr(registry.cpu_kernel(), "__file__", None), "worst": worst}))
"""


def _child(cache_root, **env):
    e = {k: v for k, v in os.environ.items()
         if k not in ("RNN_ABLATIONS_NO_KERNEL", "RNN_ABLATIONS_DISABLE_KERNEL")}
    e.update(env)
    e["RNN_ABLATIONS_CACHE"] = str(cache_root)
    e["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    proc = subprocess.run([sys.executable, "-c", CHILD], env=e, capture_output=True, text=True,
                          timeout=1800, cwd=str(cache_root.parent))
    assert proc.returncode == 0, (
        f"import rnn_ablations exited with {proc.returncode} (-7/135: SIGBUS)\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    return result, proc.stderr


def _no_compiler_reason():
    cxx = os.environ.get("CXX", "c++")
    if shutil.which(cxx) is None:
        return f"no C++ compiler ({cxx} not found): the first-use build cannot run"
    include = sysconfig.get_paths().get("include")
    if not include or not os.path.isfile(os.path.join(include, "Python.h")):
        return f"no Python headers ({include}/Python.h): the first-use build cannot run"
    return None


def _kernel_folder(cache_root):
    folders = [p for p in cache_root.iterdir() if p.is_dir() and p.name.startswith("cpu-")]
    assert len(folders) == 1, folders
    return folders[0]


@pytest.fixture(scope="module")
def built_cache(tmp_path_factory):
    """A cache holding a module compiled through the first-use path (once for this file)."""
    reason = _no_compiler_reason()
    if reason:
        pytest.skip(reason)
    cache_root = tmp_path_factory.mktemp("kernel_cache") / "cache"
    result, err = _child(cache_root)
    assert result["source"] == "compiled", (result, err[-3000:])
    assert "compiling the CPU kernel" in err
    assert result["worst"] < 1e-4, result
    return cache_root


def _assert_valid(folder):
    path, problem = _kernel_loader.cached_module(str(folder))
    assert problem is None and path is not None, problem
    record = json.loads((folder / "build.json").read_text())
    assert os.path.getsize(path) == record["size"]
    assert not [p for p in folder.iterdir() if p.name.startswith((".out-", ".build-"))]
    return Path(path)


@pytest.mark.slow  # the kernel's first-use build
def test_compiled_module_has_a_record_and_is_loaded_from_the_cache(built_cache):
    folder = _kernel_folder(built_cache)
    module = _assert_valid(folder)
    record = json.loads((folder / "build.json").read_text())
    assert record["module"] == module.name and len(record["sha256"]) == 64
    result, err = _child(built_cache)
    assert result["source"] == "cache" and result["file"] == str(module), result
    assert "rnn_ablations:" not in err, err  # a good cache loads without a word
    assert result["worst"] < 1e-4, result


@pytest.mark.slow  # the kernel's first-use build
def test_truncated_module_is_compiled_again(built_cache):
    """A truncated shared library, once mapped, kills the process with SIGBUS: never loaded."""
    folder = _kernel_folder(built_cache)
    module = _assert_valid(folder)
    size = module.stat().st_size
    with open(module, "r+b") as f:
        f.truncate(size // 2)
    result, err = _child(built_cache)
    assert result["source"] == "compiled", (result, err[-3000:])
    assert "cached CPU kernel cannot be used" in err and "truncated" in err, err
    assert "compiling it again" in err, err
    assert "generic PyTorch path" not in err, err
    assert result["worst"] < 1e-4, result
    assert _assert_valid(folder).stat().st_size == size


@pytest.mark.slow  # the kernel's first-use build
def test_overwritten_module_is_compiled_again(built_cache):
    folder = _kernel_folder(built_cache)
    module = _assert_valid(folder)
    size = module.stat().st_size
    module.write_bytes(b"not a shared library\n" * 8)
    result, err = _child(built_cache)
    assert result["source"] == "compiled", (result, err[-3000:])
    assert "cached CPU kernel cannot be used" in err and "overwritten" in err, err
    assert "failed" not in err, err  # nothing failed: nothing is said to have
    assert result["worst"] < 1e-4, result
    assert _assert_valid(folder).stat().st_size == size


@pytest.mark.slow  # the kernel's first-use build
def test_module_that_matches_its_record_but_does_not_load_is_compiled_again(built_cache):
    folder = _kernel_folder(built_cache)
    module = _assert_valid(folder)
    module.write_bytes(_elf(b"garbage that dlopen refuses\n" * 8, kind=1))
    record = json.loads((folder / "build.json").read_text())
    record["size"], record["sha256"] = _kernel_loader._digest(str(module))
    (folder / "build.json").write_text(json.dumps(record))
    result, err = _child(built_cache)
    assert result["source"] == "compiled", (result, err[-3000:])
    assert "does not load" in err and "compiling it again" in err, err
    assert result["worst"] < 1e-4, result
    _assert_valid(folder)


@pytest.mark.slow  # the kernel's first-use build
def test_damaged_module_without_a_compiler_falls_back_and_names_the_fix(built_cache, tmp_path):
    cache_root = tmp_path / "cache"
    shutil.copytree(built_cache, cache_root)
    folder = _kernel_folder(cache_root)
    module = _assert_valid(folder)
    with open(module, "r+b") as f:
        f.truncate(4096)
    result, err = _child(cache_root, CC="/nonexistent/cc", CXX="/nonexistent/c++")
    assert result["source"] is None and result["file"] is None, result
    assert "truncated" in err and "compiling it again failed" in err, err
    assert "generic PyTorch path" in err and "apt install g++ python3-dev" in err, err
    assert f"deleting the folder {folder}" in err, err
    assert result["worst"] == 0.0, result


def test_read_only_cache_folder_warns_what_failed(tmp_path, monkeypatch, caplog):
    """A cache that cannot be written is named as such, not as a compiler failure."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setattr(_kernel_loader, "_installed", lambda: (None, "no kernel built at install time"))
    monkeypatch.setenv("RNN_ABLATIONS_CACHE", str(blocker / "cache"))  # under a file: not creatable
    monkeypatch.delenv("RNN_ABLATIONS_NO_KERNEL", raising=False)
    monkeypatch.delenv("RNN_ABLATIONS_DISABLE_KERNEL", raising=False)
    with caplog.at_level("WARNING", logger="rnn_ablations"):
        module, why, source = _kernel_loader.load_cpu_kernel()
    assert module is None and source == ""
    assert "cannot be written" in why and "RNN_ABLATIONS_CACHE to a writable folder" in why, why
    assert "compil" not in why.split("To fix:")[0], why


# ------------------------------------------------------------------ the record check (no compiler)
def _elf(body: bytes, kind: int = 3) -> bytes:
    """A little-endian ELF64 file of type ``kind`` (3: a shared object; 1: a relocatable object,
    which dlopen refuses) whose headers lie inside it: the file header, then ``body``."""
    import struct
    return (b"\x7fELF\x02\x01\x01" + b"\0" * 9
            + struct.pack("<HHIQQQIHHHHHH", kind, 62, 1, 0, 0, 0, 0, 64, 56, 0, 64, 0, 0) + body)


def _fake_cache(folder, content=_elf(bytes(range(256)) * 40), name="_C.abi3.so"):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(content)
    size, sha = _kernel_loader._digest(str(folder / name))
    (folder / "build.json").write_text(json.dumps({"module": name, "size": size, "sha256": sha}))
    return folder / name


def test_record_check(tmp_path):
    assert _kernel_loader.cached_module(str(tmp_path / "absent")) == (None, None)
    (tmp_path / "empty").mkdir()
    assert _kernel_loader.cached_module(str(tmp_path / "empty")) == (None, None)

    module = _fake_cache(tmp_path / "c")
    assert _kernel_loader.cached_module(str(tmp_path / "c")) == (str(module), None)
    data = module.read_bytes()

    module.write_bytes(data[:100])
    path, why = _kernel_loader.cached_module(str(tmp_path / "c"))
    assert path is None and f"is 100 bytes, its record says {len(data)}" in why
    assert "(truncated or overwritten)" in why

    module.write_bytes(data[:-1] + b"\0")  # same size, other bytes
    path, why = _kernel_loader.cached_module(str(tmp_path / "c"))
    assert path is None and "SHA-256" in why

    module.write_bytes(data)
    (tmp_path / "c" / "build.json").write_text("{not json")
    path, why = _kernel_loader.cached_module(str(tmp_path / "c"))
    assert path is None and "cannot be read" in why

    (tmp_path / "c" / "build.json").unlink()
    path, why = _kernel_loader.cached_module(str(tmp_path / "c"))
    assert path is None and "has no size and SHA-256 record" in why

    module = _fake_cache(tmp_path / "d")
    (tmp_path / "d" / "build.json").write_text(json.dumps(
        {"module": "../elsewhere/_C.so", "size": 1, "sha256": "0" * 64}))
    path, why = _kernel_loader.cached_module(str(tmp_path / "d"))
    assert path is None and "bad module name" in why


def test_publish_replaces_module_and_record_together(tmp_path):
    folder = tmp_path / "c"
    old = _fake_cache(folder)
    out = folder / ".out-x"
    out.mkdir()
    (out / old.name).write_bytes(_elf(b"new module" * 50))
    final = _kernel_loader._publish(str(folder), str(out / old.name), 1.0)
    assert final == str(old)
    assert _kernel_loader.cached_module(str(folder)) == (str(old), None)
    assert old.read_bytes() == _elf(b"new module" * 50)
    assert sorted(p.name for p in folder.iterdir()) == [".out-x", old.name, "build.json"]


# --------------------------------------------------------------------------- the installed module
class _Module:
    """Stands for a compiled module: what the loader reads of it."""

    def __init__(self, digest):
        self.__file__ = "/somewhere/_C.so"
        if digest is not None:
            self.sources_digest = digest


def test_installed_module_compiled_from_other_sources_is_refused(monkeypatch):
    """An in-place or editable build that predates an edit of csrc/ (its recorded digest differs
    from the files beside it) is not used: the reason names the rebuild command; a module from
    the same sources, or where no sources are shipped, is."""
    from rnn_ablations.kernels import build as _build

    monkeypatch.setattr(_build, "sources_digest", lambda: "0123456789abcdef")
    assert _kernel_loader._stale_sources(_Module("0123456789abcdef")) == ""
    for recorded in ("fedcba9876543210", None):
        why = _kernel_loader._stale_sources(_Module(recorded))
        assert "compiled from other sources" in why and "build_ext --inplace" in why, why
        assert (recorded or "not recorded") in why
    monkeypatch.setattr(_build, "sources_digest", lambda: "")
    assert _kernel_loader._stale_sources(_Module(None)) == ""


def test_this_checkout_s_module_records_its_sources():
    """The module built by scripts/setup.sh records the digest of the sources it came from, and
    the loader took it (so the digest of the files now is the same)."""
    from rnn_ablations.kernels import build as _build, registry

    if registry.cpu_kernel_source() != "installed":
        pytest.skip("the kernel in use did not come from the install "
                    f"({registry.cpu_kernel_source()!r})")
    assert registry.cpu_kernel().raw.sources_digest == _build.sources_digest()
