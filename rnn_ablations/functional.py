"""The generic (reference) path: one recurrent layer in one direction, written with PyTorch ops.

It runs on every device and dtype and is differentiated by autograd.  The compiled kernels
(``rnn_ablations._C`` on CPU, the NVRTC-compiled kernels of :mod:`rnn_ablations.kernels.cuda`
on CUDA; the element-wise scan of
:mod:`rnn_ablations.kernels.scan` for cells that never read h_{t-1}) compute exactly the same function
faster; the tests check them against each other.  All read the block layout from
:mod:`rnn_ablations.variants`.

Conventions of a *layer call* (shared with the kernel):

* time-major tensors: ``xr`` (T, B, R·H) = the recurrent blocks' input projections *plus bias*,
  ``xo`` (T, B, X·H) = the input-only blocks (gates of a cell that never reads h_{t-1}, content
  ``c̃``, highway projection), or ``None``; ``w_hh`` is ``None`` when the cell has no recurrent
  block (R = 0);
* the batch is sorted by decreasing length and ``batch_sizes[t]`` rows are active at step t
  (as in a :class:`~torch.nn.utils.rnn.PackedSequence`); an inactive row keeps its state and
  outputs zero, so the final state of every row is the state after its last real token;
* ``rec_mask`` (B, H) or ``None``: the variational recurrent-dropout mask multiplied into
  ``h_{t-1}`` before it enters the recurrent projection.
"""
from __future__ import annotations

import contextlib
import warnings
from typing import List, NamedTuple, Optional, Sequence, Tuple

import torch

from .variants import Variant, output_flags

__all__ = ["shape_checks", "StepResult", "pointwise", "cell_step", "generic_layer", "generic_from_projection",
           "generic_directions", "reversal_index", "Reversal", "projection_bias"]


class StepResult(NamedTuple):
    h: torch.Tensor
    c: torch.Tensor
    input_gate: Optional[torch.Tensor]
    forget_gate: Optional[torch.Tensor]
    content: Optional[torch.Tensor]


@contextlib.contextmanager
def shape_checks():
    """Shape comparisons under ``torch.jit.trace``, without its TracerWarning.  The tracer sees
    a size compared to a Python number and warns that the result is taken as a constant; the
    comparisons made in this block are of parameter shapes, or guard the example input (the
    traced graph records the branch that raises nothing, and its own operators refuse a wrong
    feature size), so that constant is what is meant."""
    if not torch.jit.is_tracing():
        yield
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        yield


def projection_bias(bias: Optional[torch.Tensor], width: int) -> Optional[torch.Tensor]:
    """The bias of the whole input projection (``width`` = (R+X)·H entries): the recurrent
    blocks' bias (R·H) followed by zeros for the input-only blocks, which have none."""
    if bias is None:
        return bias
    if torch.jit.is_tracing():
        with shape_checks():  # a parameter's shape: a constant of the traced graph
            whole = bool(bias.shape[0] == width)
    else:
        whole = bias.shape[0] == width
    if whole:
        return bias
    return torch.cat([bias, bias.new_zeros(width - bias.shape[0])])


def reversal_index(lengths: torch.Tensor, seq_len: int) -> torch.Tensor:
    """(T, B) int64 index that reverses every row within its length (``lengths`` (B,), CPU);
    padded positions map to themselves.  ``t.gather(0, index)`` reverses a time-major tensor,
    and the index is its own inverse."""
    steps = torch.arange(seq_len).unsqueeze(1)
    return torch.where(steps < lengths.unsqueeze(0), lengths.unsqueeze(0) - 1 - steps, steps)


class Reversal:
    """Reverses time-major tensors (T, B, ...) within each row's length, as the second direction
    of a bidirectional layer reads its input: ``index`` (T, B) from :func:`reversal_index`, or
    ``None`` when every row has all T steps (then a flip).  Calling it reverses a whole tensor;
    :meth:`steps` and :meth:`place` do it a few steps at a time (the streamed no-gradient forward,
    ``kernels/projection.py``), so that no reversed copy of a whole tensor is held."""

    def __init__(self, index: Optional[torch.Tensor]):
        self.index = index

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        if self.index is None:
            return t.flip(0)
        return t.gather(0, self.index.unsqueeze(-1).expand_as(t))

    def steps(self, t: torch.Tensor, t0: int, t1: int) -> torch.Tensor:
        """Steps ``t0:t1`` of the reversed ``t`` (T, B, X)."""
        if self.index is None:
            T = t.shape[0]
            return t[T - t1:T - t0].flip(0)
        return t.gather(0, self.index[t0:t1].unsqueeze(-1).expand(t1 - t0, *t.shape[1:]))

    def place(self, dst: torch.Tensor, src: torch.Tensor, t0: int) -> None:
        """Write ``src``, steps ``t0:t0 + len(src)`` of a reversed tensor, into ``dst`` (T, B, X;
        a view is fine) at their places in the original order (the index is its own inverse)."""
        t1 = t0 + src.shape[0]
        if self.index is None:
            T = dst.shape[0]
            dst[T - t1:T - t0].copy_(src.flip(0))
        else:
            dst.scatter_(0, self.index[t0:t1].unsqueeze(-1).expand_as(src), src)


