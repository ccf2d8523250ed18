"""The host side of the CUDA kernels: the entry points that the operators' CUDA implementations
call (``forward`` / ``backward``: the step kernel; ``scan_forward`` / ``scan_backward``: the
element-wise scan; ``persistent_forward`` / ``persistent_backward`` / ``persistent_plan``: the
persistent kernels), with the arguments and results of the CPU kernel's entry points
(``csrc/cpu/layer_plain.cpp``, ``csrc/cpu/scan.cpp``; read their headers for the arguments).

The step loop runs here, in Python: per step one cuBLAS GEMM through torch (``addmm`` of the
active rows' h_{t-1} into the step's preallocated fp32 / float64 pre-activations, fp32
accumulation for the half types, torch's math-mode flags) and one launch of the NVRTC-compiled
element-wise kernel (:mod:`.driver`, on torch's current stream); the backward is its mirror (one
element-wise launch, then the GEMM for dL/dh_{t-1}), the weight gradient one GEMM after the loop.
No host synchronisation, no allocation outside torch's caching allocator and no host-to-device
copy but an asynchronous one from pinned memory, so a call can be captured in a CUDA graph
(:mod:`rnn_ablations.kernels.cuda_graphs` replays the whole loop so).  The scan and the persistent
kernels are one launch per call (per 1024 steps for the persistent ones).

Dtypes: float64, float32, bfloat16 and float16; the saved tensors (gates, cs, hin) and the
carried gradients are in the accumulation type (float32 for the half types).
"""
from __future__ import annotations

import ctypes
import dataclasses
from typing import List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from . import driver, structs
from .programs import PARAMS, Program

__all__ = ["plain_forward", "plain_backward", "scan_forward", "scan_backward", "persistent_forward",
           "persistent_backward", "persistent_plan", "SCAN_ABI", "pack"]

#: the scan entry points' calling convention (rnn_ablations.kernels.backend.SCAN_ABI)
SCAN_ABI = 3

#: the device type the entry points take (the CPU tests of the host loops set "cpu", with a
#: recording stand-in for the driver)
DEVICE_TYPE = "cuda"
_THREADS = 256  # element-wise and scan kernels
_P_THREADS = 512  # persistent_kernel.cuh kThreads
_MAX_ROWS = 65535  # persistent_kernel.cuh kMaxRows
_INT32_MAX = 2 ** 31 - 1

_NAMES = {torch.float64: "float64", torch.float32: "float32", torch.bfloat16: "bfloat16",
          torch.float16: "float16"}


def _on_device(t: Tensor) -> bool:
    return t.device.type == DEVICE_TYPE


