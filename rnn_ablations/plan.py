"""The run plan: the one function that turns the settings into a decision per layer call
(:func:`plan_layer`).

The settings (:class:`~rnn_ablations.settings.Options`, :func:`~rnn_ablations.settings.options`
and the environment variables) live in :mod:`rnn_ablations.settings`, which imports nothing of the
package.

The decision
------------
:func:`plan_layer` is a pure function of the settings (:class:`Options`),
a description of the call (:class:`LayerCall`: shapes, device, dtype, gradient wanted, threads,
autocast), what this process has compiled (:class:`Kernels`) and the measured thresholds of the
CPU schedule policy (:class:`Policy`); it returns a small :class:`Plan`.  It reads no tensor and
no global, so each decision is unit-tested without running a layer
(``tests/test_run_plan.py``).  :func:`decide` describes a real call (:func:`describe`, step and
scan cells alike) and asks it; :mod:`rnn_ablations.dispatch` runs the runner the plan names
(``Plan.runner``, one of :data:`RUNNERS`).

The decisions, in order:

1. **implementation** (``Plan.path``): ``"generic"`` (torch ops), ``"cpu"`` (the compiled CPU
   kernel, float32/float64) or ``"cuda"`` (the compiled CUDA kernel, float32/float64/bfloat16/
   float16).  The dtype that counts is the projection's: under ``torch.autocast`` a float32
   input projection comes out in the autocast dtype.  An empty input (no step or no row) takes the
   generic path for a cell that reads h_{t-1} (autograd then gives zero gradients of the right
   shapes, as for ``nn.LSTM``).  With ``backend="auto"`` a missing kernel falls back to the
   generic path with a warning (``Plan.warning``, shown once per kind); with
   ``backend="kernel"`` every fallback is an error that says why.
2. **CPU schedule** (``Plan.schedule``, ``Plan.concurrent``): see :func:`_cpu_schedule`.
3. **input projection on oneDNN** (``Plan.onednn``): float32 CPU weights of at least
   ``Policy.onednn_min_weight`` entries, not under autocast (see
   :mod:`rnn_ablations.kernels.projection`).
4. **CUDA recurrence** (``Plan.recurrence``): ``"steps"`` (the step kernel) or ``"persistent"``
   (asked for explicitly: ``auto`` keeps the step kernel, see
   :mod:`rnn_ablations.kernels.cuda.recurrence`); whether the persistent kernel fits this layer
   is asked of the compiled kernel by :func:`decide` (:func:`check_persistent`), except in a
   traced graph, where the operator refuses a shape it does not apply to when the graph runs.
5. **CUDA graphs** (``Plan.graphs``): the setting, on the CUDA kernel only, and not while
   ``torch.compile`` / ``torch.export`` trace the call (``LayerCall.compiling``).
6. **scan** (cells that read no h_{t-1}): ``Plan.fused_scan``: the projection, the scan and the
   backward in one node (the kernel adds the bias), where the kernel has that interface and no
   autocast is active and every parameter has the input's dtype and device.
7. **bfloat16 on the CPU** (``Plan.bf16_on_f32``, ``Plan.bf16_gemm``, ``Plan.bf16_step_gemm``):
   a bfloat16 call (input or parameters, or float32 under CPU bfloat16 autocast) runs on the
   float32 kernels, planned as the float32 call they run; its input projection's GEMM in
   bfloat16 where ``Policy.bf16_gemm`` says and the runner projects itself; a step cell's step
   GEMM (h_{t-1} against ``w_hh``) in bfloat16 where ``Policy.bf16_step_gemm`` says (the states
   and the element-wise pass stay in float32).  The same in eager and traced calls.
8. **streaming** (``Plan.stream``, runners ``cpu_streamed`` / ``scan_streamed``): a large
   no-gradient CPU call computes its projections a chunk of steps at a time (:func:`_stream`).
9. **step-GEMM library** (``Plan.step_gemm``): :func:`library_step_thresholds` of the policy for
   the kernel's vector path.
10. **CUDA first-use check** (``Plan.check``, ``Plan.cuda_checked``): :func:`decide` reads the
    verdict of every family a CUDA plan runs (``kernels/cuda/selfcheck.py`` ``verdict``); a
    family that failed is not available (``plan_layer``'s ``cuda_failed``): the generic path,
    or an error with ``backend="kernel"``.
11. **proj_size** (``LayerCall.projected``): the runner ``generic_projected``.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple, Optional, Tuple

import torch

__all__ = ["LayerCall", "Kernels", "Policy", "Plan", "plan_layer", "cached_plan", "decide",
           "check_persistent", "onednn_applies", "onednn_min_weight", "CPU_DTYPES", "CUDA_DTYPES",
           "library_step_thresholds", "bf16_gemm_applies", "stream_steps", "describe", "RUNNERS"]


from ._dynamo_marks import assume_constant_result
from .functional import Reversal
from .kernels import registry
from .kernels.registry import Kernels
from .settings import Options, _keep_hash, _kept_hash, get_options


# --------------------------------------------------------------------------- the decision
CPU_DTYPES = (torch.float32, torch.float64)
CUDA_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


class LayerCall(NamedTuple):
    """What the plan needs to know of one layer call (no tensors).

    device: ``"cpu"``, ``"cuda"``, ...; dtype: the input's dtype; steps, batch: T and B (under
    ``torch.compile`` / ``torch.export``: sizes on the same side of every threshold the plan
    compares them with, see :func:`plan_sizes`);
    hidden: H; rec_blocks: R, the blocks that read h_{t-1} (0 for a cell that reads none: the
    scan); proj_weight: entries of the input weight (of all directions together for the scan,
    which projects them in one GEMM); directions: directions submitted together;
    needs_grad: a gradient is wanted (grad mode on and an input requires it); threads: torch's
    intra-op threads; autocast_dtype: the autocast dtype on this device, ``None`` outside
    autocast; uniform: every direction's input and parameters have the same shapes, dtype and
    device as the first (the concurrent directions and the one-node scan need it); scan_layout: the cell has a
    layout for the scan kernels (cells that read no h_{t-1}); compiling: the call is traced by
    ``torch.compile`` / ``torch.export`` (a compiled graph holds the operators themselves, not
    CUDA-graph replay: ``torch.compile`` has CUDA graphs of its own, mode="reduce-overhead");
    weight_dtypes: the distinct dtypes of the parameters (empty: the input's); proj_width: the
    rows of one direction's input weight ((R+X)·H, or G·H for a scan cell: the projection's
    width per step and row, which streaming measures); plain_tensor: the input is a plain
    ``torch.Tensor`` (no subclass); reversal: direction 1's reversed input can be read a few
    steps at a time (the caller passed a :class:`rnn_ablations.functional.Reversal`, or there
    is one direction, or the cell reads no h_{t-1}); projected: ``proj_size`` (``h_t`` projected
    by ``W_hr``)."""

    device: str
    dtype: torch.dtype
    steps: int
    batch: int
    hidden: int
    rec_blocks: int
    proj_weight: int
    directions: int = 1
    needs_grad: bool = False
    threads: int = 1
    autocast_dtype: Optional[torch.dtype] = None
    uniform: bool = True
    scan_layout: bool = True
    compiling: bool = False
    weight_dtypes: Tuple[torch.dtype, ...] = ()
    proj_width: int = 0
    plain_tensor: bool = True
    reversal: bool = True
    projected: bool = False


@dataclasses.dataclass(frozen=True)
class Policy:
    """The measured thresholds of the CPU schedule policy (``benchmarks/results/
    schedule_policy.md``; re-measure with ``benchmarks/schedules.py`` on a new machine).

    min_steps: the pipelined schedule from this many steps; max_step_macs /
    max_step_macs_inference: with 2+ threads, the plain schedule (and directions one after the
    other) from this many multiply-adds per step GEMM (B x R*H x H), training / no gradient;
    onednn_min_weight: the input projection on oneDNN from this many weight entries (the
    entries of one projection GEMM: a direction's ``w_ih``, or every direction's together for
    a scan cell); onednn_min_weight_by_vendor: ``(vendor, min_weight)`` entries that replace it
    on CPUs of that vendor (``Kernels.cpu_vendor``: ``"amd"``, ``"intel"``), where MKL and
    oneDNN compare otherwise (MKL picks its code per vendor; :func:`onednn_min_weight`,
    measured by ``benchmarks/projection_library.py``);
    stream_min_bytes / stream_chunk_bytes: a no-gradient forward on a CPU kernel (step or scan
    cell) whose input projections of all steps (per direction) reach ``stream_min_bytes``
    computes them a chunk of at most ``stream_chunk_bytes`` at a time (:func:`stream_steps`;
    peak memory, ``benchmarks/inference_memory.py``);
    bf16_gemm: a bfloat16 CPU call's input projection in bfloat16 (``"on"``), in float32
    (``"off"``) or in bfloat16 where the CPU has bfloat16 GEMM instructions (AVX512-BF16 or
    AMX) and in float32 elsewhere (``"auto"``; :func:`bf16_gemm_applies`);
    bf16_step_gemm: the same choice for the step GEMM of a bfloat16 CPU call of a step cell
    (``w_hh`` handed to the kernel in bfloat16, ``h_{t-1}`` rounded to bfloat16 each step,
    accumulated in float32 into the float32 gates: ``csrc/cpu/library_gemm.h``); ``"on"``
    forces it on any CPU (the tests), where it runs correctly but without bfloat16
    instructions, slower than float32;
    library_step_gemm: per vector path of the CPU kernel, ``(isa, train_min_macs,
    inference_min_macs)``: the float32 step GEMM (B x R*H x H) through MKL's packed GEMM, which
    picks its code per CPU, from this many multiply-adds per step in training / in a
    no-gradient forward, -1 never (the kernel's own packed GEMM); a path not listed never
    (:func:`library_step_thresholds`; measured by ``benchmarks/step_gemm_library.py``).  The
    plan carries them (``Plan.step_gemm``) and the CPU runner gives them to the kernel where it
    holds others, at each eager layer call; a ``torch.compile`` graph's calls run with what the
    kernel holds (the extension is not called while a graph is traced)."""

    min_steps: int = 4
    max_step_macs: int = 24_000_000
    max_step_macs_inference: int = 12_000_000
    onednn_min_weight: int = 500_000
    onednn_min_weight_by_vendor: Tuple[Tuple[str, int], ...] = ()
    stream_min_bytes: int = 64 * 2**20
    stream_chunk_bytes: int = 16 * 2**20
    bf16_gemm: str = "auto"
    # off until measured on a CPU with bfloat16 GEMM instructions: MKL's bf16 GEMM re-packs
    # w_hh at every step (its packed bf16 API is not exported by torch's wheel), which may cost
    # more than the float32 packed step GEMM saves; `benchmarks/bf16_step_gemm.py` decides
    bf16_step_gemm: str = "off"
    # avx512: never (the kernel's own packed GEMM was as fast or faster than MKL's at every
    # experiment shape on AMD EPYC AVX-512: benchmarks/results/schedule_policy.md)
    library_step_gemm: Tuple[Tuple[str, int, int], ...] = (("avx512", -1, -1),)

    def __post_init__(self) -> None:
        for name in ("bf16_gemm", "bf16_step_gemm"):
            if getattr(self, name) not in ("auto", "on", "off"):
                raise ValueError(f"Policy.{name} must be 'auto', 'on' or 'off', got "
                                 f"{getattr(self, name)!r}")
        for entry in self.library_step_gemm:
            if (not isinstance(entry, tuple) or len(entry) != 3 or not isinstance(entry[0], str)
                    or any(not isinstance(v, int) or v < -1 for v in entry[1:])):
                raise ValueError("Policy.library_step_gemm takes (isa, train_min_macs, "
                                 "inference_min_macs) tuples, the thresholds >= 0 or -1 "
                                 f"(never), e.g. ('avx512', -1, 0); got {entry!r}")
        for entry in self.onednn_min_weight_by_vendor:
            if (not isinstance(entry, tuple) or len(entry) != 2 or not isinstance(entry[0], str)
                    or not isinstance(entry[1], int) or entry[1] < 0):
                raise ValueError("Policy.onednn_min_weight_by_vendor takes (vendor, min_weight) "
                                 f"tuples, min_weight >= 0, e.g. ('amd', 200_000); got {entry!r}")
        _keep_hash(self)

    __hash__ = _kept_hash


@dataclasses.dataclass(frozen=True)
class Plan:
    """How one layer call runs.

    path: ``"generic"``, ``"cpu"`` or ``"cuda"``; reason: why, in words; isa: the CPU kernel's
    vector path (``path == "cpu"``); schedule: ``"plain"`` or ``"pipelined"`` (CPU step kernel),
    ``"scan"`` / ``"fused_scan"`` (cells that read no h_{t-1}), ``None`` otherwise; concurrent:
    the directions run at the same time, one per thread; chunk: steps per chunk of the pipelined
    schedule (0 = automatic); onednn: the input projection on oneDNN; recurrence: ``"steps"`` or
    ``"persistent"`` (CUDA step kernel); graphs: CUDA-graph replay; persistent: (blocks,
    batch_tile, backward) of the persistent kernel; warning: ``(kind, message)`` when the auto
    backend fell back to the generic path for want of a kernel (the caller warns once per
    kind); runner: the function of ``dispatch.RUNNERS`` that runs the call;
    bf16_on_f32: a bfloat16 CPU call (bfloat16 input or parameters, or float32 under
    ``torch.autocast("cpu", torch.bfloat16)``) that runs on the float32 kernels (inputs widened
    to float32, results narrowed to bfloat16); bf16_gemm: its input projection's GEMM in
    bfloat16; bf16_step_gemm: its step GEMM in bfloat16 (``w_hh`` given to the kernel in
    bfloat16); bf16_instructions: for such a call, whether the CPU has bfloat16 GEMM
    instructions (``Kernels.bf16_gemm``), which the ``"auto"`` settings of the two GEMMs read;
    stream: steps per chunk of a no-gradient forward whose input projections are
    computed a chunk at a time (0: all at once); step_gemm: ``(train_min_macs,
    inference_min_macs)`` from which the CPU kernel's step GEMM runs on MKL (-1: never);
    cuda_checked: the CUDA families (programs and rules) that passed their first-use check on
    this device, which the call runs; check: ``"passed"``, ``"off"`` (the check is switched off,
    or skipped while a graph is traced or captured) or ``""`` (no CUDA kernel runs);
    onednn_min_weight: on the CPU, the projection weight (entries) from which the input
    projection runs on oneDNN, the policy's threshold for this CPU's vendor
    (:func:`onednn_min_weight`; 0 off the CPU)."""

    path: str
    reason: str
    isa: Optional[str] = None
    schedule: Optional[str] = None
    concurrent: bool = False
    chunk: int = 0
    onednn: bool = False
    recurrence: Optional[str] = None
    graphs: bool = False
    persistent: Tuple[int, int, bool] = (0, 0, False)
    warning: Optional[Tuple[str, str]] = None
    runner: str = ""
    bf16_on_f32: bool = False
    bf16_gemm: bool = False
    bf16_step_gemm: bool = False
    bf16_instructions: bool = False
    stream: int = 0
    step_gemm: Tuple[int, int] = (-1, -1)
    cuda_checked: Tuple[str, ...] = ()
    check: str = ""
    onednn_min_weight: int = 0

    @property
    def fused_scan(self) -> bool:
        return self.schedule == "fused_scan"


def onednn_min_weight(policy: Policy, vendor: Optional[str]) -> int:
    """The weight (entries) from which the input projection runs on oneDNN on a CPU of
    ``vendor``: its ``policy.onednn_min_weight_by_vendor`` entry, else
    ``policy.onednn_min_weight``."""
    for name, weight in policy.onednn_min_weight_by_vendor:
        if name == vendor:
            return weight
    return policy.onednn_min_weight


def onednn_applies(settings: Options, device: str, dtype: torch.dtype, weight_entries: int,
                   autocast: bool, onednn_works: bool, policy: Policy = Policy(),
                   vendor: Optional[str] = None) -> bool:
    """The input projection of all steps on oneDNN: float32 CPU weights of at least
    :func:`onednn_min_weight` entries for the CPU's ``vendor`` (where oneDNN beat MKL), not
    with the generic backend, not under autocast (whose casts ``F.linear`` applies)."""
    return (settings.backend != "generic" and device == "cpu" and dtype == torch.float32
            and not autocast and onednn_works
            and weight_entries >= onednn_min_weight(policy, vendor))


def library_step_thresholds(policy: Policy, isa: Optional[str]) -> Tuple[int, int]:
    """``(train_min_macs, inference_min_macs)`` of ``policy.library_step_gemm`` for the CPU
    kernel's vector path ``isa``; ``(-1, -1)`` (never) for a path it does not list."""
    for name, train, inference in policy.library_step_gemm:
        if name == isa:
            return train, inference
    return -1, -1


def _kernel_for(settings: Options, device: str, dtype: torch.dtype, kernels: Kernels,
                scan: bool):
    """``(path, reason, warning)``: the compiled kernel for this device and dtype, or the generic
    path (raises with ``backend="kernel"`` where no kernel runs the call)."""
    what = "scan kernel" if scan else "kernel"
    if settings.backend == "generic":
        return "generic", "backend='generic'", None
    if device == "cpu" and dtype in CPU_DTYPES:
        have, error, kind = (kernels.cpu_scan if scan else kernels.cpu), kernels.cpu_error, "CPU"
    elif device == "cuda" and dtype in CUDA_DTYPES:
        have, error, kind = (kernels.cuda_scan if scan else kernels.cuda), kernels.cuda_error, "CUDA"
    else:
        if settings.backend == "kernel":
            raise RuntimeError(f"the rnn_ablations {what}s handle CPU float32/float64 and CUDA "
                               f"float32/float64/bfloat16/float16, got {device} {dtype}; use the "
                               "generic backend (rnn_ablations.options(backend='generic'))")
        return "generic", f"no kernel for {device} {dtype}", None
    if have:
        return kind.lower(), f"the compiled {kind} {what}", None
    if settings.backend == "kernel":
        raise RuntimeError(f"the rnn_ablations {kind} {what} is not available: {error}")
    message = (f"rnn_ablations: compiled {kind} {what} unavailable ({error}); using the slower "
               "generic path")
    return "generic", f"the {kind} {what} is not available", (kind + (" scan" if scan else ""),
                                                              message)


def _step_macs(call: LayerCall) -> int:
    return call.batch * call.rec_blocks * call.hidden * call.hidden


def _cpu_schedule(settings: Options, call: LayerCall, onednn: bool, policy: Policy):
    """``(schedule, concurrent)`` of the CPU step kernel.

    *Pipelined*: the recurrence runs on one thread while another computes, chunk by chunk, the
    GEMMs that do not wait for the next step (the input projection of later steps in the
    forward, the input gradient of finished steps in the backward).  *Plain*: the input
    projection of all steps first, then each step's GEMM split over the threads.

    ``auto`` takes the pipeline from ``policy.min_steps`` steps, except (a) with 2+ threads
    when one step's GEMM reaches ``max_step_macs`` (training) or ``max_step_macs_inference``
    (no gradient): then splitting every GEMM over the threads keeps both cores busy on the
    critical path; (b) single-threaded inference with a weight large enough for oneDNN's
    projection.

    *Concurrent directions* (a bidirectional layer): both directions' recurrences at once, one
    per thread, in one kernel call (one fork/join per layer and pass instead of one per step).
    ``auto`` takes it with exactly 2 threads; with more, while one step's GEMM is below the
    threshold above (not measured: the development machines have 2 cores); never with one
    thread.  Each concurrent direction then runs the one-thread rule: pipelined from
    ``min_steps`` steps, except inference with a oneDNN-sized weight.  Not under autocast (the
    projections would be in the autocast dtype, which the step kernels do not run)."""
    threads = call.threads
    one_thread_pipeline = (call.steps >= policy.min_steps
                           and (call.needs_grad or not onednn))
    limit = policy.max_step_macs if call.needs_grad else policy.max_step_macs_inference
    small_step = _step_macs(call) < limit
    concurrent = False
    if (call.directions >= 2 and settings.concurrent_directions != "off" and call.uniform
            and call.autocast_dtype is None):
        if settings.concurrent_directions == "on" or threads == 2:
            concurrent = True
        elif threads > 2:
            concurrent = small_step
    if settings.cpu_schedule != "auto":
        return settings.cpu_schedule, concurrent
    if concurrent:
        return ("pipelined" if one_thread_pipeline else "plain"), True
    if call.steps < policy.min_steps:
        return "plain", False
    if threads >= 2:
        return ("pipelined" if small_step else "plain"), False
    return ("pipelined" if one_thread_pipeline else "plain"), False


#: The runners a plan may name (``Plan.runner``), each one function of the run layer.
RUNNERS = ("generic", "generic_scan", "generic_projected", "cpu_plain", "cpu_pipelined",
           "cpu_plain_pair", "cpu_pipelined_pair", "cpu_streamed", "cuda", "scan", "fused_scan",
           "scan_streamed")


def _runner(plan: Plan, call: LayerCall) -> str:
    if call.projected:
        return "generic_projected"
    if call.rec_blocks == 0:
        if plan.stream:
            return "scan_streamed"
        return {"fused_scan": "fused_scan", "scan": "scan"}.get(plan.schedule, "generic_scan")
    if plan.path == "cpu":
        if plan.stream:
            return "cpu_streamed"
        return f"cpu_{plan.schedule}" + ("_pair" if plan.concurrent else "")
    if plan.path == "cuda":
        return "cuda"  # the step or the persistent kernel: Plan.recurrence says which
    return "generic"


def bf16_gemm_applies(setting: str, cpu_has_bf16_gemm: bool) -> bool:
    """Whether a bfloat16 CPU call computes a GEMM in bfloat16 (its input projection:
    ``Policy.bf16_gemm``; its step GEMM: ``Policy.bf16_step_gemm``): ``"on"`` / ``"off"``, or
    ``"auto"``: where the CPU has bfloat16 GEMM instructions (``cpu_has_bf16_gemm``, i.e.
    ``Kernels.bf16_gemm``: AVX512-BF16 or AMX); elsewhere bfloat16 is converted to float32
    inside the GEMM, and the float32 kernels' own GEMM is faster."""
    if setting not in ("auto", "on", "off"):
        raise ValueError(f"bf16_gemm must be 'auto', 'on' or 'off', got {setting!r}")
    return setting == "on" or (setting == "auto" and cpu_has_bf16_gemm)


def stream_steps(steps: int, batch: int, width: int, itemsize: int, min_bytes: int,
                 chunk_bytes: int) -> int:
    """Steps per chunk of a streamed no-gradient forward, or 0 when the projections of all
    ``steps`` (``steps·batch·width·itemsize`` bytes, per direction) stay below ``min_bytes``
    (they are then computed at once) or one chunk would hold every step.  A chunk holds at most
    ``chunk_bytes`` of projections, and at least one step."""
    per_step = batch * width * itemsize
    if steps < 2 or per_step * steps < min_bytes:
        return 0
    chunk = max(1, chunk_bytes // max(1, per_step))
    return chunk if chunk < steps else 0


def _bf16_on_f32(settings: Options, call: LayerCall, kernels: Kernels) -> bool:
    """A CPU call in bfloat16 (a bfloat16 input or parameter among float32 / bfloat16 ones, or
    float32 ones under ``torch.autocast("cpu", torch.bfloat16)``) that the float32 CPU kernels
    run: not with the generic backend, and where the CPU kernel is built."""
    if call.device != "cpu" or settings.backend == "generic" or not kernels.cpu:
        return False
    bf, f32 = torch.bfloat16, torch.float32
    dtypes = set(call.weight_dtypes) | {call.dtype}
    return ((bf in dtypes and dtypes <= {bf, f32})
            or (call.autocast_dtype == bf and dtypes == {f32}))


def _stream(plan: Plan, call: LayerCall, policy: Policy, bf16: bool) -> int:
    """Steps per chunk where the call's input projections are computed a chunk at a time
    (:func:`stream_steps`): a no-gradient call on a CPU kernel that projects all steps before
    its recurrence (the step kernel of either schedule, and the scan), in eager mode, float32 /
    float64 (or bfloat16 on the float32 kernels, each chunk widened on its own) outside
    autocast, on a plain tensor, whose projections of all steps reach
    ``policy.stream_min_bytes`` per direction; a bidirectional step cell needs the input's
    reversal a few steps at a time (``LayerCall.reversal``)."""
    if (plan.path != "cpu" or call.needs_grad or call.compiling or not call.plain_tensor
            or call.directions > 2):
        return 0
    if not bf16 and (call.autocast_dtype is not None or call.dtype not in CPU_DTYPES):
        return 0
    if call.rec_blocks and not call.reversal:
        return 0
    itemsize = 8 if call.dtype == torch.float64 else 4  # bfloat16: its float32 projection
    return stream_steps(call.steps, call.batch, call.proj_width, itemsize,
                        policy.stream_min_bytes, policy.stream_chunk_bytes)


#: runners whose input projection is an ``F.linear`` of their own (the bfloat16 GEMM applies)
_OWN_PROJECTION = ("cpu_plain", "cpu_plain_pair", "cpu_streamed", "scan", "scan_streamed")


def plan_layer(settings: Options, call: LayerCall, kernels: Kernels,
               policy: Policy = Policy(),
               cuda_failed: Optional[Tuple[str, str, str]] = None) -> Plan:
    """How ``call`` runs under ``settings`` with ``kernels`` (see the module docstring).
    ``cuda_failed``: ``(device, family, reason)`` when a CUDA family the plan would run failed
    its first-use check (:func:`decide` asks :func:`rnn_ablations.kernels.cuda.selfcheck.
    verdict`): the family is not available, the generic path runs the call (the check's own
    warning said so), or with ``backend="kernel"`` the call raises naming the family.
    Raises ``RuntimeError`` where ``backend="kernel"`` (or ``cuda_recurrence="persistent"``)
    asks for a kernel that cannot run the call, saying why."""
    if call.projected:
        return Plan("generic", "proj_size: h_t = W_hr (o_t * tanh(c_t)) runs on the generic "
                    "path (no kernel projects h_t)", runner="generic_projected")
    bf16 = _bf16_on_f32(settings, call, kernels)
    # a bfloat16 call is planned as the float32 call its kernels run (autocast off inside)
    run_call = call._replace(dtype=torch.float32, autocast_dtype=None, uniform=True,
                             weight_dtypes=()) if bf16 else call
    plan = _plan_layer(settings, run_call, kernels, policy)
    if plan.path == "cuda" and cuda_failed is not None:
        device, family, why = cuda_failed
        if settings.backend == "kernel":
            raise RuntimeError(
                f"backend='kernel': the CUDA kernels {family} failed their check on {device} "
                f"({why}); the auto backend runs the generic path instead "
                "(rnn_ablations.options(backend='auto'))")
        plan = Plan("generic", f"the CUDA kernels {family} failed their check on {device}")
    bf16 = bf16 and plan.path == "cpu"
    stream = _stream(plan, run_call if bf16 else call, policy, bf16)
    fields = dict(stream=stream)
    if stream:
        # the streamed forward projects outside the kernel and runs its plain forward
        if not call.rec_blocks:
            fields["reason"] = f"the compiled {call.device.upper()} scan kernel, streamed"
        fields.update(schedule="plain" if call.rec_blocks else "scan",
                      onednn=onednn_applies(settings, call.device, run_call.dtype,
                                            call.proj_weight, run_call.autocast_dtype is not None,
                                            kernels.onednn, policy, kernels.cpu_vendor))
    if plan.path == "cpu" and call.rec_blocks:
        fields["step_gemm"] = library_step_thresholds(policy, kernels.isa)
    if call.device == "cpu":
        fields["onednn_min_weight"] = onednn_min_weight(policy, kernels.cpu_vendor)
    plan = dataclasses.replace(plan, **fields)
    runner = _runner(plan, call)
    if bf16:
        gemm = runner in _OWN_PROJECTION and bf16_gemm_applies(policy.bf16_gemm,
                                                               kernels.bf16_gemm)
        # every CPU step runner hands w_hh to the kernel, which takes it in bfloat16
        step = call.rec_blocks > 0 and bf16_gemm_applies(policy.bf16_step_gemm,
                                                         kernels.bf16_gemm)
        plan = dataclasses.replace(plan, bf16_on_f32=True, bf16_gemm=gemm, bf16_step_gemm=step,
                                   bf16_instructions=kernels.bf16_gemm,
                                   onednn=plan.onednn and not gemm)
    return dataclasses.replace(plan, runner=runner)


def _plan_layer(settings: Options, call: LayerCall, kernels: Kernels, policy: Policy) -> Plan:
    autocast = call.autocast_dtype is not None
    # autocast casts float32 (not float64) inputs of F.linear to its dtype
    proj_dtype = call.autocast_dtype if autocast and call.dtype != torch.float64 else call.dtype
    empty = call.steps == 0 or call.batch == 0
    if call.rec_blocks == 0:
        return _plan_scan(settings, call, kernels, policy, proj_dtype, empty)
    onednn = onednn_applies(settings, call.device, call.dtype, call.proj_weight, autocast,
                            kernels.onednn, policy, kernels.cpu_vendor)
    if empty:
        return Plan("generic", "empty input: autograd gives the zero gradients")
    path, reason, warning = _kernel_for(settings, call.device, proj_dtype, kernels, scan=False)
    if path == "generic":
        return Plan("generic", reason, onednn=onednn, warning=warning)
    if path == "cpu":
        schedule, concurrent = _cpu_schedule(settings, call, onednn, policy)
        return Plan("cpu", reason, isa=kernels.isa, schedule=schedule, concurrent=concurrent,
                    chunk=settings.pipeline_chunk, onednn=onednn and schedule == "plain")
    recurrence = "persistent" if settings.cuda_recurrence == "persistent" else "steps"
    if recurrence == "persistent" and not kernels.persistent:
        raise RuntimeError(
            "cuda_recurrence='persistent': the CUDA kernels in use have no persistent kernel "
            "(they are compiled at run time by NVRTC; `rnn-ablations kernels` says what is "
            "available), or use rnn_ablations.options(cuda_recurrence='steps')")
    return Plan("cuda", reason, recurrence=recurrence,
                graphs=settings.cuda_graphs and not call.compiling,
                persistent=(settings.persistent_blocks, settings.persistent_batch_tile,
                            settings.persistent_backward) if recurrence == "persistent"
                else (0, 0, False))


def _plan_scan(settings: Options, call: LayerCall, kernels: Kernels, policy: Policy,
               proj_dtype: torch.dtype, empty: bool) -> Plan:
    autocast = call.autocast_dtype is not None
    onednn = onednn_applies(settings, call.device, call.dtype, call.proj_weight, autocast,
                            kernels.onednn, policy, kernels.cpu_vendor)
    if not call.scan_layout:
        return Plan("generic", "no scan layout for this cell", onednn=onednn)
    one_node = (settings.backend != "generic" and not autocast and not empty and call.uniform
                and ((call.device == "cpu" and call.dtype in CPU_DTYPES and kernels.cpu_scan)
                     or (call.device == "cuda" and call.dtype in CUDA_DTYPES
                         and kernels.cuda_scan)))
    if one_node:
        return Plan(call.device, f"the compiled {call.device.upper()} scan kernel, one node",
                    isa=kernels.isa if call.device == "cpu" else None, schedule="fused_scan",
                    onednn=onednn)
    path, reason, warning = _kernel_for(settings, call.device, proj_dtype, kernels, scan=True)
    if path == "generic":
        return Plan("generic", reason, onednn=onednn, warning=warning)
    return Plan(path, reason, isa=kernels.isa if path == "cpu" else None, schedule="scan",
                onednn=onednn)


#: :func:`plan_layer` with its plans kept: it is pure and its arguments are frozen dataclasses,
#: so repeated calls of the same shapes and settings reuse their plan (errors are not kept)
cached_plan = functools.lru_cache(maxsize=512)(plan_layer)


# --------------------------------------------------------------------------- a layer call
#: The thresholds of the CPU schedule policy in use: their one copy (``Policy``'s defaults,
#: measured in ``benchmarks/results/schedule_policy.md``).  Every plan of a layer call reads
#: them from here.
POLICY = Policy()


@assume_constant_result
def num_threads() -> int:
    """torch's intra-op thread count, for the plan.  Under ``torch.compile`` / ``torch.export``
    it is read once, when the graph is traced: it chooses a schedule (every schedule computes
    the same numbers), not a result."""
    return torch.get_num_threads()


def autocast_dtype(device_type: str) -> Optional[torch.dtype]:
    """The autocast dtype when ``torch.autocast(device_type)`` is on, else ``None``."""
    return registry.autocast_dtype(device_type)


#: How a whole stack of layers runs (:func:`stack_runner`): each layer planned and run on its own
#: (:func:`decide`, ``dispatch.RUNNERS``), or the whole stack as a loop in a captured graph
#: (``export.run_stack``): a TorchScript loop, or ``torch._higher_order_ops.scan``.
STACK_RUNNERS = ("layers", "script", "scan")


def stack_runner() -> str:
    """How ``AblatedRNN`` runs its stack of layers (one of :data:`STACK_RUNNERS`): ``"script"``
    while ``torch.jit.trace`` (or the TorchScript-based ONNX exporter) records, ``"scan"`` while
    the dynamo-based ONNX exporter captures the model (a Python loop over the steps would be
    unrolled, or specialised to one length: ``export.run_stack`` keeps the length dynamic),
    else ``"layers"`` (eager, ``torch.compile``, ``torch.export.export``: every layer is planned
    by :func:`decide` and carried out by its runner)."""
    if torch._C._get_tracing_state() is not None:
        return "script"
    if torch.compiler.is_compiling() and torch.onnx.is_in_onnx_export():
        return "scan"
    return "layers"


@assume_constant_result
def call_settings() -> Options:
    """The settings a layer call runs under: this thread's (:func:`get_options`), except where
    the call is recorded or transformed by something that cannot take the kernels' operators,
    and every layer takes the generic path (a loop of standard operators): ``torch.jit.trace``
    and ONNX export (either exporter: the TorchScript-based one records a trace, the dynamo-based
    one runs ``torch.export`` under its export flag) and ``torch.func``'s transforms (``grad``,
    ``jacrev``, ``vmap``: the kernels' autograd Functions have no functorch rules).  Under
    ``torch.compile`` / ``torch.export`` they are read when the graph is traced."""
    opts = get_options()
    if opts.backend != "generic" and (torch._C._get_tracing_state() is not None
                                      or _in_onnx_export()
                                      or torch._C._functorch.maybe_current_level() is not None):
        return dataclasses.replace(opts, backend="generic")
    return opts


#: the objects that hold ``torch.onnx``'s two "exporting" flags (looked up at the first call)
_onnx_flags: list = []


def _in_onnx_export() -> bool:
    """``torch.onnx.is_in_onnx_export()``: either exporter's flag.  torch's function imports the
    two modules that hold them at every call (4 µs, a measurable part of a small layer call's
    fixed cost); here they are looked up once.  A torch whose flags live elsewhere gets torch's
    function."""
    if not _onnx_flags:
        try:
            from torch.onnx._internal.exporter import _flags
            from torch.onnx._internal.torchscript_exporter._globals import GLOBALS
            if not (hasattr(GLOBALS, "in_onnx_export") and hasattr(_flags, "_is_onnx_exporting")):
                raise ImportError("other flags")
            _onnx_flags.extend((GLOBALS, _flags))
        except ImportError:
            _onnx_flags.append(None)
    if _onnx_flags[0] is None:
        return torch.onnx.is_in_onnx_export()
    return bool(_onnx_flags[0].in_onnx_export or _onnx_flags[1]._is_onnx_exporting)


def threshold_sizes(steps, batch, rec_blocks: int, hidden: int, needs_grad: bool):
    """Sizes on the same side of each of the plan's thresholds (:data:`POLICY`) as ``steps`` and
    ``batch``.  A symbolic size (dynamic shapes) is compared only where the comparison is known
    from its range (``statically_known_true``: no guard); otherwise it takes the side of the
    long sequence and the small step GEMM, so the graph holds no guard on the size and serves
    every size its range allows (``torch.export`` with ``Dim("T", min=1)``): the schedules
    compute the same function, the threshold only chooses the faster one."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true as known

    min_steps = POLICY.min_steps
    if known(steps == 0):
        steps_for_plan = 0
    elif known(steps < min_steps):
        steps_for_plan = 1
    else:
        steps_for_plan = min_steps
    limit = POLICY.max_step_macs if needs_grad else POLICY.max_step_macs_inference
    per_row = max(1, rec_blocks * hidden * hidden)
    large_batch = -(-limit // per_row)  # the smallest batch at the limit
    if known(batch == 0):
        batch_for_plan = 0
    elif known(batch >= large_batch):
        batch_for_plan = large_batch
    else:
        batch_for_plan = 1
    return steps_for_plan, batch_for_plan


def plan_sizes(steps, batch, rec_blocks: int, hidden: int, needs_grad: bool):
    """``(steps, batch)`` for a :class:`LayerCall`.  In eager mode T and B.  Under
    ``torch.compile`` / ``torch.export`` the plan is made when the graph is traced, and a size
    may be symbolic (dynamic shapes: one graph for every sequence length, which a plan keyed on
    the exact size would not allow).  The plan reads the sizes only through its thresholds
    (zero, ``min_steps``, the step GEMM's ``max_step_macs`` / ``max_step_macs_inference``), so
    each is replaced by a size on the same side of every threshold, or, for a symbolic size
    whose side its range does not fix, on a fixed side (:func:`threshold_sizes`): the graph
    then holds no guard on the size."""
    if not torch.compiler.is_compiling():
        return steps, batch
    return threshold_sizes(steps, batch, rec_blocks, hidden, needs_grad)


def describe(x: torch.Tensor, params, h0: torch.Tensor, c0: torch.Tensor,
             scan_layout: bool = False, needs_grad: Optional[bool] = None,
             reverse=None) -> LayerCall:
    """The :class:`LayerCall` of one layer: ``x`` (T, B, D_in) its input, ``params[d] = (w_ih,
    w_hh, bias[, w_hr])`` per direction (``w_hh`` is ``None`` for a cell that reads no
    h_{t-1}, which runs as a scan; ``w_hr``: ``proj_size``'s projection), ``h0`` / ``c0``
    (directions, B, H) its initial states; ``scan_layout``: the scan kernels have a layout for
    the cell; ``reverse``: what reverses direction 1's input (the module passes a
    :class:`rnn_ablations.functional.Reversal`).  A gradient is wanted (``needs_grad=None``)
    when grad mode is on and a tensor the layer reads requires one (a scan cell reads no h_0)."""
    w_ih, w_hh = params[0][0], params[0][1]
    reads_hidden = w_hh is not None
    hidden = c0.shape[-1]
    rec_blocks = w_hh.shape[0] // max(1, hidden) if reads_hidden else 0
    weights = [t for p in params for t in p if t is not None]
    if needs_grad is None:
        needs_grad = torch.is_grad_enabled() and (
            x.requires_grad or c0.requires_grad or (reads_hidden and h0.requires_grad)
            or any(t.requires_grad for t in weights))
    device = "cpu" if x.is_cpu else x.device.type
    dtype = x.dtype
    weight_dtypes = ()
    if any(t.dtype is not dtype for t in weights):
        weight_dtypes = tuple(sorted({t.dtype for t in weights}, key=str))
    # whether the directions may run together (the concurrent and one-node kernels take the
    # parameters in the input's dtype and on its device)
    uniform = len(params) == 1 or (not weight_dtypes and (
        x.is_cpu and all(t.is_cpu for t in weights) or all(t.device == x.device for t in weights)))
    # the weight one projection GEMM reads: a direction's (a step cell), or all directions'
    # together (a scan cell projects them in one GEMM)
    proj_weight = w_ih.numel() if reads_hidden else sum(p[0].numel() for p in params)
    steps, batch = plan_sizes(x.shape[0], x.shape[1], rec_blocks, hidden, needs_grad)
    reversal = len(params) == 1 or not reads_hidden or isinstance(reverse, Reversal)
    projected = len(params[0]) > 3 and params[0][3] is not None
    return LayerCall(device, x.dtype, steps, batch, hidden, rec_blocks, proj_weight, len(params),
                     needs_grad, num_threads(), autocast_dtype(device), uniform, scan_layout,
                     torch.compiler.is_compiling(), weight_dtypes, w_ih.shape[0],
                     type(x) is torch.Tensor, reversal, projected)


@assume_constant_result
def _plan_of(fields) -> Plan:
    """The plan of the call whose :class:`LayerCall` fields are ``fields`` (a plain tuple: what
    a traced graph can pass to a function it treats as constant), under :func:`call_settings`
    and what this process has compiled.  Under ``torch.compile`` / ``torch.export`` it is made
    once, when the graph is traced, and the graph holds the operators it chose.  The fallback
    warning is given here, where a traced graph does not look (it takes a lock)."""
    plan = cached_plan(call_settings(), LayerCall(*fields), registry.kernels(), POLICY)
    registry.warn_once(plan)
    return plan


def _cuda_checked(plan: Plan, call: LayerCall, variant, highway: bool,
                  device: torch.device) -> Plan:
    """``plan`` (a CUDA plan) with the verdicts of the CUDA kernels' first-use check on
    ``device`` for every family it runs (:func:`rnn_ablations.kernels.cuda.selfcheck.verdict`,
    each family checked at its first use on the device and remembered by device and family):
    the plan of a call whose family failed is :func:`plan_layer`'s with ``cuda_failed``."""
    from .kernels.cuda import selfcheck
    if not selfcheck.enabled():
        return _with_check(plan, "off", ())
    # the dtype the kernels see: under autocast the projection's (float32 inputs only)
    dtype = (call.autocast_dtype if call.autocast_dtype is not None
             and call.dtype == torch.float32 else call.dtype)
    names = []
    for fam in selfcheck.families(plan, variant, highway, dtype):
        why = selfcheck.verdict(device, fam, variant, registry.cuda_kernel)
        if why is not None:
            return cached_plan(call_settings(), call, registry.kernels(), POLICY,
                               (str(device), fam.name, why))
        names.append(fam.name)
    return _with_check(plan, "passed", tuple(names))


@functools.lru_cache(maxsize=512)
def _with_check(plan: Plan, check: str, names: Tuple[str, ...]) -> Plan:
    return dataclasses.replace(plan, check=check, cuda_checked=names)


def check_persistent(plan: Plan, kernel, spec: int, highway: bool, proj: torch.Tensor,
                     w_hh: torch.Tensor) -> None:
    """``ValueError`` naming the reason when ``plan`` asks for the persistent CUDA kernel and
    ``kernel`` (its ``persistent_plan``: the forward, and the backward with
    ``persistent_backward``) says it does not apply to a layer with ``proj`` (T, B, (R+X)·H; only
    its shape, dtype and device are read) and ``w_hh``."""
    if plan.recurrence != "persistent":
        return
    blocks, tile, backward = plan.persistent
    ok, why = kernel.persistent_plan(spec, highway, proj, w_hh, blocks, tile, False)[:2]
    if ok and backward:
        ok, why = kernel.persistent_plan(spec, highway, proj, w_hh, blocks, tile, True)[:2]
        why = f"(its backward, persistent_backward) {why}"
    if not ok:
        raise ValueError(f"cuda_recurrence='persistent': the persistent CUDA kernel does not "
                         f"apply to this layer: {why}; use rnn_ablations.options("
                         "cuda_recurrence='auto') or 'steps' (the step kernel runs every shape)")


def decide(x: torch.Tensor, params, h0: torch.Tensor, c0: torch.Tensor,
           scan_layout: bool = False, needs_grad: Optional[bool] = None, spec: int = 0,
           highway: bool = False, variant=None, reverse=None) -> Plan:
    """How one layer call runs: :func:`describe`, then :func:`plan_layer` under the call's
    settings (:func:`call_settings`), what this process has compiled and :data:`POLICY`; a CUDA
    plan reads the first-use check's verdicts on the call's device for ``variant`` (eagerly;
    a traced graph holds the operators it chose, unchecked); a persistent CUDA recurrence is
    checked against the layer (:func:`check_persistent`, with the variant's kernel ``spec`` and
    ``highway``) outside a traced graph."""
    call = describe(x, params, h0, c0, scan_layout, needs_grad, reverse)
    if call.compiling:
        plan = _plan_of(tuple(call))
    else:  # _plan_of's work, without the round trip through a tuple that a traced graph needs
        plan = cached_plan(call_settings(), call, registry.kernels(), POLICY)
        if plan.warning is not None:
            registry.warn_once(plan, stacklevel=5)  # one frame fewer than from _plan_of
    if plan.path == "cuda" and variant is not None and not call.compiling:
        plan = _cuda_checked(plan, call, variant, highway, x.device)
    if plan.recurrence == "persistent" and not call.compiling:
        w_ih, w_hh = params[0][0], params[0][1]
        dtype = (call.autocast_dtype if call.autocast_dtype is not None
                 and x.dtype != torch.float64 else x.dtype)
        # the projection's shape, dtype and device, without its memory
        proj = torch.empty((), device=x.device, dtype=dtype).expand(
            x.shape[0], x.shape[1], w_ih.shape[0])
        check_persistent(plan, registry.cuda_kernel(), spec, highway, proj, w_hh.to(dtype))
    return plan