def cell_step(content: torch.Tensor, i_pre: torch.Tensor, f_pre: torch.Tensor,
              o_pre: torch.Tensor, r_pre: torch.Tensor, hw_pre: torch.Tensor,
              c_prev: torch.Tensor, content_tanh: bool, has_memory: bool, output_gate: bool,
              output_tanh: bool, highway: bool) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                      torch.Tensor]:
    """The element-wise maths of one step, written once for the generic path
    (:func:`pointwise`) and the TorchScript / ONNX loop (``export.py``; this function is
    scriptable): the blocks' pre-activations (a block the cell lacks is any tensor, never read),
    the variant's rules as flags (``variants.output_flags``: the output rule reads an output
    gate, a tanh of the memory).  Returns
    ``(h, c, i, f, content)`` (the gates and the content after their activations; for a cell
    without memory ``i`` and ``f`` are the content, not gates)."""
    if content_tanh:
        content = torch.tanh(content)
    if not has_memory:  # output rule "content" (the S-RNN): h_t = c̃_t, its state is h
        h = content
        c, i, f = h, content, content
    else:
        i = torch.sigmoid(i_pre)
        f = torch.sigmoid(f_pre)
        c = i * content + f * c_prev
        h = torch.tanh(c) if output_tanh else c  # "identity": h_t = c_t
        if output_gate:  # o∘tanh(c_t) or o∘c_t
            h = torch.sigmoid(o_pre) * h
    if highway:
        r = torch.sigmoid(r_pre)
        h = r * h + (1 - r) * hw_pre
        if not has_memory:
            c = h
    return h, c, i, f, content


def pointwise(variant: Variant, highway: bool, a: torch.Tensor, xo: Optional[torch.Tensor],
              c_prev: torch.Tensor) -> StepResult:
    """The element-wise part of one step, from the pre-activations ``a`` (n, R·H) and the
    input-only blocks ``xo`` (:func:`cell_step`)."""
    hidden = c_prev.shape[-1]
    rec_names, inp_names = variant.blocks(highway)
    pre = dict(zip(rec_names, a.split(hidden, dim=-1))) if rec_names else {}
    if inp_names:
        pre.update(zip(inp_names, xo.split(hidden, dim=-1)))
    content = pre[variant.content_block]
    h, c, i, f, content = cell_step(
        content, pre.get("i", content), pre.get("f", content), pre.get("o", content),
        pre.get("r", content), pre.get("hw", content), c_prev,
        variant.content_activation == "tanh", variant.has_memory, *output_flags(variant.output),
        highway)
    if not variant.has_memory:
        return StepResult(h, c, None, None, None)
    return StepResult(h, c, i, f, content)


def generic_layer(variant: Variant, highway: bool, xr: torch.Tensor, xo: Optional[torch.Tensor],
                  w_hh: Optional[torch.Tensor], h0: torch.Tensor, c0: torch.Tensor,
                  batch_sizes, rec_mask: Optional[torch.Tensor] = None,
                  keep_steps: bool = False, w_hr: Optional[torch.Tensor] = None):
    """Run one layer/direction; returns ``(output (T,B,H), h_n, c_n, steps)``.

    ``w_hr`` (P, H) or ``None``: ``nn.LSTM``'s ``proj_size``: the cell's output is projected,
    ``h_t = W_hr (o_t ∘ tanh(c_t))`` (P entries), and that is what the next step reads (``w_hh``
    (R·H, P), ``h0`` (B, P)) and what the layer outputs.

    ``batch_sizes``: a sequence of ints, or the CPU int64 tensor of the kernels' calls.
    ``steps`` is the list of :class:`StepResult` per time step (for ``weighted_sum``) when
    ``keep_steps`` is true, else ``None``.

    Eagerly, step t runs on its ``batch_sizes[t]`` active rows.  Under ``torch.compile`` /
    ``torch.export`` (and so the dynamo-based ONNX exporter), where reading a tensor's values
    would make the graph depend on data, a tensor ``batch_sizes`` is not read: every step runs
    on all rows and an inactive row's state and output are selected away (``torch.where``), which
    gives the same numbers.
    """
    if isinstance(batch_sizes, torch.Tensor):
        if torch.compiler.is_compiling() and not keep_steps:
            return _generic_layer_masked(variant, highway, xr, xo, w_hh, h0, c0, batch_sizes,
                                         rec_mask, w_hr)
        batch_sizes = batch_sizes.tolist()
    seq_len, batch = xr.shape[0], xr.shape[1]
    h, c = h0, c0
    outputs: List[torch.Tensor] = []
    steps: Optional[List[StepResult]] = [] if keep_steps else None
    w_t = None if w_hh is None else w_hh.t()
    for t in range(seq_len):
        n = int(batch_sizes[t])
        if w_t is None:  # no recurrent block: nothing reads h_{t-1}
            a = xr[t, :n]
        else:
            h_prev = h[:n] if rec_mask is None else h[:n] * rec_mask[:n]
            a = torch.addmm(xr[t, :n], h_prev, w_t)
        res = pointwise(variant, highway, a, None if xo is None else xo[t, :n], c[:n])
        if keep_steps:
            steps.append(res)
        h_t = res.h if w_hr is None else res.h.mm(w_hr.t())
        if n < batch:
            outputs.append(torch.cat([h_t, h_t.new_zeros(batch - n, h_t.shape[1])]))
            h = torch.cat([h_t, h[n:]])
            c = torch.cat([res.c, c[n:]])
        else:
            outputs.append(h_t)
            h, c = h_t, res.c
    return torch.stack(outputs), h, c, steps


