"""Realistic bugs planted one at a time in the CUDA kernels (device sources or host loops), and
which test of the emulation suite catches each: the mutation table.

Each :class:`Mutation` names its file (a device source under ``csrc``, or a host module of
``rnn_ablations.kernels.cuda``), the text it replaces, the class of bug, and the checks to try
in order (each one a test of ``tests/cuda_emulation`` called as pytest would, on a device built
from the mutated sources).  A mutation that only a GPU can show (memory ordering, the L2 load,
the PTX rounding mode of float16) is marked ``hardware`` with the loan's check that covers it.

Every mutation runs in a child process (a planted bug may crash or corrupt the process):

    cd tests && python -m cuda_emulation.mutations                # all; writes the table
    cd tests && python -m cuda_emulation.mutations --one NAME     # one; prints a JSON line

The table goes to ``benchmarks/results/cuda_emulation_mutations.md`` (machine, command, each
mutation with the test that caught it, the first-use check's verdict on the mutated kernels).
``test_cuda_emulation_mutations.py::test_each_planted_bug_is_caught`` (slow) runs them as tests.
"""
from __future__ import annotations

import dataclasses
import importlib.abc
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Callable, Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
RESULT = os.path.join(ROOT, "benchmarks", "results", "cuda_emulation_mutations.md")
RESULTS_JSON = os.path.join(ROOT, "benchmarks", "results", "cuda_emulation_mutations.json")
CHILD_TIMEOUT_S = 300
WATCHDOG_S = 5


@dataclasses.dataclass(frozen=True)
class Mutation:
    name: str
    kind: str                         # the class of bug
    path: str                         # "csrc/<file>" or "host/<module>.py" (kernels/cuda)
    edits: Tuple[Tuple[str, str], ...]  # (old, new), applied in order, each old exactly once
    checks: Tuple[str, ...]           # CHECKS to try, in order
    what: str                         # one line: the bug
    family: Optional[Tuple[str, str, bool]] = None  # first-use check: (kind, variant, highway)
    hardware: str = ""                # not visible in the emulation: the loan's check that is
    equivalent: str = ""              # not a bug after all: why the kernel stays correct

    @property
    def device(self) -> bool:
        return self.path.startswith("csrc/")


def M(name, kind, path, old, new, checks, what, family=None, hardware="", more=(),
      equivalent=""):
    return Mutation(name, kind, path, ((old, new),) + tuple(more), tuple(checks), what, family,
                    hardware, equivalent)


FWD, BWD, STEP, SCAN = ("csrc/cuda/forward_element.cuh", "csrc/cuda/backward_element.cuh",
                        "csrc/cuda/step_kernel.cuh", "csrc/cuda/scan_kernel.cuh")
PERS, TYPES, ARGS = ("csrc/cuda/persistent_kernel.cuh", "csrc/cuda/device_types.cuh",
                     "csrc/cuda/kernel_args.cuh")
ACC_ZERO = ("    A acc[kTileRows][kTileBatch];\n#pragma unroll\n    for (int x = 0; x < kTileRows; ++x)\n"
            "#pragma unroll\n      for (int y = 0; y < kTileBatch; ++y) acc[x][y] = A(0);\n")
TILE_LOOP = "  for (int tile = warp; tile < tiles; tile += kWarps) {\n"
ACC_HOISTED = ("  A acc[kTileRows][kTileBatch];\n#pragma unroll\n  for (int x = 0; x < kTileRows; ++x)\n"
               "#pragma unroll\n    for (int y = 0; y < kTileBatch; ++y) acc[x][y] = A(0);\n")
GPU = "benchmarks/gpu_in_use.py and tests/kernels/test_cuda.py on a loan (benchmarks/gpu_loan.sh)"

