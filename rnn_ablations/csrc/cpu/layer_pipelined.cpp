// The pipelined CPU entry points: one layer, one direction, from the layer input.  The input
// projection (forward) and the input / weight gradients (backward) are computed here, chunk by
// chunk, on the second core while the first runs the recurrence (pipeline.h).  x (T, B, D) is the
// layer input; w_ih ((R+X)*H, D); bias (R*H) or empty (the input-only blocks have no bias).

#include <ATen/core/Tensor.h>
#include <ATen/Dispatch.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/zeros_like.h>

#include <algorithm>
#include <vector>

#include "layer_tensors.h"
#include "entry_points.h"
#include "pipeline.h"
#include "step_state.h"

namespace rnn_ablations {

using cpu::LayerSizes;
using cpu::Pipeline;
using cpu::StepState;

namespace {

void check_pipelined_inputs(const at::Tensor& x, const at::Tensor& w_ih, const at::Tensor& bias,
                        const at::Tensor& w_hh, const at::Tensor& h0, const at::Tensor& c0,
                        const at::Tensor& batch_sizes) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 3 && x.is_contiguous(),
              "rnn_ablations kernel: x must be a contiguous CPU tensor (T, B, D)");
  const int64_t H = check_w_hh(w_hh, "rnn_ablations kernel");
  TORCH_CHECK(w_ih.dim() == 2 && w_ih.is_contiguous() && w_ih.size(1) == x.size(2) &&
                  w_ih.size(0) >= w_hh.size(0) && w_ih.size(0) % H == 0,
              "rnn_ablations kernel: w_ih must be contiguous ((R+X)*H, D)");
  TORCH_CHECK(bias.numel() == 0 || (bias.dim() == 1 && bias.size(0) == w_hh.size(0) &&
                                    bias.is_contiguous()),
              "rnn_ablations kernel: bias must be empty or (R*H,)");
  TORCH_CHECK(h0.is_contiguous() && c0.is_contiguous() && h0.dim() == 2 && c0.dim() == 2 &&
                  h0.size(0) == x.size(1) && h0.size(1) == H && c0.sizes() == h0.sizes(),
              "rnn_ablations kernel: h0/c0 must be contiguous (B, H)");
  for (const at::Tensor* t : {&w_ih, &h0, &c0}) {
    TORCH_CHECK(t->scalar_type() == x.scalar_type(), "rnn_ablations kernel: all tensors must have the same dtype");
  }
  check_w_hh_dtype(w_hh, x, "rnn_ablations kernel");
  if (bias.numel()) TORCH_CHECK(bias.scalar_type() == x.scalar_type(), "rnn_ablations kernel: bias dtype");
  check_batch_sizes(batch_sizes, x.size(0), x.size(1), "rnn_ablations kernel");
}

}  // namespace

