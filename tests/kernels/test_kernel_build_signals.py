"""A first-use build of the CPU kernel dies with the process that imports the package, and never
runs twice at once in one cache folder.

The compiler is a stand-in (``$CXX``, a script that records its pid and sleeps), so no real
compile runs: the test kills the importing process while the build is inside the compiler and
checks that the compiler is gone and the folder's lock is free."""
import fcntl
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="PR_SET_PDEATHSIG and process groups: Linux")

CHILD = """
import sys
sys.modules["rnn_ablations._C"] = None   # no installed module: the first-use build runs
import rnn_ablations
rnn_ablations.kernel_available()         # the kernel's first use (the import loads nothing)
"""


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1].split()[0] not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return False


def _wait(predicate, seconds):
    end = time.time() + seconds
    while time.time() < end:
        if predicate():
            return True
        time.sleep(0.2)
    return predicate()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_killed_importer_stops_its_build(tmp_path, sig):
    pids = tmp_path / "compiler.pids"
    fake = tmp_path / "bin" / "c++"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\necho $$ >> {pids}\nexec sleep 300\n")
    fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items()
           if k not in ("RNN_ABLATIONS_NO_KERNEL", "RNN_ABLATIONS_DISABLE_KERNEL")}
    env.update(RNN_ABLATIONS_CACHE=str(tmp_path / "cache"), CXX=str(fake), CC=str(fake),
               PATH=f"{fake.parent}{os.pathsep}{env.get('PATH', '')}",
               PYTHONPATH=os.pathsep.join([str(ROOT)] + [p for p in [env.get("PYTHONPATH")] if p]))
    proc = subprocess.Popen([sys.executable, "-c", CHILD], env=env, cwd=str(tmp_path),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        assert _wait(lambda: pids.exists() and pids.read_text().strip(), 120), \
            "the build never reached the compiler"
        compilers = [int(p) for p in pids.read_text().split()]
        proc.send_signal(sig)
        proc.wait(timeout=30)
        assert _wait(lambda: not any(_alive(p) for p in pids.read_text().split()), 20), \
            f"the build outlived the importer killed by {sig!r}: {pids.read_text().split()}"
        assert compilers
        # the folder's build lock is free: the next import may build
        (folder,) = [p for p in (tmp_path / "cache").iterdir() if p.name.startswith("cpu-")]
        with open(folder / ".lock", "w") as lock:
            def free():
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return True
                except BlockingIOError:
                    return False
            assert _wait(free, 20), "the build lock is still held after the build stopped"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for p in (pids.read_text().split() if pids.exists() else []):
            try:
                os.kill(int(p), signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_build_holds_the_lock_in_its_own_process():
    """The build process inherits the folder's lock descriptor: a dead importer does not free
    the folder while its build runs."""
    from rnn_ablations.kernels import loader
    import inspect

    source = inspect.getsource(loader._compile)
    assert "lock.fileno()" in source
    assert "start_new_session=True" in inspect.getsource(loader._run_build)
