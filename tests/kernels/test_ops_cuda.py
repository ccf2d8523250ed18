"""The CUDA kernel's operators (rnn_ablations.kernels.cuda.ops) where no GPU is: their registration for the
CUDA dispatch key and their fake kernels, on fake CUDA tensors (``FakeTensorMode`` makes CUDA
tensors without a device); and on a GPU, the layers' calls of the CUDA implementations, each
passing ``opcheck``, and a compiled or exported model running them.

The registration runs in a child process against a stand-in for the CUDA kernels' module whose
entry points fail when called: under a fake mode the dispatcher must answer from the fake
kernels, never call the kernel."""
import json

import pytest
import torch
from torch.library import opcheck
from torch.utils._python_dispatch import TorchDispatchMode

import rnn_ablations as ra
from _cuda_cases import STEP_VARIANTS, needs_cuda_kernel, no_tf32, requires_cuda  # noqa: F401
from conftest import run_python
from rnn_ablations import AblatedRNN, VARIANTS, kernel_available

pytestmark = pytest.mark.skipif(not kernel_available(), reason="the CPU kernel is not built "
                                "(the shared operator schemas are defined with it)")

CHILD = r"""
import json, types
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
import rnn_ablations as ra
from rnn_ablations import VARIANTS
from rnn_ablations.kernels.cuda import ops as ops_cuda

def refuse(*args, **kwargs):
    raise AssertionError("a fake call reached the kernel")

stub = types.SimpleNamespace(forward=refuse, backward=refuse, scan_forward=refuse,
                             scan_backward=refuse, persistent_forward=refuse,
                             persistent_backward=refuse, persistent_plan=refuse)
kernel = ops_cuda.CudaKernel(stub)
report = {"registered": kernel.operators,
          "cuda_kernel": {name: torch._C._dispatch_has_kernel_for_dispatch_key(
              "rnn_ablations::" + name, "CUDA") for name in ops_cuda.CUDA_OPERATORS},
          "persistent_cpu_kernel": torch._C._dispatch_has_kernel_for_dispatch_key(
              "rnn_ablations::persistent_forward", "CPU")}
T, B, H = 5, 3, 4
results = {}
with FakeTensorMode():
    for v in map(ra.get_variant, VARIANTS):
        if not v.reads_hidden:
            continue
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            for train in (False, True):
                for highway in (False, True):
                    R, X = v.num_recurrent(highway), v.num_input_only(highway)
                    kw = dict(device="cuda", dtype=dtype)
                    proj = torch.empty(T, B, (R + X) * H, **kw)
                    w_hh = torch.empty(R * H, H, **kw)
                    h0, c0 = torch.empty(B, H, **kw), torch.empty(B, H, **kw)
                    bs = torch.full((T,), B, dtype=torch.int64)
                    mask = torch.empty(0, **kw)
                    key = f"{v.name}/{dtype}/{train}/{highway}"
                    plain = kernel.plain_forward(v.kernel_spec, highway, proj, w_hh, h0, c0, bs, mask,
                                           train)
                    pers = kernel.persistent_forward(v.kernel_spec, highway, proj, w_hh, h0, c0,
                                                     bs, mask, train, 0, 0)
                    grads = kernel.persistent_backward(
                        v.kernel_spec, highway, torch.empty(T, B, H, **kw), h0, c0, *plain[3:6],
                        plain[0], proj, w_hh, h0, c0, bs, mask, 0, 0)
                    results[key] = {
                        "plain": [[list(t.shape), str(t.dtype), t.device.type] for t in plain],
                        "persistent": [[list(t.shape), str(t.dtype)] for t in pers],
                        "persistent_backward": [[list(t.shape), str(t.dtype)] for t in grads],
                        "R": R, "X": X}
report["results"] = results
print(json.dumps(report))
"""


