"""What the CUDA kernels' host loops share (:mod:`.step`, :mod:`.scan`, :mod:`.persistent`): the
input checks (those of the CPU kernel, ``csrc/cpu/layer_tensors.h``), the packing of a
launch's arguments in the kernel's parameter order (:func:`pack`, from ``programs.PARAMS``), the
final states and the previous hidden states of a layer, and the device type and guard.

The device type the entry points take is :data:`DEVICE_TYPE` (``"cuda"``; the tests that run
the host loops on CPU tensors set ``"cpu"``), read at each call (:func:`device_type`).
"""
from __future__ import annotations

import contextlib
import ctypes
from typing import List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from .. import ops
from . import structs
from .programs import PARAMS, Program

THREADS = 256  # element-wise and scan kernels: threads per block
INT32_MAX = 2 ** 31 - 1

NAMES = {torch.float64: "float64", torch.float32: "float32", torch.bfloat16: "bfloat16",
         torch.float16: "float16"}

#: the accumulation type of a storage dtype (float32 for the half types)
acc_dtype = ops.accumulation_dtype


#: the device type the entry points take (see the module docstring)
DEVICE_TYPE = "cuda"


def device_type() -> str:
    """The device type the entry points take (:data:`DEVICE_TYPE`)."""
    return DEVICE_TYPE


def on_device(t: Tensor) -> bool:
    return t.device.type == device_type()


def device_guard(dev: torch.device):
    """``torch.cuda.device(dev)`` for a CUDA device; nothing for the CPU stand-in."""
    return torch.cuda.device(dev) if dev.type == "cuda" else contextlib.nullcontext()


def ptr(t: Optional[Tensor]) -> ctypes.c_void_p:
    """A pointer argument (a fresh object: a step loop may move it along in place)."""
    return ctypes.c_void_p(t.data_ptr() if t is not None else None)


def i64(v: int) -> ctypes.c_int64:
    return ctypes.c_int64(int(v))


