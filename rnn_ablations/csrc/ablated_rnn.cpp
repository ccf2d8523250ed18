// Fused CPU kernel for one recurrent layer in one direction of every variant in
// rnn_ablations/variants.py (the equations live there; this file only follows them).
//
// Layout (see rnn_ablations/functional.py, the reference implementation):
//   proj (T, B, (R+X)*H)  input projections: first the R recurrent blocks (bias included),
//                         then the X input-only blocks (content c~ = W_cx x, highway projection)
//   w_hh (R*H, H)    recurrent weights
//   batch_sizes (T)  int64, non-increasing; rows [0, batch_sizes[t]) are active at step t
//   rec_mask (B, H)  variational dropout mask on h_{t-1}, or empty
// Per step: one GEMM (active rows x R*H) against h_{t-1}, then one fused element-wise pass.
// Backward: per step one GEMM for dh_{t-1}; the weight gradient is one GEMM after the loop.
// In float32 on CPUs with AVX2 + FMA the per-step GEMMs run on w_hh packed once per call (see
// PackedB); otherwise, and for the large all-step GEMMs, ATen (MKL).  The vector code (the
// element-wise pass and the packed GEMM) lives in vec_kernels.cpp, compiled for several
// instruction sets and chosen at run time.

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include "common.h"
#include "vec_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>
#include <cstdlib>
#include <atomic>
#include <memory>
#include <thread>
#include <type_traits>
#include <utility>

