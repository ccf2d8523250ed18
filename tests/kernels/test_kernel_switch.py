"""The kernel on/off switch (``RNN_ABLATIONS_NO_KERNEL``, parsed by ``rnn_ablations._env``) and the
check of the module installed inside the package before it is mapped.

The child processes import a copy of the package (``_package_copy``) so that the module
"installed" in it can be truncated or removed without touching the checkout."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from rnn_ablations import _env

from rnn_ablations.kernels import build as _build, loader as _kernel_loader

from conftest import REPO, requires_kernel


@pytest.mark.parametrize("environ,disabled", [
    ({}, False), ({"RNN_ABLATIONS_NO_KERNEL": ""}, False), ({"RNN_ABLATIONS_NO_KERNEL": "0"}, False),
    ({"RNN_ABLATIONS_NO_KERNEL": "1"}, True), ({"RNN_ABLATIONS_NO_KERNEL": " 1 "}, True),
    ({"RNN_ABLATIONS_DISABLE_KERNEL": "1"}, True), ({"RNN_ABLATIONS_DISABLE_KERNEL": "0"}, False),
    ({"RNN_ABLATIONS_NO_KERNEL": "1", "RNN_ABLATIONS_DISABLE_KERNEL": "1"}, True),
])
def test_switch_values(environ, disabled):
    assert _env.kernel_disabled(environ) is disabled


@pytest.mark.parametrize("environ,message", [
    ({"RNN_ABLATIONS_NO_KERNEL": "yes"}, "RNN_ABLATIONS_NO_KERNEL='yes' is not understood"),
    ({"RNN_ABLATIONS_NO_KERNEL": "true"}, "RNN_ABLATIONS_NO_KERNEL='true' is not understood"),
    ({"RNN_ABLATIONS_DISABLE_KERNEL": "yes"},
     "RNN_ABLATIONS_DISABLE_KERNEL is another name for RNN_ABLATIONS_NO_KERNEL"),
    ({"RNN_ABLATIONS_NO_KERNEL": "2"}, "set it to 1 to run without the compiled kernels"),
    ({"RNN_ABLATIONS_NO_KERNEL": "1", "RNN_ABLATIONS_DISABLE_KERNEL": "0"}, "disagree"),
])
def test_switch_refuses_other_values(environ, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        _env.kernel_disabled(environ)


def test_cache_root():
    assert _env.cache_root({"RNN_ABLATIONS_CACHE": "~/k"}) == os.path.join(
        os.path.expanduser("~"), "k")
    assert _env.cache_root({"XDG_CACHE_HOME": "/x"}) == "/x/rnn_ablations"
    assert _env.cache_root({"RNN_ABLATIONS_CACHE": " ", "XDG_CACHE_HOME": "/x"}) == "/x/rnn_ablations"


def _kernel_file():
    from rnn_ablations.kernels import registry
    return registry.cpu_kernel().raw.__file__


@pytest.fixture(scope="module")
def package_copy(tmp_path_factory):
    """A copy of the package whose installed CPU kernel is the one this process runs, with the
    record ``setup.py`` writes beside it."""
    root = tmp_path_factory.mktemp("copy")
    shutil.copytree(REPO / "rnn_ablations", root / "rnn_ablations",
                    ignore=shutil.ignore_patterns("__pycache__", "_C*.so", "_C*.json"))
    target = root / "rnn_ablations" / os.path.basename(_kernel_file())  # _C.<abi tag>.so
    shutil.copyfile(_kernel_file(), target)
    _build.write_installed_record(str(target), __import__("torch").__version__)
    return root, target


CHILD = """
import json, sys, torch
import rnn_ablations as ra
from rnn_ablations.kernels import registry
m = ra.AblatedRNN("ran", 3, 4)
x = torch.randn(5, 2, 3)
out = m(x)[0]
with ra.use_backend("generic"):
    ref = m(x)[0]
print(json.dumps({"source": registry.cpu_kernel_source(), "error": registry.cpu_kernel_error(),
                  "loaded": "rnn_ablations._C" in sys.modules, "file": ra.__file__,
                  "available": ra.kernel_available(), "equal": bool(torch.allclose(out, ref, atol=1e-5))}))
