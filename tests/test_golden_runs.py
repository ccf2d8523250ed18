"""Golden data of the run layer, recorded from the code and kept equal when it is rebuilt:

* the runner the plan names for a grid of layer calls (settings x shapes x devices x dtypes x
  gradient x threads x autocast x what is compiled): ``tests/fixtures/golden_runs.json``
  ``"plans"``;
* the operators a forward + backward calls (seen by a ``TorchDispatchMode``) for every variant,
  one and two directions, one and two threads, with and without a gradient: ``"operators"``.

Regenerate (only when a change of the run layer is meant to change them, and say why in its
commit): ``RNN_ABLATIONS_WRITE_GOLDEN=1 python -m pytest tests/test_golden_runs.py``.
"""
import itertools
import json
import os
import random
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import rnn_ablations as ra
from conftest import requires_kernel
from rnn_ablations.plan import Kernels, LayerCall, plan_layer
from rnn_ablations.settings import Options

GOLDEN = Path(__file__).parent / "fixtures" / "golden_runs.json"
WRITE = os.environ.get("RNN_ABLATIONS_WRITE_GOLDEN", "") == "1"


def _load():
    return json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}


def _store(section, data):
    golden = _load()
    golden[section] = data
    GOLDEN.write_text(json.dumps(golden, indent=1, sort_keys=True) + "\n")


# --------------------------------------------------------------------------- plans
ALL = Kernels(cpu=True, cuda=True, cpu_scan=True, cuda_scan=True, persistent=True,
              onednn=True, isa="avx2")
KERNEL_SETS = {
    "all": ALL,
    "none": Kernels(cpu_error="no compiler", cuda_error="no CUDA"),
    "cpu only": Kernels(cpu=True, cpu_scan=True, onednn=True, isa="avx512",
                        cuda_error="no CUDA"),
    "no persistent, no onednn": Kernels(cpu=True, cuda=True, cpu_scan=True, cuda_scan=True,
                                        isa="portable"),
}
#: a CPU with bfloat16 GEMM instructions (AVX512-BF16 or AMX), for the cases beyond the sample:
#: what the machine has is an argument of the plan, so the golden data holds on any CPU
BF16_KERNELS = {"cpu with bf16 GEMM": Kernels(cpu=True, cpu_scan=True, onednn=True, isa="avx512",
                                              cuda_error="no CUDA", bf16_gemm=True)}
SETTINGS = {
    "default": {},
    "generic": dict(backend="generic"),
    "kernel": dict(backend="kernel"),
    "plain": dict(cpu_schedule="plain"),
    "pipelined": dict(cpu_schedule="pipelined"),
    "directions on": dict(concurrent_directions="on"),
    "directions off": dict(concurrent_directions="off"),
    "persistent": dict(cuda_recurrence="persistent"),
    "no graphs": dict(cuda_graphs=False),
    "chunk 3": dict(pipeline_chunk=3),
}
DTYPES = {"f32": torch.float32, "f64": torch.float64, "f16": torch.float16,
          "bf16": torch.bfloat16}
AXES = dict(
    settings=list(SETTINGS), kernels=list(KERNEL_SETS), device=["cpu", "cuda", "mps"],
    dtype=list(DTYPES), steps=[0, 1, 3, 4, 50], batch=[0, 1, 32], hidden=[3, 384, 650],
    rec_blocks=[0, 1, 3, 4], proj_weight=[36, 640_000], directions=[1, 2],
    needs_grad=[False, True], threads=[1, 2, 4], autocast=[None, "bf16", "f16"],
    uniform=[True, False], scan_layout=[True, False])
N_RANDOM = 1500


