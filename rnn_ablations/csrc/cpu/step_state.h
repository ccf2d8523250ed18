// One step of the CPU recurrence (forward and backward), shared by the plain (layer_plain.cpp)
// and the pipelined (layer_pipelined.cpp) entry points: the state a layer call carries
// (StepState), the per-step GEMM against h_{t-1} (packed w_hh or ATen) and the element-wise pass
// of vec_kernels.h, split over rows.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/zeros.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <type_traits>
#include <vector>

#include "layer_tensors.h"
#include "library_gemm.h"
#include "vec_kernels.h"

namespace rnn_ablations {
namespace cpu {

// The block sizes of a layer call: H from w_hh (R*H, H), R its blocks, X = P/H - R the input-only
// blocks of a projection of width P (checked against the spec by check_kernel_spec).
struct LayerSizes {
  int64_t H, R, X;
};
inline LayerSizes layer_sizes(const at::Tensor& w_hh, int64_t proj_width) {
  const int64_t H = w_hh.size(1), R = w_hh.size(0) / H;
  return {H, R, proj_width / H - R};
}

// Rows per task of the element-wise pass: one task when the step is small (a parallel region
// costs more than it saves), otherwise the rows split evenly over the threads.
inline int64_t grain_rows(int64_t rows, int64_t hidden) {
  const int64_t threads = std::max<int64_t>(1, at::get_num_threads());
  if (threads == 1 || rows * hidden < 16384) return std::max<int64_t>(rows, 1);
  return std::max<int64_t>(1, (rows + threads - 1) / threads);
}

// Step t of a (T, ...) tensor whose rows within a step are contiguous: a pointer, not a tensor
// (a step of a small layer costs a few microseconds, about what ATen's select and narrow would
// add to it).
template <typename scalar_t>
inline scalar_t* at_step(const at::Tensor& x, int64_t t) {
  return x.data_ptr<scalar_t>() + t * x.stride(0);
}

// ---------------------------------------------------------------------------------------------
// One step of the recurrence, shared by the plain and the pipelined entry points.
struct StepState {
  KernelSpec ks;  // the variant's element-wise rules and block layout (common/kernel_spec.h)
  Dims d;
  const int64_t* bs;
  bool has_mask;
  at::Tensor gates, out, cs, hin, h0, c0, w_hh, w_t, rec_mask, hp_buf;  // forward
  at::Tensor grad_out, dproj, dh, dc;                                     // backward
  PackedB packed;  // w_hh packed for the step GEMM (float32, on a path with a packed kernel)
  // w_hh packed by MKL for the step GEMM (float32, where the per-shape choice takes the
  // library: library_gemm.h); when defined, neither `packed` nor `packed_blocks` is.
  LibraryPackedB library;
  // w_hh in bfloat16 (given so: the step GEMM in bfloat16 with float32 accumulation,
  // library_gemm.h); when defined, no other packed form is.
  Bf16StepB bf16;
  // The forward's w_hh packed per recurrent block (R of them, each H x H, its own panels), so
  // that the hidden units of a step can be split over threads: each thread computes every gate
  // column of its units and then their element-wise pass, one parallel region per step
  // (forward_step).  Empty where `packed` is used instead (the backward, double, ATen's GEMM).
  std::vector<PackedB> packed_blocks;
  // Inference (the forward of a call that keeps nothing for a backward): the memory cells c_t
  // live in one (B, H) buffer, updated in place step after step (a row that has ended keeps its
  // last c_t there, which is its c_n), instead of a (T, B, H) tensor that only a backward reads.
  bool rolling_c = false;
  // The forward's spec, sizes, buffers and inputs, with w_hh packed for the step GEMM (the
  // caller sets `gates`).  Checks the recurrent-dropout mask.
  // `keep`: the call feeds a backward (training), so c_t of every step (and, with the highway,
  // h_t before the mix) are kept; false = inference (rolling_c, no hin).
  // `split_units`: the caller runs every step with `parallel` (the plain kernel), so the steps
  // may be split by hidden units (packed_blocks) where that pays (see pack).
  void init_forward(const KernelSpec& ks_, const Dims& d_, const at::Tensor& batch_sizes,
                    const at::Tensor& h0_, const at::Tensor& c0_, const at::Tensor& w_hh_,
                    const at::Tensor& rec_mask_, bool keep, const char* who,
                    bool split_units = false) {
    ks = ks_; d = d_; bs = batch_sizes.data_ptr<int64_t>();
    has_mask = rec_mask_.defined() && rec_mask_.numel() > 0;
    if (has_mask) check_like(rec_mask_, h0_.sizes(), h0_, "rec_mask", who);
    const auto opt = h0_.options();
    // Every active row of out[t] is written by its step; finish_forward zeroes the others.
    out = at::empty({d.T, d.B, d.H}, opt);
    rolling_c = !keep;
    // A cell without memory writes no c_t (c_n is h_n): its saved cs is zeros, so that every
    // result is a function of the inputs (what torch.library.opcheck and torch.compile assume).
    cs = rolling_c   ? c0_.clone(at::MemoryFormat::Contiguous)
         : ks.memory ? at::empty({d.T, d.B, d.H}, opt)
                     : at::zeros({d.T, d.B, d.H}, opt);
    hin = (ks.highway && keep) ? at::empty({d.T, d.B, d.H}, opt) : at::Tensor();
    hp_buf = has_mask ? at::empty({d.B, d.H}, opt) : at::Tensor();
    h0 = h0_; c0 = c0_; w_hh = w_hh_; w_t = w_hh_.t(); rec_mask = rec_mask_;
    pack(false, split_units);
  }
  // The backward's spec, sizes, the forward's saved tensors, the incoming gradients (dh and dc
  // start as the gradients of h_n and c_n) and d_proj (T, B, P), with w_hh packed for the step
  // GEMM.  Shared by the plain and the pipelined backward (checked by check_backward_inputs).
  void init_backward(const KernelSpec& ks_, const Dims& d_, const at::Tensor& batch_sizes,
                     const at::Tensor& gates_, const at::Tensor& cs_, const at::Tensor& hin_,
                     const at::Tensor& out_, const at::Tensor& c0_, const at::Tensor& w_hh_,
                     const at::Tensor& rec_mask_, const at::Tensor& grad_out_,
                     const at::Tensor& grad_hn, const at::Tensor& grad_cn,
                     const at::TensorOptions& opt) {
    ks = ks_; d = d_; bs = batch_sizes.data_ptr<int64_t>();
    has_mask = rec_mask_.defined() && rec_mask_.numel() > 0;
    gates = gates_; cs = cs_; hin = hin_; out = out_; c0 = c0_; w_hh = w_hh_;
    rec_mask = rec_mask_; grad_out = grad_out_.contiguous();
    pack(true);
    // Every element of an active row is written by the element-wise pass; only the rows that
    // are inactive at a step (padding) are zeroed there.
    dproj = at::empty({d.T, d.B, d.proj_stride}, opt);
    dh = grad_hn.clone().contiguous();
    dc = grad_cn.clone().contiguous();
    if (!ks.memory) dh.add_(dc);  // c_n is a copy of h_n for a cell without memory
  }
  // After the forward's last step: zero the rows of out that no step wrote (a row's steps past
  // its length, and the steps after the loop stopped at a batch size of 0), and return {h_n,
  // c_n, cs as the forward returns it (empty in inference)}.
  std::vector<at::Tensor> finish_forward(const at::Tensor& h0_, const at::Tensor& c0_) {
    for (int64_t t = 0; t < d.T; ++t) {
      const int64_t n = bs[t];
      if (n == 0) {
        out.narrow(0, t, d.T - t).zero_();
        break;
      }
      if (n < d.B) out[t].narrow(0, n, d.B - n).zero_();
    }
    if (!rolling_c) {
      auto fin = final_states(ks.memory, out, cs, h0_, c0_, bs);
      return {fin.first, fin.second, cs};
    }
    // c_n is the rolling buffer itself (each row's last update is its last step).
    at::Tensor h_n = last_step_rows(out, h0_, bs);
    return {h_n, ks.memory ? cs : h_n.clone(), at::empty({0}, out.options())};
  }
  // dL/dc_0 as returned: zero for a cell without memory (its c is h, whose gradient is in dh).
  at::Tensor grad_c0() {
    if (!ks.memory) dc.zero_();
    return dc;
  }
  // Pack w_hh for the forward (B = w_hh^T) or the backward (B = w_hh) step GEMM.
  // The forward packs w_hh per recurrent block (packed_blocks) when its steps will be split by
  // hidden units: `split_units`, more than one thread and not already inside a parallel region
  // (the concurrent directions run each direction on one thread), and at least 8 panels per
  // block.  With fewer, the unit chunks are unbalanced and each block's partial last panel costs
  // a larger share of padding, so the whole product split by panels is used.
  void pack(bool backward, bool split_units = false) {
    // RNN_ABLATIONS_PACKED_GEMM=0 takes ATen's GEMM instead (for A/B timing and the tests).
    const char* env = std::getenv("RNN_ABLATIONS_PACKED_GEMM");
    const bool aten = env && env[0] == '0';
    if (w_hh.scalar_type() == at::kBFloat16) {  // the step GEMM in bfloat16
      bf16 = bf16_step_b(w_hh.contiguous(), !backward, d.B, !aten);
      return;
    }
    if (aten) return;
    // MKL's packed GEMM where the per-shape choice says (set_library_step_gemm)
    if (w_hh.scalar_type() == at::kFloat && w_hh.is_contiguous() &&
        library_step_applies(!backward && rolling_c, d.B, backward ? d.H : d.R * d.H,
                             backward ? d.R * d.H : d.H)) {
      library = library_pack_b(w_hh, !backward, d.B);
      return;
    }
    if (w_hh.scalar_type() == at::kFloat && packed_gemm_available()) {
      const int64_t width = packed_gemm_panel();
      const bool by_units = !backward && split_units && at::get_num_threads() > 1 &&
                            !at::in_parallel_region() && (d.H + width - 1) / width >= 8;
      packed_blocks.clear();
      if (by_units) {
        for (int64_t blk = 0; blk < d.R; ++blk) {
          packed_blocks.push_back(pack_b(w_hh.narrow(0, blk * d.H, d.H), true));
        }
      } else {
        packed = pack_b(w_hh, !backward);
      }
    }
  }
};

// gates (n x N, row stride ldc) [+]= A (n x K) * packed w_hh; false when no packed weight
// applies (double, or the portable path): the caller then uses ATen.  A bfloat16 w_hh always
// takes its own GEMM here (float32 only: check_w_hh_dtype).
template <typename scalar_t, bool Acc>
bool step_gemm(StepState& s, int64_t n, const scalar_t* A, int64_t lda, scalar_t* C, int64_t ldc,
               bool parallel) {
  if constexpr (std::is_same<scalar_t, float>::value) {
    if (s.bf16.defined()) {
      bf16_step_gemm(Acc, n, A, lda, s.bf16, C, ldc);
      return true;
    }
    if (s.library.defined()) {
      library_gemm(Acc, n, A, lda, s.library, C, ldc);
      return true;
    }
    if (s.packed.defined()) {
      gemm_packed(Acc, n, A, lda, s.packed, C, ldc, parallel);
      return true;
    }
  }
  (void)s; (void)n; (void)A; (void)lda; (void)C; (void)ldc; (void)parallel;
  return false;
}

// Forward step t: gates[t] holds the pre-activations of the recurrent blocks (input projection
// and bias); add h_{t-1} W_hh^T for the active rows, then the element-wise pass.  `parallel`
// lets the step use the threads (false inside a pipeline role, which owns one core).
// With w_hh packed per block (float32, AVX2/AVX-512): the hidden units are split into chunks of
// whole panels, and each chunk's thread computes the chunk's columns of every gate block and then
// the element-wise pass of those units for all rows: one parallel region per step, and no
// thread waits between the product and the element-wise pass.  Otherwise the product (split by
// panels) and the element-wise pass (split by rows) are two regions.
template <typename scalar_t>
void forward_step(StepState& s, int64_t t, const scalar_t* xo_t, bool parallel) {
  const int64_t n = s.bs[t];
  // h_{t-1} of the active rows (n x H, contiguous rows), masked into hp_buf with recurrent dropout
  const scalar_t* a = t == 0 ? s.h0.data_ptr<scalar_t>() : at_step<scalar_t>(s.out, t - 1);
  if (s.has_mask) {
    at::Tensor hp = s.hp_buf.narrow(0, 0, n);
    at::mul_out(hp, (t == 0 ? s.h0 : s.out[t - 1]).narrow(0, 0, n), s.rec_mask.narrow(0, 0, n));
    a = hp.data_ptr<scalar_t>();
  }
  scalar_t* gp = at_step<scalar_t>(s.gates, t);
  // In inference c_{t-1} and c_t share the rolling buffer (element-wise, each unit read before
  // it is written).
  const scalar_t* cpp = s.rolling_c ? s.cs.data_ptr<scalar_t>()
                        : t == 0    ? s.c0.data_ptr<scalar_t>()
                                    : at_step<scalar_t>(s.cs, t - 1);
  scalar_t* cp = s.rolling_c ? s.cs.data_ptr<scalar_t>() : at_step<scalar_t>(s.cs, t);
  scalar_t* hp = at_step<scalar_t>(s.out, t);
  scalar_t* hinp = s.hin.defined() ? at_step<scalar_t>(s.hin, t) : nullptr;
  if constexpr (std::is_same<scalar_t, float>::value) {
    if (!s.packed_blocks.empty()) {
      const int64_t H = s.d.H, R = s.d.R, panels = s.packed_blocks[0].panels();
      const int64_t width = s.packed_blocks[0].panel;
      const int64_t threads = parallel ? at::get_num_threads() : 1;
      const int64_t chunks = (threads > 1 && worth_splitting(n, R * H, H))
                                 ? std::min<int64_t>(threads, panels) : 1;
      auto body = [&](int64_t c0, int64_t c1) {
        for (int64_t c = c0; c < c1; ++c) {
          const int64_t p0 = c * panels / chunks, p1 = (c + 1) * panels / chunks;
          if (p0 == p1) continue;
          for (int64_t blk = 0; blk < R; ++blk) {
            gemm_packed_range(true, n, a, H, s.packed_blocks[blk], gp + blk * H,
                              s.d.gates_stride, p0, p1);
          }
          pointwise_forward(s.ks, s.d, gp, xo_t, cpp, cp, hp, hinp, 0, n, p0 * width,
                            std::min(p1 * width, H));
        }
      };
      if (chunks > 1) {
        at::parallel_for(0, chunks, 1, body);
        count_unit_split_step();
      } else {
        body(0, 1);
      }
      return;
    }
  }
  if (!step_gemm<scalar_t, true>(s, n, a, s.d.H, gp, s.d.gates_stride, parallel)) {
    const at::Tensor h_prev = at::from_blob(const_cast<scalar_t*>(a), {n, s.d.H},
                                            s.out.options());
    s.gates[t].narrow(0, 0, n).addmm_(h_prev, s.w_t);
  }
  auto body = [&](int64_t r0, int64_t r1) {
    pointwise_forward(s.ks, s.d, gp, xo_t, cpp, cp, hp, hinp, r0, r1, int64_t{0}, s.d.H);
  };
  if (parallel) at::parallel_for(0, n, grain_rows(n, s.d.H), body);
  else body(0, n);
}

// Backward step t: add dL/dout_t to the carried dh, element-wise pass into dproj[t], then
// dh_{t-1} = dproj[t] W_hh for the active rows.  Inactive rows of dproj[t] are zeroed.
template <typename scalar_t>
void backward_step(StepState& s, int64_t t, const scalar_t* xo_t, bool parallel) {
  const int64_t n = s.bs[t], B = s.d.B, R = s.d.R, H = s.d.H, X = s.d.X;
  const int64_t P = s.d.proj_stride;
  scalar_t* dap = at_step<scalar_t>(s.dproj, t);  // (B, P), contiguous
  if (n < B) std::fill(dap + n * P, dap + B * P, scalar_t(0));
  if (n == 0) return;
  const scalar_t* gop = at_step<scalar_t>(s.grad_out, t);  // (B, H), contiguous
  const scalar_t* gp = at_step<scalar_t>(s.gates, t);
  const bool memory = s.ks.memory;
  const scalar_t* ccur = memory ? at_step<scalar_t>(s.cs, t) : nullptr;
  const scalar_t* cprev = !memory ? nullptr
                          : t == 0 ? s.c0.data_ptr<scalar_t>()
                                   : at_step<scalar_t>(s.cs, t - 1);
  const scalar_t* hinp = s.ks.highway ? at_step<scalar_t>(s.hin, t) : nullptr;
  scalar_t* dhp = s.dh.data_ptr<scalar_t>();
  scalar_t* dcp = s.dc.data_ptr<scalar_t>();
  scalar_t* dxop = X > 0 ? dap + R * H : nullptr;
  auto body = [&](int64_t r0, int64_t r1) {
    // dL/dh_t: the carried gradient plus dL/dout_t, for this task's rows
    for (int64_t i = r0 * H; i < r1 * H; ++i) dhp[i] += gop[i];
    pointwise_backward(s.ks, s.d, gp, xo_t, ccur, cprev, hinp, dhp, dcp, dap, dxop, r0, r1);
  };
  if (parallel) at::parallel_for(0, n, grain_rows(n, H), body);
  else body(0, n);
  if (!step_gemm<scalar_t, false>(s, n, dap, P, dhp, H, parallel)) {
    at::Tensor dh_n = s.dh.narrow(0, 0, n);
    at::mm_out(dh_n, s.dproj[t].narrow(0, 0, n).narrow(1, 0, R * H), s.w_hh);
  }
  if (s.has_mask) s.dh.narrow(0, 0, n).mul_(s.rec_mask.narrow(0, 0, n));
}

}  // namespace cpu
}  // namespace rnn_ablations
