// Element-wise scan (CPU) of a gated memory whose gates read x_t only: the recurrence of
// LSTM - S-RNN - HIDDEN (rnn_ablations/variants.py; the generic reference is
// rnn_ablations/functional.py, the autograd wrapper rnn_ablations/kernels/scan.py).
//
//   spec, highway     the variant's kernel spec (Variant.kernel_spec) and whether the layer has
//                     the highway blocks; common/kernel_spec.h decode_scan_spec derives the output
//                     rule and the block offsets from them (and refuses a cell the scan does not
//                     run)
//   proj (T, B, D*G*H) all input projections of one layer, D = 1 or 2 directions side by side;
//                     time-major contiguous, or the time-major view of a contiguous (B, T, ...)
//                     tensor (batch-major: out, cs and d_proj are then batch-major too); per
//                     direction, G blocks of H columns in the table's weight order
//                     (Variant.blocks(highway)): i, f, [o], [r], content, [hw]
//       i, f, o, r    sigmoid gates (input, forget, output when the rule is o*tanh(c), highway)
//       content       c~ = W_cx x_t as it is;  hw the highway projection
//   bias (D*G*H)      optional, added to proj's blocks inside the scan (the backward can sum
//                     its gradient there too: bias_grad)
//   c_t = i * c~ + f * c_{t-1};  h_t by the output rule (o*tanh(c_t), tanh(c_t) or c_t);
//   with highway h_t <- r * h_t + (1 - r) * hw  (the maths: common/elementwise.h,
//   scan_forward_element / scan_backward_element)
//   batch_sizes (T)   CPU int64, non-increasing: rows [0, batch_sizes[t]) are active at step t;
//                     an inactive row keeps its state and outputs 0.
//   h0, c0 (D, B, H)  initial states; outputs out (T, B, D*H) (directions side by side, as a
//                     bidirectional layer's output), h_n, c_n (D, B, H).
// Direction 1 runs each row backwards within its length L_b (positions L_b-1 .. 0), so a
// bidirectional layer needs no reversed copies of its input or output.
//
// Nothing reads h_{t-1}, so there is no per-step matrix product: every (row, unit) is an
// independent linear recurrence in c.  The (direction, row) pairs are split over the threads
// (at::parallel_for), each runs its steps in order with a loop over the H units; its running c
// stays in its c_n row (L1-resident).  The backward recomputes the activations from proj
// (cheaper than storing them: the pass is memory-bound) and reads the saved memories c_t.
// The row loops are scan_rows_impl.h's, on a lane type: float32 rows run 8 AVX2 + FMA lanes
// (scan_rows_avx2.cpp) when the kernel's vector path executes AVX2 (avx2 or avx512:
// rnn_ablations::isa_runs_avx2(); RNN_ABLATIONS_ISA=portable not), otherwise the portable lanes
// defined here (any CPU, and float64).  Both run the per-element maths of common/elementwise.h.

#include <ATen/core/Tensor.h>
#include <ATen/Dispatch.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "../common/kernel_spec.h"
#include "layer_tensors.h"
#include "scan_rows.h"
#include "vec_kernels.h"

namespace {

using namespace rnn_ablations;
using namespace rnn_ablations::scan;

#include "../common/elementwise.h"  // scan_forward_element, scan_backward_element
#include "fast_exp.h"                // exp_reduce, exp_reduced: the float exp's polynomial

// The portable rows' lane policy (scan_rows_impl.h): GCC vector extensions of N lanes of S in
// 16 bytes (4 floats, 2 doubles), which the compiler lowers to the build's baseline vector
// instructions (SSE2 on x86-64, NEON on aarch64).  float: the branch-free exp of
// cpu/fast_exp.h on the lanes; double: libm's exp per
// lane (gradcheck and float64 users).
// (The vector types are spelled out per scalar: GCC drops vector_size on a dependent type.)
typedef float Float4 __attribute__((vector_size(16)));
typedef double Double2 __attribute__((vector_size(16)));
typedef int32_t Int4 __attribute__((vector_size(16)));
template <typename S> struct RawLanes;
template <> struct RawLanes<float> { using Raw = Float4; using Int = Int4; };
template <> struct RawLanes<double> { using Raw = Double2; using Int = void; };

template <typename S_>
struct PortableLanes {
  using S = S_;
  using Raw = typename RawLanes<S>::Raw;
  using Int = typename RawLanes<S>::Int;  // float's exponent arithmetic
  static constexpr int64_t N = 16 / sizeof(S);

