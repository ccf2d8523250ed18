"""The CUDA kernel cache (``rnn_ablations/kernels/cuda/cache.py``) shared between users and
checked before use, without a GPU and without NVRTC: a stand-in compiler returns a fixed payload
per program and counts its calls, so the tests see exactly what is compiled, what is read back
and what is said.

* entries are created with the process umask (0o644 under umask 022), so another user reads them
  instead of compiling all 62 programs again;
* a cache that cannot be written is reported once per process, not once per program;
* an entry whose payload differs from the SHA-256 in its header (bytes changed at the same size),
  or whose header lacks a field, is never handed on: it is reported in one line and compiled
  again.

"Another user" is a real one where the tests run as root (the effective uid is switched to
``nobody`` around the reads), else the same user with the folder made read-only (writing fails
as it would for a user who does not own it).
"""
import contextlib
import hashlib
import json
import logging
import os
import shutil
import stat
import tempfile

import pytest

from rnn_ablations.kernels.cuda import cache, nvrtc, programs


class FakeNvrtc:
    """Stands for NVRTC: version 13.0, sm_75..sm_120, a payload derived from the program."""

    def __init__(self, monkeypatch):
        self.calls = []
        monkeypatch.setattr(nvrtc, "version", lambda: (13, 0))
        monkeypatch.setattr(nvrtc, "supported_archs", lambda: [75, 80, 86, 89, 90, 100, 120])
        monkeypatch.setattr(nvrtc, "compile_program", self.compile_program)

    def compile_program(self, source, name, expressions, options, cubin=True):
        self.calls.append(name)
        seed = hashlib.sha256((name + " ".join(options)).encode()).digest()
        lowered = "_Z" + name.replace("[", "_").replace("]", "_").replace(",", "_")
        body = seed * 64 + lowered.encode() + b"\0"
        payload = fake_elf(body) if cubin else b"//ptx\n.entry " + body
        return payload, [lowered], ""


def fake_elf(body: bytes) -> bytes:
    """A little-endian ELF64 file: its header, ``body``, and one section header (after the
    body) describing the body's bytes."""
    import struct
    shoff = 64 + len(body)
    head = (b"\x7fELF\x02\x01\x01" + b"\0" * 9
            + struct.pack("<HHIQQQIHHHHHH", 2, 190, 1, 0, 0, shoff, 0, 64, 0, 0, 64, 1, 0))
    section = struct.pack("<IIQQQQIIQQ", 0, 1, 0, 0, 64, len(body), 0, 0, 1, 0)
    return head + body + section


@pytest.fixture
def fake(monkeypatch):
    cache._memory.clear()
    cache._unwritable.clear()
    cache._unreadable.clear()
    yield FakeNvrtc(monkeypatch)
    cache._memory.clear()
    cache._unwritable.clear()
    cache._unreadable.clear()


@pytest.fixture
def shared_root(monkeypatch):
    """A cache root every user can reach (pytest's own tmp folders are private to their user)."""
    root = tempfile.mkdtemp(prefix="rnn_ablations-shared-cache-")
    os.chmod(root, 0o755)
    monkeypatch.setenv("RNN_ABLATIONS_CACHE", root)
    yield root
    for folder, dirs, files in os.walk(root):
        os.chmod(folder, 0o755)
    shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def umask(mask):
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


@contextlib.contextmanager
def as_another_user(folder):
    """Run the block as a user who does not own ``folder``: as root, with the effective uid and
    gid of ``nobody``; otherwise as this user with the folder read-only."""
    if os.geteuid() == 0:
        try:
            os.setegid(65534)
            os.seteuid(65534)
        except OSError as exc:
            os.setegid(0)
            pytest.skip(f"running as root without the right to switch to another user ({exc})")
        try:
            yield "nobody"
        finally:
            os.seteuid(0)
            os.setegid(0)
    else:
        mode = stat.S_IMODE(os.stat(folder).st_mode)
        os.chmod(folder, 0o555)
        try:
            yield "read-only folder"
        finally:
            os.chmod(folder, mode)


def _records(caplog, text):
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