@pytest.fixture(scope="module")
def report():
    proc = run_python(CHILD, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_every_cuda_operator_has_a_cuda_kernel(report):
    assert report["registered"] is True
    assert report["cuda_kernel"] == {name: True for name in report["cuda_kernel"]}
    # the persistent kernel exists on CUDA only: a CPU call is refused by the dispatcher
    assert report["persistent_cpu_kernel"] is False


def test_fake_results_have_the_kernels_shapes_and_dtypes(report):
    T, B, H = 5, 3, 4
    assert report["results"], "no variant with a step kernel in the table"
    for key, got in report["results"].items():
        _, dtype, train, highway = key.split("/")
        train, highway = train == "True", highway == "True"
        acc = "torch.float32" if dtype in ("torch.float16", "torch.bfloat16") else dtype
        R = got["R"]
        want = [[[T, B, H], dtype], [[B, H], dtype], [[B, H], dtype], [[T, B, R * H], acc],
                [[T, B, H] if train else [0], acc],
                [[T, B, H] if train and highway else [0], acc]]
        assert [r[:2] for r in got["plain"]] == want, key
        assert {r[2] for r in got["plain"]} == {"cuda"}, key
        # the persistent forward writes the gates only for a backward
        want_persistent = list(want)
        want_persistent[3] = [[T, B, R * H] if train else [0], acc]
        assert got["persistent"] == want_persistent, key
        P = (R + got["X"]) * H
        assert got["persistent_backward"] == [[[T, B, P], dtype], [[R * H, H], dtype],
                                              [[B, H], dtype], [[B, H], dtype]], key


# --------------------------------------------------------------------------- on a GPU
class _RecordOps(TorchDispatchMode):
    """Keeps every call of an rnn_ablations operator with copies of its arguments."""

    def __init__(self):
        super().__init__()
        self.calls = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace == "rnn_ablations":
            self.calls.setdefault(func, []).append(
                (tuple(a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args),
                 dict(kwargs)))
        return func(*args, **kwargs)


@requires_cuda
@needs_cuda_kernel
@pytest.mark.parametrize("recurrence", ["steps", "persistent"])
def test_cuda_operators_opcheck(recurrence):
    """The layers' CUDA calls go through the operators, and each passes ``opcheck`` (schema,
    fake kernel against the kernel's results, traceability)."""
    rec = _RecordOps()
    for variant in STEP_VARIANTS:
        for bidirectional in (False, True):
            for highway in (False, True):
                torch.manual_seed(0)
                rnn = AblatedRNN(variant, 5, 8, num_layers=2, bidirectional=bidirectional,
                                 highway=highway).cuda()
                x = torch.randn(6, 3, 5, device="cuda", requires_grad=True)
                with ra.options(backend="kernel", cuda_graphs=False,
                                cuda_recurrence=recurrence, persistent_backward=True), rec:
                    out, _ = rnn(x)
                    out.square().sum().backward()
                    with torch.no_grad():
                        rnn(x)
    names = {f._schema.name.split("::")[1] for f in rec.calls}
    want = ({"persistent_forward", "persistent_backward"} if recurrence == "persistent"
            else {"plain_forward", "plain_backward"})
    assert want <= names, names
    for func, calls in rec.calls.items():
        seen = set()
        for args, kwargs in calls:
            key = tuple(a if isinstance(a, (bool, int)) else
                        tuple(a.shape) if isinstance(a, torch.Tensor) else None for a in args)
            if key not in seen:
                seen.add(key)
                opcheck(func, args, kwargs)


@requires_cuda
@needs_cuda_kernel
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("bidirectional", [False, True])
def test_cuda_compile_fullgraph_equals_eager(variant, bidirectional):
    """``torch.compile(fullgraph=True)`` of a CUDA layer holds the kernel operators and gives the
    eager forward and gradients."""
    torch.manual_seed(0)
    rnn = AblatedRNN(variant, 5, 8, num_layers=2, bidirectional=bidirectional).cuda()
    x = torch.randn(7, 3, 5, device="cuda")

    def run(f):
        rnn.zero_grad()
        out, (h, c) = f(x)
        (out.square().sum() + h.sum() + c.sum()).backward()
        return [out.detach(), h.detach(), c.detach()] + [p.grad.clone() for p in rnn.parameters()]

    with ra.options(backend="kernel"):
        want = run(rnn)
        torch._dynamo.reset()
        got = run(torch.compile(rnn, fullgraph=True, backend="aot_eager"))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


@requires_cuda
@needs_cuda_kernel
def test_cuda_export_runs_the_operators():
    torch.manual_seed(0)
    rnn = AblatedRNN("ran", 5, 8, num_layers=2, bidirectional=True).cuda().eval()
    x = torch.randn(7, 3, 5, device="cuda")
    with ra.options(backend="kernel"):
        want = rnn(x)[0]