MUTATIONS: List[Mutation] = [
    # ---- the element-wise rules of one variant, forward and backward
    M("ran_content_rule", "gate rule of one variant", FWD,
      "    content = static_cast<A>(xo[ks.content_block * xs]);",
      "    content = tanh(static_cast<A>(xo[ks.content_block * xs]));",
      ["step_real_shape[ran]"], "tanh applied to a content that reads x_t (ran, identity_ran)",
      family=("step", "ran", False)),
    M("srnn_content_grad", "gradient (one variant)", BWD,
      "dab[k] = static_cast<T>(ks.content_tanh ? content_output_grad<true, A>(gh, hv)",
      "dab[k] = static_cast<T>(ks.content_tanh ? content_output_grad<false, A>(gh, hv)",
      ["step_real_shape[srnn]"], "the S-RNN content's gradient without tanh's derivative",
      family=("step", "srnn", False)),
    M("input_forget_grads_swapped", "gradient", BWD,
      "  dab[j] = static_cast<T>(d_i);\n  dab[H + j] = static_cast<T>(d_f);",
      "  dab[j] = static_cast<T>(d_f);\n  dab[H + j] = static_cast<T>(d_i);",
      ["step_real_shape[lstm]"], "d_i and d_f written to each other's block",
      family=("step", "lstm", False)),
    M("highway_gate_grad_sign", "gradient", BWD,
      "    dab[(R - 1) * H + j] = static_cast<T>(d_r);",
      "    dab[(R - 1) * H + j] = static_cast<T>(-d_r);",
      ["step_real_shape[lstm]"], "the highway gate's gradient negated",
      family=("step", "lstm", True)),
    M("carried_dc_dropped", "gradient", STEP,
      "  if (ks.memory) dc[b * H + j] = dc_prev;",
      "",
      ["step_real_shape[lstm]"], "dL/dc_{t-1} not carried to the previous step",
      family=("step", "lstm", False)),
    M("g_out_dropped", "gradient", STEP,
      "  const A gh = dh[b * H + j] + static_cast<A>(g_out[b * H + j]);",
      "  const A gh = dh[b * H + j];",
      ["step_real_shape[lstm]"], "the step backward ignores dL/dout_t",
      family=("step", "lstm", False)),
    M("step_bound_off_by_one", "grid sizing", STEP,
      "  if (idx >= n * H) return;\n  const int64_t b = idx / H, j = idx % H;\n  A c, h_pre;",
      "  if (idx >= n * H - 1) return;\n  const int64_t b = idx / H, j = idx % H;\n  A c, h_pre;",
      ["step_real_shape[lstm]"], "the forward's last element of a step never computed",
      family=("step", "lstm", False)),
    # ---- the scan: indices, strides, the rule shared with the CPU scan
    M("scan_strides_swapped", "scan index/stride", SCAN,
      "    const scalar_t* p = proj + t * z.p_st + b * z.p_sb + base;\n    const int64_t o =",
      "    const scalar_t* p = proj + t * z.p_sb + b * z.p_st + base;\n    const int64_t o =",
      ["scan_generic[o_tanh]"], "the forward reads proj with its time and row strides swapped",
      family=("scan", "lstm_minus_srnn_minus_hidden", False)),
    M("scan_reverse_over_T", "host/device time index (reversed, padded rows)", SCAN,
      "    const int64_t t = position(d, s, steps);\n    const scalar_t* p",
      "    const int64_t t = position(d, s, n.T);\n    const scalar_t* p",
      ["scan_generic[o_tanh]"], "direction 1 reversed over T instead of the row's length",
      family=("scan", "lstm_minus_srnn_minus_hidden", False)),
    M("scan_g_out_strides", "scan index/stride", SCAN,
      "g_out[t * z.g_st + b * z.g_sb + d * H + j]",
      "g_out[t * z.o_st + b * z.o_sb + d * H + j]",
      ["scan_generic[o_tanh]"], "dL/dout read with out's strides (differ for a batch-major call)",
      family=("scan", "lstm_minus_srnn_minus_hidden", False)),
    M("scan_c_prev_index", "scan index/stride", SCAN,
      "const acc_t cp = s > 0 ? cs[position(d, s - 1, steps) * z.o_st",
      "const acc_t cp = s > 0 ? cs[position(d, s, steps) * z.o_st",
      ["scan_generic[o_tanh]"], "the backward reads c_t where c_{t-1} is meant",
      family=("scan", "lstm_minus_srnn_minus_hidden", False)),
    M("scan_highway_rule", "gate rule (shared with the CPU scan)", "csrc/common/elementwise.h",
      "if constexpr (HW) h = highway_mix<T>(Act::sigmoid(pre(kScanR)), h, pre(kScanHw));",
      "if constexpr (HW) h = highway_mix<T>(Act::sigmoid(pre(kScanR)), pre(kScanHw), h);",
      ["scan_generic[o_tanh,highway]"],
      "the scan's highway mix with h and the highway input swapped (elementwise.h: the CPU "
      "scan compiles it too)", family=("scan", "lstm_minus_srnn_minus_hidden", True)),
    # ---- the persistent kernels: every __syncthreads, the grid barriers, the tiles
    M("fwd_sync_after_w_load", "__syncthreads", PERS,
      "    ws[i] = j0 + u < H ? a.w_hh[(static_cast<int64_t>(r) * H + j0 + u) * H + k] : T(0);\n"
      "  }\n  __syncthreads();\n",
      "    ws[i] = j0 + u < H ? a.w_hh[(static_cast<int64_t>(r) * H + j0 + u) * H + k] : T(0);\n"
      "  }\n",
      ["persistent_default[lstm]"], "forward: no barrier after the W_hh slice is loaded",
      family=("persistent", "lstm", False),
      equivalent="the barrier after the first staging of h_{t-1} orders the W_hh writes before "
                 "any read of them"),
    M("fwd_sync_after_staging", "__syncthreads", PERS,
      "        hs[i] = v;\n      }\n      __syncthreads();\n",
      "        hs[i] = v;\n      }\n",
      ["persistent_default[lstm]"], "forward: no barrier after h_{t-1} is staged",
      family=("persistent", "lstm", False)),
    M("fwd_sync_after_products", "__syncthreads", PERS,
      "      block_tile_products<T, A>(ws, RU, H, hs, bn, pre, warp, lane);\n      __syncthreads();\n",
      "      block_tile_products<T, A>(ws, RU, H, hs, bn, pre, warp, lane);\n",
      ["persistent_default[lstm]"], "forward: no barrier between the products and the "
      "element-wise step", family=("persistent", "lstm", False)),
    M("fwd_sync_between_tiles", "row-tile race (__syncthreads)", PERS,
      "      __syncthreads();  // hs and pre are reused by the next tile of rows\n", "",
      ["persistent_default[lstm]", "persistent_row_tiles"],
      "forward: the next tile of rows overwrites hs / pre while this one reads them",
      family=("persistent", "lstm", False),
      equivalent="the element-wise step reads pre and proj, not hs; the next tile writes pre "
                 "only after its staging barrier, which every thread reaches after its "
                 "element-wise step"),
    M("bwd_sync_after_staging", "__syncthreads", PERS,
      "        ds[i] = static_cast<A>(load_cg(a.dproj + (t * B + cb + bl) * P + q));\n      }\n"
      "      __syncthreads();\n",
      "        ds[i] = static_cast<A>(load_cg(a.dproj + (t * B + cb + bl) * P + q));\n      }\n",
      ["persistent_default[lstm]"], "backward: no barrier after d_proj_t is staged",
      family=("persistent_backward", "lstm", False)),
    M("bwd_sync_after_products", "__syncthreads", PERS,
      "      block_tile_products<T, A>(wc, U, RH, ds, bn, sums, warp, lane);\n      __syncthreads();\n",
      "      block_tile_products<T, A>(wc, U, RH, ds, bn, sums, warp, lane);\n",
      ["persistent_default[lstm]"], "backward: no barrier between the products and dh",
      family=("persistent_backward", "lstm", False)),
    M("bwd_sync_between_tiles", "row-tile race (__syncthreads)", PERS,
      "      __syncthreads();  // ds and sums are reused by the next tile of rows\n", "",
      ["persistent_default[lstm]", "persistent_row_tiles"],
      "backward: the next tile of rows overwrites ds / sums while this one reads them",
      family=("persistent_backward", "lstm", False),
      equivalent="the dh step reads sums, not ds; the next tile writes sums only after its "
                 "staging barrier, which every thread reaches after its dh step"),
    M("fwd_grid_barrier_removed", "grid barrier", PERS,
      "    if (s + 1 < a.steps) grid_barrier(a.barrier, arrivals);", "",
      ["persistent_16_sms", "persistent_default[lstm]"],
      "forward: no grid barrier between steps (a block reads h_{t-1} before it is written)",
      family=("persistent", "lstm", False)),
    M("bwd_grid_barrier_removed", "grid barrier", PERS,
      "    grid_barrier(a.barrier, arrivals);  // d_proj_t of every unit written", "",
      ["persistent_16_sms", "persistent_default[lstm]"],
      "backward: no grid barrier before dh_{t-1} reads every unit's d_proj_t",
      family=("persistent_backward", "lstm", False)),
    M("grid_barrier_miscount", "grid barrier", PERS,
      "    target += gridDim.x;\n", "    target += gridDim.x + 1;\n",
      ["persistent_default[lstm]"],
      "the barrier waits for one arrival more than the grid has (a hang on a GPU)",
      family=("persistent", "lstm", False)),
    M("accumulators_per_warp", "per-tile accumulators", PERS, ACC_ZERO, "",
      ["persistent_16_sms"], "a warp's accumulators zeroed once, not per output tile",
      family=("persistent", "lstm", False), more=((TILE_LOOP, ACC_HOISTED + TILE_LOOP),)),
    # ---- the structs on both sides, the 16-bit conversions
    M("struct_order_device", "struct field order (device)", ARGS,
      "  T* h_n;                  // (B, H), initialised to h0\n"
      "  T* c_n;                  // (B, H), initialised to c0 (to h0 without memory)\n",
      "  T* c_n;                  // (B, H), initialised to c0 (to h0 without memory)\n"
      "  T* h_n;                  // (B, H), initialised to h0\n",
      ["persistent_default[lstm]"], "PersistentArgs: h_n and c_n in the other order on the device",
      family=("persistent", "lstm", False)),
    M("struct_order_host", "struct field order (host)", "host/structs.py",
      '"proj", "w_hh", "h0", "c0", "mask", "out", "cs", "gates", "hin", "h_n", "c_n",',
      '"proj", "w_hh", "h0", "c0", "mask", "out", "cs", "gates", "hin", "c_n", "h_n",',
      ["persistent_default[lstm]"], "PersistentArgs: h_n and c_n in the other order on the host",
      family=("persistent", "lstm", False)),
    M("bf16_ties_away", "16-bit conversion", TYPES,
      "      const uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);",
      "      const uint32_t rounding = 0x8000u;",
      ["conversions[bfloat16]"], "bfloat16 rounds ties away from zero, not to even"),
    # ---- the host loops: grid sizing, time indices of reversed and padded rows
    M("host_grid_by_rows", "grid sizing (host)", "host/step.py",
      "            go(params, C.blocks_for(n * H), C.THREADS)\n        h_n, c_n",
      "            go(params, C.blocks_for(n), C.THREADS)\n        h_n, c_n",
      ["step_real_shape[lstm]"], "the forward's grid sized by rows n instead of n*H elements",
      family=("step", "lstm", False)),
    M("host_backward_row_counts", "host time index (reversed rows)", "host/persistent.py",
      "a.n[0:length] = [bs[hi - s] for s in range(length)]",
      "a.n[0:length] = [bs[s] for s in range(length)]",
      ["persistent_default[lstm]"], "the persistent backward's row counts in forward order",
      family=("persistent_backward", "lstm", False)),
    M("host_backward_c_prev", "host time index", "host/step.py",
      "                a_cp.value = p_c0 if t == 0 else p_cs + (t - 1) * B * H * ea",
      "                a_cp.value = p_c0 if t == 0 else p_cs + t * B * H * ea",
      ["step_real_shape[lstm]"], "the step backward reads c_t where c_{t-1} is meant",
      family=("step", "lstm", False)),
    M("host_scan_lengths", "host time index (padded rows)", "host/scan.py",
      "if B == 0 or T == 0 or bs[-1] == B:", "if B == 0 or T == 0 or bs[0] == B:",
      ["scan_generic[o_tanh]"], "padded rows run as if every row had all T steps",
      family=("scan", "lstm_minus_srnn_minus_hidden", False)),
    # ---- what only a GPU shows
    M("no_release_fence", "memory fence", PERS,
      "    __threadfence();  // this block's writes, before its arrival\n", "",
      ["persistent_16_sms"], "the grid barrier's release fence removed",
      hardware=GPU),
    M("plain_load_for_ldcg", "__ldcg", TYPES,
      "template <typename T> __device__ __forceinline__ T load_cg(const T* p) { return __ldcg(p); }",
      "template <typename T> __device__ __forceinline__ T load_cg(const T* p) { return *p; }",
      ["persistent_16_sms"], "h_{t-1} written by other blocks read through L1", hardware=GPU),
    M("fp16_round_toward_zero", "16-bit conversion (PTX)", TYPES,
      'asm("cvt.rn.f16.f32 %0, %1;" : "=h"(x) : "f"(f));',
      'asm("cvt.rz.f16.f32 %0, %1;" : "=h"(x) : "f"(f));',
      ["conversions[float16]"], "float16 conversion rounds toward zero (the PTX instruction)",
      hardware="benchmarks/gpu_in_use.py's bit-exact float16/bfloat16 conversion check on a loan"),
]

