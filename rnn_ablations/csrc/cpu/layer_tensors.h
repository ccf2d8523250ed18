// The tensors of one layer call of the CPU kernel (layer_plain.cpp, layer_pipelined.cpp,
// layer_directions.cpp, scan.cpp): their names, the input checks, the final states and h_{t-1}.
// It includes ATen, so it is the CPU kernel's alone; the CUDA kernels (csrc/cuda, compiled by
// NVRTC without torch headers) use the same names, and their host code
// (rnn_ablations/kernels/cuda/common.py) makes the same checks.  The variant arrives as a kernel
// spec (../common/kernel_spec.h).
//
// Names used by every kernel file (one layer, one direction; T steps, B rows, H units, R
// recurrent and X input-only blocks of H rows, see ../common/kernel_spec.h):
//   proj   (T, B, (R+X)*H)  input projections of all steps: the recurrent blocks ("xr", bias
//                           included) then the input-only blocks ("xo": content c~ = W_cx x, the
//                           highway projection hw); xo is also a (T, B, X*H) tensor of its own
//   gates  (T, B, R*H)      the recurrent blocks' activations (saved for the backward)
//   cs     (T, B, H)        the cell states c_t ("c sequence")
//   hin    (T, B, H)        with highway: h_t before the highway mix ("highway input", h_pre)
//   out    (T, B, H)        the outputs h_t
//   rec_mask (B, H)         the variational recurrent-dropout mask on h_{t-1}, or empty
//   batch_sizes (T)         int64 on the CPU, non-increasing: rows [0, batch_sizes[t]) are
//                           active at step t
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/zeros.h>
#include <ATen/OpMathType.h>
#include <ATen/TensorOperators.h>  // hp * rec_mask

#include <utility>

#include "../common/kernel_spec.h"

