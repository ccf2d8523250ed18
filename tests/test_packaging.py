"""Packaging: metadata, the wheel's contents, the kernel's loading and ISA choice, the commands'
optional dependencies, the shipped configs and nn.LSTM's surface of AblatedRNN.

The end-to-end check (build the wheel in isolation, install it into a clean venv, import it:
the kernel is compiled on first use) is `scripts/check_wheel.sh`, run by `.ci/run`."""
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

import rnn_ablations as ra
from rnn_ablations import AblatedRNN, cli
from rnn_ablations.commands import configs

from conftest import REPO as ROOT, requires_kernel

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = None


def _pyproject():
    if tomllib is None:
        pytest.skip("tomllib needs Python 3.11")
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)


def test_metadata():
    meta = _pyproject()["project"]
    assert meta["version"] == ra.__version__
    assert meta["license"] == "Apache-2.0" and meta["license-files"] == ["LICENSE"]
    assert "Apache License" in (ROOT / "LICENSE").read_text()[:200]
    deps = meta["dependencies"]
    assert [re.split(r"[<>=!~ ]", d)[0] for d in deps] == ["torch", "numpy"]
    torch_spec = deps[0]
    major_minor = tuple(int(v) for v in torch.__version__.split("+")[0].split(".")[:2])
    low = tuple(int(v) for v in re.search(r">=(\d+)\.(\d+)", torch_spec).groups())
    high = tuple(int(v) for v in re.search(r"<(\d+)\.(\d+)", torch_spec).groups())
    assert low <= major_minor < high, f"the torch tested here ({torch.__version__}) is outside {torch_spec}"
    extras = meta["optional-dependencies"]
    assert set(extras) >= {"lm", "viz", "allennlp", "onmt", "all"}
    assert {"tqdm", "matplotlib"} <= set(extras["lm"])
    assert meta["scripts"]["rnn-ablations"] == "rnn_ablations.cli:main"


def _pins():
    """{normalised name: version} of requirements/constraints.txt and core.txt (pip freeze
    leaves out setuptools, which core.txt pins)."""
    pins = {}
    for f in ("constraints.txt", "core.txt"):
        for line in (ROOT / "requirements" / f).read_text().splitlines():
            if "==" in line and not line.startswith("#"):
                name, version = line.split("==", 1)
                pins[re.sub(r"[-_.]+", "-", name.strip()).lower()] = version.strip()
    return pins


@pytest.mark.parametrize("extra", ["allennlp", "onmt", "lm", "viz"])
def test_extra_pins_admit_the_tested_versions(extra):
    """Every requirement of an extra is met by the version the tested set pins
    (requirements/constraints.txt): installing the extra alone gives a set of the kind the tests
    ran with.  The AllenNLP set includes setuptools < 81 (py-rouge, which allennlp-models
    imports, needs pkg_resources, which setuptools 81 removed: the parser would not register)."""
    from packaging.requirements import Requirement

    pins = _pins()
    reqs = [Requirement(r) for r in _pyproject()["project"]["optional-dependencies"][extra]]
    for req in reqs:
        name = re.sub(r"[-_.]+", "-", req.name).lower()
        assert name in pins, f"{req} of [{extra}] is not pinned in requirements/constraints.txt"
        assert req.specifier.contains(pins[name], prereleases=True), \
            f"[{extra}] asks {req} but the tested set has {name}=={pins[name]}"
    if extra == "allennlp":
        setuptools = [r for r in reqs if r.name == "setuptools"]
        assert setuptools and not setuptools[0].specifier.contains("81.0"), setuptools


def test_setup_sh_installs_every_extra_it_pins():
    """requirements/*.txt (scripts/setup.sh) and the extras name the same packages."""
    extras = _pyproject()["project"]["optional-dependencies"]

    def names(lines):
        return {re.split(r"[<>=!~ \[]", l.strip())[0].lower().replace("_", "-")
                for l in lines if l.strip() and not l.startswith("#")}
    req = ROOT / "requirements"
    assert names(extras["allennlp"]) == names((req / "allennlp.txt").read_text().splitlines())
    assert names(extras["onmt"]) == names((req / "onmt.txt").read_text().splitlines())