  // N lanes as a value (elementwise.h's T): construction from an S broadcasts it
  struct V {
    Raw v;
    V() = default;
    V(Raw x) : v(x) {}
    V(S x) : v(Raw{} + x) {}
    friend V operator+(V a, V b) { return a.v + b.v; }
    friend V operator-(V a, V b) { return a.v - b.v; }
    friend V operator*(V a, V b) { return a.v * b.v; }
  };

  static inline Raw exp(Raw x) {
    if constexpr (std::is_same<S, float>::value) {
      x = x < kExpMin ? Raw{} + kExpMin : x;
      x = x > kExpMax ? Raw{} + kExpMax : x;
      // k = floor(x log2(e) + 0.5), as a truncation of a positive number (x log2(e) + 0.5
      // lies in [-125, 128)): a conversion SSE2 has, where a floor needs SSE4.1
      const Int ki = __builtin_convertvector(x * kExpLog2e + 128.5f, Int) - 128;
      const Raw p = exp_reduced(exp_reduce(x, __builtin_convertvector(ki, Raw)));
      return p * (Raw)((ki + 127) << 23);  // 2^k: the exponent bits of a float
    } else {
      for (int64_t l = 0; l < N; ++l) x[l] = std::exp(x[l]);
      return x;
    }
  }

  // the activations of elementwise.h's scan elements: sigmoid(x) = 1 / (1 + exp(-x)),
  // tanh(x) = sign(x) (1 - e^{-2|x|}) / (1 + e^{-2|x|})
  struct Act {
    // (float: exactly 0 below kSigmoidZeroBelow, as torch gives it; double: libm's exp overflows
    // there by itself.  exp's clamps keep a NaN.  common/elementwise.h: non-finite numbers.)
    static inline V sigmoid(V x) {
      const Raw s = S(1) / (S(1) + exp(-x.v));
      if constexpr (std::is_same<S, float>::value) return x.v < kSigmoidZeroBelow ? Raw{} : s;
      return s;
    }
    static inline V tanh(V x) {
      const Raw e = exp(S(-2) * (x.v < 0 ? -x.v : x.v));
      const Raw t = (S(1) - e) / (S(1) + e);
      return x.v < 0 ? -t : t;
    }
  };

  // a row's last H mod N units: `rem` lanes, loaded into zeroed lanes and stored back alone
  using Mask = int64_t;
  static inline Mask mask(int64_t rem) { return rem; }
  static inline Mask all() { return N; }
  template <bool Tail>
  static inline Raw ld(const S* p, Mask m) {
    Raw v{};
    std::memcpy(&v, p, sizeof(S) * (Tail ? m : N));
    return v;
  }
  template <bool Tail>
  static inline void st(S* p, Mask m, V v) {
    std::memcpy(p, &v.v, sizeof(S) * (Tail ? m : N));
  }
};

#include "scan_rows_impl.h"         // the row loops

// Dimensions of one call: T steps, B rows, D directions, H units, G blocks per direction.
struct ScanDims {
  int64_t T, B, D, H, G;
  int64_t proj_row() const { return D * G * H; }  // width of a proj / d_proj row
  int64_t out_row() const { return D * H; }        // width of an out / cs / g_out row
};


// Steps each row runs: the number of t with batch_sizes[t] > b.
std::vector<int64_t> row_lengths(const at::Tensor& batch_sizes, int64_t B) {
  std::vector<int64_t> len(B, 0);
  const int64_t* bs = batch_sizes.data_ptr<int64_t>();
  for (int64_t t = 0; t < batch_sizes.size(0); ++t)
    for (int64_t b = 0; b < bs[t]; ++b) ++len[b];
  return len;
}

// Rows per task: one task when the whole scan is small (a parallel region costs more than it
// saves), otherwise single rows (parallel_for splits them evenly over the threads).
int64_t grain_rows(const ScanDims& n) {
  const int64_t tasks = n.D * n.B;
  return tasks * n.T * n.H < 32768 ? std::max<int64_t>(tasks, 1) : 1;
}

// Zero the rows' inactive steps of a (T, B, W) tensor with row strides (st, sb).
template <typename T>
void zero_padding(T* data, const std::vector<int64_t>& len, int64_t T_, int64_t B, int64_t W,
                  int64_t st, int64_t sb) {
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = len[b]; t < T_; ++t) std::memset(data + t * st + b * sb, 0, sizeof(T) * W);
}