std::vector<at::Tensor> pipelined_forward(int64_t spec, bool highway, at::Tensor x, at::Tensor w_ih,
                                      at::Tensor bias, at::Tensor w_hh, at::Tensor h0,
                                      at::Tensor c0, at::Tensor batch_sizes, at::Tensor rec_mask,
                                      bool keep_hin, int64_t chunk) {
  const char* who = "rnn_ablations kernel";
  check_pipelined_inputs(x, w_ih, bias, w_hh, h0, c0, batch_sizes);
  const int64_t T = x.size(0), B = x.size(1), D = x.size(2), P = w_ih.size(0);
  const LayerSizes z = cpu::layer_sizes(w_hh, P);
  const int64_t H = z.H, R = z.R, X = z.X, RH = R * H, XH = X * H;
  StepState s;
  s.init_forward(check_kernel_spec(spec, highway, R, X, who), Dims{T, B, H, R, X, P, XH, RH},
                 batch_sizes, h0, c0, w_hh, rec_mask, keep_hin, who);
  s.gates = at::empty({T, B, RH}, x.options());
  at::Tensor xo = X > 0 ? at::empty({T, B, XH}, x.options()) : at::empty({0}, x.options());
  const bool has_bias = bias.numel() > 0;
  const at::Tensor w_rec_t = w_ih.narrow(0, 0, RH).t();
  const at::Tensor w_xo_t = X > 0 ? w_ih.narrow(0, RH, XH).t() : at::Tensor();

  const int64_t C = cpu::auto_chunk(T, B, chunk);
  const int64_t chunks = (T + C - 1) / C;
  auto project = [&](int64_t k) {
    const int64_t t0 = k * C, len = std::min(C, T - t0), rows = len * B;
    at::Tensor x2 = x.narrow(0, t0, len).view({rows, D});
    at::Tensor g2 = s.gates.narrow(0, t0, len).view({rows, RH});
    if (has_bias) at::addmm_out(g2, bias, x2, w_rec_t); else at::mm_out(g2, x2, w_rec_t);
    if (X > 0) {
      at::Tensor o2 = xo.narrow(0, t0, len).view({rows, XH});
      at::mm_out(o2, x2, w_xo_t);
    }
  };
  Pipeline pipe(chunks);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "rnn_ablations_pipelined_forward", [&] {
    auto recurrence = [&] {
      for (int64_t k = 0; k < chunks; ++k) {
        // make sure chunk k is projected: claim it if nobody has, else wait for role 1
        while (!pipe.done[k].load(std::memory_order_acquire)) {
          int64_t j = pipe.next.load();
          if (j <= k) {
            if (pipe.next.compare_exchange_weak(j, j + 1)) {
              project(j);
              pipe.done[j].store(1, std::memory_order_release);
            }
          } else if (!pipe.wait(k)) {
            return;
          }
        }
        const int64_t t1 = std::min(T, (k + 1) * C);
        for (int64_t t = k * C; t < t1; ++t) {
          if (s.bs[t] == 0) return;
          const scalar_t* xop = X > 0 ? cpu::at_step<scalar_t>(xo, t) : nullptr;
          cpu::forward_step<scalar_t>(s, t, xop, false);
        }
      }
    };
    auto projector = [&] {
      for (int64_t j = pipe.next.fetch_add(1); j < chunks; j = pipe.next.fetch_add(1)) {
        if (pipe.failed.load()) return;
        project(j);
        pipe.done[j].store(1, std::memory_order_release);
      }
    };
    pipe.run(recurrence, projector);
  });
  auto fin = s.finish_forward(h0, c0);
  return {s.out, fin[0], fin[1], s.gates, fin[2],
          s.hin.defined() ? s.hin : at::empty({0}, x.options()), xo};
}