BY_NAME = {m.name: m for m in MUTATIONS}
assert len(BY_NAME) == len(MUTATIONS)


# ------------------------------------------------------------------------------ the checks
def _checks() -> Dict[str, Tuple[str, Callable]]:
    """name -> (the pytest test it runs, a callable of the installed device)."""
    import torch
    from . import test_cuda_emulation as base
    from . import test_cuda_emulation_shapes as shapes
    out = {}
    for v in base.STEP_VARIANTS:
        out[f"step_real_shape[{v}]"] = (
            f"test_cuda_emulation_shapes.py::test_step_kernel_at_real_shapes[{v}-64]",
            lambda dev, v=v: shapes.test_step_kernel_at_real_shapes(dev, v, 64))
    out["persistent_default[lstm]"] = (
        "test_cuda_emulation.py::test_persistent_kernels_equal_generic[lstm-True]",
        lambda dev: base.test_persistent_kernels_equal_generic(dev, "lstm", True))
    out["persistent_16_sms"] = ("test_cuda_emulation_shapes.py::test_persistent_on_16_sms",
                                lambda dev: shapes.test_persistent_on_16_sms(dev))
    out["persistent_row_tiles"] = (
        "test_cuda_emulation_shapes.py::test_persistent_unpadded_row_tiles",
        lambda dev: shapes.test_persistent_unpadded_row_tiles(dev))
    for rule, hw, tag in ((1, False, "o_tanh"), (1, True, "o_tanh,highway")):
        out[f"scan_generic[{tag}]"] = (
            f"test_cuda_emulation_shapes.py::test_scan_against_the_generic_path[{rule}-{hw}]",
            lambda dev, rule=rule, hw=hw: shapes.test_scan_against_the_generic_path(dev, rule, hw))
    for dt, name in ((torch.bfloat16, "bfloat16"), (torch.float16, "float16")):
        out[f"conversions[{name}]"] = (
            f"test_cuda_emulation.py::test_16_bit_conversions_are_torchs[{name}]",
            lambda dev, dt=dt: base.test_16_bit_conversions_are_torchs(dev, dt))
    return out