@pytest.fixture(scope="module")
def pure_wheel(tmp_path_factory):
    """The wheel `pip wheel .` builds where torch is absent from the build environment (as in
    pip's isolated build): here with RNN_ABLATIONS_NO_KERNEL=1 and the current environment, so
    that no compiler runs and nothing is downloaded."""
    out = tmp_path_factory.mktemp("wheel")
    env = dict(os.environ, RNN_ABLATIONS_NO_KERNEL="1", RNN_ABLATIONS_NO_CUDA="1")
    build = tmp_path_factory.mktemp("build")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(out), str(ROOT)],
        env=env, cwd=build, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    wheels = list(out.glob("*.whl"))
    assert len(wheels) == 1
    return wheels[0]


@pytest.mark.slow  # builds the wheel
def test_wheel_contents(pure_wheel):
    assert pure_wheel.name.endswith("-py3-none-any.whl"), pure_wheel.name
    with zipfile.ZipFile(pure_wheel) as z:
        names = set(z.namelist())
        meta_name = next(n for n in names if n.endswith(".dist-info/METADATA"))
        meta = z.read(meta_name).decode()
    assert "rnn_ablations_hooks.pth" in names and "rnn_ablations_hooks.py" in names
    assert "rnn_ablations/py.typed" in names      # PEP 561: the package's annotations are used
    src = ROOT / "rnn_ablations" / "csrc"
    csrc = sorted(p.relative_to(src).as_posix() for p in src.rglob("*")
                  if p.suffix in (".cpp", ".cu", ".h"))
    assert {"bindings.cpp", "kernel_spec.h", "elementwise.h", "vec_impl.h"} <= {
        f.rsplit("/", 1)[-1] for f in csrc}
    for f in csrc:  # every kernel source, so that the kernel can be compiled on first use
        assert f"rnn_ablations/csrc/{f}" in names, f
    assert "rnn_ablations/kernels/build.py" in names and "rnn_ablations/kernels/loader.py" in names
    shipped = {n.rsplit("/", 1)[1] for n in names if n.startswith("rnn_ablations/configs/")}
    in_repo = {p.name for d in ("allennlp_configs", "onmt_configs", "tests/fixtures/onmt",
                                "tests/fixtures/allennlp")
               for p in (ROOT / d).iterdir()}
    assert shipped == in_repo
    assert not any(n.endswith(".so") for n in names)
    assert re.search(r"^License-Expression: Apache-2.0$", meta, re.M)
    assert re.search(r'^Provides-Extra: lm$', meta, re.M)
    assert re.search(r'^Requires-Dist: tqdm; extra == "lm"$', meta, re.M)


# ------------------------------------------------------------------------------- the kernel
def _python(code, **env):
    e = dict(os.environ)
    e.update(env)
    e["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    return subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True,
                          timeout=300)


@requires_kernel
def test_isa_environment_variable():
    for isa in ra.supported_kernel_isas():
        proc = _python("import rnn_ablations as ra; print(ra.kernel_isa())", RNN_ABLATIONS_ISA=isa)
        assert proc.returncode == 0 and proc.stdout.strip() == isa, proc.stderr[-2000:]
    # refused where the kernel is first used (the import loads no kernel)
    first_use = "import rnn_ablations as ra; ra.kernel_available()"
    proc = _python(first_use, RNN_ABLATIONS_ISA="sse9")
    assert proc.returncode != 0
    assert "'sse9'" in proc.stderr and all(i in proc.stderr for i in ("avx512", "avx2", "portable"))
    # a path this CPU cannot run: refused, with the paths it can
    for isa in ("avx512", "avx2"):
        if isa not in ra.supported_kernel_isas():
            proc = _python(first_use, RNN_ABLATIONS_ISA=isa)
            assert proc.returncode != 0 and f"kernel ISA '{isa}' requested" in proc.stderr, proc.stderr[-2000:]
            assert "'portable' or 'auto'" in proc.stderr


