"""The CUDA kernels checked without a GPU: NVRTC (from the nvidia-cuda-nvrtc wheel of
requirements/core.txt) compiles every instantiation to CUBIN for sm_80 and sm_90 through the
package's own precompile command and disk cache; the launcher's by-value structs have the C
structs' layouts and its parameter lists are the kernels' (probes that NVRTC compiles only when
they agree, and that fail when they do not); the launcher's spec decoder agrees with the CPU
kernel's (kernel_spec.h) on every variant; the cache is written atomically and survives a
damaged file (a changed byte is caught by the SHA-256 in the entry's header).  Launch and
numerics: tests/cuda_emulation (the device code and the host loops run on the CPU) and
tests/kernels/test_cuda*.py (on a GPU)."""
import io
import os
import shutil
import subprocess
import time

import pytest

from conftest import requires_kernel
from rnn_ablations.kernels.cuda import cache, nvrtc, precompile, programs, structs
from rnn_ablations.variants import VARIANTS_TABLE

NVRTC_MISSING = nvrtc.library_error()
pytestmark = pytest.mark.skipif(
    NVRTC_MISSING is not None,
    reason="NVRTC is not installed (pip install -r requirements/core.txt brings the "
           f"nvidia-cuda-nvrtc wheel): {NVRTC_MISSING}")


def _compile(source, expressions=(), arch="sm_80"):
    return nvrtc.compile_program(source, "probe.cu", list(expressions), cache.options_for(arch))


@pytest.mark.slow  # compiles all 62 programs
@pytest.mark.parametrize("arch", [80, 90])
def test_nvrtc_compiles_every_instantiation(arch, tmp_path, monkeypatch):
    """Every program the launcher can ask for compiles to CUBIN (cold, into an empty cache);
    a second run reads them all from the cache."""
    monkeypatch.setenv("RNN_ABLATIONS_CACHE", str(tmp_path))
    out = io.StringIO()
    start = time.perf_counter()
    failures = precompile.precompile(arch, jobs=2, out=out)
    seconds = time.perf_counter() - start
    text = out.getvalue()
    assert failures == 0, text
    n = len(programs.all_programs())
    assert n == 62  # 4 dtypes x (2 step + 12 scan) + 3 dtypes x 2 persistent
    assert f"{n} instantiations, 0 failed" in text and f"target sm_{arch} (CUBIN)" in text
    assert text.count(" compiled\n") == n
    files = os.listdir(os.path.join(str(tmp_path), "cuda"))
    assert len(files) == n and not [f for f in files if f.startswith(".tmp")]
    print(f"\nNVRTC {nvrtc.version()}: {n} instantiations for sm_{arch} in {seconds:.1f} s")
    again = io.StringIO()
    assert precompile.precompile(arch, jobs=1, out=again) == 0
    assert again.getvalue().count(" cache\n") == n


def test_nvrtc_launcher_signatures_are_the_kernels():
    """Each kernel's parameter list is the launcher's (programs.PARAMS), checked by NVRTC."""
    progs = programs.all_programs()
    _compile(programs.signature_probe(progs))  # declarations only: no code is generated
    # the probe can fail: one parameter's type changed on the launcher's side
    wrong = programs.Program("step_forward", "float32")
    params = list(programs.PARAMS["step_forward"])
    try:
        programs.PARAMS["step_forward"] = params[:1] + [("n", "int32")] + params[2:]
        with pytest.raises(nvrtc.NvrtcError, match="the kernel's parameters are not the launcher's"):
            _compile(programs.signature_probe([wrong]))
    finally:
        programs.PARAMS["step_forward"] = params


