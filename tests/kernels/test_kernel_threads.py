"""The CPU kernel's worker threads under the wrappers a caller may install.

With two threads the pipelined schedule and the concurrent directions run part of a layer on a
second thread of the OpenMP team.  That thread gets the caller's grad and inference modes and
nothing else, and the bindings release the GIL for the whole call, so a Python-level mode or
hook on the caller's thread (non-reentrant checkpointing, saved-tensor hooks, ``save_on_cpu``,
a ``TorchDispatchMode``, ``FlopCounterMode``, ``torch.profiler``) can neither block the worker
nor be lost (the profiler records the worker's calls, which get its state): each
case below runs in a child process with a timeout (a blocked kernel cannot be interrupted from
Python) and must give the unwrapped call's numbers.
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from rnn_ablations import VARIANTS, get_variant, kernel_available

pytestmark = pytest.mark.skipif(not kernel_available(), reason="the CPU kernel is not built")

CHILD = textwrap.dedent(r"""
    import json, sys
    import torch
    from torch.utils.checkpoint import checkpoint
    from torch.utils.flop_counter import FlopCounterMode
    from torch.utils._python_dispatch import TorchDispatchMode
    from rnn_ablations import AblatedRNN, use_backend, use_kernel_isa, use_pipeline
    from rnn_ablations.aliases import use_concurrent_directions

    schedule = sys.argv[1]
    torch.set_num_threads(2)

    class Seen(TorchDispatchMode):
        ops = set()
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Seen.ops.add(str(func))
            return func(*args, **(kwargs or {}))

    packed = []
    threads = set()  # the threads the profiler recorded ATen calls on
    def pack(t):
        packed.append(t.shape)
        return t

    def run(rnn, x, how, grad):
        x.grad = None
        for p in rnn.parameters():
            p.grad = None
        with torch.enable_grad() if grad else torch.no_grad():
            if how == "checkpoint":
                out = checkpoint(lambda t: rnn(t)[0], x, use_reentrant=False)
            elif how == "saved_tensors_hooks":
                with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                    out = rnn(x)[0]
            elif how == "save_on_cpu":
                with torch.autograd.graph.save_on_cpu():
                    out = rnn(x)[0]
            elif how == "dispatch_mode":
                with Seen():
                    out = rnn(x)[0]
            elif how == "flop_counter":
                with FlopCounterMode(display=False):
                    out = rnn(x)[0]
            elif how == "profiler":
                # on the portable path the step GEMM is ATen's, so a direction's thread calls
                # ATen operators the profiler can record (the AVX2 / AVX-512 paths' packed GEMM
                # and element-wise pass are not operators)
                # (the most threads of three profiled calls: the first profile after the team
                # started may miss the other thread's first events)
                seen = []
                for _ in range(3):
                    with use_kernel_isa("portable"), torch.profiler.profile(
                            activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                        out = rnn(x)[0]
                    seen.append({e.thread for e in prof.events() if e.name.startswith("aten::")})
                threads.update(max(seen, key=len))
            else:
                out = rnn(x)[0]
            if grad:
                out.square().sum().backward()
        grads = [x.grad] + [p.grad for p in rnn.parameters()] if grad else []
        return out.detach(), grads

    pipeline = "always" if schedule == "pipelined" else "never"
    directions = "always" if schedule == "concurrent" else "never"
    with use_backend("kernel"), use_pipeline(pipeline), use_concurrent_directions(directions):
        for variant in sys.argv[2].split(","):
            torch.manual_seed(0)
            rnn = AblatedRNN(variant, 6, 8, num_layers=2, bidirectional=schedule == "concurrent",
                             batch_first=True)
            for grad in (True, False):
                x = torch.randn(3, 9, 6, requires_grad=grad)
                ref, ref_grads = run(rnn, x, "plain", grad)
                for wrapper in sys.argv[3].split(","):
                    Seen.ops.clear()
                    packed.clear()
                    threads.clear()
                    # the case is announced before it runs: a blocked one is the last line
                    print("case", variant, wrapper, "grad" if grad else "no_grad", flush=True)
                    got, got_grads = run(rnn, x, wrapper, grad)
                    ok = torch.allclose(ref, got, rtol=1e-5, atol=1e-6) and all(
                        torch.allclose(a, b, rtol=1e-5, atol=1e-6)
                        for a, b in zip(ref_grads, got_grads))
                    print(json.dumps({"variant": variant, "wrapper": wrapper, "grad": grad,
                                      "equal": bool(ok), "dispatch_ops": len(Seen.ops),
                                      "packed": len(packed), "threads": len(threads)}),
                          flush=True)
""")

WRAPPERS = ["checkpoint", "saved_tensors_hooks", "save_on_cpu", "dispatch_mode", "flop_counter",
            "profiler"]


@pytest.mark.parametrize("schedule", ["pipelined", "concurrent"])
def test_wrappers_on_the_threaded_schedules(schedule):
    """Every variant, every wrapper, with and without grad, on one threaded schedule."""
    timeout = 240
    env = dict(os.environ, OMP_NUM_THREADS="2")
    try:
        proc = subprocess.run([sys.executable, "-c", CHILD, schedule, ",".join(VARIANTS),
                               ",".join(WRAPPERS)], capture_output=True, text=True,
                              timeout=timeout, env=env)
    except subprocess.TimeoutExpired as exc:
        lines = (exc.stdout or b"").decode().strip().splitlines()
        pytest.fail(f"the {schedule} schedule did not return within {timeout} s: blocked at "
                    f"{lines[-1] if lines else 'the first case'}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(rows) == len(VARIANTS) * len(WRAPPERS) * 2
    for r in rows:
        assert r["equal"], f"{r} changed the numbers"
        if r["wrapper"] == "dispatch_mode":
            assert r["dispatch_ops"] > 0, f"{r}: the dispatch mode saw no operator"
        if r["wrapper"] == "saved_tensors_hooks" and r["grad"]:
            assert r["packed"] > 0, f"{r}: the saved-tensor hook saw none of the saved tensors"
    if schedule == "concurrent":
        # the second direction runs on the team's second thread (a static split): its operators
        # are recorded too when the profiler's state reaches that thread.  Whether a given
        # profiled call shows them depends on timing (the profile that starts just after the
        # team did can miss the other thread's first events; the pipelined schedule's second
        # thread takes only the chunks the first has not claimed yet, on a small input maybe
        # none), so one recorded call on two threads is the evidence asked for.
        profiled = [r for r in rows if r["wrapper"] == "profiler"
                    and get_variant(r["variant"]).has_step_kernel]
        assert max(r["threads"] for r in profiled) >= 2, \
            f"the profiler never recorded the second thread: {profiled}"