def _plan_cases():
    """A fixed sample of the grid (every axis value appears), plus the corners of the policy."""
    rng = random.Random(20240611)
    names = list(AXES)
    cases = []
    for _ in range(N_RANDOM):
        cases.append({k: rng.choice(AXES[k]) for k in names})
    base = dict(settings="default", kernels="all", device="cpu", dtype="f32", steps=50, batch=32,
                hidden=384, rec_blocks=4, proj_weight=36, directions=1, needs_grad=True,
                threads=2, autocast=None, uniform=True, scan_layout=True)
    for name in names:  # one axis at a time from a typical call
        for value in AXES[name]:
            cases.append(dict(base, **{name: value}))
    for directions, threads, grad, steps in itertools.product([1, 2], [1, 2, 4], [False, True],
                                                               [3, 50]):
        for hidden, proj_weight in ((3, 36), (650, 640_000)):
            cases.append(dict(base, directions=directions, threads=threads, needs_grad=grad,
                              steps=steps, hidden=hidden, proj_weight=proj_weight))
    # a large no-gradient call (streamed) and proj_size: fields of LayerCall beyond the grid
    for rec_blocks, dtype, projected in ((4, "f32", False), (0, "f32", False), (4, "bf16", False),
                                         (4, "f32", True), (0, "f32", True)):
        cases.append(dict(base, rec_blocks=rec_blocks, dtype=dtype, needs_grad=False,
                          extra=dict(steps=4096, proj_width=1536, projected=projected)))
    # bfloat16 on a CPU with bfloat16 GEMM instructions: bfloat16 calls and bfloat16 autocast,
    # step and scan cells, each schedule, with and without a gradient, streamed
    for settings, dtype, autocast, rec_blocks, grad in itertools.product(
            ["default", "plain", "pipelined", "generic"], ["bf16", "f32"], [None, "bf16"], [0, 4],
            [False, True]):
        cases.append(dict(base, kernels="cpu with bf16 GEMM", settings=settings, dtype=dtype,
                          autocast=autocast, rec_blocks=rec_blocks, needs_grad=grad))
    for rec_blocks in (0, 4):
        cases.append(dict(base, kernels="cpu with bf16 GEMM", dtype="bf16", rec_blocks=rec_blocks,
                          needs_grad=False, extra=dict(steps=4096, proj_width=1536)))
    return cases


def _key(case):
    extra = "".join(f"|{k}={v}" for k, v in sorted(case.get("extra", {}).items()))
    return "|".join(f"{k}={case[k]}" for k in AXES) + extra


def _decide(case):
    call = LayerCall(device=case["device"], dtype=DTYPES[case["dtype"]], steps=case["steps"],
                     batch=case["batch"], hidden=case["hidden"], rec_blocks=case["rec_blocks"],
                     proj_weight=case["proj_weight"], directions=case["directions"],
                     needs_grad=case["needs_grad"], threads=case["threads"],
                     autocast_dtype=DTYPES.get(case["autocast"]), uniform=case["uniform"],
                     scan_layout=case["scan_layout"])._replace(**case.get("extra", {}))
    try:
        plan = plan_layer(Options(**SETTINGS[case["settings"]]), call,
                          {**KERNEL_SETS, **BF16_KERNELS}[case["kernels"]])
    except (RuntimeError, ValueError) as exc:
        return {"error": type(exc).__name__ + ": " + str(exc).split(":")[0]}
    return {"runner": plan.runner, "isa": plan.isa, "chunk": plan.chunk, "onednn": plan.onednn,
            "graphs": plan.graphs, "persistent": list(plan.persistent),
            "warning": plan.warning[0] if plan.warning else None,
            "bf16_on_f32": plan.bf16_on_f32, "bf16_gemm": plan.bf16_gemm,
            "bf16_step_gemm": plan.bf16_step_gemm, "stream": plan.stream,
            "step_gemm": list(plan.step_gemm)}


def test_the_plan_names_the_golden_runner_for_every_case():
    got = {_key(c): _decide(c) for c in _plan_cases()}
    if WRITE:
        _store("plans", got)
    want = _load().get("plans")
    assert want is not None, f"no golden plans in {GOLDEN}: run with RNN_ABLATIONS_WRITE_GOLDEN=1"
    assert set(got) == set(want), "the grid of cases changed: regenerate the golden data"
    wrong = [(k, want[k], got[k]) for k in want if want[k] != got[k]]
    assert not wrong, f"{len(wrong)} of {len(want)} plans changed, e.g. {wrong[:3]}"
    # the grid reaches every runner and the errors
    runners = {v.get("runner") for v in want.values()}
    assert runners >= set(ra.plan.RUNNERS), sorted(set(ra.plan.RUNNERS) - runners)
    assert any("error" in v for v in want.values())


