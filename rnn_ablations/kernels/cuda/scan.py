"""The element-wise scan's host side (``scan_forward`` / ``scan_backward`` programs,
``csrc/cuda/scan_kernel.cuh``): a cell that reads no h_{t-1}, one launch per call over every
(direction, row, unit), the loop over T inside the kernel; arguments and results as the CPU
kernel's (``csrc/cpu/scan.cpp``)."""
from __future__ import annotations

from typing import List, Optional

import torch
from torch import Tensor

from . import common as C
from . import driver, structs

__all__ = ["scan_forward", "scan_backward"]


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
    if device.type != "cuda":  # the CPU stand-in of the tests
        return lens.to(device)
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
    if not C.on_device(proj):
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
    return C.batch_size_list(batch_sizes, proj.size(0), proj.size(1), who)


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
    prog = C.program("scan_forward", proj.dtype, who, int(sp.output), bool(highway))
    acc = C.acc_dtype(proj.dtype)
    dev = proj.device
    with C.device_guard(dev):
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
        driver.launch(k, C.pack("scan_forward", proj.dtype, sp=sp,
                                n=structs.Dims(T, B, D, H, G), z=z, len=lens, proj=proj,
                                bias=bias if has_bias else None, h0=h0, c0=c0, out=out,
                                h_n=h_n, c_n=c_n, cs=cs if save else None),
                      C.blocks_for(threads), C.THREADS)
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
    acc = C.acc_dtype(proj.dtype)
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
    prog = C.program("scan_backward", proj.dtype, who, int(sp.output), bool(highway))
    dev = proj.device
    with C.device_guard(dev):
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
        driver.launch(k, C.pack("scan_backward", proj.dtype, sp=sp,
                                n=structs.Dims(T, B, D, H, G), z=z, len=lens, g_out=g_out,
                                g_hn=g_hn, g_cn=g_cn, proj=proj,
                                bias=bias if has_bias else None, c0=c0, cs=cs, dproj=dproj,
                                dc0=dc0, dbias_rows=dbias_rows),
                      C.blocks_for(threads), C.THREADS)
        return [dproj, dc0, dbias()]