namespace {

using namespace rnn_ablations;  // KernelSpec, input checks, final_states, previous_hidden,
                                // Dims, the element-wise pass and the packed GEMM (vec_kernels.h)

// Rows per task of the element-wise pass: one task when the step is small (a parallel region
// costs more than it saves), otherwise the rows split evenly over the threads.
inline int64_t grain_rows(int64_t rows, int64_t hidden) {
  const int64_t threads = std::max<int64_t>(1, at::get_num_threads());
  if (threads == 1 || rows * hidden < 16384) return std::max<int64_t>(rows, 1);
  return std::max<int64_t>(1, (rows + threads - 1) / threads);
}

// ---------------------------------------------------------------------------------------------
// One step of the recurrence, shared by the plain and the pipelined entry points.
struct StepState {
  KernelSpec ks;  // the variant's element-wise rules and block layout (kernel_spec.h)
  Dims d;
  const int64_t* bs;
  bool has_mask;
  at::Tensor gates, out, cs, hin, h0, c0, w_hh, w_t, rec_mask, hp_buf;  // forward
  at::Tensor grad_out, dproj, dh, dc;                                     // backward
  PackedB packed;  // w_hh packed for the step GEMM (float32, on a path with a packed kernel)
  // The forward's buffers and inputs (the caller sets ks, d, has_mask and gates), with
  // w_hh packed for the step GEMM.
  void init_forward(const at::Tensor& h0_, const at::Tensor& c0_, const at::Tensor& w_hh_,
                    const at::Tensor& rec_mask_, bool keep_hin) {
    const auto opt = h0_.options();
    out = at::zeros({d.T, d.B, d.H}, opt);
    cs = at::empty({d.T, d.B, d.H}, opt);
    hin = (ks.highway && keep_hin) ? at::empty({d.T, d.B, d.H}, opt) : at::Tensor();
    hp_buf = has_mask ? at::empty({d.B, d.H}, opt) : at::Tensor();
    h0 = h0_; c0 = c0_; w_hh = w_hh_; w_t = w_hh_.t(); rec_mask = rec_mask_;
    pack(false);
  }
  // Pack w_hh for the forward (B = w_hh^T) or the backward (B = w_hh) step GEMM.
  void pack(bool backward) {
    // RNN_ABLATIONS_PACKED_GEMM=0 takes ATen's GEMM instead (for A/B timing and the tests).
    const char* env = std::getenv("RNN_ABLATIONS_PACKED_GEMM");
    if (env && env[0] == '0') return;
    if (w_hh.scalar_type() == at::kFloat && packed_gemm_available()) {
      packed = pack_b(w_hh, !backward);
    }
  }
};

// gates (n x N, row stride ldc) [+]= A (n x K) * packed w_hh; false when no packed weight
// applies (double, or the portable path): the caller then uses ATen.
template <typename scalar_t, bool Acc>
bool step_gemm(StepState& s, int64_t n, const scalar_t* A, int64_t lda, scalar_t* C, int64_t ldc,
               bool parallel) {
  if constexpr (std::is_same<scalar_t, float>::value) {
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
// splits the rows over threads (false inside a pipeline role, which owns one core).
template <typename scalar_t>
void forward_step(StepState& s, int64_t t, const scalar_t* xo_t, bool parallel) {
  const int64_t n = s.bs[t];
  at::Tensor h_prev = (t == 0 ? s.h0 : s.out[t - 1]).narrow(0, 0, n);
  if (s.has_mask) {
    at::Tensor hp = s.hp_buf.narrow(0, 0, n);
    at::mul_out(hp, h_prev, s.rec_mask.narrow(0, 0, n));
    h_prev = hp;
  }
  scalar_t* gp = s.gates[t].data_ptr<scalar_t>();
  if (!step_gemm<scalar_t, true>(s, n, h_prev.data_ptr<scalar_t>(), s.d.H, gp, s.d.gates_stride,
                                 parallel)) {
    s.gates[t].narrow(0, 0, n).addmm_(h_prev, s.w_t);
  }
  const scalar_t* cpp = (t == 0 ? s.c0 : s.cs[t - 1]).data_ptr<scalar_t>();
  scalar_t* cp = s.cs[t].data_ptr<scalar_t>();
  scalar_t* hp = s.out[t].data_ptr<scalar_t>();
  scalar_t* hinp = s.hin.defined() ? s.hin[t].data_ptr<scalar_t>() : nullptr;
  auto body = [&](int64_t r0, int64_t r1) {
    pointwise_forward(s.ks, s.d, gp, xo_t, cpp, cp, hp, hinp, r0, r1);
  };
  if (parallel) at::parallel_for(0, n, grain_rows(n, s.d.H), body);
  else body(0, n);
}

// Backward step t: add dL/dout_t to the carried dh, element-wise pass into dproj[t], then
// dh_{t-1} = dproj[t] W_hh for the active rows.  Inactive rows of dproj[t] are zeroed.
template <typename scalar_t>
void backward_step(StepState& s, int64_t t, const scalar_t* xo_t, bool parallel) {
  const int64_t n = s.bs[t], B = s.d.B, R = s.d.R, H = s.d.H, X = s.d.X;
  if (n < B) s.dproj[t].narrow(0, n, B - n).zero_();
  if (n == 0) return;
  s.dh.narrow(0, 0, n).add_(s.grad_out[t].narrow(0, 0, n));
  const scalar_t* gp = s.gates[t].data_ptr<scalar_t>();
  const bool memory = s.ks.memory;
  const scalar_t* ccur = memory ? s.cs[t].data_ptr<scalar_t>() : nullptr;
  const scalar_t* cprev = memory ? (t == 0 ? s.c0 : s.cs[t - 1]).data_ptr<scalar_t>() : nullptr;
  const scalar_t* hinp = s.ks.highway ? s.hin[t].data_ptr<scalar_t>() : nullptr;
  scalar_t* dhp = s.dh.data_ptr<scalar_t>();
  scalar_t* dcp = s.dc.data_ptr<scalar_t>();
  scalar_t* dap = s.dproj[t].data_ptr<scalar_t>();
  scalar_t* dxop = X > 0 ? dap + R * H : nullptr;
  auto body = [&](int64_t r0, int64_t r1) {
    pointwise_backward(s.ks, s.d, gp, xo_t, ccur, cprev, hinp, dhp, dcp, dap, dxop, r0, r1);
  };
  if (parallel) at::parallel_for(0, n, grain_rows(n, H), body);
  else body(0, n);
  at::Tensor dh_n = s.dh.narrow(0, 0, n);
  if (!step_gemm<scalar_t, false>(s, n, dap, s.d.proj_stride, dhp, H, parallel)) {
    at::mm_out(dh_n, s.dproj[t].narrow(0, 0, n).narrow(1, 0, R * H), s.w_hh);
  }
  if (s.has_mask) dh_n.mul_(s.rec_mask.narrow(0, 0, n));
}

// ---------------------------------------------------------------------------------------------
// Two-role pipeline.  Role 0 runs the recurrence (inherently sequential, small GEMMs); role 1
// runs the large GEMMs that do not depend on the next step (input projections of later chunks
// of steps in the forward pass; input and weight gradients of finished chunks in the backward
// pass) on the other core at the same time.  Both roles run inside one at::parallel_for of two
// items, i.e. in torch's own OpenMP team; ATen and MKL calls inside a parallel region run
// single-threaded, so each role owns one core.  With one thread the two roles run one after the
// other, and the schedule below is still correct (role 0 never waits for work that only role 1
// can do: it claims unstarted chunks itself).
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

struct Pipeline {
  explicit Pipeline(int64_t chunks) : done(new std::atomic<int>[std::max<int64_t>(chunks, 1)]) {
    for (int64_t i = 0; i < std::max<int64_t>(chunks, 1); ++i) done[i].store(0);
  }
  std::unique_ptr<std::atomic<int>[]> done;  // chunk finished (projected / back-propagated)
  std::atomic<int64_t> next{0};               // next unclaimed chunk or task
  std::atomic<bool> failed{false};            // a role threw: the other stops waiting

  // Wait for chunk k; false when the other role failed.
  bool wait(int64_t k) {
    int64_t spins = 0;
    while (!done[k].load(std::memory_order_acquire)) {
      if (failed.load(std::memory_order_relaxed)) return false;
      if (++spins < 4096) cpu_relax(); else std::this_thread::yield();
    }
    return true;
  }

  template <class F0, class F1>
  void run(F0&& role0, F1&& role1) {
    at::parallel_for(0, 2, 1, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        try {
          at::NoGradGuard no_grad;  // grad mode is thread-local: off in the team's threads too
          if (r == 0) role0(); else role1();
        } catch (...) {
          failed.store(true);
          throw;
        }
      }
    });
    TORCH_CHECK(!failed.load(), "rnn_ablations kernel: a pipeline role failed");
  }
};

inline int64_t auto_chunk(int64_t T, int64_t B, int64_t chunk) {
  if (chunk > 0) return std::min(chunk, std::max<int64_t>(T, 1));
  // about 256 rows per GEMM, and at least 4 chunks so that the roles overlap (an empty batch
  // has nothing to project: one step per chunk)
  int64_t c = B > 0 ? std::max<int64_t>(1, (256 + B - 1) / B) : 1;
  return std::max<int64_t>(1, std::min(c, T / 4));
}

void check_fused_inputs(const at::Tensor& x, const at::Tensor& w_ih, const at::Tensor& bias,
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
  for (const at::Tensor* t : {&w_ih, &w_hh, &h0, &c0}) {
    TORCH_CHECK(t->scalar_type() == x.scalar_type(), "rnn_ablations kernel: all tensors must have the same dtype");
  }
  if (bias.numel()) TORCH_CHECK(bias.scalar_type() == x.scalar_type(), "rnn_ablations kernel: bias dtype");
  check_batch_sizes(batch_sizes, x.size(0), x.size(1), "rnn_ablations kernel");
}

// Weight gradient dW (M x K) = g^T (M x rows) * in (rows x K), for g (rows x M) and in (rows x K)
// with unit column stride.  For a large, contiguous g with M >= 4K (the LSTM's 4H x H blocks at
// H = 650) MKL ran the transposed product in^T g 1.15-1.2x faster on the development machine
// (AMD EPYC, 2 threads), so it is computed that way and transposed once; for the other shapes
// measured (narrower blocks, strided g, H = 256) the direct product was as fast or faster.
at::Tensor weight_grad(const at::Tensor& g, const at::Tensor& in) {
  const int64_t M = g.size(1), K = in.size(1);
  const bool transposed = g.is_contiguous() && M >= 4 * K && M * K >= (int64_t{1} << 20);
  if (transposed) return at::mm(in.t(), g).t().contiguous();
  return at::mm(g.t(), in);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Entry points taking the input projections (the caller computed them for all steps at once).

// Returns {out (T,B,H), h_n (B,H), c_n (B,H), gates (T,B,R*H) activations, cs (T,B,H), hin}.
std::vector<at::Tensor> rnn_forward(int64_t spec, bool highway, at::Tensor proj, at::Tensor w_hh,
                                    at::Tensor h0, at::Tensor c0, at::Tensor batch_sizes,
                                    at::Tensor rec_mask, bool keep_hin, bool in_place) {
  check_plain_inputs(proj, w_hh, h0, c0, batch_sizes, at::kCPU, "rnn_ablations kernel");
  // The kernel's own writes into views of proj are not autograd operations (the autograd
  // wrapper in dispatch.py owns the gradient).
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  at::NoGradGuard no_grad;
  const int64_t H = w_hh.size(1);
  const int64_t R = w_hh.size(0) / H;
  const int64_t T = proj.size(0), B = proj.size(1), P = proj.size(2);
  const int64_t X = P / H - R;
  const KernelSpec ks = check_kernel_spec(spec, highway, R, X, "rnn_ablations kernel");
  const bool has_mask = rec_mask.defined() && rec_mask.numel() > 0;
  if (has_mask) check_like(rec_mask, h0.sizes(), h0, "rec_mask", "rnn_ablations kernel");
  StepState s;
  s.ks = ks; s.d = Dims{T, B, H, R, X, P, P, in_place ? P : R * H};
  s.bs = batch_sizes.data_ptr<int64_t>(); s.has_mask = has_mask;
  // Pre-activations of the recurrent blocks, turned into activations in place: in proj itself
  // when the caller allows it (its input-only blocks stay as they are), else in a copy.
  s.gates = proj.narrow(2, 0, R * H);
  if (!in_place) s.gates = X == 0 ? s.gates.clone() : s.gates.contiguous();
  s.init_forward(h0, c0, w_hh, rec_mask, keep_hin);

  AT_DISPATCH_FLOATING_TYPES(proj.scalar_type(), "rnn_ablations_forward", [&] {
    for (int64_t t = 0; t < T && s.bs[t] > 0; ++t) {
      const scalar_t* xop = X > 0 ? proj[t].data_ptr<scalar_t>() + R * H : nullptr;
      forward_step<scalar_t>(s, t, xop, true);
    }
  });
  auto fin = final_states(ks.memory, s.out, s.cs, h0, c0, s.bs);
  return {s.out, fin.first, fin.second, s.gates, s.cs,
          s.hin.defined() ? s.hin : at::empty({0}, proj.options())};
}

// Returns {d_proj (T,B,(R+X)*H), d_w_hh, d_h0, d_c0}.
std::vector<at::Tensor> rnn_backward(int64_t spec, bool highway, at::Tensor grad_out,
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
  const int64_t H = w_hh.size(1);
  const int64_t R = w_hh.size(0) / H;
  const int64_t T = proj.size(0), B = proj.size(1), P = proj.size(2);
  const int64_t X = P / H - R;
  const bool has_mask = rec_mask.defined() && rec_mask.numel() > 0;
  StepState s;
  TORCH_CHECK(gates.defined() && gates.dim() == 3 && gates.size(0) == T && gates.size(1) == B &&
                  gates.size(2) == R * H && gates.stride(2) == 1 &&
                  gates.stride(1) >= R * H && (B == 0 || gates.stride(0) == B * gates.stride(1)) &&
                  gates.scalar_type() == proj.scalar_type() && gates.device().is_cpu(),
              who, ": gates must be the forward's (T, B, R*H) activations");
  s.ks = ks; s.d = Dims{T, B, H, R, X, P, P, gates.stride(1)};
  s.bs = batch_sizes.data_ptr<int64_t>(); s.has_mask = has_mask;
  s.gates = gates; s.cs = cs; s.hin = hin; s.out = out; s.c0 = c0; s.w_hh = w_hh;
  s.rec_mask = rec_mask; s.grad_out = grad_out.contiguous();
  s.pack(true);
  // Every element of an active row is written by the element-wise pass; only the rows that are
  // inactive at a step (padding) are zeroed.
  s.dproj = at::empty_like(proj);
  s.dh = grad_hn.clone().contiguous();
  s.dc = grad_cn.clone().contiguous();
  if (!ks.memory) s.dh.add_(s.dc);  // c_n is a copy of h_n for a cell without memory

  AT_DISPATCH_FLOATING_TYPES(proj.scalar_type(), "rnn_ablations_backward", [&] {
    for (int64_t t = T - 1; t >= 0; --t) {
      const scalar_t* xop = X > 0 ? proj[t].data_ptr<scalar_t>() + R * H : nullptr;
      backward_step<scalar_t>(s, t, xop, true);
    }
  });
  // Weight gradient: one GEMM over all steps, against h_{t-1} (masked) of every row.
  at::Tensor h_prev = previous_hidden(out, h0, rec_mask, has_mask, 0, T);
  at::Tensor dw = weight_grad(s.dproj.view({T * B, P}).narrow(1, 0, R * H), h_prev);
  if (!ks.memory) s.dc.zero_();
  return {s.dproj, dw, s.dh, s.dc};
}

// ---------------------------------------------------------------------------------------------
// Pipelined entry points: the input projection (forward) and the input / weight gradients
// (backward) are computed here, chunk by chunk, on the second core while the first runs the
// recurrence (see Pipeline).  x (T, B, D) is the layer input; w_ih ((R+X)*H, D); bias (R*H) or
// empty (the input-only blocks have no bias).

// Returns {out, h_n, c_n, gates (activations), cs, hin, xo (T,B,X*H) input-only projections}.
std::vector<at::Tensor> fused_forward(int64_t spec, bool highway, at::Tensor x, at::Tensor w_ih,
                                      at::Tensor bias, at::Tensor w_hh, at::Tensor h0,
                                      at::Tensor c0, at::Tensor batch_sizes, at::Tensor rec_mask,
                                      bool keep_hin, int64_t chunk) {
  check_fused_inputs(x, w_ih, bias, w_hh, h0, c0, batch_sizes);
  const int64_t H = w_hh.size(1);
  const int64_t R = w_hh.size(0) / H;
  const int64_t T = x.size(0), B = x.size(1), D = x.size(2), P = w_ih.size(0);
  const int64_t X = P / H - R, RH = R * H, XH = X * H;
  const KernelSpec ks = check_kernel_spec(spec, highway, R, X, "rnn_ablations kernel");
  const bool has_mask = rec_mask.defined() && rec_mask.numel() > 0;
  if (has_mask) check_like(rec_mask, h0.sizes(), h0, "rec_mask", "rnn_ablations kernel");
  StepState s;
  s.ks = ks; s.d = Dims{T, B, H, R, X, P, XH, RH};
  s.bs = batch_sizes.data_ptr<int64_t>(); s.has_mask = has_mask;
  s.gates = at::empty({T, B, RH}, x.options());
  at::Tensor xo = X > 0 ? at::empty({T, B, XH}, x.options()) : at::empty({0}, x.options());
  s.init_forward(h0, c0, w_hh, rec_mask, keep_hin);
  const bool has_bias = bias.numel() > 0;
  const at::Tensor w_rec_t = w_ih.narrow(0, 0, RH).t();
  const at::Tensor w_xo_t = X > 0 ? w_ih.narrow(0, RH, XH).t() : at::Tensor();

  const int64_t C = auto_chunk(T, B, chunk);
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
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "rnn_ablations_fused_forward", [&] {
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
          const scalar_t* xop = X > 0 ? xo[t].data_ptr<scalar_t>() : nullptr;
          forward_step<scalar_t>(s, t, xop, false);
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
  auto fin = final_states(ks.memory, s.out, s.cs, h0, c0, s.bs);
  return {s.out, fin.first, fin.second, s.gates, s.cs,
          s.hin.defined() ? s.hin : at::empty({0}, x.options()), xo};
}

// Returns {dx (T,B,D) or empty, d_w_ih, d_bias (R*H) or empty, d_w_hh, d_h0, d_c0}.
std::vector<at::Tensor> fused_backward(int64_t spec, bool highway, at::Tensor grad_out,
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
  const int64_t H = w_hh.size(1);
  const int64_t R = w_hh.size(0) / H;
  const int64_t T = x.size(0), B = x.size(1), D = x.size(2), P = w_ih.size(0);
  const int64_t X = P / H - R, RH = R * H;
  const bool has_mask = rec_mask.defined() && rec_mask.numel() > 0;
  StepState s;
  s.ks = ks; s.d = Dims{T, B, H, R, X, P, X * H, RH};
  s.bs = batch_sizes.data_ptr<int64_t>(); s.has_mask = has_mask;
  s.gates = gates; s.cs = cs; s.hin = hin; s.out = out; s.c0 = c0; s.w_hh = w_hh;
  s.rec_mask = rec_mask; s.grad_out = grad_out.contiguous();
  s.pack(true);
  s.dproj = at::empty({T, B, P}, x.options());
  s.dh = grad_hn.clone().contiguous();
  s.dc = grad_cn.clone().contiguous();
  if (!ks.memory) s.dh.add_(s.dc);  // c_n is a copy of h_n for a cell without memory
  at::Tensor dx = need_dx ? at::empty({T, B, D}, x.options()) : at::empty({0}, x.options());

  // Tasks per chunk, taken in the order the recurrence finishes chunks (last chunk first).  When
  // the input gradient is needed, it is the pipelined task (its cost is close to the recurrence's)
  // and the weight gradients are two GEMMs over all steps on both threads afterwards; otherwise
  // the weight gradients are pipelined, each role accumulating into its own buffers.
  std::vector<int> task_types;  // 0: dx, 1: d_w_ih, 2: d_w_hh
  // (Pipelining the weight gradients too when the input gradient is needed was measured slower:
  // 0.74 vs 0.80x nn.LSTM for lstm at H = 650, and the per-role accumulators make the sum order
  // depend on timing.)
  const bool pipe_dw = need_dw && !need_dx;
  if (need_dx) task_types.push_back(0);
  if (pipe_dw) { task_types.push_back(1); task_types.push_back(2); }
  const int64_t per = static_cast<int64_t>(task_types.size());
  const int64_t C = auto_chunk(T, B, chunk);
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
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "rnn_ablations_fused_backward", [&] {
    auto recurrence = [&] {
      for (int64_t k = chunks - 1; k >= 0; --k) {
        const int64_t t0 = k * C, t1 = std::min(T, t0 + C);
        for (int64_t t = t1 - 1; t >= t0; --t) {
          const scalar_t* xop = X > 0 ? xo[t].data_ptr<scalar_t>() : nullptr;
          backward_step<scalar_t>(s, t, xop, false);
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
  if (!ks.memory) s.dc.zero_();
  if (!need_dw) {
    g_w_ih = at::empty({0}, x.options());
    g_w_hh = at::empty({0}, x.options());
  }
  return {dx, g_w_ih, g_b, g_w_hh, s.dh, s.dc};
}

// The decoded spec as the table test reads it (tests/test_variant_table.py).
py::dict describe_kernel_spec(int64_t spec, bool highway) {
  const KernelSpec ks = decode_kernel_spec(spec, highway, "describe_kernel_spec");
  const auto blocks = kernel_spec_blocks(ks);
  py::dict d;
  d["output"] = output_rule_name(ks.output);
  d["memory"] = ks.memory;
  d["content_recurrent"] = ks.content_recurrent;
  d["content_activation"] = ks.content_tanh ? "tanh" : "identity";
  d["recurrent"] = blocks[0];
  d["input_only"] = blocks[1];
  return d;
}

void register_scan(pybind11::module_& m);  // scan.cpp: the element-wise scan (no step GEMM)

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "rnn_ablations fused CPU recurrence (forward and hand-written backward)";
#ifdef RNN_ABLATIONS_TORCH_VERSION
  m.attr("torch_version") = RNN_ABLATIONS_TORCH_VERSION;  // the torch this module was built for
#endif
  register_scan(m);
  m.def("forward", &rnn_forward,
        "one layer, one direction: forward from the input projections; with in_place=True the "
        "recurrent blocks of proj become the returned gates (proj must be a scratch tensor)",
        py::arg("spec"), py::arg("highway"), py::arg("proj"), py::arg("w_hh"), py::arg("h0"),
        py::arg("c0"), py::arg("batch_sizes"), py::arg("rec_mask"), py::arg("keep_hin"),
        py::arg("in_place") = false);
  m.def("backward", &rnn_backward, "one layer, one direction: backward to the input projections");
  m.def("fused_forward", &fused_forward,
        "one layer, one direction: pipelined input projection + recurrence");
  m.def("fused_backward", &fused_backward,
        "one layer, one direction: pipelined recurrence backward + input/weight gradients");
  m.def("packed_gemm", &packed_gemm_available,
        "whether the vector path in use has the packed step GEMM (float32; AVX2 + FMA)");
  m.def("kernel_isa", &isa_name,
        "the vector path in use: 'avx2' or 'portable' (RNN_ABLATIONS_ISA, else the best the "
        "CPU supports)");
  m.def("set_kernel_isa", &set_isa, "switch the vector path: 'avx2', 'portable' or 'auto'",
        py::arg("name"));
  m.def("supported_isas", &supported_isas,
        "the vector paths this CPU and build can run, best first");
  m.def("describe_kernel_spec", &describe_kernel_spec,
        "the step kernels' view of a kernel spec (Variant.kernel_spec): a dict with the output "
        "rule, memory, content form and the recurrent / input-only block roles they index; "
        "raises for a spec they refuse", py::arg("spec"), py::arg("highway"));
  m.def("weight_grad", &weight_grad, "g^T in for g (rows, M), in (rows, K): a weight gradient");
}