def test_nvrtc_struct_layouts_match_the_launcher(tmp_path):
    """The ctypes Structures the launcher passes by value have the C structs' sizes and
    alignments on the device (NVRTC) and their field offsets (the host C++ compiler, on the same
    plain-data headers), and either check can fail."""
    _compile(structs.layout_probe())
    bad = structs.layout_probe().replace("sizeof(rnn_ablations::Dims) == 40",
                                         "sizeof(rnn_ablations::Dims) == 48")
    assert bad != structs.layout_probe()
    with pytest.raises(nvrtc.NvrtcError, match="Dims: size differs"):
        _compile(bad)
    cxx = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler for the field offsets (the CPU kernel needs one: g++)")

    def host(source):
        path = tmp_path / "probe.cpp"
        path.write_text(source)
        return subprocess.run([cxx, "-std=c++17", "-fsyntax-only", f"-I{programs.CSRC}",
                               str(path)], capture_output=True, text=True)

    done = host(structs.host_layout_probe())
    assert done.returncode == 0, done.stderr
    assert "offsetof(S0, R) == 8" in structs.host_layout_probe()
    moved = host(structs.host_layout_probe().replace("offsetof(S0, R) == 8",
                                                     "offsetof(S0, R) == 16"))
    assert moved.returncode != 0 and "KernelSpec.R: offset differs" in moved.stderr


def test_nvrtc_lowered_names_name_the_instantiation():
    binary, lowered, _ = _compile(programs.Program("scan_forward", "bfloat16", 1, True).source,
                                  ["rnn_ablations::scan_forward_kernel<rnn_ablations::BFloat16, "
                                   "float, 1, true>"])
    assert lowered[0].startswith("_ZN13rnn_ablations19scan_forward_kernel") and binary


@requires_kernel
def test_nvrtc_spec_decoder_agrees_with_kernel_spec_h():
    """The launcher's decoder (structs.py) reads every code as the CPU kernel's kernel_spec.h
    does (every combination of the spec's bits, so every variant of the table among them), and
    refuses what it refuses."""
    from rnn_ablations.kernels.registry import _C
    codes = {(0xA5 << 8) | bits for bits in range(128)}
    assert {v.kernel_spec for v in VARIANTS_TABLE.values()} <= codes
    checked = 0
    for code in sorted(codes):
        for highway in (False, True):
            name = f"spec {code:#x} highway={highway}"
            try:
                want = _C.describe_kernel_spec(code, highway)
            except RuntimeError:
                want = None
            if want is None:
                with pytest.raises(RuntimeError):
                    structs.decode_kernel_spec(code, highway, "test")
            else:
                s = structs.decode_kernel_spec(code, highway, "test")
                rec, inp = structs.kernel_spec_blocks(s)
                assert (rec, inp) == (list(want["recurrent"]), list(want["input_only"])), name
                checked += 1
            try:
                want_scan = _C.describe_scan_spec(code, highway)
            except RuntimeError:
                want_scan = None
            if want_scan is None:
                with pytest.raises(RuntimeError):
                    structs.decode_scan_spec(code, highway, "test")
            else:
                s = structs.decode_scan_spec(code, highway, "test")
                assert structs.scan_spec_blocks(s) == list(want_scan["input_only"]), name
                checked += 1
    assert checked >= len(VARIANTS_TABLE)
    for bad in (0, 3, 0xA5 << 8 | 1 << 20):
        with pytest.raises(RuntimeError, match="unknown kernel spec"):
            structs.decode_kernel_spec(bad, False, "test")


def test_nvrtc_cache_is_atomic_and_repairs_a_damaged_file(tmp_path, monkeypatch):
    monkeypatch.setenv("RNN_ABLATIONS_CACHE", str(tmp_path))
    prog = programs.Program("step_forward", "float32")
    first = cache.binary(prog, 80, quiet=True, force=True)
    folder = os.path.join(str(tmp_path), "cuda")
    (name,) = os.listdir(folder)
    assert name.endswith(".bin") and first.kind == "cubin" and first.seconds > 0
    cache._memory.clear()
    again = cache.binary(prog, 80, quiet=True)
    assert again.seconds == 0 and again.data == first.data and again.lowered == first.lowered
    with open(os.path.join(folder, name), "r+b") as f:  # a truncated file is not used
        f.truncate(100)
    cache._memory.clear()
    repaired = cache.binary(prog, 80, quiet=True)
    # (a CUBIN is not byte-identical from one compile to the next: it carries a build id)
    assert repaired.seconds > 0 and repaired.data[:4] == b"\x7fELF"
    assert repaired.lowered == first.lowered
    assert os.listdir(folder) == [name]