def _acc(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype


def _ptr(t: Optional[Tensor]) -> ctypes.c_void_p:
    """A pointer argument (a fresh object: a step loop may move it along in place)."""
    return ctypes.c_void_p(t.data_ptr() if t is not None else None)


def _i64(v: int) -> ctypes.c_int64:
    return ctypes.c_int64(int(v))


def _blocks(n: int, threads: int = _THREADS) -> int:
    return max(1, (n + threads - 1) // threads)


def _program(family: str, dtype: torch.dtype, who: str, out=None, highway=None) -> Program:
    name = _NAMES.get(dtype)
    if name is None:
        raise RuntimeError(f"{who}: dtype {dtype} is not supported (float64, float32, bfloat16 "
                           "or float16)")
    return Program(family, name, out, highway)


_STRUCTS = {"KernelSpec": structs.KernelSpec, "ScanSpec": structs.ScanSpec, "Dims": structs.Dims,
            "Strides": structs.Strides, "PersistentArgs": structs.PersistentArgs,
            "PersistentBackwardArgs": structs.PersistentBackwardArgs}


def pack(family: str, dtype: torch.dtype, **args) -> list:
    """The launch arguments of a ``family`` kernel (programs.PARAMS) for storage dtype
    ``dtype``, in the kernel's parameter order, from keyword arguments named as its parameters:
    structs as they are, ``int64`` as c_int64, pointers from tensors (or None: null) whose dtype
    is checked against the parameter's (T: ``dtype``, A: its accumulation type, int64)."""
    params = PARAMS[family]
    names = [n for n, _ in params]
    if sorted(args) != sorted(names):
        raise TypeError(f"{family} kernel: arguments {sorted(args)}, parameters {names}")
    acc = _acc(dtype)
    out = []
    for name, sym in params:
        v = args[name]
        if sym in _STRUCTS:
            if not isinstance(v, _STRUCTS[sym]):
                raise TypeError(f"{family} kernel: {name} must be a {sym}, got {type(v).__name__}")
            out.append(v)
        elif sym == "int64":
            out.append(_i64(v))
        else:
            if v is not None:
                base = sym.replace("const ", "").rstrip("*")
                want = {"T": dtype, "A": acc, "int64": torch.int64}[base]
                if v.dtype != want:
                    raise TypeError(f"{family} kernel: {name} ({sym}) must be {want}, got "
                                    f"{v.dtype}")
            out.append(_ptr(v))
    return out


# ------------------------------------------------------------------------------ input checks
# (common/layer_tensors.h, as the CPU kernel checks them)

def _check_w_hh(w_hh: Tensor, who: str) -> int:
    if not (w_hh.dim() == 2 and w_hh.size(1) > 0 and w_hh.size(0) > 0 and w_hh.is_contiguous()
            and w_hh.size(0) % w_hh.size(1) == 0):
        raise RuntimeError(f"{who}: w_hh must be contiguous (R*H, H) with H > 0, got "
                           f"{list(w_hh.shape)}")
    return w_hh.size(1)


def _check_like(t: Tensor, sizes, like: Tensor, name: str, who: str,
                any_strides: bool = False) -> None:
    if t is None or tuple(t.shape) != tuple(sizes) or not (any_strides or t.is_contiguous()):
        raise RuntimeError(f"{who}: {name} must "
                           f"{'have shape' if any_strides else 'be contiguous with shape'} "
                           f"{list(sizes)}, got {None if t is None else list(t.shape)}")
    if t.dtype != like.dtype or t.device != like.device:
        raise RuntimeError(f"{who}: {name} must have dtype {like.dtype} on {like.device}, got "
                           f"{t.dtype} on {t.device}")


def _check_saved_acc(t: Tensor, out: Tensor, name: str, who: str) -> None:
    acc = _acc(out.dtype)
    if t is None or tuple(t.shape) != tuple(out.shape) or not t.is_contiguous():
        raise RuntimeError(f"{who}: {name} must be contiguous with shape {list(out.shape)}")
    if t.dtype not in (out.dtype, acc) or t.device != out.device:
        raise RuntimeError(f"{who}: {name} must have dtype {out.dtype} or {acc} on {out.device}, "
                           f"got {t.dtype} on {t.device}")


def _batch_sizes(batch_sizes: Tensor, T: int, B: int, who: str) -> List[int]:
    if not (batch_sizes.device.type == "cpu" and batch_sizes.dtype == torch.int64
            and batch_sizes.dim() == 1 and batch_sizes.size(0) == T):
        raise RuntimeError(f"{who}: batch_sizes must be a CPU int64 tensor of length T = {T}")
    bs = batch_sizes.tolist()
    for t, n in enumerate(bs):
        if n < 0 or n > B or (t > 0 and n > bs[t - 1]):
            raise RuntimeError(f"{who}: batch_sizes must be non-increasing and <= B = {B}")
    return bs


def _check_plain_inputs(proj, w_hh, h0, c0, batch_sizes, who) -> List[int]:
    for t in (proj, w_hh, h0, c0):
        if t.device.type != DEVICE_TYPE or t.device != proj.device:
            raise RuntimeError(f"{who}: proj, w_hh, h0, c0 must be on one CUDA device")
        if t.dtype != proj.dtype:
            raise RuntimeError(f"{who}: all tensors must have one dtype")
    if proj.dim() != 3 or not proj.is_contiguous():
        raise RuntimeError(f"{who}: proj must be contiguous (T, B, (R+X)*H)")
    _check_w_hh(w_hh, who)
    if proj.size(2) < w_hh.size(0) or proj.size(2) % w_hh.size(1):
        raise RuntimeError(f"{who}: proj width must be (R+X)*H")
    if not (h0.is_contiguous() and c0.is_contiguous() and h0.dim() == 2
            and h0.size(0) == proj.size(1) and h0.size(1) == w_hh.size(1)
            and c0.shape == h0.shape):
        raise RuntimeError(f"{who}: h0/c0 must be contiguous (B, H)")
    return _batch_sizes(batch_sizes, proj.size(0), proj.size(1), who)


def _check_backward_inputs(spec, highway, grad_out, grad_hn, grad_cn, cs, hin, out, w_hh, h0,
                           c0, batch_sizes, rec_mask, P, who):
    H = _check_w_hh(w_hh, who)
    if not (out.dim() == 3 and out.size(2) == H and out.is_contiguous() and _on_device(out)):
        raise RuntimeError(f"{who}: out must be the forward's contiguous (T, B, H) output on cuda")
    if not (P > 0 and P % H == 0 and P >= w_hh.size(0)):
        raise RuntimeError(f"{who}: the projection width must be (R+X)*H, got {P}")
    ks = structs.check_kernel_spec(spec, highway, w_hh.size(0) // H,
                                   P // H - w_hh.size(0) // H, who)
    T, B = out.size(0), out.size(1)
    _check_like(w_hh, w_hh.shape, out, "w_hh", who)
    _check_like(grad_out, out.shape, out, "grad_out", who, True)
    _check_saved_acc(cs, out, "cs", who)
    _check_like(grad_hn, (B, H), out, "grad_hn", who, True)
    _check_like(grad_cn, (B, H), out, "grad_cn", who, True)
    _check_like(h0, (B, H), out, "h0", who)
    _check_like(c0, (B, H), out, "c0", who)
    if highway:
        _check_saved_acc(hin, out, "hin (highway inputs)", who)
    if rec_mask is not None and rec_mask.numel() > 0:
        _check_like(rec_mask, (B, H), out, "rec_mask", who)
    return ks, _batch_sizes(batch_sizes, T, B, who)


def _has_mask(rec_mask: Optional[Tensor]) -> bool:
    return rec_mask is not None and rec_mask.numel() > 0


def _last_step_rows(seq: Tensor, init: Tensor, bs: Sequence[int]) -> Tensor:
    """Row b of seq (T, B, H) at its last active step, in init's dtype (rows never active keep
    init's row)."""
    last = init.clone()
    T = seq.size(0)
    for t in range(T):
        n, n_next = bs[t], (bs[t + 1] if t + 1 < T else 0)
        if n > n_next:
            last[n_next:n].copy_(seq[t, n_next:n])
    return last


def _final_states(memory: bool, out, cs, h0, c0, bs) -> Tuple[Tensor, Tensor]:
    h_n = _last_step_rows(out, h0, bs)
    return h_n, (_last_step_rows(cs, c0, bs) if memory else h_n.clone())


def _previous_hidden(out, h0, rec_mask, has_mask, t0, length) -> Tensor:
    B, H = h0.shape
    if length == 0:
        return h0.new_zeros(0, H)
    if t0 > 0:
        hp = out[t0 - 1:t0 - 1 + length]
    else:
        hp = torch.cat([h0.unsqueeze(0), out[:length - 1]], 0) if length > 1 else h0.unsqueeze(0)
    if has_mask:
        hp = hp * rec_mask.unsqueeze(0)
    return hp.reshape(length * B, H)


# ------------------------------------------------------------------------------ GEMMs
_dtype_out = {}  # device type -> whether torch's mm/addmm take out_dtype there


def _gemm(dst: Tensor, a: Tensor, b: Tensor, accumulate: bool) -> None:
    """dst (+)= a @ b with a, b in the storage dtype and dst in the accumulation type: cuBLAS
    with fp32 accumulation and an fp32 result for the half types."""
    if dst.dtype == a.dtype:
        if accumulate:
            dst.addmm_(a, b)
        else:
            torch.mm(a, b, out=dst)
        return
    known = _dtype_out.get(dst.device.type)
    if known is not False:
        try:
            if accumulate:
                torch.addmm(dst, a, b, out_dtype=dst.dtype, out=dst)
            else:
                torch.mm(a, b, out_dtype=dst.dtype, out=dst)
            _dtype_out[dst.device.type] = True
            return
        except (RuntimeError, TypeError, NotImplementedError):
            if known:
                raise
            _dtype_out[dst.device.type] = False
    # the products of 16-bit values are exact in fp32: the same sums, in cuBLAS's fp32 GEMM
    prod = torch.mm(a.to(dst.dtype), b.to(dst.dtype))
    if accumulate:
        dst.add_(prod)
    else:
        dst.copy_(prod)


def _forward_inputs(spec, highway, proj, w_hh, h0, c0, batch_sizes, rec_mask, who):
    """The checks and sizes both forward step loops (eager and persistent) start from:
    -> (batch sizes, H, T, B, P, R, X, decoded spec, whether a recurrent mask is given)."""
    bs = _check_plain_inputs(proj, w_hh, h0, c0, batch_sizes, who)
    H, T, B, P = w_hh.size(1), proj.size(0), proj.size(1), proj.size(2)
    R = w_hh.size(0) // H
    X = P // H - R
    ks = structs.check_kernel_spec(spec, highway, R, X, who)
    has_mask = _has_mask(rec_mask)
    if has_mask:
        _check_like(rec_mask, h0.shape, h0, "rec_mask", who)
    return bs, H, T, B, P, R, X, ks, has_mask


def _backward_inputs(spec, highway, grad_out, grad_hn, grad_cn, cs, hin, out, proj, w_hh, h0, c0,
                     batch_sizes, rec_mask, who):
    """The checks and sizes both backward step loops (eager and persistent) start from:
    -> (decoded spec, batch sizes, H, T, B, P, R)."""
    if proj.dim() != 3:
        raise RuntimeError(f"{who}: proj must be (T, B, (R+X)*H)")
    ks, bs = _check_backward_inputs(spec, highway, grad_out, grad_hn, grad_cn, cs, hin, out,
                                    w_hh, h0, c0, batch_sizes, rec_mask, proj.size(2), who)
    _check_like(proj, (out.size(0), out.size(1), proj.size(2)), out, "proj", who)
    H, T, B, P = w_hh.size(1), proj.size(0), proj.size(1), proj.size(2)
    return ks, bs, H, T, B, P, w_hh.size(0) // H


# ------------------------------------------------------------------------------ step kernel
def plain_forward(spec, highway, proj, w_hh, h0, c0, batch_sizes, rec_mask,
                  keep_hin) -> List[Tensor]:
    """-> [out (T,B,H), h_n, c_n, gates (activations), cs (T,B,H), hin], as plain_forward (CPU);
    out, h_n, c_n in the input dtype; gates, cs, hin in the accumulation type."""
    who = "rnn_ablations CUDA kernel"
    bs, H, T, B, P, R, X, ks, has_mask = _forward_inputs(spec, highway, proj, w_hh, h0, c0,
                                                         batch_sizes, rec_mask, who)
    prog = _program("step_forward", proj.dtype, who)
    dev = proj.device
    acc = _acc(proj.dtype)
    with torch.cuda.device(dev):
        k = driver.kernel(prog, dev.index)
        gates = proj[:, :, :R * H].to(acc, copy=True).contiguous()
        c0a = c0.to(acc)
        out = torch.zeros(T, B, H, dtype=proj.dtype, device=dev)
        cs = torch.zeros(T, B, H, dtype=acc, device=dev)
        hin = torch.empty(T, B, H, dtype=acc, device=dev) if highway and keep_hin else None
        hp_buf = torch.empty(B, H, dtype=proj.dtype, device=dev) if has_mask else None
        w_t = w_hh.t()
        # the step's arguments, checked once (pack) and then moved along by pointer arithmetic
        args = pack("step_forward", proj.dtype, ks=ks, n=0, H=H, xo_stride=P, gates=gates,
                    xo=proj if X > 0 else None, c_prev=c0a, c_out=cs, h_out=out, h_pre_out=hin)
        params = driver.params_of(args)
        _, a_n, _, _, a_g, a_xo, a_cp, a_co, a_h, a_hp = args
        es, ea = proj.element_size(), cs.element_size()
        p_g, p_x, p_c0, p_cs = gates.data_ptr(), proj.data_ptr(), c0a.data_ptr(), cs.data_ptr()
        p_out, p_hin = out.data_ptr(), (hin.data_ptr() if hin is not None else None)
        for t in range(T):
            n = bs[t]
            if n <= 0:
                break
            h_prev = h0[:n] if t == 0 else out[t - 1, :n]
            if has_mask:
                h_prev = torch.mul(h_prev, rec_mask[:n], out=hp_buf[:n])
            _gemm(gates[t, :n], h_prev, w_t, accumulate=True)
            a_n.value = n
            a_g.value = p_g + t * B * R * H * ea
            if X > 0:
                a_xo.value = p_x + (t * B * P + R * H) * es
            a_cp.value = p_c0 if t == 0 else p_cs + (t - 1) * B * H * ea
            a_co.value = p_cs + t * B * H * ea
            a_h.value = p_out + t * B * H * es
            if p_hin is not None:
                a_hp.value = p_hin + t * B * H * ea
            driver.launch(k, params, _blocks(n * H), _THREADS)
        h_n, c_n = _final_states(ks.memory, out, cs, h0, c0, bs)
    return [out, h_n, c_n, gates, cs,
            hin if hin is not None else torch.empty(0, dtype=acc, device=dev)]


def plain_backward(spec, highway, grad_out, grad_hn, grad_cn, gates, cs, hin, out, proj, w_hh,
                   h0, c0, batch_sizes, rec_mask) -> List[Tensor]:
    """-> [d_proj, d_w_hh, d_h0, d_c0], as plain_backward (CPU); gates, cs, hin as the forward
    returned them (accumulation type)."""
    who = "rnn_ablations CUDA kernel (backward)"
    ks, bs, H, T, B, P, R = _backward_inputs(spec, highway, grad_out, grad_hn, grad_cn, cs, hin,
                                             out, proj, w_hh, h0, c0, batch_sizes, rec_mask, who)
    X = P // H - R
    if not (gates.dim() == 3 and tuple(gates.shape) == (T, B, R * H)):
        raise RuntimeError(f"{who}: gates must have shape (T, B, R*H) = ({T}, {B}, {R * H})")
    acc = _acc(proj.dtype)
    for t in (gates, cs):
        if t.dtype != acc or not t.is_contiguous() or not _on_device(t):
            raise RuntimeError(f"{who}: gates and cs must be the contiguous {acc} tensors "
                               "returned by the forward")
    if highway and (hin.dtype != acc or hin.numel() != T * B * H):
        raise RuntimeError(f"{who}: hin must be the {acc} tensor returned by the forward "
                           "(keep_hin=True)")
    has_mask = _has_mask(rec_mask)
    prog = _program("step_backward", proj.dtype, who)
    dev = proj.device
    with torch.cuda.device(dev):
        k = driver.kernel(prog, dev.index)
        grad_out = grad_out.to(proj.dtype).contiguous()
        dproj = torch.zeros_like(proj)
        dh = grad_hn.to(acc, copy=True).contiguous()
        dc = grad_cn.to(acc, copy=True).contiguous()
        c0a = c0.to(acc)
        if not ks.memory:
            dh.add_(dc)  # c_n is a copy of h_n for a cell without memory
        args = pack("step_backward", proj.dtype, ks=ks, n=0, H=H, P=P, gates=gates,
                    xo=proj if X > 0 else None, c_cur=cs if ks.memory else None,
                    c_prev=c0a if ks.memory else None, h_pre=hin if highway else None, dh=dh,
                    g_out=grad_out, dc=dc, da=dproj)
        params = driver.params_of(args)
        _, a_n, _, _, a_g, a_xo, a_cc, a_cp, a_hp, _, a_go, _, a_da = args
        es, ea = proj.element_size(), gates.element_size()
        p_g, p_x, p_cs, p_c0 = gates.data_ptr(), proj.data_ptr(), cs.data_ptr(), c0a.data_ptr()
        p_hin = hin.data_ptr() if highway else None
        p_go, p_dp = grad_out.data_ptr(), dproj.data_ptr()
        for t in range(T - 1, -1, -1):
            n = bs[t]
            if n == 0:
                continue
            a_n.value = n
            a_g.value = p_g + t * B * R * H * ea
            if X > 0:
                a_xo.value = p_x + (t * B * P + R * H) * es
            if ks.memory:
                a_cc.value = p_cs + t * B * H * ea
                a_cp.value = p_c0 if t == 0 else p_cs + (t - 1) * B * H * ea
            if p_hin is not None:
                a_hp.value = p_hin + t * B * H * ea
            a_go.value = p_go + t * B * H * es
            a_da.value = p_dp + t * B * P * es
            driver.launch(k, params, _blocks(n * H), _THREADS)
            _gemm(dh[:n], dproj[t, :n, :R * H], w_hh, accumulate=False)
            if has_mask:
                dh[:n].mul_(rec_mask[:n])
        dw = torch.mm(dproj.view(T * B, P)[:, :R * H].t(),
                      _previous_hidden(out, h0, rec_mask, has_mask, 0, T))
        if not ks.memory:
            dc.zero_()
    return [dproj, dw, dh.to(proj.dtype), dc.to(proj.dtype)]


# ------------------------------------------------------------------------------ scan
def _is_batch_major(t: Tensor) -> bool:
    return not t.is_contiguous() and t.transpose(0, 1).is_contiguous()


def _empty_like_layout(proj: Tensor, W: int, dtype: torch.dtype) -> Tensor:
    T, B = proj.size(0), proj.size(1)
    if _is_batch_major(proj):
        return torch.empty(B, T, W, dtype=dtype, device=proj.device).transpose(0, 1)
    return torch.empty(T, B, W, dtype=dtype, device=proj.device)


def _row_lengths(batch_sizes: Tensor, bs: List[int], B: int, device) -> Optional[Tensor]:
    """(B) int64 on the device: each row's steps; None when every row runs all T steps.  The
    copy is asynchronous, from pinned memory."""
    T = len(bs)
    if B == 0 or T == 0 or bs[-1] == B:
        return None
    lens = (batch_sizes.unsqueeze(1) > torch.arange(B)).sum(0)
    return lens.pin_memory().to(device, non_blocking=True)


def _check_bias(bias: Optional[Tensor], proj: Tensor, who: str) -> bool:
    if bias is None or bias.numel() == 0:
        return False
    if not (bias.device == proj.device and bias.dtype == proj.dtype and bias.dim() == 1
            and bias.is_contiguous() and bias.size(0) == proj.size(2)):
        raise RuntimeError(f"{who}: bias must be a contiguous vector of proj's dtype and device "
                           f"with proj.size(2) = {proj.size(2)} entries")
    return True


def _check_scan_common(proj, h0, c0, batch_sizes, who) -> List[int]:
    if not _on_device(proj):
        raise RuntimeError(f"{who}: proj must be a CUDA tensor")
    if not (proj.dim() == 3 and (proj.is_contiguous() or _is_batch_major(proj))):
        raise RuntimeError(f"{who}: proj must be (T, B, D*G*H), contiguous or the transpose of a "
                           "contiguous (B, T, D*G*H)")
    for t in (h0, c0):
        if t.device != proj.device or t.dtype != proj.dtype:
            raise RuntimeError(f"{who}: h0 and c0 must be on proj's device, of proj's dtype")
        if not (t.dim() == 3 and t.is_contiguous() and t.size(0) in (1, 2)
                and t.size(1) == proj.size(1)):
            raise RuntimeError(f"{who}: h0 and c0 must be contiguous (D, B, H) with D = 1 or 2 "
                               "directions")
    if not (h0.shape == c0.shape and c0.size(2) > 0
            and proj.size(2) % (c0.size(0) * c0.size(2)) == 0):
        raise RuntimeError(f"{who}: proj's width must be a multiple of D*H")
    return _batch_sizes(batch_sizes, proj.size(0), proj.size(1), who)


def scan_forward(spec, highway, proj, h0, c0, batch_sizes, save, bias=None) -> List[Tensor]:
    """-> [out, h_n, c_n, cs]; out and cs laid out like proj (time- or batch-major); bias
    (D*G*H) added to proj's blocks when given (csrc/cpu/scan.cpp)."""
    who = "scan_forward (CUDA)"
    bs = _check_scan_common(proj, h0, c0, batch_sizes, who)
    has_bias = _check_bias(bias, proj, who)
    T, B = proj.size(0), proj.size(1)
    D, H = c0.size(0), c0.size(2)
    G = proj.size(2) // (D * H)
    sp = structs.check_scan_spec(spec, highway, G, H, D, who)
    prog = _program("scan_forward", proj.dtype, who, int(sp.output), bool(highway))
    acc = _acc(proj.dtype)
    dev = proj.device
    with torch.cuda.device(dev):
        out = _empty_like_layout(proj, D * H, proj.dtype)
        h_n = torch.empty(D, B, H, dtype=proj.dtype, device=dev)
        c_n = torch.empty(D, B, H, dtype=proj.dtype, device=dev)
        cs = (_empty_like_layout(proj, D * H, acc) if save
              else torch.empty(0, dtype=acc, device=dev))
        threads = D * B * H
        if threads == 0:
            return [out.zero_(), h_n, c_n, cs]
        k = driver.kernel(prog, dev.index)
        lens = _row_lengths(batch_sizes, bs, B, dev)
        z = structs.Strides(proj.stride(0), proj.stride(1), out.stride(0), out.stride(1), 0, 0)
        driver.launch(k, pack("scan_forward", proj.dtype, sp=sp, n=structs.Dims(T, B, D, H, G),
                              z=z, len=lens, proj=proj, bias=bias if has_bias else None, h0=h0,
                              c0=c0, out=out, h_n=h_n, c_n=c_n, cs=cs if save else None),
                      _blocks(threads), _THREADS)
    return [out, h_n, c_n, cs]


def scan_backward(spec, highway, g_out, g_hn, g_cn, proj, c0, cs, batch_sizes, bias=None,
                  bias_grad=False) -> List[Tensor]:
    """-> [d_proj laid out like proj, d_c0, d_bias (D*G*H) when bias_grad, else empty]."""
    who = "scan_backward (CUDA)"
    bs = _check_scan_common(proj, g_hn, c0, batch_sizes, who)
    has_bias = _check_bias(bias, proj, who)
    T, B = proj.size(0), proj.size(1)
    D, H = c0.size(0), c0.size(2)
    G = proj.size(2) // (D * H)
    sp = structs.check_scan_spec(spec, highway, G, H, D, who)
    acc = _acc(proj.dtype)
    if not (g_out.device == proj.device and g_out.dtype == proj.dtype and g_out.dim() == 3
            and tuple(g_out.shape) == (T, B, D * H)
            and (g_out.numel() == 0 or g_out.stride(2) == 1)):
        raise RuntimeError(f"{who}: g_out must be (T, B, D*H) of proj's dtype, contiguous rows")
    bm = _is_batch_major(proj)
    if not (cs.device == proj.device and cs.dtype == acc and cs.dim() == 3
            and tuple(cs.shape) == (T, B, D * H)
            and (cs.numel() == 0 or (cs.stride(2) == 1
                                     and cs.stride(0) == (D * H if bm else B * D * H)
                                     and cs.stride(1) == (T * D * H if bm else D * H)))):
        raise RuntimeError(f"{who}: cs must be the memories saved by scan_forward (laid out like "
                           "proj)")
    if not (g_cn.device == proj.device and g_cn.dtype == proj.dtype and g_cn.is_contiguous()
            and g_cn.shape == c0.shape):
        raise RuntimeError(f"{who}: g_cn must be contiguous (D, B, H) of proj's dtype")
    prog = _program("scan_backward", proj.dtype, who, int(sp.output), bool(highway))
    dev = proj.device
    with torch.cuda.device(dev):
        dproj = _empty_like_layout(proj, proj.size(2), proj.dtype)
        dc0 = torch.empty_like(c0)
        dbias_rows = (torch.empty(D * B, G * H, dtype=acc, device=dev) if bias_grad else None)

        def dbias():
            if not bias_grad:
                return torch.empty(0, dtype=proj.dtype, device=dev)
            return dbias_rows.view(D, B, G * H).sum(1).view(-1).to(proj.dtype)

        threads = D * B * H
        if threads == 0:
            if bias_grad:
                dbias_rows.zero_()
            return [dproj.zero_(), dc0, dbias()]
        k = driver.kernel(prog, dev.index)
        lens = _row_lengths(batch_sizes, bs, B, dev)
        z = structs.Strides(proj.stride(0), proj.stride(1), cs.stride(0), cs.stride(1),
                            g_out.stride(0), g_out.stride(1))
        driver.launch(k, pack("scan_backward", proj.dtype, sp=sp,
                              n=structs.Dims(T, B, D, H, G), z=z, len=lens, g_out=g_out,
                              g_hn=g_hn, g_cn=g_cn, proj=proj, bias=bias if has_bias else None,
                              c0=c0, cs=cs, dproj=dproj, dc0=dc0, dbias_rows=dbias_rows),
                      _blocks(threads), _THREADS)
        return [dproj, dc0, dbias()]


# ------------------------------------------------------------------------------ persistent
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
            torch.cuda.get_device_name(device))


_props = {}


def make_plan(backward: bool, ks, H: int, rows: int, dtype: torch.dtype, device: int,
              blocks: int, batch_tile: int) -> Tuple[Plan, Optional[driver.Kernel]]:
    """rows: the most rows active at a step; blocks / batch_tile: 0 = automatic (one block per
    SM; as many rows per tile as the shared memory holds), else forced."""
    p = Plan()
    if dtype not in (torch.float32, torch.bfloat16, torch.float16):
        p.why = (f"the persistent kernel runs float32, bfloat16 and float16, not "
                 f"{_NAMES.get(dtype, str(dtype))} (the step kernel runs it)")
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
    k = driver.kernel(_program("persistent_backward" if backward else "persistent_forward",
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
    if not (_on_device(proj) and _on_device(w_hh) and proj.dim() == 3):
        raise RuntimeError(f"{who}: proj (T, B, (R+X)*H) and w_hh must be CUDA tensors")
    H = _check_w_hh(w_hh, who)
    R = w_hh.size(0) // H
    if proj.size(2) % H or proj.size(2) < R * H:
        raise RuntimeError(f"{who}: proj width must be (R+X)*H")
    ks = structs.check_kernel_spec(spec, highway, R, proj.size(2) // H - R, who)
    with torch.cuda.device(proj.device):
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
    """As :func:`forward`: [out, h_n, c_n, gates, cs, hin]; gates (acc_t) only with keep_hin
    (else empty); hin with highway and keep_hin, else empty."""
    who = "rnn_ablations persistent CUDA kernel"
    bs, H, T, B, P, R, X, ks, has_mask = _forward_inputs(spec, highway, proj, w_hh, h0, c0,
                                                         batch_sizes, rec_mask, who)
    steps = _active_steps(bs)
    dev = proj.device
    acc = _acc(proj.dtype)
    with torch.cuda.device(dev):
        p, k = make_plan(False, ks, H, bs[0] if steps > 0 else 0, proj.dtype, dev.index,
                         int(blocks), int(batch_tile))
        if not p.ok:
            raise RuntimeError(f"{who} does not apply: {p.why} (rnn_ablations."
                               "set_cuda_recurrence('steps') runs the step kernel)")
        if H > _INT32_MAX // (R + X) or B * H > _INT32_MAX:
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
        for i, t0 in enumerate(range(0, steps, structs.CHUNK_STEPS)):
            length = min(structs.CHUNK_STEPS, steps - t0)
            a.t0, a.steps = t0, length
            a.n_after = bs[t0 + length] if t0 + length < T else 0
            a.n[0:length] = bs[t0:t0 + length]
            a.barrier = barrier[i].data_ptr()
            driver.launch(k, pack("persistent_forward", proj.dtype, a=a), p.blocks, _P_THREADS,
                          p.smem, cooperative=True)
    return [out, h_n, c_n, gates, cs, hin]


def persistent_backward(spec, highway, grad_out, grad_hn, grad_cn, gates, cs, hin, out, proj,
                        w_hh, h0, c0, batch_sizes, rec_mask, blocks, batch_tile) -> List[Tensor]:
    """As :func:`backward`: [d_proj, d_w_hh, d_h0, d_c0], the recurrence in one persistent
    launch per 1024 steps; the weight gradient one GEMM after it."""
    who = "rnn_ablations persistent CUDA kernel (backward)"
    ks, bs, H, T, B, P, R = _backward_inputs(spec, highway, grad_out, grad_hn, grad_cn, cs, hin,
                                             out, proj, w_hh, h0, c0, batch_sizes, rec_mask, who)
    acc = _acc(proj.dtype)
    if not (gates.dtype == acc and gates.is_contiguous() and _on_device(gates)
            and gates.dim() == 3
            and tuple(gates.shape) == (T, B, R * H)):
        raise RuntimeError(f"{who}: gates must be the contiguous {acc} (T, B, R*H) tensor the "
                           "forward returned with keep_hin=True")
    if not (cs.dtype == acc and _on_device(cs)):
        raise RuntimeError(f"{who}: cs must be the forward's {acc} tensor")
    if highway and not (hin.dtype == acc and hin.numel() == T * B * H):
        raise RuntimeError(f"{who}: hin must be the {acc} tensor returned by the forward "
                           "(keep_hin=True)")
    has_mask = _has_mask(rec_mask)
    steps = _active_steps(bs)
    dev = proj.device
    with torch.cuda.device(dev):
        p, k = make_plan(True, ks, H, bs[0] if steps > 0 else 0, proj.dtype, dev.index,
                         int(blocks), int(batch_tile))
        if not p.ok:
            raise RuntimeError(f"{who} does not apply: {p.why} (rnn_ablations.kernels.cuda_recurrence."
                               "PERSISTENT_BACKWARD = False runs the step kernel's backward)")
        if R * H > _INT32_MAX or B * H > _INT32_MAX:
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
        for i, hi in enumerate(range(steps - 1, -1, -structs.CHUNK_STEPS)):
            length = min(structs.CHUNK_STEPS, hi + 1)
            a.t_hi, a.steps = hi, length
            a.n[0:length] = [bs[hi - s] for s in range(length)]
            a.barrier = barrier[i].data_ptr()
            driver.launch(k, pack("persistent_backward", proj.dtype, a=a), p.blocks,
                          _P_THREADS, p.smem, cooperative=True)
        dw = torch.mm(dproj.view(T * B, P)[:, :R * H].t(),
                      _previous_hidden(out, h0, rec_mask, has_mask, 0, T))
        if not ks.memory:
            dc.zero_()
    return [dproj, dw, dh.to(proj.dtype), dc.to(proj.dtype)]