std::vector<at::Tensor> pipelined_backward(int64_t spec, bool highway, at::Tensor grad_out,
                                       at::Tensor grad_hn, at::Tensor grad_cn, at::Tensor gates,
                                       at::Tensor cs, at::Tensor hin, at::Tensor xo, at::Tensor out,
                                       at::Tensor x, at::Tensor w_ih, at::Tensor w_hh,
                                       at::Tensor h0, at::Tensor c0, at::Tensor batch_sizes,
                                       at::Tensor rec_mask, bool need_dx, bool need_dw,
                                       bool need_bias, int64_t chunk) {
  const char* who = "rnn_ablations kernel (pipelined backward)";
  TORCH_CHECK(w_ih.dim() == 2, who, ": w_ih must be ((R+X)*H, D)");
  const KernelSpec ks = check_backward_inputs(spec, highway, grad_out, grad_hn, grad_cn, cs, hin,
                                              out, w_hh, h0, c0, batch_sizes, rec_mask,
                                              w_ih.size(0), at::kCPU, who);
  {
    const int64_t T_ = out.size(0), B_ = out.size(1), H_ = w_hh.size(1);
    const int64_t RH_ = w_hh.size(0), XH_ = w_ih.size(0) - RH_;
    TORCH_CHECK(x.dim() == 3, who, ": x must be (T, B, D)");
    check_like(x, {T_, B_, x.size(2)}, out, "x", who);
    check_like(w_ih, {RH_ + XH_, x.size(2)}, out, "w_ih", who);
    check_like(gates, {T_, B_, RH_}, out, "gates", who);
    if (XH_ > 0) check_like(xo, {T_, B_, XH_}, out, "xo (input-only projections)", who);
    (void)H_;
  }
  const int64_t T = x.size(0), B = x.size(1), D = x.size(2), P = w_ih.size(0);
  const LayerSizes z = cpu::layer_sizes(w_hh, P);
  const int64_t H = z.H, R = z.R, X = z.X, RH = R * H;
  const bool has_mask = rec_mask.defined() && rec_mask.numel() > 0;
  StepState s;
  s.init_backward(ks, Dims{T, B, H, R, X, P, X * H, RH}, batch_sizes, gates, cs, hin, out, c0,
                  w_hh, rec_mask, grad_out, grad_hn, grad_cn, x.options());
  at::Tensor dx = need_dx ? at::empty({T, B, D}, x.options()) : at::empty({0}, x.options());

  // Tasks per chunk, taken in the order the recurrence finishes chunks (last chunk first).  When
  // the input gradient is needed, it is the pipelined task (its cost is close to the recurrence's)
  // and the weight gradients are two GEMMs over all steps on both threads afterwards; otherwise
  // the weight gradients are pipelined, each role accumulating into its own buffers.
  std::vector<int> task_types;  // 0: dx, 1: d_w_ih, 2: d_w_hh
  // (The weight gradients are not pipelined as well when the input gradient is needed: that
  // schedule is slower, and per-role accumulators would make the sum order depend on timing.)
  const bool pipe_dw = need_dw && !need_dx;
  if (need_dx) task_types.push_back(0);
  if (pipe_dw) { task_types.push_back(1); task_types.push_back(2); }
  const int64_t per = static_cast<int64_t>(task_types.size());
  const int64_t C = cpu::auto_chunk(T, B, chunk);
  const int64_t chunks = (T + C - 1) / C;
  const int64_t tasks = chunks * per;
  at::Tensor dw_ih[2], dw_hh[2];
  auto do_task = [&](int64_t q, int role) {
    const int64_t k = chunks - 1 - q / per;
    const int64_t t0 = k * C, len = std::min(C, T - t0), rows = len * B;
    at::Tensor dp = s.dproj.narrow(0, t0, len).view({rows, P});
    switch (task_types[q % per]) {
      case 0: {
        at::Tensor dx2 = dx.narrow(0, t0, len).view({rows, D});
        at::mm_out(dx2, dp, w_ih);
        break;
      }
      case 1: {
        at::Tensor x2 = x.narrow(0, t0, len).view({rows, D});
        if (dw_ih[role].defined()) dw_ih[role].addmm_(dp.t(), x2);
        else dw_ih[role] = at::mm(dp.t(), x2);
        break;
      }
      default: {
        at::Tensor hp = previous_hidden(out, h0, rec_mask, has_mask, t0, len);
        at::Tensor dr = dp.narrow(1, 0, RH).t();
        if (dw_hh[role].defined()) dw_hh[role].addmm_(dr, hp);
        else dw_hh[role] = at::mm(dr, hp);
        break;
      }
    }
  };
  Pipeline pipe(chunks);
  auto take_tasks = [&](int role) {
    for (int64_t q = pipe.next.fetch_add(1); q < tasks; q = pipe.next.fetch_add(1)) {
      if (!pipe.wait(chunks - 1 - q / per)) return;
      do_task(q, role);
    }
  };
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "rnn_ablations_pipelined_backward", [&] {
    auto recurrence = [&] {
      for (int64_t k = chunks - 1; k >= 0; --k) {
        const int64_t t0 = k * C, t1 = std::min(T, t0 + C);
        for (int64_t t = t1 - 1; t >= t0; --t) {
          const scalar_t* xop = X > 0 ? cpu::at_step<scalar_t>(xo, t) : nullptr;
          cpu::backward_step<scalar_t>(s, t, xop, false);
        }
        pipe.done[k].store(1, std::memory_order_release);
      }
      take_tasks(0);
    };
    pipe.run(recurrence, [&] { take_tasks(1); });
  });

  at::Tensor g_w_ih, g_w_hh;
  if (need_dw && !pipe_dw) {  // all steps at once, on all threads
    at::Tensor dp = s.dproj.view({T * B, P});
    g_w_ih = weight_grad(dp, x.view({T * B, D}));
    g_w_hh = weight_grad(dp.narrow(1, 0, RH), previous_hidden(out, h0, rec_mask, has_mask, 0, T));
  } else if (need_dw) {
    auto combine = [](at::Tensor* acc, const at::Tensor& like) {  // T = 0: no role took a task
      if (!acc[0].defined()) return acc[1].defined() ? acc[1] : at::zeros_like(like);
      return acc[1].defined() ? acc[0].add_(acc[1]) : acc[0];
    };
    g_w_ih = combine(dw_ih, w_ih);
    g_w_hh = combine(dw_hh, w_hh);
  }
  at::Tensor g_b = need_bias ? s.dproj.view({T * B, P}).narrow(1, 0, RH).sum(0)
                             : at::empty({0}, x.options());
  at::Tensor g_c0 = s.grad_c0();
  if (!need_dw) {
    g_w_ih = at::empty({0}, x.options());
    g_w_hh = at::empty({0}, x.options());
  }
  // d_w_hh in w_hh's dtype (bfloat16 where the step GEMM ran in bfloat16), computed in float32
  return {dx, g_w_ih, g_b, need_dw ? g_w_hh.to(w_hh.scalar_type()) : g_w_hh, s.dh, g_c0};
}

}  // namespace rnn_ablations