# --------------------------------------------------------------------------- operators
#: operators that only allocate, view or read metadata: not part of the recorded sequence
_NOT_WORK = {"view", "_unsafe_view", "t", "transpose", "expand", "select", "slice", "unsqueeze",
             "squeeze", "alias", "detach", "lift_fresh", "_local_scalar_dense", "new_empty",
             "new_empty_strided", "empty", "empty_strided", "zeros", "new_zeros", "ones_like",
             "zeros_like", "full", "arange", "unbind", "split", "split_with_sizes", "as_strided",
             "reshape", "_reshape_alias", "narrow", "permute", "empty_like", "is_nonzero",
             "equal", "lift", "slice_backward", "select_backward"}


class _Recorder(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.name()
        base = name.split("::", 1)[1].split(".", 1)[0]
        if not (name.startswith("aten::") and base in _NOT_WORK):
            self.ops.append(name)
        return func(*args, **(kwargs or {}))


VARIANTS = sorted(ra.VARIANTS)
#: (variant, bidirectional, threads, gradient, steps): 3 steps run the plain schedule
OP_CASES = [(v, bi, threads, grad, steps) for v in VARIANTS for bi in (False, True)
            for threads in (1, 2) for grad in (False, True) for steps in (3, 6)]


def _run_recorded(variant, bidirectional, threads, grad, steps):
    torch.manual_seed(0)
    model = ra.AblatedRNN(variant, 5, 7, num_layers=2, bidirectional=bidirectional)
    x = torch.randn(steps, 3, 5)
    lengths = [steps, steps - 1, 2] if bidirectional else None
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.set_grad_enabled(grad), _Recorder() as rec:
            out, (h_n, c_n) = model(x, lengths=lengths)
            if grad:
                (out.sum() + h_n.sum() + c_n.sum()).backward()
    finally:
        torch.set_num_threads(old)
    return rec.ops


@requires_kernel
def test_a_forward_and_backward_call_the_golden_operators():
    got = {f"{v}|bi={bi}|threads={t}|grad={g}|steps={s}": _run_recorded(v, bi, t, g, s)
           for v, bi, t, g, s in OP_CASES}
    # and one model whose input weight is large enough for the oneDNN projection
    for grad in (False, True):
        torch.manual_seed(0)
        model = ra.AblatedRNN("lstm", 200, 700)
        x = torch.randn(3, 2, 200)
        old = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            with torch.set_grad_enabled(grad), _Recorder() as rec:
                out, (h_n, _) = model(x)
                if grad:
                    (out.sum() + h_n.sum()).backward()
        finally:
            torch.set_num_threads(old)
        got[f"lstm oneDNN weight|grad={grad}"] = rec.ops
    if WRITE:
        _store("operators", got)
    want = _load().get("operators")
    assert want is not None, f"no golden operators in {GOLDEN}: run with RNN_ABLATIONS_WRITE_GOLDEN=1"
    assert set(got) == set(want)
    wrong = [k for k in want if want[k] != got[k]]
    assert not wrong, (f"{len(wrong)} of {len(want)} operator sequences changed, e.g. {wrong[0]}:\n"
                       f"was {want[wrong[0]]}\nnow {got[wrong[0]]}")
    # the recorded sequences reach the kernels' operators
    seen = {op for ops in want.values() for op in ops}
    assert {"rnn_ablations::pipelined_forward", "rnn_ablations::pipelined_backward",
            "rnn_ablations::plain_forward_", "rnn_ablations::plain_backward",
            "rnn_ablations::plain_directions_forward_", "rnn_ablations::plain_directions_backward",
            "rnn_ablations::pipelined_directions_forward",
            "rnn_ablations::pipelined_directions_backward", "rnn_ablations::scan_forward",
            "rnn_ablations::scan_backward", "rnn_ablations::weight_grad"} <= seen