def _entry(root):
    folder = os.path.join(root, "cuda")
    (name,) = [n for n in os.listdir(folder) if n.endswith(".bin")]
    return os.path.join(folder, name)


PROG = programs.Program("step_forward", "float32")


# --------------------------------------------------------------------------------- sharing
@pytest.mark.parametrize("mask,mode", [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)],
                         ids=["umask022", "umask002", "umask077"])
def test_entries_are_created_with_the_process_umask(fake, shared_root, mask, mode):
    with umask(mask):
        cache.binary(PROG, 90, quiet=True)
    got = stat.S_IMODE(os.stat(_entry(shared_root)).st_mode)
    assert got == mode, f"entry mode {oct(got)}, want {oct(mode)} under umask {oct(mask)}"


def test_another_user_reads_a_shared_cache_without_compiling(fake, shared_root, caplog):
    """User A fills the cache (umask 022); user B, who cannot write the folder, reads every
    program from it: nothing compiled, nothing said."""
    progs = programs.all_programs()
    with umask(0o022):
        for p in progs:
            cache.binary(p, 90, quiet=True)
    assert len(fake.calls) == len(progs) == 62
    cache._memory.clear()
    fake.calls.clear()
    with caplog.at_level(logging.WARNING, logger="rnn_ablations"), \
            as_another_user(os.path.join(shared_root, "cuda")) as who:
        sources = [cache.lookup(p, 90)[1] for p in progs]
    assert fake.calls == [], f"{who} compiled {len(fake.calls)} programs again"
    assert set(sources) == {"disk"}
    assert not [r for r in caplog.records if r.name == "rnn_ablations"], caplog.text


def test_another_user_compiling_into_a_shared_cache_warns_once(fake, shared_root, caplog):
    """User B needs programs the cache lacks and cannot write it: each is compiled in memory,
    and the process says once that the cache cannot be written."""
    os.makedirs(os.path.join(shared_root, "cuda"), mode=0o755)
    progs = programs.all_programs()[:5]
    with caplog.at_level(logging.WARNING, logger="rnn_ablations"), \
            as_another_user(os.path.join(shared_root, "cuda")):
        for p in progs:
            assert cache.lookup(p, 90, quiet=True)[1] == "compiled"
        assert cache.lookup(progs[0], 90, quiet=True)[1] == "memory"
    assert len(fake.calls) == 5
    said = _records(caplog, "cannot write the CUDA kernel cache")
    assert len(said) == 1, said
    assert "RNN_ABLATIONS_CACHE" in said[0] and "precompile" in said[0]


def test_unwritable_cache_warns_once_per_process(fake, tmp_path, monkeypatch, caplog):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("RNN_ABLATIONS_CACHE", str(blocker / "cache"))  # under a file
    with caplog.at_level(logging.WARNING, logger="rnn_ablations"):
        for p in programs.all_programs()[:4]:
            cache.binary(p, 80)
    said = _records(caplog, "cannot write the CUDA kernel cache")
    assert len(said) == 1, said
    assert len(_records(caplog, "compiling the CUDA kernel")) == 4
    assert len(fake.calls) == 4


def test_entries_another_user_cannot_read_are_reported_once(fake, shared_root, caplog):
    """Entries left 0600 by another user: compiled again, with one line naming the cause."""
    progs = programs.all_programs()[:4]
    with umask(0o077):
        for p in progs:
            cache.binary(p, 90, quiet=True)
    cache._memory.clear()
    fake.calls.clear()
    folder = os.path.join(shared_root, "cuda")
    os.chmod(folder, 0o755)
    if os.geteuid() != 0:
        for name in os.listdir(folder):
            os.chmod(os.path.join(folder, name), 0)
    with caplog.at_level(logging.WARNING, logger="rnn_ablations"), as_another_user(folder):
        for p in progs:
            cache.binary(p, 90, quiet=True)
    assert len(fake.calls) == 4
    said = _records(caplog, "cannot read")
    assert len(said) == 1 and "chmod a+r" in said[0], caplog.text