"""


def _child(root, cache, **env):
    e = {k: v for k, v in os.environ.items() if k not in ("RNN_ABLATIONS_NO_KERNEL",
                                                           "RNN_ABLATIONS_DISABLE_KERNEL",
                                                           "RNN_ABLATIONS_BACKEND")}
    e.update(env, RNN_ABLATIONS_CACHE=str(cache), PYTHONPATH=str(root),
             CC="/nonexistent/cc", CXX="/nonexistent/c++")
    proc = subprocess.run([sys.executable, "-c", CHILD], env=e, capture_output=True, text=True,
                          timeout=600, cwd=str(root))
    assert proc.returncode == 0, (
        f"import rnn_ablations exited with {proc.returncode} (-7/135: SIGBUS)\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["file"].startswith(str(root)) and result["equal"], result
    return result, proc.stderr


@requires_kernel
def test_installed_module_with_its_record_loads(package_copy, tmp_path):
    root, _ = package_copy
    result, _ = _child(root, tmp_path / "cache")
    assert result["source"] == "installed" and result["available"], result


@requires_kernel
def test_switch_keeps_the_installed_module_unloaded(package_copy, tmp_path):
    """RNN_ABLATIONS_NO_KERNEL=1 (or its other name) is read before anything is mapped."""
    root, _ = package_copy
    result, err = _child(root, tmp_path / "cache", RNN_ABLATIONS_NO_KERNEL="1")
    assert not result["loaded"] and not result["available"], result
    assert "RNN_ABLATIONS_NO_KERNEL=1 is set" in result["error"] and "Traceback" not in err
    e = dict(os.environ, PYTHONPATH=str(root), RNN_ABLATIONS_NO_KERNEL="yes")
    proc = subprocess.run([sys.executable, "-c", "import rnn_ablations"], env=e,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "RNN_ABLATIONS_NO_KERNEL='yes' is not understood" in proc.stderr


def test_other_name_of_the_switch_in_the_loader(monkeypatch):
    monkeypatch.delenv("RNN_ABLATIONS_NO_KERNEL", raising=False)
    monkeypatch.setenv("RNN_ABLATIONS_DISABLE_KERNEL", "1")
    module, why, source = _kernel_loader.load_cpu_kernel()
    assert module is None and source == "" and "RNN_ABLATIONS_DISABLE_KERNEL=1 is set" in why
    monkeypatch.setenv("RNN_ABLATIONS_DISABLE_KERNEL", "yes")
    with pytest.raises(ValueError, match="another name for RNN_ABLATIONS_NO_KERNEL"):
        _kernel_loader.load_cpu_kernel()


@requires_kernel
def test_truncated_installed_module_is_not_mapped(package_copy, tmp_path):
    """A truncated installed module used to kill the import with SIGBUS; now it is refused by
    its record and the generic path runs (the compiler is hidden: no first-use build)."""
    root, target = package_copy
    copy = tmp_path / "pkg"
    shutil.copytree(root, copy)
    module = copy / "rnn_ablations" / target.name
    size = module.stat().st_size
    with open(module, "r+b") as f:
        f.truncate(size // 2)
    result, err = _child(copy, tmp_path / "cache")
    assert not result["loaded"] and not result["available"], result
    assert "truncated or overwritten" in err and f"{size // 2} bytes, its record says {size}" in err
    # with the switch: nothing is even looked at
    result, err = _child(copy, tmp_path / "cache", RNN_ABLATIONS_NO_KERNEL="1")
    assert not result["loaded"] and "truncated" not in err
    # no record (a module built before records were written, or copied alone): not mapped either
    os.remove(copy / "rnn_ablations" / _build.INSTALLED_RECORD)
    assert "has no size and SHA-256 record" in _kernel_loader.installed_record_problem(str(module))


# ------------------------------------------------------------------------------- first use
FIRST_USE = """
import json, time, torch
t = time.perf_counter()
import rnn_ablations as ra
from rnn_ablations.kernels import loader as _kernel_loader
import_s = time.perf_counter() - t
available = ra.kernel_available()  # the kernel's first use
print(json.dumps({"import_s": import_s, "loader_s": _kernel_loader.last_load_seconds,
                  "available": available}))