def _generic_layer_masked(variant: Variant, highway: bool, xr: torch.Tensor,
                          xo: Optional[torch.Tensor], w_hh: Optional[torch.Tensor],
                          h0: torch.Tensor, c0: torch.Tensor, batch_sizes: torch.Tensor,
                          rec_mask: Optional[torch.Tensor] = None,
                          w_hr: Optional[torch.Tensor] = None):
    """:func:`generic_layer` without reading ``batch_sizes``' values (for traced graphs): every
    step runs on all B rows; row b is active at step t when ``b < batch_sizes[t]``."""
    seq_len, batch = xr.shape[0], xr.shape[1]
    active = (torch.arange(batch).unsqueeze(0) < batch_sizes.unsqueeze(1)).to(xr.device)
    h, c = h0, c0
    outputs: List[torch.Tensor] = []
    w_t = None if w_hh is None else w_hh.t()
    for t in range(seq_len):
        if w_t is None:  # no recurrent block: nothing reads h_{t-1}
            a = xr[t]
        else:
            a = torch.addmm(xr[t], h if rec_mask is None else h * rec_mask, w_t)
        res = pointwise(variant, highway, a, None if xo is None else xo[t], c)
        h_t = res.h if w_hr is None else res.h.mm(w_hr.t())
        on = active[t].unsqueeze(1)
        outputs.append(torch.where(on, h_t, torch.zeros_like(h_t)))
        h = torch.where(on, h_t, h)
        c = torch.where(on, res.c, c)
    return torch.stack(outputs), h, c, None


# --------------------------------------------------------------------------- the reference path
def generic_from_projection(variant: Variant, highway: bool, proj: torch.Tensor,
                            w_hh: Optional[torch.Tensor], h0: torch.Tensor, c0: torch.Tensor,
                            batch_sizes, rec_mask: Optional[torch.Tensor] = None,
                            w_hr: Optional[torch.Tensor] = None):
    """One direction of a layer from its input projection ``proj`` (T, B, (R+X)·H: the
    recurrent blocks, bias included, then the input-only blocks; ``w_hh`` ``None`` for a cell
    that reads no h_{t-1}), on the generic path (:func:`generic_layer`; ``w_hr``:
    ``proj_size``'s projection).  Returns ``(output, h_n, c_n)``."""
    rh = w_hh.shape[0] if w_hh is not None else 0
    xo = proj[..., rh:] if proj.shape[-1] > rh else None
    out, h_n, c_n, _ = generic_layer(variant, highway, proj[..., :rh], xo, w_hh, h0, c0,
                                     batch_sizes, rec_mask, w_hr=w_hr)
    return out, h_n, c_n


def generic_directions(variant: Variant, highway: bool, proj: torch.Tensor, h0: torch.Tensor,
                       c0: torch.Tensor, batch_sizes: torch.Tensor):
    """The generic path of a cell that reads no h_{t-1}, for D = ``h0.shape[0]`` directions
    whose projections (bias included) lie side by side in ``proj`` (T, B, D·G·H); direction 1
    reads every row backwards within its length (the outputs are put back in order).  Returns
    ``(output (T, B, D·H), h_n (D, B, H), c_n (D, B, H))``."""
    dirs, seq_len = h0.shape[0], proj.shape[0]
    width = proj.shape[-1] // dirs
    outs, hs, cs = [], [], []
    rev = None
    for d in range(dirs):
        p = proj[..., d * width:(d + 1) * width]
        if d == 1:
            lengths = (batch_sizes.unsqueeze(0) > torch.arange(proj.shape[1]).unsqueeze(1)).sum(1)
            rev = reversal_index(lengths, seq_len).to(proj.device).unsqueeze(-1)
            p = p.gather(0, rev.expand_as(p))
        out, h_n, c_n, _ = generic_layer(variant, highway, p[..., :0], p, None, h0[d], c0[d],
                                         batch_sizes)
        if d == 1:
            out = out.gather(0, rev.expand_as(out))
        outs.append(out)
        hs.append(h_n)
        cs.append(c_n)
    return torch.cat(outs, -1) if dirs > 1 else outs[0], torch.stack(hs), torch.stack(cs)
