"""The step kernel's host loops (``step_forward`` / ``step_backward`` programs,
``csrc/cuda/step_kernel.cuh``): per step one GEMM through torch and one launch of the
element-wise kernel; the backward is its mirror, the weight gradient one GEMM after the loop.

The GEMM (:class:`StepGemm`) writes the step's pre-activations (forward) or dL/dh_{t-1}
(backward) in the accumulation type: for the half types torch's ``mm`` / ``addmm`` with
``out_dtype=float32`` where this torch and device take it (probed once per operator and device
type on a 1 x 1 product), else an fp32 GEMM of the operands in fp32 (W_hh converted once per
call, not per step: the products of 16-bit values are exact in fp32, so the sums are the same).
The loop runs outside autocast, so the pre-activations stay in the accumulation type.

Per step the loop makes one driver call (``cuLaunchKernel``): the context, the stream and the
parameter array are resolved once per call (:func:`.driver.launcher`), and the step's pointers
are moved along in place in that array.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch
from torch import Tensor

from . import common as C
from . import driver

__all__ = ["plain_forward", "plain_backward", "StepGemm", "out_dtype_supported"]

# (device type, "mm" | "addmm") -> whether torch's operator takes out_dtype=float32 for 16-bit
# operands there
_out_dtype: Dict[Tuple[str, str], bool] = {}


def out_dtype_supported(device: torch.device, op: str, dtype: torch.dtype) -> bool:
    """Whether ``torch.mm`` (``op="mm"``) or ``torch.addmm`` (``"addmm"``) with operands of the
    16-bit ``dtype`` on ``device`` writes a float32 result (``out_dtype=torch.float32``): tried
    once per (device type, operator) on a 1 x 1 product, outside autocast, and remembered."""
    key = (device.type, op)
    got = _out_dtype.get(key)
    if got is None:
        a = torch.ones(1, 1, dtype=dtype, device=device)
        dst = torch.full((1, 1), 0.5, dtype=torch.float32, device=device)
        try:
            with torch.autocast(device.type, enabled=False):
                if op == "addmm":
                    torch.addmm(dst, a, a, out_dtype=torch.float32, out=dst)
                    want = 1.5
                else:
                    torch.mm(a, a, out_dtype=torch.float32, out=dst)
                    want = 1.0
            got = dst.dtype == torch.float32 and float(dst[0, 0]) == want
        except (RuntimeError, TypeError, NotImplementedError, ValueError):
            got = False
        _out_dtype[key] = got
    return got


class StepGemm:
    """``dst (+)= a @ w`` for one call's weight ``w`` (storage dtype) with ``dst`` in the
    accumulation type ``acc``: ``accumulate`` adds (``addmm``), else overwrites (``mm``).
    Decides once per call how (see the module docstring); ``w_acc`` holds the fp32 copy of
    ``w`` where the operator does not take ``out_dtype``."""

    def __init__(self, w: Tensor, acc: torch.dtype, accumulate: bool):
        self.w, self.accumulate = w, accumulate
        self.op = "addmm" if accumulate else "mm"
        self.same = w.dtype == acc
        self.w_acc: Optional[Tensor] = None
        self.out_dtype = False
        if not self.same:
            self.out_dtype = out_dtype_supported(w.device, self.op, w.dtype)
            if not self.out_dtype:
                self.w_acc = w.to(acc)

    def __call__(self, dst: Tensor, a: Tensor) -> None:
        w = self.w
        if self.same:
            if self.accumulate:
                dst.addmm_(a, w)
            else:
                torch.mm(a, w, out=dst)
        elif self.out_dtype:
            if self.accumulate:
                torch.addmm(dst, a, w, out_dtype=dst.dtype, out=dst)
            else:
                torch.mm(a, w, out_dtype=dst.dtype, out=dst)
        elif self.accumulate:
            dst.addmm_(a.to(dst.dtype), self.w_acc)
        else:
            torch.mm(a.to(dst.dtype), self.w_acc, out=dst)


def plain_forward(spec, highway, proj, w_hh, h0, c0, batch_sizes, rec_mask,
                  keep_hin) -> List[Tensor]:
    """-> [out (T,B,H), h_n, c_n, gates (activations), cs (T,B,H), hin], as plain_forward (CPU);
    out, h_n, c_n in the input dtype; gates, cs, hin in the accumulation type."""
    who = "rnn_ablations CUDA kernel"
    bs, H, T, B, P, R, X, ks, has_mask = C.forward_inputs(spec, highway, proj, w_hh, h0, c0,
                                                          batch_sizes, rec_mask, who)
    prog = C.program("step_forward", proj.dtype, who)
    dev = proj.device
    acc = C.acc_dtype(proj.dtype)
    with C.device_guard(dev), torch.autocast(dev.type, enabled=False):
        k = driver.kernel(prog, dev.index)
        gates = proj[:, :, :R * H].to(acc, copy=True).contiguous()
        c0a = c0.to(acc)
        out = torch.zeros(T, B, H, dtype=proj.dtype, device=dev)
        cs = torch.zeros(T, B, H, dtype=acc, device=dev)
        hin = torch.empty(T, B, H, dtype=acc, device=dev) if highway and keep_hin else None
        hp_buf = torch.empty(B, H, dtype=proj.dtype, device=dev) if has_mask else None
        gemm = StepGemm(w_hh.t(), acc, accumulate=True)
        # the step's arguments, checked once (pack) and then moved along by pointer arithmetic
        args = C.pack("step_forward", proj.dtype, ks=ks, n=0, H=H, xo_stride=P, gates=gates,
                      xo=proj if X > 0 else None, c_prev=c0a, c_out=cs, h_out=out, h_pre_out=hin)
        params = driver.params_of(args)
        go = driver.launcher(k)
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
            gemm(gates[t, :n], h_prev)
            a_n.value = n
            a_g.value = p_g + t * B * R * H * ea
            if X > 0:
                a_xo.value = p_x + (t * B * P + R * H) * es
            a_cp.value = p_c0 if t == 0 else p_cs + (t - 1) * B * H * ea
            a_co.value = p_cs + t * B * H * ea
            a_h.value = p_out + t * B * H * es
            if p_hin is not None:
                a_hp.value = p_hin + t * B * H * ea
            go(params, C.blocks_for(n * H), C.THREADS)
        h_n, c_n = C.final_states(ks.memory, out, cs, h0, c0, bs)
    return [out, h_n, c_n, gates, cs,
            hin if hin is not None else torch.empty(0, dtype=acc, device=dev)]


def plain_backward(spec, highway, grad_out, grad_hn, grad_cn, gates, cs, hin, out, proj, w_hh,
                   h0, c0, batch_sizes, rec_mask) -> List[Tensor]:
    """-> [d_proj, d_w_hh, d_h0, d_c0], as plain_backward (CPU); gates, cs, hin as the forward
    returned them (accumulation type)."""
    who = "rnn_ablations CUDA kernel (backward)"
    ks, bs, H, T, B, P, R = C.backward_inputs(spec, highway, grad_out, grad_hn, grad_cn, cs, hin,
                                              out, proj, w_hh, h0, c0, batch_sizes, rec_mask, who)
    X = P // H - R
    if not (gates.dim() == 3 and tuple(gates.shape) == (T, B, R * H)):
        raise RuntimeError(f"{who}: gates must have shape (T, B, R*H) = ({T}, {B}, {R * H})")
    acc = C.acc_dtype(proj.dtype)
    for t in (gates, cs):
        if t.dtype != acc or not t.is_contiguous() or not C.on_device(t):
            raise RuntimeError(f"{who}: gates and cs must be the contiguous {acc} tensors "
                               "returned by the forward")
    if highway and (hin.dtype != acc or hin.numel() != T * B * H):
        raise RuntimeError(f"{who}: hin must be the {acc} tensor returned by the forward "
                           "(keep_hin=True)")
    has_mask = C.mask_given(rec_mask)
    prog = C.program("step_backward", proj.dtype, who)
    dev = proj.device
    with C.device_guard(dev), torch.autocast(dev.type, enabled=False):
        k = driver.kernel(prog, dev.index)
        grad_out = grad_out.to(proj.dtype).contiguous()
        dproj = torch.zeros_like(proj)
        dh = grad_hn.to(acc, copy=True).contiguous()
        dc = grad_cn.to(acc, copy=True).contiguous()
        c0a = c0.to(acc)
        if not ks.memory:
            dh.add_(dc)  # c_n is a copy of h_n for a cell without memory
        gemm = StepGemm(w_hh, acc, accumulate=False)
        args = C.pack("step_backward", proj.dtype, ks=ks, n=0, H=H, P=P, gates=gates,
                      xo=proj if X > 0 else None, c_cur=cs if ks.memory else None,
                      c_prev=c0a if ks.memory else None, h_pre=hin if highway else None, dh=dh,
                      g_out=grad_out, dc=dc, da=dproj)
        params = driver.params_of(args)
        go = driver.launcher(k)
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
            go(params, C.blocks_for(n * H), C.THREADS)
            gemm(dh[:n], dproj[t, :n, :R * H])
            if has_mask:
                dh[:n].mul_(rec_mask[:n])
        dw = torch.mm(dproj.view(T * B, P)[:, :R * H].t(),
                      C.previous_hidden(out, h0, rec_mask, has_mask, 0, T))
        if not ks.memory:
            dc.zero_()
    return [dproj, dw, dh.to(proj.dtype), dc.to(proj.dtype)]