@requires_kernel
def test_kernel_module_is_stripped_and_records_its_torch():
    from rnn_ablations import _C
    assert _C.torch_version == torch.__version__
    proc = subprocess.run(["readelf", "-S", _C.__file__], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip("readelf not available")
    assert ".debug_info" not in proc.stdout, "the kernel was built with debug info"


def test_first_use_compile_failure_warns_and_names_the_fix(tmp_path, monkeypatch, caplog):
    """Without a working compiler the loader returns no kernel, says why and how to fix it."""
    from rnn_ablations.kernels import loader as _kernel_loader
    monkeypatch.setattr(_kernel_loader, "_installed", lambda: (None, "no kernel built at install time"))
    monkeypatch.setenv("RNN_ABLATIONS_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("RNN_ABLATIONS_NO_KERNEL", raising=False)
    monkeypatch.delenv("RNN_ABLATIONS_DISABLE_KERNEL", raising=False)
    monkeypatch.setenv("CC", "/nonexistent/cc")
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    with caplog.at_level("WARNING", logger="rnn_ablations"):
        module, why, source = _kernel_loader.load_cpu_kernel()
    assert module is None and source == ""
    assert "apt install g++ python3-dev" in why and "RNN_ABLATIONS_NO_KERNEL=1" in why
    assert "it cannot be compiled here: no C++ compiler" in why, why
    # checked before the build is announced or run: no "compiling" line, no compiler output
    assert not any("compiling the CPU kernel" in r.getMessage() for r in caplog.records)
    assert "no-build-isolation" not in why and "\n" not in why, why
    assert any("generic PyTorch path" in r.getMessage() for r in caplog.records)
    monkeypatch.setenv("RNN_ABLATIONS_NO_KERNEL", "1")  # asked for: no compile, no warning
    caplog.clear()
    module, why, _ = _kernel_loader.load_cpu_kernel()
    assert module is None and "RNN_ABLATIONS_NO_KERNEL" in why and not caplog.records


# ------------------------------------------------------------------------------- commands
def test_version_option(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--version"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"rnn-ablations {ra.__version__} (torch "), out


def test_configs_command(capsys):
    assert cli.main(["configs"]) == 0
    out = capsys.readouterr().out
    for name in ("bidaf_srnn", "biaffine_parser_ran", "drqa_lstm", "multi30k_bran", "smoke_multi30k"):
        assert re.search(rf"^  {name}$", out, re.M), name
    assert cli.main(["configs", "path", "bidaf_srnn"]) == 0
    path = Path(capsys.readouterr().out.strip())
    assert path.is_file() and path.read_text().startswith('local encoder = "srnn";')
    assert cli.main(["configs", "path", "multi30k_bran.yaml"]) == 0
    assert capsys.readouterr().out.strip().endswith("multi30k_bran.yaml")
    assert cli.main(["configs", "path", "onmt_toy_data"]) == 0
    data = Path(capsys.readouterr().out.strip())
    assert sorted(p.name for p in data.iterdir()) == [
        "src-train.txt", "src-val.txt", "tgt-train.txt", "tgt-val.txt"]
    assert cli.main(["configs", "path", "allennlp_toy_data"]) == 0
    data = Path(capsys.readouterr().out.strip())
    assert {"squad_tiny.json", "ud_tiny.conllu", "glove_tiny_8d.txt"} <= {p.name for p in data.iterdir()}
    assert cli.main(["configs", "path", "bidaf_sr"]) == 2
    assert "did you mean bidaf_srnn" in capsys.readouterr().err


#: what a shipped config's comments may not name: files of a checkout that the wheel lacks
_CHECKOUT_ONLY = re.compile(r"benchmarks/|\$REPO|tests/|scripts/|docs/|allennlp_configs/|onmt_configs/")


def test_shipped_configs_name_only_what_the_wheel_has():
    from rnn_ablations.commands.configs import config_files

    files = config_files()
    assert len(files) >= 20
    for name, path in files.items():
        comment = "#" if path.suffix == ".yaml" else "//"
        for number, line in enumerate(path.read_text().splitlines(), 1):
            text = line[line.index(comment):] if comment in line else ""
            assert not _CHECKOUT_ONLY.search(text), f"{path.name}:{number}: {line}"


def test_command_help_names_only_what_the_wheel_has():
    import argparse

    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert "speed" in sub.choices
    for name, command in sub.choices.items():
        text = command.format_help()
        found = _CHECKOUT_ONLY.search(text)
        assert not found, f"`rnn-ablations {name} --help` names {found.group(0)!r}:\n{text}"


@pytest.mark.parametrize("command,argv,module,extra", [
    ("ablate", ["ablate", "--out", "unused"], "tqdm", 'pip install "$PKG[lm]"'),
    ("ablate", ["ablate", "--out", "unused"], "matplotlib", 'pip install "$PKG[lm]"'),
    ("visualize", ["visualize", "--model", "m", "--text", "a b", "--out", "f.png"], "matplotlib",
     'pip install "$PKG[viz]"'),
    ("onmt-train", ["onmt-train", "-config", "x.yaml"], "onmt", 'pip install "$PKG[onmt]"'),
])
def test_command_names_its_missing_extra(monkeypatch, capsys, tmp_path, command, argv, module, extra):
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == module else real(name, *a))
    monkeypatch.chdir(tmp_path)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert f"`rnn-ablations {command}` needs {module}" in err and extra in err
    assert not (tmp_path / "unused").exists()


# ------------------------------------------------------------------------------- nn.LSTM surface
@pytest.mark.parametrize("layers,bidirectional", [(1, False), (2, True)])
def test_nn_lstm_surface(layers, bidirectional):
    ours = AblatedRNN("lstm", 3, 4, num_layers=layers, bidirectional=bidirectional)
    ref = torch.nn.LSTM(3, 4, num_layers=layers, bidirectional=bidirectional)
    assert ours._flat_weights_names == ref._flat_weights_names
    assert ours._all_weights == ref._all_weights
    ours.load_state_dict(ref.state_dict())
    for a_row, b_row in zip(ours.all_weights, ref.all_weights):
        for a, b in zip(a_row, b_row):
            assert torch.equal(a, b)
    x = torch.randn(5, 2, 3)
    before = ours(x)[0]
    assert ours.flatten_parameters() is None
    assert torch.equal(ours(x)[0], before)
    ran = AblatedRNN("ran", 3, 4, bidirectional=True)
    assert ran._flat_weights_names == ["weight_ih_l0", "weight_hh_l0", "bias_l0", "weight_ih_l0_reverse",
                                       "weight_hh_l0_reverse", "bias_l0_reverse"]
    assert [p for row in ran.all_weights for p in row] == list(ran.parameters())


def test_first_use_compile_error_names_the_log_not_a_compiler_install(tmp_path, monkeypatch):
    """A compiler that is there but fails (here one that exits 1 at once) is not fixed by
    installing one: the fix names the build log instead."""
    from rnn_ablations.kernels import loader as _kernel_loader
    monkeypatch.setattr(_kernel_loader, "_installed", lambda: (None, "no kernel built at install time"))
    monkeypatch.setenv("RNN_ABLATIONS_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("RNN_ABLATIONS_NO_KERNEL", raising=False)
    monkeypatch.delenv("RNN_ABLATIONS_DISABLE_KERNEL", raising=False)
    failing = tmp_path / "c++"
    failing.write_text("#!/bin/sh\necho 'c++: error: this compiler always fails' >&2\nexit 1\n")
    failing.chmod(0o755)
    monkeypatch.setenv("CC", str(failing))
    monkeypatch.setenv("CXX", str(failing))
    module, why, source = _kernel_loader.load_cpu_kernel()
    assert module is None and source == ""
    assert "the compiler failed" in why, why
    assert "apt install g++" not in why, why
    assert "read the compiler's errors in" in why and "build.log" in why, why
