"""``rnn-ablations kernels build`` / ``precompile-cuda``: the explicit build step."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rnn_ablations import cli

ROOT = Path(__file__).resolve().parents[2]


def _run(code, tmp_path, **env):
    e = {k: v for k, v in os.environ.items()
         if k not in ("RNN_ABLATIONS_NO_KERNEL", "RNN_ABLATIONS_DISABLE_KERNEL")}
    e.update(env)
    e["RNN_ABLATIONS_CACHE"] = str(tmp_path / "cache")
    e["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    return subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True,
                          timeout=600, cwd=str(tmp_path))


MAIN = "import sys; from rnn_ablations.cli import main; sys.exit(main(['kernels', 'build']))"


def test_build_names_the_module_it_has(tmp_path):
    from rnn_ablations.kernels import registry
    if registry.cpu_kernel() is None:
        pytest.skip(f"no CPU kernel here: {registry.cpu_kernel_error()}")
    proc = _run(MAIN, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "CPU kernel for torch" in proc.stdout and ".so" in proc.stdout, proc.stdout


def test_build_without_a_compiler_says_so_in_one_line(tmp_path):
    """No installed module, an empty cache and no compiler: one clean line, before any
    "compiling" announcement, with no compiler output and no pip advice."""
    code = "import sys; sys.modules['rnn_ablations._C'] = None\n" + MAIN
    proc = _run(code, tmp_path, CC="/nonexistent/cc", CXX="/nonexistent/c++")
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    errors = [line for line in proc.stderr.splitlines() if "kernels build: error" in line]
    assert len(errors) == 1, proc.stderr
    assert "no C++ compiler" in errors[0] and "apt install g++ python3-dev" in errors[0]
    assert "compiling the CPU kernel" not in proc.stderr, proc.stderr
    assert "no-build-isolation" not in proc.stderr and "Traceback" not in proc.stderr
    # said once, and not sending the user to the command that just failed
    assert proc.stderr.count("no C++ compiler") == 1, proc.stderr
    assert "`rnn-ablations kernels build`" not in proc.stderr, proc.stderr
    # a second run tries again (the failure the first remembered does not stop it)
    again = _run(code, tmp_path, CC="/nonexistent/cc", CXX="/nonexistent/c++")
    assert again.returncode == 1 and again.stderr.count("no C++ compiler") == 1, again.stderr


def test_build_refuses_while_the_kernel_is_switched_off(tmp_path):
    proc = _run(MAIN, tmp_path, RNN_ABLATIONS_NO_KERNEL="1")
    assert proc.returncode == 2 and "unset it to build the kernel" in proc.stderr, proc.stderr


def test_precompile_cuda_reads_its_options_as_the_module_does(monkeypatch, capsys):
    """The command and ``python -m rnn_ablations.kernels.cuda.precompile`` share one parser
    definition: --arch repeated or listed compiles every architecture named (each once), and a
    wrong value is reported with the usage of the command that was run."""
    from rnn_ablations.kernels.cuda import precompile
    seen = []
    monkeypatch.setattr(precompile, "precompile",
                        lambda arch, jobs=1, force=False, out=None: seen.append((arch, jobs,
                                                                                force)) or 0)
    assert cli.main(["kernels", "precompile-cuda", "--arch", "sm_80", "--arch", "sm_90",
                     "--jobs", "2", "--force"]) == 0
    assert seen == [(80, 2, True), (90, 2, True)]
    seen.clear()
    assert cli.main(["kernels", "precompile-cuda", "--arch", "sm_80,sm_90", "--arch",
                     "sm_90"]) == 0
    assert [a for a, _, _ in seen] == [80, 90]
    seen.clear()
    assert precompile.main(["--arch", "sm_80", "--arch", "sm_86"]) == 0
    assert [a for a, _, _ in seen] == [80, 86]
    seen.clear()
    capsys.readouterr()
    for bad in (["--arch", "hopper"], ["--jobs", "0"]):
        with pytest.raises(SystemExit) as exc:
            cli.main(["kernels", "precompile-cuda"] + bad)
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert "kernels precompile-cuda" in err and "python -m" not in err, err
    assert seen == []