// proj (T, B, W) must be time-major contiguous, or the time-major view of a batch-major
// contiguous (B, T, W) tensor (then the outputs are batch-major too).
bool is_batch_major(const at::Tensor& proj) {
  return !proj.is_contiguous() && proj.transpose(0, 1).is_contiguous();
}

// A new (T, B, W) tensor laid out like proj (time- or batch-major).
at::Tensor empty_like_layout(const at::Tensor& proj, int64_t W) {
  const int64_t T = proj.size(0), B = proj.size(1);
  if (is_batch_major(proj)) return at::empty({B, T, W}, proj.options()).transpose(0, 1);
  return at::empty({T, B, W}, proj.options());
}

void check_common(const at::Tensor& proj, const at::Tensor& h0, const at::Tensor& c0,
                  const at::Tensor& batch_sizes, const char* who) {
  TORCH_CHECK(proj.device().is_cpu(), who, ": proj must be a CPU tensor (the CUDA scan is in _C_cuda)");
  TORCH_CHECK(proj.scalar_type() == at::kFloat || proj.scalar_type() == at::kDouble, who,
              ": float32 or float64 only, got ", proj.scalar_type());
  TORCH_CHECK(proj.dim() == 3 && (proj.is_contiguous() || is_batch_major(proj)), who,
              ": proj must be (T, B, D*G*H), contiguous or the transpose of a contiguous "
              "(B, T, D*G*H)");
  for (const at::Tensor* t : {&h0, &c0}) {
    TORCH_CHECK(t->device().is_cpu() && t->scalar_type() == proj.scalar_type(), who,
                ": h0 and c0 must be CPU tensors of proj's dtype");
    TORCH_CHECK(t->dim() == 3 && t->is_contiguous() && (t->size(0) == 1 || t->size(0) == 2) &&
                    t->size(1) == proj.size(1),
                who, ": h0 and c0 must be contiguous (D, B, H) with D = 1 or 2 directions");
  }
  TORCH_CHECK(h0.sizes() == c0.sizes() && c0.size(2) > 0 &&
                  proj.size(2) % (c0.size(0) * c0.size(2)) == 0,
              who, ": proj's width must be a multiple of D*H");
  rnn_ablations::check_batch_sizes(batch_sizes, proj.size(0), proj.size(1), who);
}

// bias: undefined/empty (none) or a contiguous (D*G*H) vector of proj's dtype.
bool check_bias(const c10::optional<at::Tensor>& bias, const at::Tensor& proj, const char* who) {
  if (!bias.has_value() || !bias->defined() || bias->numel() == 0) return false;
  TORCH_CHECK(bias->device().is_cpu() && bias->scalar_type() == proj.scalar_type() &&
                  bias->dim() == 1 && bias->is_contiguous() && bias->size(0) == proj.size(2),
              who, ": bias must be a contiguous CPU vector of proj's dtype with proj.size(2) = ",
              proj.size(2), " entries");
  return true;
}

ScanDims dims_of(const at::Tensor& proj, const at::Tensor& c0) {
  const int64_t D = c0.size(0), H = c0.size(2);
  return ScanDims{proj.size(0), proj.size(1), D, H, proj.size(2) / (D * H)};
}

// Whether float32 rows run the AVX2 + FMA copy (scan_rows_avx2.cpp): the kernel's vector path is one
// that executes AVX2 (avx2, and avx512, whose CPUs all have AVX2: the scan is bound by memory,
// not by the vector width).
bool use_avx2_rows() {
  return rnn_ablations::scan::avx2_rows_built() && rnn_ablations::isa_runs_avx2();
}