# ------------------------------------------------------------------------------ integrity
def test_entry_records_the_sha256_of_its_payload(fake, shared_root):
    b = cache.binary(PROG, 90, quiet=True)
    raw = open(_entry(shared_root), "rb").read()
    head = json.loads(raw.split(b"\n")[1])
    assert set(cache.HEADER_FIELDS) <= set(head)
    assert b.sha256 == hashlib.sha256(b.data).hexdigest()
    # the header's digest covers what says which program and entry point the payload is
    fields = {k: head[k] for k in ("expression", "lowered", "kind", "target", "size")}
    assert head["sha256"] == hashlib.sha256(json.dumps(fields, sort_keys=True).encode() + b"\n"
                                            + b.data).hexdigest()
    assert head["size"] == len(b.data)


def _rewrite_header(path, change):
    raw = open(path, "rb").read()
    magic, head, data = raw.split(b"\n", 2)
    meta = json.loads(head)
    change(meta)
    with open(path, "wb") as f:
        f.write(magic + b"\n" + json.dumps(meta).encode() + b"\n" + data)


def _flip_bytes(path, n=100):
    raw = bytearray(open(path, "rb").read())
    payload_start = raw.index(b"\n", raw.index(b"\n") + 1) + 1
    for i in range(n):
        raw[payload_start + 16 + i] ^= 0xFF
    with open(path, "wb") as f:
        f.write(bytes(raw))
    return len(raw)


@pytest.mark.parametrize("quiet", [True, False])
def test_flipped_bytes_at_the_same_size_are_caught_and_compiled_again(fake, shared_root, caplog,
                                                                      quiet):
    first = cache.binary(PROG, 90, quiet=True)
    path = _entry(shared_root)
    size = _flip_bytes(path)
    assert os.path.getsize(path) == size
    cache._memory.clear()
    fake.calls.clear()
    with caplog.at_level(logging.WARNING, logger="rnn_ablations"):
        got, source = cache.lookup(PROG, 90, quiet=quiet)
    assert source == "compiled" and fake.calls == [PROG.name + ".cu"]
    assert got.data == first.data  # what reaches the driver is the program, not the damage
    said = [r.getMessage() for r in caplog.records if r.name == "rnn_ablations"]
    assert len(said) == 1 and "SHA-256" in said[0] and "compiling it again" in said[0], said
    assert PROG.name in said[0] and path in said[0]
    assert cache.read_entry(path, PROG, "sm_90")[1] is None  # the entry was stored whole again
    assert cache.compile_stats()["damaged"] >= 1


@pytest.mark.parametrize("field", cache.HEADER_FIELDS)
def test_header_without_a_field_is_a_damaged_entry(fake, shared_root, caplog, field):
    cache.binary(PROG, 90, quiet=True)
    path = _entry(shared_root)
    _rewrite_header(path, lambda meta: meta.pop(field))
    cache._memory.clear()
    fake.calls.clear()
    with caplog.at_level(logging.WARNING, logger="rnn_ablations"):
        _, source = cache.lookup(PROG, 90, quiet=True)
    assert source == "compiled" and len(fake.calls) == 1
    said = _records(caplog, "compiling it again")
    assert len(said) == 1 and f"without the field(s) {field}" in said[0], said


@pytest.mark.parametrize("damage,why", [
    (lambda p: open(p, "r+b").truncate(os.path.getsize(p) - 7), "truncated or overwritten"),
    (lambda p: open(p, "wb").write(cache._MAGIC + b"{not json\n" + b"x" * 10),
     "not JSON"),
    (lambda p: open(p, "wb").write(b"\x7fELF plain binary"), "not a cache entry"),
    (lambda p: _rewrite_header(p, lambda m: m.update(expression="other<int>")),
     "holds another program"),
    (lambda p: _rewrite_header(p, lambda m: m.update(kind="ptx")), "not the cubin for sm_90"),
    (lambda p: _rewrite_header(p, lambda m: m.update(lowered="")), "empty entry-point name"),
], ids=["truncated", "header-not-json", "no-magic", "other-program",
        "other-kind", "empty-name"])
