"""Every kernel class implements the declared interface (rnn_ablations.kernels.interface): every
public method of every kernel class, CUDA included, is a method of a protocol the class
implements, with exactly its parameters (names, kinds, defaults: no ``*args``); every class
declares its capabilities; and the run layer reads no private global of the kernel backend."""
import inspect
import re
from pathlib import Path

import pytest

from rnn_ablations.kernels import interface, ops
from rnn_ablations.kernels.cuda import graphs as cuda_graphs, ops as ops_cuda, recurrence as cuda_recurrence
from rnn_ablations.kernels.interface import (PROTOCOLS, PersistentEntries, PipelinedKernel,
                                             ScanKernel, StepKernel, WeightGrad)

CLASSES = {
    "CpuKernel": (ops.CpuKernel, (StepKernel, ScanKernel, PipelinedKernel, WeightGrad)),
    "CudaKernel": (ops_cuda.CudaKernel, (StepKernel, ScanKernel, PersistentEntries)),
    "GraphedKernel": (cuda_graphs.GraphedKernel, (StepKernel,)),
    "PersistentKernel": (cuda_recurrence.PersistentKernel, (StepKernel,)),
}
CAPABILITIES = ("in_place_gates", "scan", "persistent")


def _methods(cls):
    return {n for n, v in vars(cls).items() if inspect.isfunction(v) and not n.startswith("_")}


def _params(fn):
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()
            if p.name != "self"]


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_every_method_matches_its_protocol(name):
    cls, protocols = CLASSES[name]
    declared = {m: p for p in protocols for m in _methods(p)}
    assert _methods(cls) <= set(declared), \
        f"{name} has methods no protocol declares: {sorted(_methods(cls) - set(declared))}"
    for method, protocol in declared.items():
        assert callable(getattr(cls, method, None)), f"{name} lacks {protocol.__name__}.{method}"
        got, want = _params(getattr(cls, method)), _params(getattr(protocol, method))
        assert not any(kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
                       for _, kind, _ in got), f"{name}.{method} takes *args"
        assert got == want, (name, method, got, want)


def test_every_protocol_method_has_an_implementation():
    implemented = {m for cls, _ in CLASSES.values() for m in _methods(cls)}
    for protocol in PROTOCOLS:
        assert _methods(protocol) <= implemented, protocol.__name__


def test_the_interface_test_fails_on_a_star_args_method():
    class Loose(ops.CpuKernel):
        def plain_backward(self, *args):  # noqa: D102
            return args

    with pytest.raises(AssertionError, match="takes \\*args|plain_backward"):
        CLASSES["Loose"] = (Loose, (StepKernel,))
        try:
            test_every_method_matches_its_protocol("Loose")
        finally:
            del CLASSES["Loose"]


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_capabilities_are_declared(name):
    cls, protocols = CLASSES[name]
    for capability in CAPABILITIES:
        assert capability in vars(cls) or capability in inspect.getsource(cls.__init__), \
            f"{name} does not declare {capability}"
    assert cls.in_place_gates is (name == "CpuKernel")


def test_the_loaded_kernels_are_instances():
    from rnn_ablations.kernels import registry
    cpu = registry.cpu_kernel()
    if cpu is not None:
        assert isinstance(cpu, (StepKernel, ScanKernel, PipelinedKernel, WeightGrad))
        assert isinstance(cpu, interface.Capabilities) and cpu.scan == registry.kernels().cpu_scan
    cuda = registry.cuda_kernel()
    if cuda is not None:
        assert isinstance(cuda, (StepKernel, ScanKernel, interface.Capabilities))


def test_the_tests_set_the_kernels_through_one_fixture():
    """The tests read the loaded kernels through the registry's accessors and set them for a
    test through conftest's ``given_kernels`` (the one place that touches the registry's
    globals); the CUDA emulation's tests are their own (tests/cuda_emulation)."""
    tests = Path(__file__).resolve().parents[1]
    pattern = re.compile(r"registry\.(_C|_C_cuda|_graphed_cuda|_CUDA_KERNEL_ERROR|_KERNEL_ERROR|"
                         r"_KERNEL_SOURCE)\b|\"(_C|_C_cuda|_graphed_cuda)\"")
    found = []
    for path in tests.rglob("*.py"):
        rel = path.relative_to(tests)
        if rel.parts[0] == "cuda_emulation" or rel.as_posix() in ("conftest.py",
                                                                  "kernels/test_kernel_interface.py"):
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line.split("#")[0]):
                found.append(f"{rel}:{n}")
    assert not found, found


def test_no_private_backend_global_is_read_outside_backend():
    """The run layer reaches the kernels through backend's accessor functions
    (``cpu_kernel()``, ``cuda_kernel()``, ``graphed_cuda_kernel()``, ``cuda_kernel_error()``)."""
    package = Path(interface.__file__).resolve().parents[1]
    pattern = re.compile(r"registry\.(_C|_C_cuda|_graphed_cuda|_CUDA_KERNEL_ERROR|_KERNEL_ERROR)\b")
    found = []
    for path in package.rglob("*.py"):
        if path.name == "registry.py" and path.parent.name == "kernels":
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#")[0]
            if pattern.search(code) and "``" not in code:
                found.append(f"{path.relative_to(package)}:{n}")
    assert not found, found
