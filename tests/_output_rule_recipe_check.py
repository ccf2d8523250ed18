"""Run by tests/test_output_rule_recipe.py in a subprocess whose PYTHONPATH puts a copy of the
package first (the copy has CONTRIBUTING.md's output-rule recipe applied for h_t = o∘c_t, rule
"o_cell", and its own CPU kernel built in place).  Argument: the copy's root.

Checks, for a row that reads h_{t-1} (step kernels) and a row whose gates read x_t only (the
element-wise scan): the copy's kernel is the one loaded; the kernel backend runs the kernels
(operators of the rnn_ablations library, a scan for the second row) and agrees with the generic
path (outputs, h_n, c_n and every gradient, float64, uni- and bidirectional, highway on and off,
padded lengths); the generic path agrees with a hand-written float64 cell h_t = o∘c_t; a traced
model (the scripted loop of rnn_ablations/export.py) gives the eager numbers."""
import os
import sys

import torch
from torch.utils._python_dispatch import TorchDispatchMode

COPY = os.path.realpath(sys.argv[1])

import rnn_ablations  # noqa: E402
from rnn_ablations import AblatedRNN, kernel_available, use_backend  # noqa: E402
from rnn_ablations.variants import VARIANTS_TABLE, Variant  # noqa: E402

import test_reference_equations as ref  # noqa: E402  (tests/ is on the path)

assert os.path.realpath(rnn_ablations.__file__).startswith(COPY + os.sep), rnn_ablations.__file__
assert kernel_available(), "the copy's CPU kernel did not load"
_C = next(m for n, m in sys.modules.items() if n.startswith("rnn_ablations") and n.endswith("._C"))
assert os.path.realpath(_C.__file__).startswith(COPY + os.sep), (
    f"the kernel loaded is {_C.__file__}, not the copy's")

sigmoid, tanh, rows = torch.sigmoid, torch.tanh, ref._rows

STEP = Variant(
    name="lstm_o_cell", paper_name="LSTM with h_t = o∘c_t", code=200,
    recurrent=("i", "f", "g", "o"), content_block="g", content_activation="tanh",
    has_memory=True, output="o_cell", context_independent_content=False,
    equations="i,f,o = σ(W·h h_{t-1} + W·x x_t + b·); c̃ = tanh(W_ch h_{t-1} + W_cx x_t + b_c); "
              "c_t = i∘c̃ + f∘c_{t-1}; h_t = o∘c_t")
SCAN = Variant(
    name="gates_from_x_o_cell", paper_name="gates from x_t, h_t = o∘c_t", code=201,
    recurrent=(), input_only_biased=("i", "f", "o"), input_only=("c",), content_block="c",
    content_activation="identity", has_memory=True, output="o_cell",
    context_independent_content=True,
    equations="i,f,o = σ(W·x x_t + b·); c̃ = W_cx x_t; c_t = i∘c̃ + f∘c_{t-1}; h_t = o∘c_t")


def step_cell(x, h, c, Wx, Wh, b, H):
    def pre(k):
        return rows(Wx, k, H) @ x + rows(Wh, k, H) @ h + rows(b, k, H)
    i, f, o = sigmoid(pre(0)), sigmoid(pre(1)), sigmoid(pre(3))
    c_new = i * tanh(pre(2)) + f * c
    return o * c_new, c_new


def scan_cell(x, h, c, Wx, Wh, b, H):
    def gate(k):
        return sigmoid(rows(Wx, k, H) @ x + rows(b, k, H))
    i, f, o = gate(0), gate(1), gate(2)
    c_new = i * (rows(Wx, 3, H) @ x) + f * c
    return o * c_new, c_new


# (cell, blocks reading h_{t-1}, input-only blocks without bias, blocks with a bias)
ref.CELLS[STEP.name] = (step_cell, 4, 0, 4)
ref.CELLS[SCAN.name] = (scan_cell, 0, 1, 3)
for v in (STEP, SCAN):
    VARIANTS_TABLE[v.name] = v


