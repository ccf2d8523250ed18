// The plain CPU entry points: one layer, one direction, from the input projections of all steps
// (the caller computed them at once).  Per step: one GEMM (active rows x R*H) against h_{t-1},
// then one fused element-wise pass (step_state.h); backward: per step one GEMM for dh_{t-1}, and
// the weight gradient as one GEMM after the loop.  In float32 on CPUs with AVX2 + FMA the per-step
// GEMMs run on w_hh packed once per call (vec_kernels.h, PackedB); otherwise, and for the large
// all-step GEMMs, ATen (MKL).

#include <ATen/core/Tensor.h>
#include <ATen/Dispatch.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <ATen/core/grad_mode.h>

#include <vector>

#include "layer_tensors.h"
#include "entry_points.h"
#include "step_state.h"

namespace rnn_ablations {

using cpu::LayerSizes;
using cpu::StepState;

// Weight gradient dW (M x K) = g^T (M x rows) * in (rows x K), for g (rows x M) and in (rows x K)
// with unit column stride: one GEMM over all rows, written straight into the gradient.  (in^T g
// transposed into a fresh tensor was level at the 4H x H blocks of H = 650 and up to 1.37x slower
// at smaller ones on an AMD EPYC with AVX2: benchmarks/projection_layout.py.)
at::Tensor weight_grad(const at::Tensor& g, const at::Tensor& in) { return at::mm(g.t(), in); }


std::vector<at::Tensor> plain_forward(int64_t spec, bool highway, at::Tensor proj, at::Tensor w_hh,
                                    at::Tensor h0, at::Tensor c0, at::Tensor batch_sizes,
                                    at::Tensor rec_mask, bool keep_hin, bool in_place) {
  const char* who = "rnn_ablations kernel";
  check_plain_inputs(proj, w_hh, h0, c0, batch_sizes, at::kCPU, who);
  // The kernel's own writes into views of proj are not autograd operations (the autograd
  // wrapper in dispatch.py owns the gradient).
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  at::NoGradGuard no_grad;
  const int64_t T = proj.size(0), B = proj.size(1), P = proj.size(2);
  const LayerSizes z = cpu::layer_sizes(w_hh, P);
  const int64_t H = z.H, R = z.R, X = z.X;
  StepState s;
  s.init_forward(check_kernel_spec(spec, highway, R, X, who),
                 Dims{T, B, H, R, X, P, P, in_place ? P : R * H}, batch_sizes, h0, c0, w_hh,
                 rec_mask, keep_hin, who, /*split_units=*/true);
  // Pre-activations of the recurrent blocks, turned into activations in place: in proj itself
  // when the caller allows it (its input-only blocks stay as they are), else in a copy.
  s.gates = proj.narrow(2, 0, R * H);
  if (!in_place) s.gates = X == 0 ? s.gates.clone() : s.gates.contiguous();

  AT_DISPATCH_FLOATING_TYPES(proj.scalar_type(), "rnn_ablations_forward", [&] {
    for (int64_t t = 0; t < T && s.bs[t] > 0; ++t) {
      const scalar_t* xop = X > 0 ? cpu::at_step<scalar_t>(proj, t) + R * H : nullptr;
      cpu::forward_step<scalar_t>(s, t, xop, true);
    }
  });
  auto fin = s.finish_forward(h0, c0);
  return {s.out, fin[0], fin[1], s.gates, fin[2],
          s.hin.defined() ? s.hin : at::empty({0}, proj.options())};
}

std::vector<at::Tensor> plain_backward(int64_t spec, bool highway, at::Tensor grad_out,
                                     at::Tensor grad_hn, at::Tensor grad_cn, at::Tensor gates,
                                     at::Tensor cs, at::Tensor hin, at::Tensor out, at::Tensor proj,
                                     at::Tensor w_hh, at::Tensor h0, at::Tensor c0,
                                     at::Tensor batch_sizes, at::Tensor rec_mask) {
  const char* who = "rnn_ablations kernel (backward)";
  TORCH_CHECK(proj.dim() == 3, who, ": proj must be (T, B, (R+X)*H)");
  const KernelSpec ks = check_backward_inputs(spec, highway, grad_out, grad_hn, grad_cn, cs, hin,
                                              out, w_hh, h0, c0, batch_sizes, rec_mask,
                                              proj.size(2), at::kCPU, who);
  check_like(proj, {out.size(0), out.size(1), proj.size(2)}, out, "proj", who);
  const int64_t T = proj.size(0), B = proj.size(1), P = proj.size(2);
  const LayerSizes z = cpu::layer_sizes(w_hh, P);
  const int64_t H = z.H, R = z.R, X = z.X;
  TORCH_CHECK(gates.defined() && gates.dim() == 3 && gates.size(0) == T && gates.size(1) == B &&
                  gates.size(2) == R * H && gates.stride(2) == 1 &&
                  gates.stride(1) >= R * H && (B == 0 || gates.stride(0) == B * gates.stride(1)) &&
                  gates.scalar_type() == proj.scalar_type() && gates.device().is_cpu(),
              who, ": gates must be the forward's (T, B, R*H) activations");
  StepState s;
  s.init_backward(ks, Dims{T, B, H, R, X, P, P, gates.stride(1)}, batch_sizes, gates, cs, hin,
                  out, c0, w_hh, rec_mask, grad_out, grad_hn, grad_cn, proj.options());

  AT_DISPATCH_FLOATING_TYPES(proj.scalar_type(), "rnn_ablations_backward", [&] {
    for (int64_t t = T - 1; t >= 0; --t) {
      const scalar_t* xop = X > 0 ? cpu::at_step<scalar_t>(proj, t) + R * H : nullptr;
      cpu::backward_step<scalar_t>(s, t, xop, true);
    }
  });
  // Weight gradient: one GEMM over all steps, against h_{t-1} (masked) of every row.
  at::Tensor h_prev = previous_hidden(out, h0, rec_mask, s.has_mask, 0, T);
  at::Tensor dw = weight_grad(s.dproj.view({T * B, P}).narrow(1, 0, R * H), h_prev);
  // d_w_hh in w_hh's dtype (bfloat16 where the step GEMM ran in bfloat16), computed in float32
  return {s.dproj, dw.to(w_hh.scalar_type()), s.dh, s.grad_c0()};
}

}  // namespace rnn_ablations
