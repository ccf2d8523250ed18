"""The seams of the run layer, each decided by the run plan (``rnn_ablations.plan.decide``) and
carried out by its runner:

* the CUDA kernels' first-use check is remembered by what was checked (device, family):
  ``backend="kernel"`` keeps running a second layer, another length and another batch size
  after the check passed (CUDA plans on the emulated device);
* a bfloat16 model under ``torch.compile`` gets the plan it gets eagerly (the float32 kernels),
  also with ``backend="kernel"``;
* a no-gradient −HIDDEN call (the scan) streams its projections, and a bfloat16 no-gradient
  call is widened a chunk at a time: peak memory below what the whole call's projections (or
  float32 copies) take, each measured in a fresh process.
"""
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import rnn_ablations as ra
from rnn_ablations import AblatedRNN, dispatch, explain
from rnn_ablations.kernels import registry

needs_cpu_kernel = pytest.mark.skipif(not registry.kernel_available(),
                                      reason="the CPU kernel is not built")


# --------------------------------------------------------------------------- the CUDA check
@pytest.fixture
def emulated(monkeypatch, fresh_cuda_selfcheck):
    from _cuda_plans import emulator_or_skip
    emulator = emulator_or_skip()
    from rnn_ablations.kernels.cuda import host
    from rnn_ablations.kernels.cuda import ops as ops_cuda
    from _cuda_plans import cuda_plans_on_cpu
    with emulator.installed() as device:
        cuda_plans_on_cpu(monkeypatch, ops_cuda.CudaKernel(host), scan=True)
        with ra.options(cuda_graphs=False):
            yield device


@needs_cpu_kernel
@pytest.mark.parametrize("variant", ["lstm", "ran", "lstm_minus_srnn_minus_hidden"])
def test_kernel_backend_runs_every_layer_length_and_batch_after_a_passing_check(variant,
                                                                               emulated):
    """A 2-layer model with backend='kernel' on CUDA plans (the emulated device): the first
    call checks each family once; the second layer, and calls with another T and another B,
    run on the kernels (the emulated launches grow), with the generic path's numbers."""
    torch.manual_seed(3)
    model = AblatedRNN(variant, 5, 6, num_layers=2, bidirectional=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no check may fail
        for T, B in ((4, 3), (6, 3), (4, 5), (2, 1)):
            x = torch.randn(T, B, 5)
            with ra.options(backend="kernel"):
                plans = explain(model, x)
                before = emulated.launches()
                out, (h, c) = model(x)
                assert emulated.launches() > before
            assert [p.plan.path for p in plans] == ["cuda", "cuda"]
            assert all(p.plan.check == "passed" for p in plans)
            with ra.options(backend="generic"):
                want, (wh, wc) = model(x)
            for a, b in zip((out, h, c), (want, wh, wc)):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    from rnn_ablations.kernels.cuda import selfcheck
    assert all(why is None for why in selfcheck.status().values())
    assert len(selfcheck.status()) == 1  # one family, checked once


# --------------------------------------------------------------------------- compiled bfloat16
def _graph_targets():
    targets = []

    def backend(gm, example_inputs):
        targets.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward
    return targets, backend


@needs_cpu_kernel
@pytest.mark.parametrize("variant", ["lstm", "lstm_minus_srnn_minus_hidden"])
def test_a_compiled_bfloat16_model_takes_the_eager_plan(variant):
    """torch.compile of a bfloat16 model: the graph holds the CPU kernels' operators on the
    widened call (as the eager plan says, ``explain``), with backend='kernel' too, and gives
    the eager numbers."""
    torch.manual_seed(4)
    model = AblatedRNN(variant, 5, 6, num_layers=2).bfloat16().eval()
    x = torch.randn(7, 3, 5).bfloat16()
    with torch.no_grad(), ra.options(backend="kernel"):
        plans = explain(model, x)
        assert all(p.plan.path == "cpu" and p.plan.bf16_on_f32 for p in plans), str(plans)
        want, (wh, wc) = model(x)
        targets, backend = _graph_targets()
        torch._dynamo.reset()
        got, (h, c) = torch.compile(model, backend=backend, fullgraph=True)(x)
    assert any("rnn_ablations" in t for t in targets), targets
    assert got.dtype == torch.bfloat16
    for a, b in zip((got, h, c), (want, wh, wc)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


# --------------------------------------------------------------------------- peak memory
_CHILD = r"""
import dataclasses, sys, torch
from rnn_ablations import AblatedRNN, options
from rnn_ablations import plan as run_plan
from rnn_ablations.commands.machine import call_peak_memory
torch.set_num_threads(1)
variant, dtype, mode, T = sys.argv[1], getattr(torch, sys.argv[2]), sys.argv[3], int(sys.argv[4])
B, D, H = 400, 32, 32
m = AblatedRNN(variant, D, H).to(dtype)
x = torch.randn(T, B, D).to(dtype)
if mode == "whole":  # the projections of all steps at once
    run_plan.POLICY = dataclasses.replace(run_plan.POLICY, stream_min_bytes=1 << 62)
with torch.no_grad(), options(backend="kernel", cpu_schedule="plain"):
    m(x[:2, :2])
    print("PEAK", call_peak_memory(lambda: m(x)))
"""


def _child_peak(variant: str, dtype: str, mode: str, T: int) -> int:
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=str(root))
    res = subprocess.run([sys.executable, "-c", _CHILD, variant, dtype, mode, str(T)],
                         capture_output=True, text=True, env=env, cwd=str(root), timeout=300)
    assert res.returncode == 0, res.stderr
    return int(res.stdout.split("PEAK")[1])


@needs_cpu_kernel
def test_minus_hidden_inference_streams_its_projections():
    """−HIDDEN, T=400 B=400 H=32, no gradient: the projections of all steps (i, f, o, c: 80
    MiB) reach the streaming threshold; streamed, the call holds its output (20 MiB) and one
    chunk.  The bound (0.75 x output + projections) must fail for the unstreamed call, or the
    measurement would not see the projections."""
    variant = "lstm_minus_srnn_minus_hidden"
    streamed = _child_peak(variant, "float32", "streamed", 400)
    whole = _child_peak(variant, "float32", "whole", 400)
    out_bytes, proj_bytes = 400 * 400 * 32 * 4, 400 * 400 * 128 * 4
    bound = 0.75 * (out_bytes + proj_bytes)
    mib = (round(streamed / 2**20, 1), round(whole / 2**20, 1), "MiB streamed, whole")
    assert whole > bound, mib
    assert streamed < bound, mib


@needs_cpu_kernel
@pytest.mark.parametrize("variant", ["lstm", "lstm_minus_srnn_minus_hidden"])
def test_bfloat16_inference_holds_no_float32_copy_of_the_call(variant):
    """A bfloat16 no-gradient call, T=2000 B=400 d_in=H=32: widened a chunk at a time, it holds
    its bfloat16 output (49 MiB) and one chunk's buffers (about 60 MiB at 16 MiB of
    projections a chunk), never float32 copies of the whole input and output (98 MiB each):
    the peak stays below their sum."""
    peak = _child_peak(variant, "bfloat16", "streamed", 2000)
    copies = 2 * 2000 * 400 * 32 * 4
    assert peak < copies, (round(peak / 2**20, 1), "MiB", round(copies / 2**20, 1))
