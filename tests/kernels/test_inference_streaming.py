"""The streamed no-gradient forward of the CPU step kernel (either schedule) (``rnn_ablations.kernels.projection.
streamed_forward``, the plan's ``Plan.stream`` from ``plan.POLICY``):
the same outputs and final states as the forward that projects all steps at once, for every
variant with a step kernel, one and two directions, packed sequences and the highway; and, in a
child process, a peak memory below what the projections of all steps would take."""
import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rnn_ablations import AblatedRNN, options
from rnn_ablations import plan as run_plan
from rnn_ablations.kernels import registry
from rnn_ablations.plan import stream_steps

pytestmark = pytest.mark.skipif(registry.cpu_kernel() is None,
                                reason="the CPU kernel is not built")

STEP_VARIANTS = ["lstm", "srnn", "lstm_minus_srnn", "ran", "identity_ran"]


@pytest.fixture
def tiny_chunks(monkeypatch):
    """Stream every call, 3 steps a chunk at the shapes below."""
    def use(chunk_steps, batch, width, itemsize=8):
        monkeypatch.setattr(run_plan, "POLICY", dataclasses.replace(
            run_plan.POLICY, stream_min_bytes=1,
            stream_chunk_bytes=chunk_steps * batch * width * itemsize))
    return use


def test_stream_steps_rule():
    assert stream_steps(100, 10, 40, 4, min_bytes=10**9, chunk_bytes=1000) == 0
    assert stream_steps(100, 10, 40, 4, min_bytes=1, chunk_bytes=1600 * 3) == 3
    assert stream_steps(100, 10, 40, 4, min_bytes=1, chunk_bytes=1) == 1
    assert stream_steps(3, 10, 40, 4, min_bytes=1, chunk_bytes=1600 * 3) == 0  # one chunk
    assert stream_steps(1, 10, 40, 4, min_bytes=1, chunk_bytes=1) == 0


def _run(model, x, lengths=None):
    with torch.no_grad():
        if lengths is None:
            out, (h, c) = model(x)
            return out, h, c
        packed = torch.nn.utils.rnn.pack_padded_sequence(x, lengths, enforce_sorted=False)
        out, (h, c) = model(packed)
        out, _ = torch.nn.utils.rnn.pad_packed_sequence(out)
        return out, h, c


@pytest.mark.parametrize("variant", STEP_VARIANTS)
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("schedule", ["plain", "pipelined"])
def test_streamed_equals_unstreamed(variant, bidirectional, packed, schedule, tiny_chunks,
                                    monkeypatch):
    torch.manual_seed(0)
    T, B, D, H = 11, 5, 6, 7
    model = AblatedRNN(variant, D, H, num_layers=2, bidirectional=bidirectional).double()
    x = torch.randn(T, B, D, dtype=torch.float64)
    lengths = torch.tensor([11, 4, 9, 1, 7]) if packed else None
    with options(backend="kernel", cpu_schedule=schedule):
        ref = _run(model, x, lengths)
        calls = []
        import rnn_ablations.dispatch as dispatch
        real = dispatch.streamed_forward
        monkeypatch.setattr(dispatch, "streamed_forward",
                            lambda *a, **k: calls.append(a[-1]) or real(*a, **k))
        tiny_chunks(3, B, model.weight_ih_l0.shape[0])
        got = _run(model, x, lengths)
    assert calls and all(c >= 1 for c in calls), "the streamed forward did not run"
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_streamed_highway_and_generic_reference(tiny_chunks):
    torch.manual_seed(1)
    T, B, D, H = 9, 4, 5, 6
    model = AblatedRNN("lstm", D, H, highway=True).double()
    x = torch.randn(T, B, D, dtype=torch.float64)
    with options(backend="generic"):
        ref = _run(model, x)
    tiny_chunks(2, B, model.weight_ih_l0.shape[0])
    with options(backend="kernel", cpu_schedule="plain"):
        got = _run(model, x)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_training_forward_is_not_streamed(tiny_chunks, monkeypatch):
    import rnn_ablations.dispatch as dispatch
    monkeypatch.setattr(dispatch, "streamed_forward",
                        lambda *a, **k: pytest.fail("a forward that needs a gradient streamed"))
    tiny_chunks(2, 3, 16)
    model = AblatedRNN("lstm", 4, 4)
    with options(backend="kernel", cpu_schedule="plain"):
        out, _ = model(torch.randn(6, 3, 4))
    out.sum().backward()


_CHILD = r"""
import dataclasses, sys, torch
from rnn_ablations import AblatedRNN, options
from rnn_ablations import plan as run_plan
from rnn_ablations.commands.machine import call_peak_memory
torch.set_num_threads(1)
T, B, D, H = 400, 400, 32, 32
m = AblatedRNN("lstm", D, H)
x = torch.randn(T, B, D)
if sys.argv[1] == "whole":  # the projections of all steps at once
    run_plan.POLICY = dataclasses.replace(run_plan.POLICY, stream_min_bytes=1 << 62)
with torch.no_grad(), options(backend="kernel", cpu_schedule="plain"):
    m(x[:2, :2])
    print("PEAK", call_peak_memory(lambda: m(x)))
"""


def _child_peak(mode: str) -> int:
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=str(root))
    res = subprocess.run([sys.executable, "-c", _CHILD, mode], capture_output=True, text=True,
                         env=env, cwd=str(root), timeout=300)
    assert res.returncode == 0, res.stderr
    return int(res.stdout.split("PEAK")[1])


def test_streamed_peak_memory_is_bounded():
    """T=400, B=400, H=32 (lstm): the output is 20 MiB, the projections of all steps 80 MiB
    (above the 64 MiB streaming threshold); unstreamed the call peaks at about their sum (97 MiB
    on the Xeon VM), streamed at about 59 MiB.  Each in a fresh process (memory an earlier call
    freed may stay resident and hide part of a later call's peak); the peak is the call's own
    (``commands.machine.call_peak_memory``: Linux's high-water mark, reset before it).  The
    bound is loose (RSS also counts the allocator's and the libraries' pages), and the same
    bound on the unstreamed call must fail, or the measurement would not see the projections."""
    streamed, whole = _child_peak("streamed"), _child_peak("whole")
    out_bytes, proj_bytes = 400 * 400 * 32 * 4, 400 * 400 * 128 * 4
    bound = 0.75 * (out_bytes + proj_bytes)
    mib = (round(streamed / 2**20, 1), round(whole / 2**20, 1), "MiB streamed, unstreamed")
    assert whole > bound, mib  # the measurement sees the projections
    assert streamed < bound, mib