// The AVX2 rows exist for float32; float64 always runs the portable rows.
bool avx2_forward(const ScanArgs<float>& a, int64_t k0, int64_t k1) {
  rnn_ablations::scan::forward_rows_avx2(a, k0, k1);
  return true;
}
bool avx2_forward(const ScanArgs<double>&, int64_t, int64_t) { return false; }
bool avx2_backward(const ScanArgs<float>& a, int64_t k0, int64_t k1) {
  rnn_ablations::scan::backward_rows_avx2(a, k0, k1);
  return true;
}
bool avx2_backward(const ScanArgs<double>&, int64_t, int64_t) { return false; }

template <typename T>
ScanArgs<T> args_of(const ScanSpec& sp, const ScanDims& n, const std::vector<int64_t>& len,
                    const at::Tensor& proj, const T* bias, const at::Tensor& out_like,
                    const std::vector<T>& zeros) {
  ScanArgs<T> a{};
  a.nT = n.T; a.nB = n.B; a.nD = n.D; a.H = n.H; a.G = n.G;
  a.spec = sp;
  a.p_st = proj.stride(0); a.p_sb = proj.stride(1);
  a.o_st = out_like.stride(0); a.o_sb = out_like.stride(1);
  a.len = len.data();
  a.proj = proj.data_ptr<T>();
  a.bias = bias;
  a.zeros = zeros.data();
  return a;
}

}  // namespace