class Ops(TorchDispatchMode):
    """The names of the rnn_ablations operators a block of code calls."""

    def __init__(self):
        super().__init__()
        self.names = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "rnn_ablations":
            self.names.add(func.__name__)
        return func(*args, **(kwargs or {}))


describe = {STEP.name: _C.describe_kernel_spec, SCAN.name: _C.describe_scan_spec}
checked = 0
for v in (STEP, SCAN):
    for highway in (False, True):
        view = describe[v.name](v.kernel_spec, highway)
        assert view["output"] == "o_cell", view
        for bidirectional in (False, True):
            torch.manual_seed(3)
            d_in, H, T, lengths = 3, 5, 6, torch.tensor([6, 2, 4])
            m = AblatedRNN(v.name, d_in, H, num_layers=2, bidirectional=bidirectional,
                           highway=highway, dtype=torch.float64)
            with torch.no_grad():
                for p in m.parameters():
                    p.uniform_(-0.8, 0.8)
            D = 2 if bidirectional else 1
            x = torch.randn(T, len(lengths), d_in, dtype=torch.float64, requires_grad=True)
            g_out = torch.randn(T, len(lengths), D * H, dtype=torch.float64)
            g_h, g_c = (torch.randn(2 * D, len(lengths), H, dtype=torch.float64)
                        for _ in range(2))
            params = [x] + list(m.parameters())
            names = ["input"] + [n for n, _ in m.named_parameters()]

            def loss(out, h, c):
                return (out * g_out).sum() + (h * g_h).sum() + (c * g_c).sum()

            results = {}
            for backend in ("generic", "kernel"):
                with use_backend(backend), Ops() as ops:
                    out, (h, c) = m(x, lengths=lengths)
                    grads = torch.autograd.grad(loss(out, h, c), params)
                if backend == "kernel":
                    assert ops.names, f"{v.name}: the kernel backend called no kernel operator"
                    scanned = any("scan" in n for n in ops.names)
                    assert scanned == (v is SCAN), (v.name, sorted(ops.names))
                else:
                    assert not ops.names, (v.name, sorted(ops.names))
                results[backend] = [out, h, c, *grads]
            what = ["output", "h_n", "c_n"] + [f"grad of {n}" for n in names]
            tag = f"{v.name} highway={highway} bidirectional={bidirectional}"
            for name, a, b in zip(what, results["generic"], results["kernel"]):
                torch.testing.assert_close(b, a, rtol=1e-10, atol=1e-12,
                                           msg=lambda s, n=name: f"{tag}: kernel {n}: {s}")
            expect = ref.reference(m, v.name, highway, x, lengths)
            expect_grads = torch.autograd.grad(loss(*expect), params)
            for name, a, b in zip(what, results["generic"], list(expect) + list(expect_grads)):
                torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11,
                                           msg=lambda s, n=name: f"{tag}: generic {n}: {s}")
            checked += 1
# torch.jit.trace records the scripted loop (rnn_ablations/export.py): the same numbers
traced = 0
for v in (STEP, SCAN):
    torch.manual_seed(4)
    m = AblatedRNN(v.name, 3, 5, num_layers=2, bidirectional=True, highway=True,
                   dtype=torch.float64).eval()
    x = torch.randn(6, 3, 3, dtype=torch.float64)
    with torch.no_grad():
        want = m(x)
        got = torch.jit.trace(m, (x,))(x)
    for name, a, b in zip(("output", "h_n", "c_n"), [got[0], *got[1]], [want[0], *want[1]]):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12,
                                   msg=lambda s, n=name: f"{v.name} traced: {n}: {s}")
    traced += 1
print(f"o_cell: kernel == generic == hand-written reference in {checked} configurations; "
      f"traced == eager for {traced} rows; kernel {_C.__file__}")
