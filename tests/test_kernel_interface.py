"""Every kernel class implements the declared interface (rnn_ablations.kernels.interface), with
the interface's parameter names where it spells them out."""
import inspect

import pytest

from rnn_ablations.kernels import cuda_graphs, cuda_recurrence, ops, ops_cuda
from rnn_ablations.kernels.interface import PipelinedKernel, ScanKernel, StepKernel

CLASSES = {
    "CpuKernel": (ops.CpuKernel, (StepKernel, ScanKernel, PipelinedKernel)),
    "CudaKernel": (ops_cuda.CudaKernel, (StepKernel, ScanKernel)),
    "GraphedKernel": (cuda_graphs.GraphedKernel, (StepKernel,)),
    "PersistentKernel": (cuda_recurrence.PersistentKernel, (StepKernel,)),
}


def _methods(protocol):
    return [n for n, v in vars(protocol).items() if inspect.isfunction(v) and not n.startswith("_")]


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_every_kernel_class_implements_its_interface(name):
    cls, protocols = CLASSES[name]
    for protocol in protocols:
        for method in _methods(protocol):
            assert callable(getattr(cls, method, None)), f"{name} lacks {protocol.__name__}.{method}"
            got = inspect.signature(getattr(cls, method))
            want = inspect.signature(getattr(protocol, method))
            params = [p for p in got.parameters.values() if p.name != "self"]
            if any(p.kind is p.VAR_POSITIONAL for p in
                   params + list(want.parameters.values())):
                continue  # forwards its arguments as they come
            wanted = [p.name for p in want.parameters.values() if p.name != "self"]
            assert [p.name for p in params][:len(wanted)] == wanted, (name, method)


def test_the_loaded_kernels_are_instances():
    from rnn_ablations.kernels import backend
    if backend._C is not None:
        assert isinstance(backend._C, (StepKernel, ScanKernel, PipelinedKernel))