namespace rnn_ablations {

// w_hh (R*H, H) with H > 0, contiguous; returns H.
inline int64_t check_w_hh(const at::Tensor& w_hh, const char* who) {
  TORCH_CHECK(w_hh.dim() == 2 && w_hh.size(1) > 0 && w_hh.size(0) > 0 && w_hh.is_contiguous() &&
                  w_hh.size(0) % w_hh.size(1) == 0,
              who, ": w_hh must be contiguous (R*H, H) with H > 0, got ", w_hh.sizes());
  return w_hh.size(1);
}

// A tensor of exactly `sizes` (contiguous unless `any_strides`), of `like`'s dtype and device.
inline void check_like(const at::Tensor& t, at::IntArrayRef sizes, const at::Tensor& like,
                       const char* name, const char* who, bool any_strides = false) {
  TORCH_CHECK(t.defined() && t.sizes() == sizes && (any_strides || t.is_contiguous()), who, ": ",
              name, any_strides ? " must have shape " : " must be contiguous with shape ", sizes,
              ", got ", t.defined() ? t.sizes() : at::IntArrayRef{});
  TORCH_CHECK(t.scalar_type() == like.scalar_type() && t.device() == like.device(), who, ": ",
              name, " must have dtype ", like.scalar_type(), " on ", like.device(), ", got ",
              t.scalar_type(), " on ", t.device());
}

// A tensor the forward saved in the accumulation type of `out`'s dtype (at::toOpMathType: float
// for half and bfloat16, else the dtype itself), contiguous with out's shape and device.
inline void check_saved_acc(const at::Tensor& t, const at::Tensor& out, const char* name,
                            const char* who) {
  const at::ScalarType acc = at::toOpMathType(out.scalar_type());
  TORCH_CHECK(t.defined() && t.sizes() == out.sizes() && t.is_contiguous(), who, ": ", name,
              " must be contiguous with shape ", out.sizes());
  TORCH_CHECK((t.scalar_type() == out.scalar_type() || t.scalar_type() == acc) &&
                  t.device() == out.device(),
              who, ": ", name, " must have dtype ", out.scalar_type(), " or ", acc, " on ",
              out.device(), ", got ", t.scalar_type(), " on ", t.device());
}

// w_hh's dtype against the dtype the kernel runs (`like`: proj, x or out): the same, or bfloat16
// under float32, which runs the step GEMM in bfloat16 with float32 accumulation (step_state.h,
// library_gemm.h: Bf16StepB) while the states, the projections and the element-wise pass stay in
// float32.  The dtype of w_hh is the whole switch, so a traced graph holds it like any argument.
inline void check_w_hh_dtype(const at::Tensor& w_hh, const at::Tensor& like, const char* who) {
  const bool same = w_hh.scalar_type() == like.scalar_type();
  const bool bf16_step = w_hh.scalar_type() == at::kBFloat16 && like.scalar_type() == at::kFloat;
  TORCH_CHECK(same || bf16_step, who, ": w_hh must have the dtype of the other tensors (",
              like.scalar_type(), "), or bfloat16 with float32 ones (the step GEMM in bfloat16); "
              "got ", w_hh.scalar_type(), ": cast w_hh with .to(", like.scalar_type(), ")");
  TORCH_CHECK(w_hh.device() == like.device(), who, ": w_hh must be on ", like.device(), ", got ",
              w_hh.device());
}

// batch_sizes: a CPU int64 tensor of length T, non-increasing, each in [0, B].
inline void check_batch_sizes(const at::Tensor& batch_sizes, int64_t T, int64_t B,
                              const char* who) {
  TORCH_CHECK(batch_sizes.device().is_cpu() && batch_sizes.scalar_type() == at::kLong &&
                  batch_sizes.dim() == 1 && batch_sizes.size(0) == T,
              who, ": batch_sizes must be a CPU int64 tensor of length T = ", T);
  const int64_t* bs = batch_sizes.data_ptr<int64_t>();
  for (int64_t t = 0; t < T; ++t) {
    TORCH_CHECK(bs[t] >= 0 && bs[t] <= B && (t == 0 || bs[t] <= bs[t - 1]), who,
                ": batch_sizes must be non-increasing and <= B = ", B);
  }
}

// The arguments of the plain entry points (forward / backward from the input projections), on
// `device` (CPU or CUDA): proj (T, B, (R+X)*H), w_hh (R*H, H), h0 and c0 (B, H), all contiguous,
// of one dtype (on the CPU w_hh may be bfloat16 with float32 ones: check_w_hh_dtype); batch_sizes
// as above.
inline void check_plain_inputs(const at::Tensor& proj, const at::Tensor& w_hh,
                               const at::Tensor& h0, const at::Tensor& c0,
                               const at::Tensor& batch_sizes, at::DeviceType device,
                               const char* who) {
  for (const at::Tensor* t : {&proj, &w_hh, &h0, &c0}) {
    TORCH_CHECK(t->device().type() == device, who, ": proj, w_hh, h0, c0 must be on ", device);
    if (t == &w_hh && device == at::kCPU) continue;  // checked below
    TORCH_CHECK(t->scalar_type() == proj.scalar_type(), who, ": all tensors must have one dtype");
  }
  if (device == at::kCPU) check_w_hh_dtype(w_hh, proj, who);
  TORCH_CHECK(proj.dim() == 3 && proj.is_contiguous(), who,
              ": proj must be contiguous (T, B, (R+X)*H)");
  check_w_hh(w_hh, who);
  TORCH_CHECK(proj.size(2) >= w_hh.size(0) && proj.size(2) % w_hh.size(1) == 0, who,
              ": proj width must be (R+X)*H");
  TORCH_CHECK(h0.is_contiguous() && c0.is_contiguous() && h0.dim() == 2 &&
                  h0.size(0) == proj.size(1) && h0.size(1) == w_hh.size(1) &&
                  c0.sizes() == h0.sizes(),
              who, ": h0/c0 must be contiguous (B, H)");
  check_batch_sizes(batch_sizes, proj.size(0), proj.size(1), who);
}

// Row b of seq (T, B, H) at its last active step, in init's dtype; a row with no step keeps
// init's row (device-agnostic ATen).
inline at::Tensor last_step_rows(const at::Tensor& seq, const at::Tensor& init, const int64_t* bs) {
  const int64_t T = seq.size(0);
  at::Tensor last = init.clone();
  for (int64_t t = 0; t < T; ++t) {
    const int64_t n = bs[t];
    const int64_t n_next = t + 1 < T ? bs[t + 1] : 0;
    if (n > n_next) last.narrow(0, n_next, n - n_next).copy_(seq[t].narrow(0, n_next, n - n_next));
  }
  return last;
}

// Final states (h_n, c_n): row b's state after its last active step.  A cell without memory (the
// S-RNN) returns c_n = h_n.
inline std::pair<at::Tensor, at::Tensor> final_states(bool memory, const at::Tensor& out,
                                               const at::Tensor& cs, const at::Tensor& h0,
                                               const at::Tensor& c0, const int64_t* bs) {
  at::Tensor h_n = last_step_rows(out, h0, bs);
  return {h_n, memory ? last_step_rows(cs, c0, bs) : h_n.clone()};
}

// h_{t-1} (masked) for steps [t0, t0 + len), as one (len*B, H) matrix.
inline at::Tensor previous_hidden(const at::Tensor& out, const at::Tensor& h0, const at::Tensor& rec_mask,
                           bool has_mask, int64_t t0, int64_t len) {
  const int64_t B = h0.size(0), H = h0.size(1);
  if (len == 0) return at::zeros({0, H}, h0.options());
  at::Tensor hp;
  if (t0 > 0) {
    hp = out.narrow(0, t0 - 1, len);
  } else {
    hp = len > 1 ? at::cat({h0.unsqueeze(0), out.narrow(0, 0, len - 1)}, 0) : h0.unsqueeze(0);
  }
  if (has_mask) hp = hp * rec_mask.unsqueeze(0);
  return hp.reshape({len * B, H});
}

// The arguments of a backward entry point: what the matching forward returned, the incoming
// gradients, and the forward's inputs.  T, B, H, R, X come from `out` and `w_hh`; every tensor
// the backward indexes is checked against them (the plain and pipelined backward differ only in
// `gates`' row stride and in proj vs. x/xo, checked by the caller).  Returns the decoded spec.
inline KernelSpec check_backward_inputs(int64_t spec, bool highway, const at::Tensor& grad_out,
                                  const at::Tensor& grad_hn, const at::Tensor& grad_cn,
                                  const at::Tensor& cs, const at::Tensor& hin,
                                  const at::Tensor& out, const at::Tensor& w_hh,
                                  const at::Tensor& h0, const at::Tensor& c0,
                                  const at::Tensor& batch_sizes, const at::Tensor& rec_mask,
                                  int64_t P, at::DeviceType device, const char* who) {
  const int64_t H = check_w_hh(w_hh, who);
  TORCH_CHECK(out.dim() == 3 && out.size(2) == H && out.is_contiguous() &&
                  out.device().type() == device,
              who, ": out must be the forward's contiguous (T, B, H) output on ", device);
  TORCH_CHECK(P > 0 && P % H == 0 && P >= w_hh.size(0), who,
              ": the projection width must be (R+X)*H, got ", P);
  const KernelSpec ks = check_kernel_spec(spec, highway, w_hh.size(0) / H,
                                          P / H - w_hh.size(0) / H, who);
  const int64_t T = out.size(0), B = out.size(1);
  if (device == at::kCPU) check_w_hh_dtype(w_hh, out, who);
  else check_like(w_hh, w_hh.sizes(), out, "w_hh", who);
  check_like(grad_out, out.sizes(), out, "grad_out", who, true);  // the incoming gradients: any strides
  // cs and hin are kept in the accumulation type (float for half/bfloat16 on CUDA).  An
  // inference forward (keep_hin=False) keeps neither: say so rather than "wrong shape".
  TORCH_CHECK(device != at::kCPU || cs.numel() > 0 || out.numel() == 0, who,
              ": cs is empty: the forward ran as inference (keep_hin=False) and kept nothing for "
              "a backward; run the forward with keep_hin=True to differentiate it");
  check_saved_acc(cs, out, "cs", who);
  check_like(grad_hn, {B, H}, out, "grad_hn", who, true);
  check_like(grad_cn, {B, H}, out, "grad_cn", who, true);
  check_like(h0, {B, H}, out, "h0", who);
  check_like(c0, {B, H}, out, "c0", who);
  if (highway) check_saved_acc(hin, out, "hin (highway inputs)", who);
  if (rec_mask.defined() && rec_mask.numel() > 0) check_like(rec_mask, {B, H}, out, "rec_mask", who);
  check_batch_sizes(batch_sizes, T, B, who);
  return ks;
}

}  // namespace rnn_ablations