def test_nvrtc_cache_entry_is_shared_and_its_payload_checked(tmp_path, monkeypatch, caplog):
    """With the real NVRTC: an entry is readable by other users under umask 022 and records the
    SHA-256 of its header's fields and its CUBIN; 100 bytes flipped in place (same size) are caught before the CUBIN is
    handed on, said in one line, and the program compiled again (tests/kernels/test_cuda_cache_sharing.py
    covers the rest with a stand-in compiler)."""
    import hashlib
    import json
    import stat
    monkeypatch.setenv("RNN_ABLATIONS_CACHE", str(tmp_path))
    prog = programs.Program("step_forward", "float32")
    old = os.umask(0o022)
    try:
        first = cache.binary(prog, 90, quiet=True, force=True)
    finally:
        os.umask(old)
    folder = os.path.join(str(tmp_path), "cuda")
    (name,) = os.listdir(folder)
    path = os.path.join(folder, name)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
    raw = bytearray(open(path, "rb").read())
    head_end = raw.index(b"\n", raw.index(b"\n") + 1) + 1
    meta = json.loads(raw[raw.index(b"\n") + 1:head_end])
    fields = {k: meta[k] for k in ("expression", "lowered", "kind", "target", "size")}
    assert meta["sha256"] == hashlib.sha256(
        json.dumps(fields, sort_keys=True).encode() + b"\n" + first.data).hexdigest()
    for i in range(100):
        raw[head_end + 64 + i] ^= 0x5A
    open(path, "wb").write(bytes(raw))
    cache._memory.clear()
    with caplog.at_level("WARNING", logger="rnn_ablations"):
        got, source = cache.lookup(prog, 90)
    assert source == "compiled" and got.data[:4] == b"\x7fELF" and got.lowered == first.lowered
    said = [r.getMessage() for r in caplog.records if r.name == "rnn_ablations"]
    assert len(said) == 1 and "SHA-256" in said[0] and "compiling it again" in said[0], said
    assert cache.read_entry(path, prog, "sm_90")[1] is None


def test_nvrtc_precompile_refuses_a_bad_arch():
    with pytest.raises(SystemExit):
        precompile.main(["--arch", "ninety"])


def test_nvrtc_kernels_not_in_use_says_why_without_a_device(monkeypatch):
    """Without a GPU the package imports and says why the CUDA kernels are not in use: a CPU
    torch has no CUDA; a CUDA torch without a visible device has no device.  Never a build
    error (there is no build)."""
    import torch
    from rnn_ablations import dispatch
    from rnn_ablations.kernels import registry
    from rnn_ablations.kernels import cuda
    if torch.version.cuda is None:
        assert "this torch has no CUDA" in cuda.unavailable_reason()
        assert not registry.cuda_kernel_available()
        assert "this torch has no CUDA" in registry.cuda_kernel_error()
        assert "built" not in registry.cuda_kernel_error()
        monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert "no CUDA device is visible" in cuda.unavailable_reason()
    monkeypatch.setenv("RNN_ABLATIONS_NO_KERNEL", "1")
    assert "RNN_ABLATIONS_NO_KERNEL=1" in cuda.unavailable_reason()