namespace rnn_ablations {

// -> (out (T,B,D*H), h_n (D,B,H), c_n (D,B,H), cs (T,B,D*H): the memories, empty unless save);
// out and cs are laid out like proj (time- or batch-major)
std::vector<at::Tensor> scan_forward(int64_t spec, bool highway, const at::Tensor& proj,
                                     const at::Tensor& h0, const at::Tensor& c0,
                                     const at::Tensor& batch_sizes, bool save,
                                     const c10::optional<at::Tensor>& bias) {
  const char* who = "scan_forward";
  check_common(proj, h0, c0, batch_sizes, who);
  const bool has_bias = check_bias(bias, proj, who);
  const ScanDims n = dims_of(proj, c0);
  const ScanSpec sp = check_scan_spec(spec, highway, n.G, n.H, n.D, who);
  at::Tensor out = empty_like_layout(proj, n.out_row());
  at::Tensor h_n = at::empty({n.D, n.B, n.H}, proj.options());
  at::Tensor c_n = at::empty({n.D, n.B, n.H}, proj.options());
  at::Tensor cs = save ? empty_like_layout(proj, n.out_row()) : at::empty({0}, proj.options());
  const std::vector<int64_t> len = row_lengths(batch_sizes, n.B);
  const bool avx2 = use_avx2_rows();
  AT_DISPATCH_FLOATING_TYPES(proj.scalar_type(), "scan_forward", [&] {
    const std::vector<scalar_t> zeros(static_cast<size_t>(n.G * n.H), scalar_t(0));
    ScanArgs<scalar_t> a = args_of<scalar_t>(sp, n, len, proj,
                                             has_bias ? bias->data_ptr<scalar_t>() : nullptr,
                                             out, zeros);
    a.h0 = h0.data_ptr<scalar_t>();
    a.c0 = c0.data_ptr<scalar_t>();
    a.out = out.data_ptr<scalar_t>();
    a.h_n = h_n.data_ptr<scalar_t>();
    a.c_n = c_n.data_ptr<scalar_t>();
    a.cs = save ? cs.data_ptr<scalar_t>() : nullptr;
    at::parallel_for(0, n.D * n.B, grain_rows(n), [&](int64_t k0, int64_t k1) {
      if (avx2 && avx2_forward(a, k0, k1)) return;
      run_forward_rows<PortableLanes<scalar_t>>(a, k0, k1);
    });
    zero_padding(a.out, len, n.T, n.B, n.out_row(), a.o_st, a.o_sb);
  });
  return {out, h_n, c_n, cs};
}

// -> (d_proj (T,B,D*G*H) laid out like proj, d_c0 (D,B,H), d_bias (D*G*H) or empty); h0
// receives no gradient (nothing reads it).  d_bias is the bias gradient (the sum of d_proj over
// the steps and rows) when bias_grad, computed inside the scan.
std::vector<at::Tensor> scan_backward(int64_t spec, bool highway, const at::Tensor& g_out,
                                      const at::Tensor& g_hn, const at::Tensor& g_cn,
                                      const at::Tensor& proj, const at::Tensor& c0,
                                      const at::Tensor& cs, const at::Tensor& batch_sizes,
                                      const c10::optional<at::Tensor>& bias, bool bias_grad) {
  const char* who = "scan_backward";
  check_common(proj, g_hn, c0, batch_sizes, who);
  const bool has_bias = check_bias(bias, proj, who);
  const ScanDims n = dims_of(proj, c0);
  const ScanSpec sp = check_scan_spec(spec, highway, n.G, n.H, n.D, who);
  for (const at::Tensor* t : {&g_out, &cs}) {
    TORCH_CHECK(t->device().is_cpu() && t->scalar_type() == proj.scalar_type() &&
                    t->dim() == 3 && t->size(0) == n.T && t->size(1) == n.B &&
                    t->size(2) == n.D * n.H && (t->numel() == 0 || t->stride(2) == 1),
                who, ": g_out and cs must be (T, B, D*H) of proj's dtype, contiguous rows");
  }
  TORCH_CHECK(cs.numel() == 0 ||
                  (cs.stride(0) == (is_batch_major(proj) ? n.D * n.H : n.B * n.D * n.H) &&
                   cs.stride(1) == (is_batch_major(proj) ? n.T * n.D * n.H : n.D * n.H)),
              who, ": cs must be laid out like proj (as scan_forward returns it)");
  TORCH_CHECK(g_cn.device().is_cpu() && g_cn.scalar_type() == proj.scalar_type() &&
                  g_cn.is_contiguous() && g_cn.sizes() == c0.sizes(),
              who, ": g_cn must be contiguous (D, B, H) of proj's dtype");
  at::Tensor dproj = empty_like_layout(proj, proj.size(2));
  at::Tensor dc0 = g_cn.clone();
  at::Tensor dbias_rows = bias_grad ? at::zeros({n.D * n.B, n.G * n.H}, proj.options())
                                    : at::Tensor();
  const std::vector<int64_t> len = row_lengths(batch_sizes, n.B);
  const bool avx2 = use_avx2_rows();
  AT_DISPATCH_FLOATING_TYPES(proj.scalar_type(), "scan_backward", [&] {
    const std::vector<scalar_t> zeros(static_cast<size_t>(n.G * n.H), scalar_t(0));
    ScanArgs<scalar_t> a = args_of<scalar_t>(sp, n, len, proj,
                                             has_bias ? bias->data_ptr<scalar_t>() : nullptr,
                                             cs, zeros);
    a.c0 = c0.data_ptr<scalar_t>();
    a.g_out = g_out.data_ptr<scalar_t>();
    a.g_st = g_out.stride(0);
    a.g_sb = g_out.stride(1);
    a.g_hn = g_hn.data_ptr<scalar_t>();
    a.cs_in = cs.data_ptr<scalar_t>();
    a.dproj = dproj.data_ptr<scalar_t>();
    a.dc = dc0.data_ptr<scalar_t>();
    a.dbias_rows = bias_grad ? dbias_rows.data_ptr<scalar_t>() : nullptr;
    at::parallel_for(0, n.D * n.B, grain_rows(n), [&](int64_t k0, int64_t k1) {
      if (avx2 && avx2_backward(a, k0, k1)) return;
      run_backward_rows<PortableLanes<scalar_t>>(a, k0, k1);
    });
    // every block of the spec is written at the active steps (G = the spec's blocks)
    zero_padding(a.dproj, len, n.T, n.B, n.proj_row(), a.p_st, a.p_sb);
  });
  at::Tensor dbias = bias_grad ? dbias_rows.view({n.D, n.B, n.G * n.H}).sum(1).view({-1})
                               : at::empty({0}, proj.options());
  return {dproj, dc0, dbias};
}

}  // namespace rnn_ablations
