// Shared by the CPU (ablated_rnn.cpp) and CUDA (ablated_rnn_cuda.cu) kernels: the variant codes
// (Variant.kind in rnn_ablations/variants.py) and the check of the packed-style batch sizes.
#pragma once

#include <torch/extension.h>

namespace rnn_ablations {

enum Kind : int64_t { kLstm = 0, kSrnn = 1, kMinusSrnn = 2, kRan = 3, kIdentityRan = 4 };

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
// of one dtype; batch_sizes as above.
inline void check_plain_inputs(const at::Tensor& proj, const at::Tensor& w_hh,
                               const at::Tensor& h0, const at::Tensor& c0,
                               const at::Tensor& batch_sizes, at::DeviceType device,
                               const char* who) {
  for (const at::Tensor* t : {&proj, &w_hh, &h0, &c0}) {
    TORCH_CHECK(t->device().type() == device, who, ": proj, w_hh, h0, c0 must be on ", device);
    TORCH_CHECK(t->scalar_type() == proj.scalar_type(), who, ": all tensors must have one dtype");
  }
  TORCH_CHECK(proj.dim() == 3 && proj.is_contiguous(), who,
              ": proj must be contiguous (T, B, (R+X)*H)");
  TORCH_CHECK(w_hh.dim() == 2 && w_hh.is_contiguous() && w_hh.size(0) % w_hh.size(1) == 0, who,
              ": w_hh must be contiguous (R*H, H)");
  TORCH_CHECK(proj.size(2) >= w_hh.size(0) && proj.size(2) % w_hh.size(1) == 0, who,
              ": proj width must be (R+X)*H");
  TORCH_CHECK(h0.is_contiguous() && c0.is_contiguous() && h0.dim() == 2 &&
                  h0.size(0) == proj.size(1) && h0.size(1) == w_hh.size(1) &&
                  c0.sizes() == h0.sizes(),
              who, ": h0/c0 must be contiguous (B, H)");
  check_batch_sizes(batch_sizes, proj.size(0), proj.size(1), who);
}

}  // namespace rnn_ablations