@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16", "float16"])
def test_nvrtc_launcher_packs_each_parameter_as_the_kernel_declares_it(dtype):
    """host.pack orders a launch's arguments as programs.PARAMS (which the signature probe holds
    to the kernels'), as c_int64 / pointers / structs, and refuses a tensor of another dtype
    than the parameter's (T: storage, A: accumulation) or a missing argument."""
    import ctypes
    import torch
    from rnn_ablations.kernels.cuda import host
    t = getattr(torch, dtype)
    a = torch.float32 if t in (torch.bfloat16, torch.float16) else t
    for family, params in programs.PARAMS.items():
        if family.startswith("persistent") and dtype == "float64":
            continue
        kw, want = {}, []
        for name, sym in params:
            if sym in host._STRUCTS:
                kw[name] = host._STRUCTS[sym]()
                want.append(kw[name])
            elif sym == "int64":
                kw[name] = 7
                want.append(7)
            else:
                base = sym.replace("const ", "").rstrip("*")
                kw[name] = torch.zeros(2, dtype={"T": t, "A": a, "int64": torch.int64}[base])
                want.append(kw[name].data_ptr())
        got = host.pack(family, t, **kw)
        assert len(got) == len(params)
        for g, w, (name, sym) in zip(got, want, params):
            if sym in host._STRUCTS:
                assert g is w
            elif sym == "int64":
                assert isinstance(g, ctypes.c_int64) and g.value == w
            else:
                assert isinstance(g, ctypes.c_void_p) and g.value == w, (family, name)
        pointer = next((n for n, s in params if s.endswith("*")), None)
        if pointer is not None:
            bad = dict(kw, **{pointer: torch.zeros(2, dtype=torch.int8)})
            with pytest.raises(TypeError, match=f"{pointer} .* must be"):
                host.pack(family, t, **bad)
        with pytest.raises(TypeError, match="arguments"):
            host.pack(family, t, **dict(list(kw.items())[1:]))


def test_nvrtc_device_sources_are_package_data():
    """Every file NVRTC reads ships in the wheel (pyproject's package data, MANIFEST.in)."""
    import fnmatch
    import re
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    text = open(os.path.join(root, "pyproject.toml")).read()
    globs = re.findall(r'"(csrc/[^"]+)"', text)
    manifest = open(os.path.join(root, "MANIFEST.in")).read()
    for path in programs.source_files():
        rel = os.path.relpath(path, os.path.join(root, "rnn_ablations")).replace(os.sep, "/")
        assert any(fnmatch.fnmatch(rel, g.replace("**/", "*")) for g in globs), rel
        assert "*" + os.path.splitext(path)[1] in manifest, rel


def test_nvrtc_gpu_check_stops_at_its_gate_without_the_cuda_kernels(tmp_path):
    """benchmarks/gpu_check.sh is valid bash and, where the package's CUDA kernels cannot run
    (here: no GPU), fails at its first step with the reason, before any other step."""
    import sys
    import torch
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    script = os.path.join(root, "benchmarks", "gpu_check.sh")
    assert subprocess.run(["bash", "-n", script]).returncode == 0
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the gate passes here (tests/kernels/test_cuda*.py run the kernels)")
    env = dict(os.environ, PYTHON=sys.executable)
    done = subprocess.run(["bash", script, str(tmp_path)], cwd=root, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 1, done.stdout + done.stderr
    summary = (tmp_path / "gpu_check_summary.txt").read_text().splitlines()
    assert len(summary) == 1 and summary[0].startswith("FAIL  gate:"), summary
    assert ("no CUDA" in summary[0]) or ("no CUDA device" in summary[0])


def test_nvrtc_targets_cubin_for_a_known_arch_and_ptx_above_the_newest():
    known = nvrtc.supported_archs()
    assert 80 in known and 90 in known
    assert cache.target_for(90) == ("sm_90", True)
    # a GPU newer than this NVRTC: PTX for the newest architecture it knows (the driver JITs it)
    assert cache.target_for(max(known) + 1) == (f"compute_{max(known)}", False)
    with pytest.raises(nvrtc.NvrtcError, match="newer GPU"):
        cache.target_for(min(known) - 1)
    ptx, lowered, _ = nvrtc.compile_program(
        programs.Program("step_forward", "float32").source, "p.cu",
        [programs.Program("step_forward", "float32").expression],
        cache.options_for(f"compute_{max(known)}"), cubin=False)
    assert b".entry " + lowered[0].encode() in ptx