def blocks_for(n: int, threads: int = THREADS) -> int:
    return max(1, (n + threads - 1) // threads)


def program(family: str, dtype: torch.dtype, who: str, out=None, highway=None) -> Program:
    name = NAMES.get(dtype)
    if name is None:
        raise RuntimeError(f"{who}: dtype {dtype} is not supported (float64, float32, bfloat16 "
                           "or float16)")
    return Program(family, name, out, highway)


STRUCTS = {"KernelSpec": structs.KernelSpec, "ScanSpec": structs.ScanSpec, "Dims": structs.Dims,
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
    acc = acc_dtype(dtype)
    out = []
    for name, sym in params:
        v = args[name]
        if sym in STRUCTS:
            if not isinstance(v, STRUCTS[sym]):
                raise TypeError(f"{family} kernel: {name} must be a {sym}, got {type(v).__name__}")
            out.append(v)
        elif sym == "int64":
            out.append(i64(v))
        else:
            if v is not None:
                base = sym.replace("const ", "").rstrip("*")
                want = {"T": dtype, "A": acc, "int64": torch.int64}[base]
                if v.dtype != want:
                    raise TypeError(f"{family} kernel: {name} ({sym}) must be {want}, got "
                                    f"{v.dtype}")
            out.append(ptr(v))
    return out


# ------------------------------------------------------------------------------ input checks
# (cpu/layer_tensors.h, as the CPU kernel checks them)

def check_w_hh(w_hh: Tensor, who: str) -> int:
    if not (w_hh.dim() == 2 and w_hh.size(1) > 0 and w_hh.size(0) > 0 and w_hh.is_contiguous()
            and w_hh.size(0) % w_hh.size(1) == 0):
        raise RuntimeError(f"{who}: w_hh must be contiguous (R*H, H) with H > 0, got "
                           f"{list(w_hh.shape)}")
    return w_hh.size(1)


def check_like(t: Tensor, sizes, like: Tensor, name: str, who: str,
               any_strides: bool = False) -> None:
    if t is None or tuple(t.shape) != tuple(sizes) or not (any_strides or t.is_contiguous()):
        raise RuntimeError(f"{who}: {name} must "
                           f"{'have shape' if any_strides else 'be contiguous with shape'} "
                           f"{list(sizes)}, got {None if t is None else list(t.shape)}")
    if t.dtype != like.dtype or t.device != like.device:
        raise RuntimeError(f"{who}: {name} must have dtype {like.dtype} on {like.device}, got "
                           f"{t.dtype} on {t.device}")


def check_saved_acc(t: Tensor, out: Tensor, name: str, who: str) -> None:
    acc = acc_dtype(out.dtype)
    if t is None or tuple(t.shape) != tuple(out.shape) or not t.is_contiguous():
        raise RuntimeError(f"{who}: {name} must be contiguous with shape {list(out.shape)}")
    if t.dtype not in (out.dtype, acc) or t.device != out.device:
        raise RuntimeError(f"{who}: {name} must have dtype {out.dtype} or {acc} on {out.device}, "
                           f"got {t.dtype} on {t.device}")


def batch_size_list(batch_sizes: Tensor, T: int, B: int, who: str) -> List[int]:
    if not (batch_sizes.device.type == "cpu" and batch_sizes.dtype == torch.int64
            and batch_sizes.dim() == 1 and batch_sizes.size(0) == T):
        raise RuntimeError(f"{who}: batch_sizes must be a CPU int64 tensor of length T = {T}")
    bs = batch_sizes.tolist()
    for t, n in enumerate(bs):
        if n < 0 or n > B or (t > 0 and n > bs[t - 1]):
            raise RuntimeError(f"{who}: batch_sizes must be non-increasing and <= B = {B}")
    return bs


def check_plain_inputs(proj, w_hh, h0, c0, batch_sizes, who) -> List[int]:
    kind = device_type()
    for t in (proj, w_hh, h0, c0):
        if t.device.type != kind or t.device != proj.device:
            raise RuntimeError(f"{who}: proj, w_hh, h0, c0 must be on one CUDA device")
        if t.dtype != proj.dtype:
            raise RuntimeError(f"{who}: all tensors must have one dtype")
    if proj.dim() != 3 or not proj.is_contiguous():
        raise RuntimeError(f"{who}: proj must be contiguous (T, B, (R+X)*H)")
    check_w_hh(w_hh, who)
    if proj.size(2) < w_hh.size(0) or proj.size(2) % w_hh.size(1):
        raise RuntimeError(f"{who}: proj width must be (R+X)*H")
    if not (h0.is_contiguous() and c0.is_contiguous() and h0.dim() == 2
            and h0.size(0) == proj.size(1) and h0.size(1) == w_hh.size(1)
            and c0.shape == h0.shape):
        raise RuntimeError(f"{who}: h0/c0 must be contiguous (B, H)")
    return batch_size_list(batch_sizes, proj.size(0), proj.size(1), who)


def check_backward_inputs(spec, highway, grad_out, grad_hn, grad_cn, cs, hin, out, w_hh, h0,
                          c0, batch_sizes, rec_mask, P, who):
    H = check_w_hh(w_hh, who)
    if not (out.dim() == 3 and out.size(2) == H and out.is_contiguous() and on_device(out)):
        raise RuntimeError(f"{who}: out must be the forward's contiguous (T, B, H) output on cuda")
    if not (P > 0 and P % H == 0 and P >= w_hh.size(0)):
        raise RuntimeError(f"{who}: the projection width must be (R+X)*H, got {P}")
    ks = structs.check_kernel_spec(spec, highway, w_hh.size(0) // H,
                                   P // H - w_hh.size(0) // H, who)
    T, B = out.size(0), out.size(1)
    check_like(w_hh, w_hh.shape, out, "w_hh", who)
    check_like(grad_out, out.shape, out, "grad_out", who, True)
    check_saved_acc(cs, out, "cs", who)
    check_like(grad_hn, (B, H), out, "grad_hn", who, True)
    check_like(grad_cn, (B, H), out, "grad_cn", who, True)
    check_like(h0, (B, H), out, "h0", who)
    check_like(c0, (B, H), out, "c0", who)
    if highway:
        check_saved_acc(hin, out, "hin (highway inputs)", who)
    if rec_mask is not None and rec_mask.numel() > 0:
        check_like(rec_mask, (B, H), out, "rec_mask", who)
    return ks, batch_size_list(batch_sizes, T, B, who)


def mask_given(rec_mask: Optional[Tensor]) -> bool:
    return rec_mask is not None and rec_mask.numel() > 0


def last_step_rows(seq: Tensor, init: Tensor, bs: Sequence[int]) -> Tensor:
    """Row b of seq (T, B, H) at its last active step, in init's dtype (rows never active keep
    init's row)."""
    last = init.clone()
    T = seq.size(0)
    for t in range(T):
        n, n_next = bs[t], (bs[t + 1] if t + 1 < T else 0)
        if n > n_next:
            last[n_next:n].copy_(seq[t, n_next:n])
    return last


def final_states(memory: bool, out, cs, h0, c0, bs) -> Tuple[Tensor, Tensor]:
    h_n = last_step_rows(out, h0, bs)
    return h_n, (last_step_rows(cs, c0, bs) if memory else h_n.clone())


def previous_hidden(out, h0, rec_mask, has_mask, t0, length) -> Tensor:
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


def forward_inputs(spec, highway, proj, w_hh, h0, c0, batch_sizes, rec_mask, who):
    """The checks and sizes both forward step loops (eager and persistent) start from:
    -> (batch sizes, H, T, B, P, R, X, decoded spec, whether a recurrent mask is given)."""
    bs = check_plain_inputs(proj, w_hh, h0, c0, batch_sizes, who)
    H, T, B, P = w_hh.size(1), proj.size(0), proj.size(1), proj.size(2)
    R = w_hh.size(0) // H
    X = P // H - R
    ks = structs.check_kernel_spec(spec, highway, R, X, who)
    has_mask = mask_given(rec_mask)
    if has_mask:
        check_like(rec_mask, h0.shape, h0, "rec_mask", who)
    return bs, H, T, B, P, R, X, ks, has_mask


def backward_inputs(spec, highway, grad_out, grad_hn, grad_cn, cs, hin, out, proj, w_hh, h0, c0,
                    batch_sizes, rec_mask, who):
    """The checks and sizes both backward step loops (eager and persistent) start from:
    -> (decoded spec, batch sizes, H, T, B, P, R)."""
    if proj.dim() != 3:
        raise RuntimeError(f"{who}: proj must be (T, B, (R+X)*H)")
    ks, bs = check_backward_inputs(spec, highway, grad_out, grad_hn, grad_cn, cs, hin, out,
                                   w_hh, h0, c0, batch_sizes, rec_mask, proj.size(2), who)
    check_like(proj, (out.size(0), out.size(1), proj.size(2)), out, "proj", who)
    H, T, B, P = w_hh.size(1), proj.size(0), proj.size(1), proj.size(2)
    return ks, bs, H, T, B, P, w_hh.size(0) // H


