"""Length-generic layers for graph capture: ``torch.jit.trace`` and ONNX export keep the
sequence length dynamic, as they do for ``torch.nn.LSTM``.

A Python loop over the time steps is unrolled by every graph capture that records what runs
(``torch.jit.trace``, the TorchScript-based ONNX exporter ``torch.onnx.export(dynamo=False)``)
and specialised to one length by ``torch.export`` (which the default, dynamo-based ONNX exporter
runs): the captured graph would then hold exactly the traced number of steps.  While such a
capture is running (:func:`rnn_ablations.plan.stack_runner` says so),
:class:`~rnn_ablations.AblatedRNN` hands its whole stack to :func:`run_stack`, which puts the recurrence into the graph as a loop:

* under ``torch.jit.trace`` (and so ``torch.onnx.export(dynamo=False)``): a ``torch.jit.script``
  function whose loop runs ``input.size(0)`` steps (an ONNX ``Loop``);
* under the dynamo-based ONNX exporter: ``torch._higher_order_ops.scan`` over the time steps (an
  ONNX ``Scan``), whose step is :func:`rnn_ablations.functional.pointwise`.

The input projections, dropout between layers and the concatenation of the directions are
ordinary operators on whole sequences.  Padded batches (``lengths`` / ``mask``) are handled
without reading a length's value: each step runs on every row, and a row past its length keeps
its state and outputs zero (``torch.where``); the reverse direction reads each row backwards
within its length through a gather index built from the lengths.  So one captured graph serves
every sequence length, batch size and set of lengths, with the eager numbers.

``torch.compile`` and ``torch.export.export`` on their own keep the compiled kernels (their
operators have fake implementations for any length) and do not come here.

The step of the scripted loop reads the variant's rules from :mod:`rnn_ablations.variants`
(block positions, content activation, memory, output rule, highway) as integers
(:func:`step_layout`); the scan's step is :func:`~rnn_ablations.functional.pointwise` itself.
"""
from __future__ import annotations

import functools
from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F

from .functional import cell_step, pointwise
from .variants import Variant, output_flags

__all__ = ["run_stack", "step_layout"]



def step_layout(variant: Variant, highway: bool, hidden_size: int) -> List[int]:
    """The variant's step rules as the integers the scripted loop reads:
    ``[H, R, i, f, o, content, r, hw, content_tanh, has_memory, output_gate, output_tanh,
    highway]`` where R is
    the number of recurrent blocks and ``i`` … ``hw`` are block positions in the projection
    (recurrent blocks, then input-only ones: :meth:`Variant.blocks`), -1 when absent."""
    rec, inp = variant.blocks(highway)
    names = list(rec) + list(inp)

    def pos(name: str) -> int:
        return names.index(name) if name in names else -1

    return [hidden_size, len(rec), pos("i"), pos("f"), pos("o"), pos(variant.content_block),
            pos("r"), pos("hw"), int(variant.content_activation == "tanh"),
            int(variant.has_memory), *map(int, output_flags(variant.output)), int(highway)]


def _block(a: torch.Tensor, at: int, hidden: int, absent: torch.Tensor) -> torch.Tensor:
    """Block ``at`` of the pre-activations ``a`` (n, blocks·H), or ``absent`` (``at`` = -1)."""
    if at < 0:
        return absent
    return a[:, at * hidden:(at + 1) * hidden]