"""


@pytest.mark.slow  # the kernel's first-use build
def test_failed_first_use_build_is_remembered(tmp_path):
    """No compiler: the first import looks for one and warns; the next ones neither look nor
    print anything (the loader's part of the import well under a second), until the build
    environment changes."""
    root = tmp_path / "pkg"
    shutil.copytree(REPO / "rnn_ablations", root / "rnn_ablations",
                    ignore=shutil.ignore_patterns("__pycache__", "_C*.so", "_C*.json"))
    cache = tmp_path / "cache"
    e = {k: v for k, v in os.environ.items() if k not in ("RNN_ABLATIONS_NO_KERNEL",
                                                           "RNN_ABLATIONS_DISABLE_KERNEL")}
    e.update(RNN_ABLATIONS_CACHE=str(cache), PYTHONPATH=str(root), CC="/nonexistent/cc",
             CXX="/nonexistent/c++")
    runs = []
    for _ in range(3):
        proc = subprocess.run([sys.executable, "-c", FIRST_USE], env=e, capture_output=True,
                              text=True, timeout=600, cwd=str(tmp_path))
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs.append((json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr))
    warnings = [err.count("the CPU kernel is not available") for _, err in runs]
    assert warnings == [1, 0, 0], [err[-2000:] for _, err in runs]
    # the compiler is looked for before any "compiling" announcement: one line says it is missing
    assert "compiling the CPU kernel" not in runs[0][1]
    assert "Later processes do not compile" in runs[0][1]
    for result, err in runs[1:]:
        assert not result["available"] and result["loader_s"] < 1.0, result
        assert "compiling" not in err
    # the same record, read in another build environment: tried again
    folders = [p for p in cache.iterdir() if p.name.startswith("cpu-")]
    assert len(folders) == 1 and (folders[0] / _kernel_loader.FAILED).is_file()
    old = dict(os.environ)
    try:
        os.environ["CXX"] = "/nonexistent/c++"
        assert _kernel_loader._remembered_failure(str(folders[0])) is not None
        os.environ["CXX"] = "/nonexistent/other-c++"
        assert _kernel_loader._remembered_failure(str(folders[0])) is None
    finally:
        os.environ.clear()
        os.environ.update(old)


def test_first_use_build_reports_progress(tmp_path, monkeypatch, caplog):
    """A build says every PROGRESS_EVERY seconds how long it has run, how many files it has
    compiled (the object files it wrote) and how long the rest takes at the present load."""
    script = tmp_path / "slow_build.py"
    script.write_text(
        "import os, sys, time\n"
        "temp = sys.argv[sys.argv.index('--build-temp') + 1]\n"
        "os.makedirs(temp, exist_ok=True)\n"
        "for name in ('bindings.o', 'scan.o'):\n"
        "    open(os.path.join(temp, name), 'w').close()\n"
        "time.sleep(1.5)\n")
    monkeypatch.setattr(_build, "__file__", str(script))
    monkeypatch.setattr(_kernel_loader, "PROGRESS_EVERY", 0.4)
    monkeypatch.setenv("RNN_ABLATIONS_CACHE", str(tmp_path / "cache"))
    with caplog.at_level("WARNING", logger="rnn_ablations"):
        rc = _kernel_loader._run_build(str(tmp_path), str(tmp_path), str(tmp_path / "t"),
                                       str(tmp_path / "build.log"))
    assert rc == 0
    progress = [r.getMessage() for r in caplog.records if "still compiling" in r.getMessage()]
    files = len(_build.cpu_sources())
    assert progress and f"2 of {files} files compiled, about " in progress[-1], progress
    assert "s to go at the present load" in progress[-1], progress


def test_build_estimate_follows_the_cores_the_load_and_the_recorded_build(tmp_path, monkeypatch):
    """One estimate (:func:`loader.estimate_seconds`): the compilers' work shared by the jobs on
    the cores left by the load, never below the largest file on one core; a build recorded in
    the cache gives the work; the progress line's time to go shrinks as files are compiled."""
    est = _kernel_loader.estimate_seconds
    files = len(_build.cpu_sources())
    largest = _kernel_loader._LARGEST_SHARE
    # quiet, two cores, three compilers at once (2/3 of a core each): the work over two cores,
    # or the largest file on 2/3 of a core if that is longer
    quiet = max(100 / 2, largest * 100 * 1.5)
    assert est(cpu_seconds=100, files=files, cores=2, load=0, jobs=3) == pytest.approx(quiet)
    # many cores: the largest file on one core bounds it
    assert est(cpu_seconds=100, files=files, cores=64, load=0, jobs=66) == \
        pytest.approx(max(100 / files, largest * 100))
    assert est(cpu_seconds=100, files=files, cores=1, load=0, jobs=1) == pytest.approx(100.0)
    # a loaded machine: each compiler gets its share of the cores (2 of 5 + 3 runnable), and the
    # same compile takes more CPU time on shared cores
    slower = 1 + _kernel_loader._CONTENDED
    assert est(cpu_seconds=100, files=files, cores=2, load=5, jobs=3) == \
        pytest.approx(max(100 * slower / (3 * 0.25), largest * 100 * slower / 0.25))
    assert est(cpu_seconds=100, files=files, cores=2, load=1, jobs=3) == \
        pytest.approx(max(100 * (1 + _kernel_loader._CONTENDED / 2) / (3 * 0.5),
                          largest * 100 * (1 + _kernel_loader._CONTENDED / 2) / 0.5))
    # the build's own compilers in the load are not counted as others
    assert est(cpu_seconds=100, files=files, cores=2, load=3, jobs=3, building=3) == \
        pytest.approx(quiet)
    # no record in the cache: the default work; a recorded build's CPU seconds replace it
    monkeypatch.setenv("RNN_ABLATIONS_CACHE", str(tmp_path / "cache"))
    default = _kernel_loader._DEFAULT_CPU_SECONDS
    assert est(files=files, cores=2, load=0, jobs=3) == \
        pytest.approx(max(default / 2, largest * default * 1.5))
    folder = tmp_path / "cache" / "cpu-x"
    folder.mkdir(parents=True)
    (folder / _kernel_loader.RECORD).write_text(json.dumps({"cpu_seconds": 40.0}))
    assert est(files=files, cores=2, load=0, jobs=3) == pytest.approx(max(20.0, largest * 60))
    monkeypatch.setattr(_kernel_loader, "_load", lambda: 0.0)
    monkeypatch.setattr(_kernel_loader, "_cores", lambda: 2)
    left = [float(_kernel_loader.progress(1, done, files).split("about ")[1].split(" s")[0])
            for done in (["a.o"], ["bindings.o", "a.o"], ["bindings.o", "a.o", "b.o", "c.o"])]
    assert left[0] > left[1] > left[2] > 0, left
    # the same files done, later: the running compilers have done part of the rest
    later = [float(_kernel_loader.progress(t, [], files).split("about ")[1].split(" s")[0])
             for t in (1, 10)]
    assert later[0] > later[1], later
    assert _kernel_loader.progress(10, ["x.o"] * files, files).endswith("linking")


def test_a_second_process_says_it_waits_for_the_build(tmp_path, monkeypatch, caplog):
    import fcntl
    import threading

    folder = tmp_path / "f"
    folder.mkdir()
    holder = open(folder / ".lock", "w")
    fcntl.flock(holder, fcntl.LOCK_EX)
    (folder / _kernel_loader.BUILDING).write_text(json.dumps({"pid": 4242, "started": 0}))
    threading.Timer(1.0, lambda: fcntl.flock(holder, fcntl.LOCK_UN)).start()
    monkeypatch.setattr(_kernel_loader, "PROGRESS_EVERY", 0.4)
    with open(folder / ".lock", "w") as lock, caplog.at_level("WARNING", logger="rnn_ablations"):
        _kernel_loader._lock_waiting(fcntl, lock, str(folder))
        fcntl.flock(lock, fcntl.LOCK_UN)
    holder.close()
    messages = [r.getMessage() for r in caplog.records]
    assert any("waiting for another process (pid 4242, compiling for" in m for m in messages), messages
    assert any("still waiting for the other process's build" in m for m in messages), messages


def test_cut_installed_module_with_a_rewritten_size_is_not_mapped(package_copy, tmp_path):
    """The module cut inside its last LOAD segment and its record's size rewritten to match
    (a contrived SIGBUS): the SHA-256 refuses it before it is mapped, and the import lives."""
    import json
    root, target = package_copy
    copy = tmp_path / "pkg"
    shutil.copytree(root, copy)
    module = copy / "rnn_ablations" / target.name
    cut = module.stat().st_size - 4096
    with open(module, "r+b") as f:
        f.truncate(cut)
    record = copy / "rnn_ablations" / _build.INSTALLED_RECORD
    data = json.loads(record.read_text())
    data["size"] = cut
    record.write_text(json.dumps(data))
    assert "does not match the SHA-256" in _kernel_loader.installed_record_problem(str(module))
    result, err = _child(copy, tmp_path / "cache")
    assert not result["loaded"] and not result["available"], result
    assert "does not match the SHA-256 in its record" in err, err
