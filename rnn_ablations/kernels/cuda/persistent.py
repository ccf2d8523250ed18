"""The persistent kernels' host side (``persistent_forward`` / ``persistent_backward``
programs, ``csrc/cuda/persistent_kernel.cuh``): the launch plan of a call (:func:`make_plan`,
:func:`persistent_plan`: grid, units per block, rows per tile, shared memory, or why the kernel
does not apply) and the calls, one cooperative launch per 1024 steps."""
from __future__ import annotations

import dataclasses
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from . import common as C
from . import driver, structs

__all__ = ["Plan", "make_plan", "persistent_plan", "persistent_forward", "persistent_backward"]

_P_THREADS = 512  # persistent_kernel.cuh kThreads
_MAX_ROWS = 65535  # persistent_kernel.cuh kMaxRows


@dataclasses.dataclass
class Plan:
    """The launch configuration of one persistent call, or why there is none."""
    ok: bool = False
    why: str = ""
    blocks: int = 0
    units: int = 0
    batch_tile: int = 0
    smem: int = 0


def _align16(n: int) -> int:
    return (n + 15) // 16 * 16


def _smem_bytes(backward: bool, R: int, U: int, H: int, bt: int, elem: int, acc: int) -> int:
    """Dynamic shared memory of a block.  Forward: the W_hh slice (R*U rows of H, storage
    dtype), the staged h_{t-1} (bt rows of H, acc_t) and the pre-activations (bt rows of R*U,
    acc_t).  Backward: the W_hh columns of the block's units (U columns of R*H), the staged
    d_proj_t (bt rows of R*H, acc_t) and dh_{t-1} of the block's units (bt rows of U, acc_t)."""
    w = _align16(R * U * H * elem)
    return (w + bt * R * H * acc + bt * U * acc) if backward else \
        (w + bt * H * acc + bt * R * U * acc)


def _device_props(device: int) -> Tuple[int, int, int, str]:
    """(cooperative launch, SMs, opt-in shared memory per block, name)."""
    return (driver.device_attribute(driver.ATTR_COOPERATIVE_LAUNCH, device),
            driver.device_attribute(driver.ATTR_MULTIPROCESSOR_COUNT, device),
            driver.device_attribute(driver.ATTR_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, device),
            torch.cuda.get_device_name(device) if C.device_type() == "cuda"
            else f"{C.device_type()} stand-in device {device}")


_props = {}


def make_plan(backward: bool, ks, H: int, rows: int, dtype: torch.dtype, device: int,
              blocks: int, batch_tile: int) -> Tuple[Plan, Optional[driver.Kernel]]:
    """rows: the most rows active at a step; blocks / batch_tile: 0 = automatic (one block per
    SM; as many rows per tile as the shared memory holds), else forced."""
    p = Plan()
    if dtype not in (torch.float32, torch.bfloat16, torch.float16):
        p.why = (f"the persistent kernel runs float32, bfloat16 and float16, not "
                 f"{C.NAMES.get(dtype, str(dtype))} (the step kernel runs it)")
        return p, None
    if rows > _MAX_ROWS:
        p.why = f"batch {rows} > {_MAX_ROWS} rows (the per-step row counts are uint16)"
        return p, None
    if blocks < 0 or batch_tile < 0:
        p.why = "blocks and batch_tile must be >= 0 (0 = automatic)"
        return p, None
    props = _props.get(device)
    if props is None:
        props = _props[device] = _device_props(device)
    coop, sms, limit, name = props
    if not coop:
        p.why = f"device {name} does not support cooperative launches"
        return p, None
    want = min(blocks, H) if blocks > 0 else min(sms, H)
    U = (H + want - 1) // want
    nb = (H + U - 1) // U
    elem = torch.empty(0, dtype=dtype).element_size()
    R = int(ks.R)
    w_bytes = _smem_bytes(backward, R, U, H, 0, elem, 4)
    row_bytes = _smem_bytes(backward, R, U, H, 1, elem, 4) - w_bytes
    if w_bytes + row_bytes > limit:
        p.why = (f"the W_hh slice of one block ({R} gate blocks x {U} units x H = {H}, "
                 f"{w_bytes // 1024} KiB) and one batch row do not fit in the {limit // 1024} KiB "
                 f"of shared memory of a block on {name}")
        return p, None
    bt = (limit - w_bytes) // row_bytes
    bt = max(1, min(bt, max(rows, 1)))
    if batch_tile > 0:
        bt = min(bt, batch_tile)
    smem = _smem_bytes(backward, R, U, H, bt, elem, 4)
    k = driver.kernel(C.program("persistent_backward" if backward else "persistent_forward",
                                dtype, "rnn_ablations persistent CUDA kernel"), device)
    k.allow_shared_memory(limit)
    per_sm = k.resident_blocks_per_sm(_P_THREADS, smem)
    if per_sm < 1 or nb > per_sm * sms:
        p.why = (f"{nb} blocks of {_P_THREADS} threads with {smem // 1024} KiB of shared memory "
                 f"cannot all be resident ({per_sm} per SM, {sms} SMs)")
        return p, None
    p.ok, p.blocks, p.units, p.batch_tile, p.smem = True, nb, U, bt, smem
    return p, k