def _script_direction(pre: torch.Tensor, w_hh: torch.Tensor, h0: torch.Tensor, c0: torch.Tensor,
                      lengths: torch.Tensor, rec_mask: torch.Tensor, padded: bool, reverse: bool,
                      dropped: bool, w_hr: torch.Tensor, projected: bool,
                      layout: List[int]) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One direction of one layer (TorchScript): ``pre`` (T, B, (R+X)·H) the input projection
    with its bias; ``lengths`` (B,) on ``pre``'s device when ``padded``; ``rec_mask`` (B, H) when
    ``dropped``; ``w_hh`` when R > 0; ``w_hr`` (P, H) when ``projected`` (``proj_size``: h_t is
    projected, and the next step reads the projection).  Tensors that do not apply are empty placeholders (no
    ``Optional``: the TorchScript-based ONNX exporter has no typed form for a ``None``).
    Returns (output, h_n, c_n)."""
    H, R = layout[0], layout[1]
    i_at, f_at, o_at, c_at, r_at, hw_at = layout[2], layout[3], layout[4], layout[5], layout[6], layout[7]
    content_tanh, has_memory, output_gate, output_tanh, highway = (
        layout[8] == 1, layout[9] == 1, layout[10] == 1, layout[11] == 1, layout[12] == 1)
    T = pre.size(0)
    steps = torch.arange(T, device=pre.device).unsqueeze(1)
    if padded:
        lens = lengths.unsqueeze(0)
    else:
        lens = torch.full([1, pre.size(1)], T, dtype=torch.long, device=pre.device)
    active = steps < lens
    # row b reads its steps lens-1 … 0, then its padded steps in place (its own inverse)
    index = torch.where(active, lens - 1 - steps, steps).unsqueeze(2)
    if reverse:
        pre = pre.gather(0, index.expand(pre.size(0), pre.size(1), pre.size(2)))
    h, c = h0, c0
    outputs: List[torch.Tensor] = []
    for t in range(T):
        a = pre[t]
        if R > 0:
            h_prev = h
            if dropped:
                h_prev = h * rec_mask
            a = torch.cat([torch.addmm(a[:, :R * H], h_prev, w_hh.t()), a[:, R * H:]], 1)
        content = a[:, c_at * H:(c_at + 1) * H]
        h_new, c_new, _, _, _ = cell_step(
            content, _block(a, i_at, H, content), _block(a, f_at, H, content),
            _block(a, o_at, H, content), _block(a, r_at, H, content),
            _block(a, hw_at, H, content), c, content_tanh, has_memory, output_gate, output_tanh,
            highway)
        if projected:
            h_new = torch.mm(h_new, w_hr.t())
        if padded:
            on = active[t].unsqueeze(1)
            outputs.append(torch.where(on, h_new, torch.zeros_like(h_new)))
            h = torch.where(on, h_new, h)
            c = torch.where(on, c_new, c)
        else:
            outputs.append(h_new)
            h = h_new
            c = c_new
    out = torch.stack(outputs)
    if reverse:
        out = out.gather(0, index.expand(out.size(0), out.size(1), out.size(2)))
    return out, h, c


@functools.lru_cache(maxsize=None)
def _scripted():
    # compiled on first use: importing the package costs nothing.  torch 2.13 marks
    # torch.jit.script deprecated; it is what keeps a loop in a torch.jit.trace graph.
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return torch.jit.script(_script_direction)


def _scan_direction(variant: Variant, highway: bool, pre: torch.Tensor,
                    w_hh: Optional[torch.Tensor], h0: torch.Tensor, c0: torch.Tensor,
                    lengths: Optional[torch.Tensor], reverse: bool,
                    rec_mask: Optional[torch.Tensor], w_hr: Optional[torch.Tensor] = None):
    """One direction of one layer as a ``scan`` over the time steps (dynamo-based capture);
    ``w_hr``: ``proj_size``'s projection of h_t, or ``None``."""
    from torch._higher_order_ops.scan import scan

    # An ONNX graph is an inference graph: the scan's inputs are detached, so that the exporter's
    # passes, which run the graph again with autograd, do not trace a scan's backward (which
    # fails for a scan that reads another scan's output in torch 2.13).
    pre, h0, c0 = pre.detach(), h0.detach(), c0.detach()
    w_hh = None if w_hh is None else w_hh.detach()
    rec_mask = None if rec_mask is None else rec_mask.detach()
    w_hr = None if w_hr is None else w_hr.detach()
    H = c0.shape[-1]
    RH = variant.num_recurrent(highway) * H
    T = pre.shape[0]
    index = None
    if lengths is not None:
        steps = torch.arange(T, device=pre.device).unsqueeze(1)
        lens = lengths.unsqueeze(0)
        active = (steps < lens).unsqueeze(2)
        if reverse:
            index = torch.where(steps < lens, lens - 1 - steps, steps).unsqueeze(2)
            pre = pre.gather(0, index.expand_as(pre))
    else:
        active = None
        if reverse:
            pre = pre.flip(0)
    def step(carry, xs):
        h, c = carry
        p = xs[0]
        a = p[:, :RH]
        if w_hh is not None:  # transposed inside the step: a view is no input a scan may take
            a = torch.addmm(a, h if rec_mask is None else h * rec_mask, w_hh.t())
        res = pointwise(variant, highway, a, p[:, RH:] if p.shape[1] > RH else None, c)
        h_t = res.h if w_hr is None else res.h.mm(w_hr.t())
        if active is None:  # scan's outputs may not alias (h_t is c_t in some cells)
            return (h_t, res.c.clone()), h_t.clone()
        on = xs[1]
        return ((torch.where(on, h_t, h), torch.where(on, res.c, c)),
                torch.where(on, h_t, torch.zeros_like(h_t)))

    xs = (pre,) if active is None else (pre, active)
    # the initial states may be views of one tensor: a scan's inputs may not alias
    (h, c), out = scan(step, (h0.clone(), c0.clone()), xs)
    if index is not None:
        out = out.gather(0, index.expand_as(out))
    elif reverse:
        out = out.flip(0)
    return out, h, c