def test_other_damage_is_named_and_compiled_again(fake, shared_root, caplog, damage, why):
    cache.binary(PROG, 90, quiet=True)
    path = _entry(shared_root)
    damage(path)
    cache._memory.clear()
    fake.calls.clear()
    with caplog.at_level(logging.WARNING, logger="rnn_ablations"):
        _, source = cache.lookup(PROG, 90, quiet=True)
    assert source == "compiled" and len(fake.calls) == 1
    said = _records(caplog, "compiling it again")
    assert len(said) == 1 and why in said[0], caplog.text
    assert cache.read_entry(path, PROG, "sm_90")[1] is None


def _resign(meta, data):
    fields = {k: meta[k] for k in ("expression", "lowered", "kind", "target", "size")}
    meta["sha256"] = hashlib.sha256(json.dumps(fields, sort_keys=True).encode() + b"\n"
                                    + data).hexdigest()


def _rewrite_entry(path, change):
    """Change the payload and the header, and write the header's size and SHA-256 to match (a
    damage that the size and digest cannot see)."""
    raw = open(path, "rb").read()
    magic, head, data = raw.split(b"\n", 2)
    meta = json.loads(head)
    meta, data = change(meta, data)
    meta["size"] = len(data)
    _resign(meta, data)
    with open(path, "wb") as f:
        f.write(magic + b"\n" + json.dumps(meta).encode() + b"\n" + data)


@pytest.mark.parametrize("damage,why", [
    (lambda p: _rewrite_header(p, lambda m: m.update(lowered=m["lowered"] + "x")),
     "its bytes or its header were changed"),
    (lambda p: _rewrite_entry(p, lambda m, d: (dict(m, lowered="_Zother"), d)),
     "names an entry point '_Zother' that its CUBIN does not hold"),
    (lambda p: _rewrite_entry(p, lambda m, d: (m, d[:len(d) // 2])), "(truncated)"),
], ids=["edited-name", "edited-name-resigned", "cut-resigned"])
def test_an_edited_entry_point_or_a_cut_cubin_is_compiled_again(fake, shared_root, caplog,
                                                                damage, why):
    """The entry-point name is covered by the header's SHA-256 and must be in the payload, and
    a CUBIN must be a whole ELF file: an entry edited or cut, even with its size and SHA-256
    rewritten to match, is not handed to the driver (a wrong name would fail the family in
    every process, a cut CUBIN would crash the process) but compiled again and replaced."""
    first = cache.binary(PROG, 90, quiet=True)
    path = _entry(shared_root)
    damage(path)
    cache._memory.clear()
    fake.calls.clear()
    with caplog.at_level(logging.WARNING, logger="rnn_ablations"):
        got, source = cache.lookup(PROG, 90, quiet=True)
    assert source == "compiled" and len(fake.calls) == 1
    assert got.lowered == first.lowered and got.data == first.data
    said = _records(caplog, "compiling it again")
    assert len(said) == 1 and why in said[0], caplog.text
    assert cache.read_entry(path, PROG, "sm_90")[1] is None


def test_an_entry_of_an_older_format_is_replaced_as_a_missing_one(fake, shared_root, caplog):
    cache.binary(PROG, 90, quiet=True)
    path = _entry(shared_root)
    with open(path, "wb") as f:
        f.write(b'rnn_ablations-cuda-1\n{"size": 1}\nx')
    cache._memory.clear()
    fake.calls.clear()
    with caplog.at_level(logging.WARNING, logger="rnn_ablations"):
        _, source = cache.lookup(PROG, 90)
    assert source == "compiled" and len(fake.calls) == 1
    said = [r.getMessage() for r in caplog.records if r.name == "rnn_ablations"]
    assert len(said) == 1 and "compiling the CUDA kernel" in said[0], said
    assert cache.read_entry(path, PROG, "sm_90")[1] is None


def test_a_whole_entry_is_read_back_silently(fake, shared_root, caplog):
    first = cache.binary(PROG, 90, quiet=True)
    cache._memory.clear()
    with caplog.at_level(logging.WARNING, logger="rnn_ablations"):
        got, source = cache.lookup(PROG, 90)
    assert source == "disk" and got.data == first.data and got.lowered == first.lowered
    assert got.sha256 == first.sha256 and not caplog.records
    assert cache.read_entry(os.path.join(shared_root, "cuda", "absent.bin"), PROG,
                            "sm_90") == (None, None)