def persistent_plan(spec, highway, proj, w_hh, blocks, batch_tile, backward):
    """(applicable, reason, blocks, units per block, batch rows per tile, shared memory bytes)
    of the persistent forward (or, with ``backward``, backward) kernel for a call with these
    tensors (proj (T, B, (R+X)*H), w_hh (R*H, H) on CUDA)."""
    who = "rnn_ablations persistent CUDA kernel"
    if not (C.on_device(proj) and C.on_device(w_hh) and proj.dim() == 3):
        raise RuntimeError(f"{who}: proj (T, B, (R+X)*H) and w_hh must be CUDA tensors")
    H = C.check_w_hh(w_hh, who)
    R = w_hh.size(0) // H
    if proj.size(2) % H or proj.size(2) < R * H:
        raise RuntimeError(f"{who}: proj width must be (R+X)*H")
    ks = structs.check_kernel_spec(spec, highway, R, proj.size(2) // H - R, who)
    with C.device_guard(proj.device):
        p, _ = make_plan(bool(backward), ks, H, proj.size(1), proj.dtype, proj.device.index,
                         int(blocks), int(batch_tile))
    return (p.ok, p.why, p.blocks, p.units, p.batch_tile, p.smem)


def _active_steps(bs: List[int]) -> int:
    steps = 0
    while steps < len(bs) and bs[steps] > 0:
        steps += 1
    return steps


def persistent_forward(spec, highway, proj, w_hh, h0, c0, batch_sizes, rec_mask, keep_hin,
                       blocks, batch_tile) -> List[Tensor]:
    """As :func:`.step.plain_forward`: [out, h_n, c_n, gates, cs, hin]; gates (acc_t) only with keep_hin
    (else empty); hin with highway and keep_hin, else empty."""
    who = "rnn_ablations persistent CUDA kernel"
    bs, H, T, B, P, R, X, ks, has_mask = C.forward_inputs(spec, highway, proj, w_hh, h0, c0,
                                                          batch_sizes, rec_mask, who)
    steps = _active_steps(bs)
    dev = proj.device
    acc = C.acc_dtype(proj.dtype)
    with C.device_guard(dev):
        p, k = make_plan(False, ks, H, bs[0] if steps > 0 else 0, proj.dtype, dev.index,
                         int(blocks), int(batch_tile))
        if not p.ok:
            raise RuntimeError(f"{who} does not apply: {p.why} (rnn_ablations."
                               "set_cuda_recurrence('steps') runs the step kernel)")
        if H > C.INT32_MAX // (R + X) or B * H > C.INT32_MAX:
            raise RuntimeError(f"{who}: shape too large")
        c0a = c0.to(acc)
        out = torch.zeros(T, B, H, dtype=proj.dtype, device=dev)
        cs = torch.zeros(T, B, H, dtype=acc, device=dev)
        gates = (torch.zeros(T, B, R * H, dtype=acc, device=dev) if keep_hin
                 else torch.empty(0, dtype=acc, device=dev))
        hin = (torch.zeros(T, B, H, dtype=acc, device=dev) if highway and keep_hin
               else torch.empty(0, dtype=acc, device=dev))
        h_n = h0.clone()
        c_n = c0.clone() if ks.memory else h0.clone()  # c_n = h_n without memory
        launches = (steps + structs.CHUNK_STEPS - 1) // structs.CHUNK_STEPS
        barrier = torch.zeros(max(1, launches), dtype=torch.int32, device=dev)
        a = structs.PersistentArgs()
        a.ks = ks
        a.H, a.B, a.P, a.U, a.bt = H, B, P, p.units, p.batch_tile
        a.proj, a.w_hh, a.h0, a.c0 = proj.data_ptr(), w_hh.data_ptr(), h0.data_ptr(), c0a.data_ptr()
        a.mask = rec_mask.data_ptr() if has_mask else None
        a.out, a.cs = out.data_ptr(), cs.data_ptr()
        a.gates = gates.data_ptr() if keep_hin else None
        a.hin = hin.data_ptr() if hin.numel() > 0 else None
        a.h_n, a.c_n = h_n.data_ptr(), c_n.data_ptr()
        go = driver.launcher(k, cooperative=True)
        for i, t0 in enumerate(range(0, steps, structs.CHUNK_STEPS)):
            length = min(structs.CHUNK_STEPS, steps - t0)
            a.t0, a.steps = t0, length
            a.n_after = bs[t0 + length] if t0 + length < T else 0
            a.n[0:length] = bs[t0:t0 + length]
            a.barrier = barrier[i].data_ptr()
            go(C.pack("persistent_forward", proj.dtype, a=a), p.blocks, _P_THREADS, p.smem)
    return [out, h_n, c_n, gates, cs, hin]


def persistent_backward(spec, highway, grad_out, grad_hn, grad_cn, gates, cs, hin, out, proj,
                        w_hh, h0, c0, batch_sizes, rec_mask, blocks, batch_tile) -> List[Tensor]:
    """As :func:`.step.plain_backward`: [d_proj, d_w_hh, d_h0, d_c0], the recurrence in one persistent
    launch per 1024 steps; the weight gradient one GEMM after it."""
    who = "rnn_ablations persistent CUDA kernel (backward)"
    ks, bs, H, T, B, P, R = C.backward_inputs(spec, highway, grad_out, grad_hn, grad_cn, cs, hin,
                                              out, proj, w_hh, h0, c0, batch_sizes, rec_mask, who)
    acc = C.acc_dtype(proj.dtype)
    if not (gates.dtype == acc and gates.is_contiguous() and C.on_device(gates)
            and gates.dim() == 3
            and tuple(gates.shape) == (T, B, R * H)):
        raise RuntimeError(f"{who}: gates must be the contiguous {acc} (T, B, R*H) tensor the "
                           "forward returned with keep_hin=True")
    if not (cs.dtype == acc and C.on_device(cs)):
        raise RuntimeError(f"{who}: cs must be the forward's {acc} tensor")
    if highway and not (hin.dtype == acc and hin.numel() == T * B * H):
        raise RuntimeError(f"{who}: hin must be the {acc} tensor returned by the forward "
                           "(keep_hin=True)")
    has_mask = C.mask_given(rec_mask)
    steps = _active_steps(bs)
    dev = proj.device
    with C.device_guard(dev):
        p, k = make_plan(True, ks, H, bs[0] if steps > 0 else 0, proj.dtype, dev.index,
                         int(blocks), int(batch_tile))
        if not p.ok:
            raise RuntimeError(f"{who} does not apply: {p.why} (rnn_ablations.options("
                               "persistent_backward=False) runs the step kernel's backward)")
        if R * H > C.INT32_MAX or B * H > C.INT32_MAX:
            raise RuntimeError(f"{who}: shape too large")
        grad_out = grad_out.to(proj.dtype).contiguous()
        dproj = torch.zeros_like(proj)
        dh = grad_hn.to(acc, copy=True).contiguous()
        dc = grad_cn.to(acc, copy=True).contiguous()
        c0a = c0.to(acc).contiguous()
        if not ks.memory:
            dh.add_(dc)  # c_n is a copy of h_n for a cell without memory
        launches = (steps + structs.CHUNK_STEPS - 1) // structs.CHUNK_STEPS
        barrier = torch.zeros(max(1, launches), dtype=torch.int32, device=dev)
        a = structs.PersistentBackwardArgs()
        a.ks = ks
        a.H, a.B, a.P, a.U, a.bt = H, B, P, p.units, p.batch_tile
        a.proj, a.w_hh, a.gates, a.cs = (proj.data_ptr(), w_hh.data_ptr(), gates.data_ptr(),
                                         cs.data_ptr())
        a.c0 = c0a.data_ptr()
        a.hin = hin.data_ptr() if highway else None
        a.g_out = grad_out.data_ptr()
        a.mask = rec_mask.data_ptr() if has_mask else None
        a.dproj, a.dh, a.dc = dproj.data_ptr(), dh.data_ptr(), dc.data_ptr()
        go = driver.launcher(k, cooperative=True)
        for i, hi in enumerate(range(steps - 1, -1, -structs.CHUNK_STEPS)):
            length = min(structs.CHUNK_STEPS, hi + 1)
            a.t_hi, a.steps = hi, length
            a.n[0:length] = [bs[hi - s] for s in range(length)]
            a.barrier = barrier[i].data_ptr()
            go(C.pack("persistent_backward", proj.dtype, a=a), p.blocks, _P_THREADS, p.smem)
        dw = torch.mm(dproj.view(T * B, P)[:, :R * H].t(),
                      C.previous_hidden(out, h0, rec_mask, has_mask, 0, T))
        if not ks.memory:
            dc.zero_()
    return [dproj, dw, dh.to(proj.dtype), dc.to(proj.dtype)]