def run_stack(module, x: torch.Tensor, lengths: Optional[torch.Tensor], h0: torch.Tensor,
              c0: torch.Tensor, num_layers: Optional[int], mode: str):
    """:class:`~rnn_ablations.AblatedRNN`'s layers on the time-major ``x`` (T, B, d_in) in the
    original batch order, for the capture ``mode`` (:func:`rnn_ablations.plan.stack_runner`:
    ``"script"`` or ``"scan"``); returns ``(output, h_n, c_n)`` as ``AblatedRNN._run`` does."""
    if mode not in ("script", "scan"):
        raise ValueError(f"run_stack runs a captured stack ('script' or 'scan'), got {mode!r}")
    variant, highway, dirs = module.variant, module.highway, module.num_directions
    layout = step_layout(variant, highway, module.hidden_size)
    if lengths is not None:
        lengths = lengths.to(x.device)
    layer_input = x
    h_finals, c_finals = [], []
    for layer in range(module.num_layers if num_layers is None else num_layers):
        outputs = []
        for direction in range(dirs):
            w_ih, w_hh, bias = module.projection_parameters(layer, direction)
            w_hr = (getattr(module, module._proj_names[layer][direction])
                    if module.proj_size else None)
            pre = F.linear(layer_input, w_ih, bias)
            rec_mask = None
            if module.training and module.recurrent_dropout > 0 and w_hh is not None:
                keep = 1.0 - module.recurrent_dropout
                rec_mask = torch.empty_like(h0[0]).bernoulli_(keep) / keep
            k = layer * dirs + direction
            if mode == "scan":
                out, h_n, c_n = _scan_direction(variant, highway, pre, w_hh, h0[k], c0[k],
                                                lengths, direction == 1, rec_mask, w_hr)
            else:
                none = pre.new_zeros(0)
                out, h_n, c_n = _scripted()(
                    pre, none if w_hh is None else w_hh, h0[k], c0[k],
                    none.long() if lengths is None else lengths,
                    none if rec_mask is None else rec_mask, lengths is not None,
                    direction == 1, rec_mask is not None, none if w_hr is None else w_hr,
                    w_hr is not None, layout)
            outputs.append(out)
            h_finals.append(h_n)
            c_finals.append(c_n)
        layer_input = outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=-1)
        if module.dropout > 0 and module.training and layer < module.num_layers - 1:
            layer_input = F.dropout(layer_input, module.dropout, True)
    return layer_input, torch.stack(h_finals), torch.stack(c_finals)
