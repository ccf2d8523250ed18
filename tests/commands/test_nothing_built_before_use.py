"""A fresh install answers at once: ``import rnn_ablations`` and the commands that run no layer
(``--help``, ``--version``, ``variants``, ``configs path``, ``kernels --help``) neither load nor
compile the CPU kernel, and the import does not pull in ``torch._dynamo`` / ``torch._inductor``.

Each child runs with an empty kernel cache, no installed module (``sys.modules["rnn_ablations._C"]
= None``: what a wheel installed without torch in its build environment has) and no compiler
(``CXX`` names no file).  A child that tried to load the kernel would leave a trace the test reads:
the loader's "no C++ compiler" warning on stderr and its record of the failed build in the cache
folder.  The first layer call does load it (:func:`test_a_layer_call_loads_the_kernel`, the
control that shows the trace appears when a load happens)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: the child's prologue: no kernel installed with the package
NO_INSTALLED = "import sys; sys.modules['rnn_ablations._C'] = None\n"
CLI = NO_INSTALLED + "from rnn_ablations.cli import main\nsys.exit(main(sys.argv[1:]))\n"


def _run(code, tmp_path, *argv):
    env = {k: v for k, v in os.environ.items()
           if k not in ("RNN_ABLATIONS_NO_KERNEL", "RNN_ABLATIONS_DISABLE_KERNEL",
                        "RNN_ABLATIONS_NO_CPU_KERNEL")}
    env.update(RNN_ABLATIONS_CACHE=str(tmp_path / "cache"), CC="/nonexistent/cc",
               CXX="/nonexistent/c++")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    return subprocess.run([sys.executable, "-c", code, *argv], env=env, capture_output=True,
                          text=True, timeout=600, cwd=str(tmp_path))


def _cache_entries(tmp_path):
    """Every file the child left in its kernel cache (none when nothing was loaded)."""
    cache = tmp_path / "cache"
    return sorted(str(p.relative_to(cache)) for p in cache.rglob("*")) if cache.exists() else []


def _assert_nothing_loaded(proc, tmp_path):
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "compiling the CPU kernel" not in out and "CPU kernel is not available" not in out, out
    assert _cache_entries(tmp_path) == [], _cache_entries(tmp_path)


@pytest.mark.parametrize("argv", [
    ["--help"], ["--version"], ["variants"], ["configs", "path", "onmt_toy_data"],
    ["kernels", "--help"], ["kernels", "build", "--help"],
], ids=" ".join)
def test_command_loads_no_kernel(tmp_path, argv):
    proc = _run(CLI, tmp_path, *argv)
    _assert_nothing_loaded(proc, tmp_path)
    assert proc.stdout.strip(), proc.stderr


def test_import_loads_no_kernel_and_no_compiler_stack(tmp_path):
    code = NO_INSTALLED + (
        "import json, rnn_ablations\n"
        "from rnn_ablations.kernels import registry\n"
        "print(json.dumps({'loaded': registry.cpu_kernel_loaded(),\n"
        "                  'dynamo': 'torch._dynamo' in sys.modules,\n"
        "                  'inductor': 'torch._inductor' in sys.modules}))\n")
    proc = _run(code, tmp_path)
    _assert_nothing_loaded(proc, tmp_path)
    assert json.loads(proc.stdout.splitlines()[-1]) == {
        "loaded": False, "dynamo": False, "inductor": False}


def test_a_layer_call_loads_the_kernel(tmp_path):
    """The control: the first layer call loads the kernel (here: tries to build it, finds no
    compiler, says so once and runs the generic path), which leaves the traces the tests above
    look for."""
    code = NO_INSTALLED + (
        "import torch, rnn_ablations as ra\n"
        "from rnn_ablations.kernels import registry\n"
        "m = ra.AblatedRNN('ran', 4, 8)\n"
        "assert not registry.cpu_kernel_loaded()\n"
        "out = m(torch.randn(3, 2, 4))[0]\n"
        "print(registry.cpu_kernel_loaded(), ra.kernel_available(), tuple(out.shape))\n")
    proc = _run(code, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "False", "(3,", "2,", "8)"], proc.stdout
    assert proc.stderr.count("no C++ compiler") == 1, proc.stderr
    assert _cache_entries(tmp_path), "the failed build left no record in the cache"


def test_the_constant_mark_is_the_one_torch_sets():
    """``rnn_ablations._dynamo_marks.assume_constant_result`` sets what
    ``torch.compiler.assume_constant_result`` sets (and nothing else), so dynamo treats the
    package's plan functions as before."""
    import torch

    from rnn_ablations._dynamo_marks import assume_constant_result

    def theirs():
        return 1

    def ours():
        return 1

    assert torch.compiler.assume_constant_result(theirs) is theirs
    assert assume_constant_result(ours) is ours
    assert vars(ours) == vars(theirs) and vars(ours), (vars(ours), vars(theirs))