_SMALL = {"persistent_16_sms"}  # checks that run on the 16-SM profile


# ------------------------------------------------------------------------------ one mutation
class _MutatedHost(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports one module of rnn_ablations.kernels.cuda from mutated source."""

    def __init__(self, fullname: str, path: str, text: str):
        self.fullname, self.path, self.text = fullname, path, text

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.fullname:
            return None
        return importlib.util.spec_from_file_location(fullname, self.path, loader=self)

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        exec(compile(self.text, self.path, "exec"), module.__dict__)


def _apply(text: str, m: Mutation, where: str) -> str:
    for old, new in m.edits:
        n = text.count(old)
        if n != 1:
            raise RuntimeError(f"mutation {m.name}: its text occurs {n} times in {where} (not "
                               f"once): update it in tests/cuda_emulation/mutations.py\n{old!r}")
        text = text.replace(old, new, 1)
    return text


def run_one(name: str) -> dict:
    """Plant ``name``, run its checks in order until one fails; -> the result record."""
    m = BY_NAME[name]
    start = time.monotonic()
    tmp = tempfile.mkdtemp(prefix="mutation-")
    try:
        csrc = None
        if m.device:
            pkg = os.path.join(ROOT, "rnn_ablations")
            csrc = os.path.join(tmp, "csrc")
            shutil.copytree(os.path.join(pkg, "csrc"), csrc)
            target = os.path.join(csrc, m.path[len("csrc/"):])
            with open(target) as f:
                text = _apply(f.read(), m, m.path)
            with open(target, "w") as f:
                f.write(text)
        else:
            module = m.path[len("host/"):-len(".py")]
            path = os.path.join(ROOT, "rnn_ablations", "kernels", "cuda", module + ".py")
            with open(path) as f:
                text = _apply(f.read(), m, path)
            sys.meta_path.insert(0, _MutatedHost(f"rnn_ablations.kernels.cuda.{module}", path,
                                                 text))
        import torch
        from rnn_ablations import get_variant
        from rnn_ablations.kernels.cuda import host, programs, selfcheck
        from rnn_ablations.plan import Plan
        from . import emulator
        progs = [p for p in programs.all_programs() if "float32" in p.name]
        checks = _checks()
        caught, error = None, ""
        for check in m.checks:
            test, fn = checks[check]
            device = emulator.EmulatedDevice(csrc=csrc, progs=progs, watchdog_s=WATCHDOG_S,
                                             profile="small" if check in _SMALL else "default")
            try:
                with emulator.installed(device):
                    fn(device)
            except Exception as exc:  # noqa: BLE001 - a failing check is what we look for
                caught = test
                lines = str(exc).strip().splitlines() or ["(no message)"]
                error = f"{type(exc).__name__}: {lines[0][:160]}"
                break
        first_use = None
        if m.family is not None:
            kind, vname, hw = m.family
            v = get_variant(vname)
            if kind == "scan":
                plan = Plan("cuda", "", schedule="scan")
            elif kind == "step":
                plan = Plan("cuda", "", recurrence="steps")
            else:
                plan = Plan("cuda", "", recurrence="persistent",
                            persistent=(0, 0, kind == "persistent_backward"))
            device = emulator.EmulatedDevice(csrc=csrc, progs=progs, watchdog_s=WATCHDOG_S)
            with emulator.installed(device):
                whys = [selfcheck.check_family(f, v, torch.device("cpu"), host)
                        for f in selfcheck.families(plan, v, hw, torch.float32)]
            bad = [w for w in whys if w is not None]
            first_use = bad[0] if bad else None
            first_use = "passes" if first_use is None else "fails: " + first_use[:100]
        return dict(name=m.name, caught=caught, error=error, first_use=first_use,
                    seconds=round(time.monotonic() - start, 1))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run_child(name: str, timeout: float = CHILD_TIMEOUT_S) -> dict:
    """run_one in a child process: a crash or a hang is a result too."""
    start = time.monotonic()
    env = dict(os.environ)
    env["PYTHONPATH"] = HERE.rsplit(os.sep, 1)[0] + os.pathsep + env.get("PYTHONPATH", "")
    try:
        done = subprocess.run([sys.executable, "-m", "cuda_emulation.mutations", "--one", name],
                              cwd=os.path.dirname(HERE), env=env, capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return dict(name=name, caught=None, error=f"no result in {timeout:g} s (a hang)",
                    first_use=None, seconds=round(time.monotonic() - start, 1))
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1][:160]
    return dict(name=name, caught=f"the process (exit {done.returncode})", error=tail,
                first_use=None, seconds=round(time.monotonic() - start, 1))


# ------------------------------------------------------------------------------ the table
def _machine() -> str:
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
        with open("/proc/cpuinfo") as f:
            flags = next((l for l in f if l.startswith("flags")), "")
        isa = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "SSE"
    except OSError:  # pragma: no cover - not Linux
        isa = "?"
    return f"{model} ({isa}), {os.cpu_count()} CPUs"


def table(results: List[dict]) -> str:
    order = {m.name: i for i, m in enumerate(MUTATIONS)}
    results = sorted(results, key=lambda r: order[r["name"]])
    bugs = [r for r in results if not BY_NAME[r["name"]].equivalent]
    emu = [r for r in bugs if not BY_NAME[r["name"]].hardware]
    hw = [r for r in bugs if BY_NAME[r["name"]].hardware]
    eq = [r for r in results if BY_NAME[r["name"]].equivalent]
    caught = sum(1 for r in emu if r["caught"])
    lines = [
        "# CUDA emulation: planted bugs and the tests that catch them", "",
        f"Machine: {_machine()}. Command: `cd tests && python -m cuda_emulation.mutations` "
        "(tests/cuda_emulation/mutations.py: each bug planted alone in a copy of the device "
        "sources or of one host module, in a child process; its checks tried in order, the "
        "first that fails named). First-use check: rnn_ablations.kernels.cuda.selfcheck."
        "check_family on the mutated kernels (float32) for the family the bug is in.", "",
        f"Caught by the emulation suite: **{caught} of {len(emu)}** bugs; {len(hw)} more need a "
        f"GPU (named with the loan's check that covers them); {len(eq)} planted changes turned "
        "out not to be bugs (equivalent: the reason is given) and are not counted.", "",
        "| # | bug | class | file | caught by | how | first-use check | s |",
        "|---|---|---|---|---|---|---|---|"]
    for i, r in enumerate(results, 1):
        m = BY_NAME[r["name"]]
        how = (r["error"] or "").replace("|", "\\|")
        if m.equivalent:
            by = f"equivalent, not a bug: {m.equivalent}" + (
                f" (yet caught: `{r['caught']}`)" if r["caught"] else "")
        elif r["caught"]:
            by = f"`{r['caught']}`"
        else:
            by = (f"not in the emulation (needs a GPU): {m.hardware}" if m.hardware
                  else "**missed**")
        first = (r["first_use"] or "n/a").replace("|", "\\|")
        lines.append(f"| {i} | {m.what} (`{m.name}`) | {m.kind} | `{m.path}` | {by} | {how} | "
                     f"{first} | {r['seconds']} |")
    return "\n".join(lines) + "\n"


def main(argv: List[str]) -> int:
    """No arguments: every mutation, the table written; names: those again, merged into the
    saved results (RESULTS_JSON) and the table written from them."""
    if argv[:1] == ["--one"]:
        try:
            print(json.dumps(run_one(argv[1])))
        except Exception:  # noqa: BLE001 - the harness failed, not the check
            traceback.print_exc()
            return 2
        return 0
    unknown = [n for n in argv if n not in BY_NAME]
    if unknown:
        print(f"unknown mutation(s) {unknown}; one of {sorted(BY_NAME)}", file=sys.stderr)
        return 2
    saved: Dict[str, dict] = {}
    if argv and os.path.exists(RESULTS_JSON):
        with open(RESULTS_JSON) as f:
            saved = {r["name"]: r for r in json.load(f)}
    for name in argv or [m.name for m in MUTATIONS]:
        r = run_child(name)
        saved[name] = r
        print(f"{name}: {r['caught'] or 'NOT CAUGHT'} ({r['seconds']} s) {r['error']}",
              flush=True)
    results = [saved[m.name] for m in MUTATIONS if m.name in saved]
    os.makedirs(os.path.dirname(RESULT), exist_ok=True)
    with open(RESULTS_JSON, "w") as f:
        json.dump(results, f, indent=1)
    with open(RESULT, "w") as f:
        f.write(table(results))
    print(f"wrote {RESULT} ({len(results)} of {len(MUTATIONS)} mutations)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
