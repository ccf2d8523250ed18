// The element-wise pass and the packed step-GEMM micro-kernel, written once and compiled once
// per instruction set by vec_portable.cpp, vec_avx2.cpp and vec_avx512.cpp, each of which
// includes this file inside a namespace of its own (no include guard on purpose; it includes
// only common/elementwise.h: the including file includes the standard headers first, so that no
// standard-library template is instantiated under a target pragma).  RNN_ABLATIONS_VEC_KIND says which copy this is: 0 portable (the step GEMM is ATen's),
// 1 AVX2 + FMA, 2 AVX-512F, 3 the AVX-512 blocking emulated with AVX2 (test only); 1-3 get the
// register-blocked micro-kernel of the step GEMM.
//
// The loops over contiguous memory are written so that GCC vectorises them for the target in
// force (checked with -fopt-info-vec); the variant-specific combinations are plain arithmetic.

#include "../common/elementwise.h"  // the per-element maths shared with the CUDA kernel

// ---------------------------------------------------------------------------------------------
// Transcendentals.  float: the branch-free exp of cpu/fast_exp.h, in scalar code GCC vectorises;
// double: libm (used by gradcheck and float64 users).
#include "fast_exp.h"
inline float fast_exp(float x) {
  x = std::min(std::max(x, kExpMin), kExpMax);
  const float k = std::floor(x * kExpLog2e + 0.5f);
  const float p = exp_reduced(exp_reduce(x, k));
  int32_t e = static_cast<int32_t>(k) + 127;
  e <<= 23;
  float scale;
  std::memcpy(&scale, &e, sizeof(scale));
  return p * scale;
}

// Non-finite values as the generic path (torch.sigmoid, torch.tanh) gives them: NaN in, NaN out
// (fast_exp's clamps keep a NaN: std::max/std::min return their first argument when a
// comparison fails); sigmoid is exactly 0 where torch's float exp(-x) overflows (x < -88.72,
// -Inf included) and exactly 1 for +Inf, tanh(+-Inf) = +-1 (common/elementwise.h).  A clamped exp would leave sigmoid(-Inf) at 6e-39, so that an input
// gate shut by -Inf times an infinite content gave Inf where torch gives 0 * Inf = NaN.
template <typename T> inline T sigm(T x);
template <> inline float sigm<float>(float x) {
  const float s = 1.0f / (1.0f + fast_exp(-x));
  return x < kSigmoidZeroBelow ? 0.0f : s;
}
template <> inline double sigm<double>(double x) { return 1.0 / (1.0 + std::exp(-x)); }

template <typename T> inline T tanh_(T x);
template <> inline float tanh_<float>(float x) {
  // tanh(x) = sign(x) (1 - e^{-2|x|}) / (1 + e^{-2|x|})
  float a = std::fabs(x);
  float e = fast_exp(-2.0f * a);
  float t = (1.0f - e) / (1.0f + e);
  return std::copysign(t, x);
}
template <> inline double tanh_<double>(double x) { return std::tanh(x); }

// ---------------------------------------------------------------------------------------------
// Simple loops over contiguous memory, which GCC vectorises reliably (checked with
// -fopt-info-vec); the variant-specific combinations below are then plain arithmetic.
template <typename T>
void sigmoid_inplace(T* __restrict__ p, int64_t n) {
#pragma GCC ivdep
  for (int64_t j = 0; j < n; ++j) p[j] = sigm<T>(p[j]);
}
template <typename T>
void tanh_inplace(T* __restrict__ p, int64_t n) {
#pragma GCC ivdep
  for (int64_t j = 0; j < n; ++j) p[j] = tanh_<T>(p[j]);
}
template <typename T>
void tanh_to(const T* __restrict__ src, T* __restrict__ dst, int64_t n) {
#pragma GCC ivdep
  for (int64_t j = 0; j < n; ++j) dst[j] = tanh_<T>(src[j]);
}


// Activations of the recurrent blocks of one row, in place, for the hidden units [u0, u0 + U) of
// every block: sigmoid for every gate, the content's own activation (tanh or none) for a
// recurrent content block.  (All units: one loop over the blocks on each side of the content.)
template <typename T>
inline void activate_recurrent(const KernelSpec& ks, int64_t H, int64_t R, T* g, int64_t u0,
                               int64_t U) {
  if (u0 == 0 && U == H) {
    if (ks.content_recurrent) {
      const int64_t cb = ks.content_block;
      sigmoid_inplace<T>(g, cb * H);
      if (ks.content_tanh) tanh_inplace<T>(g + cb * H, H);
      sigmoid_inplace<T>(g + (cb + 1) * H, (R - cb - 1) * H);
    } else {
      sigmoid_inplace<T>(g, R * H);
    }
    return;
  }
  for (int64_t blk = 0; blk < R; ++blk) {
    T* p = g + blk * H + u0;
    if (ks.content_recurrent && blk == ks.content_block) {
      if (ks.content_tanh) tanh_inplace<T>(p, U);
    } else {
      sigmoid_inplace<T>(p, U);
    }
  }
}

// h_t of U units of a memory cell by the output rule Out (common/elementwise.h, cell_output): h
// holds tanh(c_t) on entry when the rule reads it; o: the output gate (read when the rule has
// one); c: c_t.
template <typename T, int Out>
void output_row(const T* __restrict__ o, const T* __restrict__ c, T* __restrict__ h, int64_t U) {
  if (output_reads_tanh(Out) && !output_has_gate(Out)) return;  // h_t = tanh(c_t): in h already
#pragma GCC ivdep
  for (int64_t j = 0; j < U; ++j) {
    h[j] = cell_output<T>(Out, output_has_gate(Out) ? o[j] : T(0),
                          output_reads_tanh(Out) ? h[j] : T(0), c[j]);
  }
}

// Element-wise forward of one step for rows [r0, r1) and hidden units [u0, u1) (see
// vec_kernels.h).  The branches on the spec are per row, outside the loops over the units.
template <typename T>
void pointwise_forward(const KernelSpec& ks, const Dims& d, T* gates, const T* xo,
                       const T* c_prev, T* c_out, T* h_out, T* h_pre_out, int64_t r0,
                       int64_t r1, int64_t u0, int64_t u1) {
  const int64_t H = d.H, U = u1 - u0;
  for (int64_t b = r0; b < r1; ++b) {
    T* __restrict__ g = gates + b * d.gates_stride;
    const T* __restrict__ xob = xo ? xo + b * d.xo_stride : nullptr;
    // c_prev may be c_out (inference: one buffer, see step_state.h), hence no __restrict__.
    const T* cp = c_prev + b * H + u0;
    T* cb = c_out + b * H + u0;
    T* __restrict__ hb = h_out + b * H + u0;
    T* __restrict__ hpreb = h_pre_out ? h_pre_out + b * H + u0 : nullptr;
    activate_recurrent<T>(ks, H, d.R, g, u0, U);
    const T* __restrict__ content = (ks.content_recurrent ? g + ks.content_block * H
                                                          : xob + ks.content_block * H) + u0;
    if (!ks.memory) {  // h_t = c~_t
      std::memcpy(hb, content, sizeof(T) * U);
    } else {
      const T* __restrict__ gi = g + u0;
      const T* __restrict__ gf = g + H + u0;
#pragma GCC ivdep
      for (int64_t j = 0; j < U; ++j) cb[j] = cell_update<T>(gi[j], content[j], gf[j], cp[j]);
      if (output_reads_tanh(ks.output)) tanh_to<T>(cb, hb, U);
      const T* go = output_has_gate(ks.output) ? g + ks.out_gate_block * H + u0 : cb;
      with_output_rule(ks.output, [&](auto rule) {
        output_row<T, decltype(rule)::value>(go, cb, hb, U);
      });
    }
    if (ks.highway) {
      const T* __restrict__ gr = g + (d.R - 1) * H + u0;       // already a sigmoid
      const T* __restrict__ hw = xob + (d.X - 1) * H + u0;
      if (hpreb) std::memcpy(hpreb, hb, sizeof(T) * U);
#pragma GCC ivdep
      for (int64_t j = 0; j < U; ++j) hb[j] = highway_mix<T>(gr[j], hb[j], hw[j]);
      if (!ks.memory) std::memcpy(cb, hb, sizeof(T) * U);  // a cell without memory: c_t = h_t
    }
  }
}

// Backward of one row of a memory cell, for one output rule and content form (templates, so that
// the loop over H has no branch).  cs: c_t of the row; tcs: tanh(c_t) of the row (filled when the
// rule reads it).  The rule's maths (common/elementwise.h cell_grad, out_gate_grad) receives
// what its forward read: o, tanh(c_t) and c_t.
template <typename T, int Out, bool ContentRecurrent, bool ContentTanh>
void memory_row_backward(const KernelSpec& ks, int64_t H, const T* __restrict__ g,
                         const T* __restrict__ xob, const T* __restrict__ cs,
                         const T* __restrict__ tcs, const T* __restrict__ cp,
                         const T* __restrict__ dhb, T* __restrict__ dcb, T* __restrict__ dab,
                         T* __restrict__ dxob) {
  const T* __restrict__ i = g;
  const T* __restrict__ f = g + H;
  const T* __restrict__ content = ContentRecurrent ? g + ks.content_block * H
                                                   : xob + ks.content_block * H;
  T* __restrict__ d_content = ContentRecurrent ? dab + ks.content_block * H
                                               : dxob + ks.content_block * H;
  const T* __restrict__ o = output_has_gate(Out) ? g + ks.out_gate_block * H : g;
  T* __restrict__ d_o = output_has_gate(Out) ? dab + ks.out_gate_block * H : nullptr;
#pragma GCC ivdep
  for (int64_t j = 0; j < H; ++j) {
    const T tc = output_reads_tanh(Out) ? tcs[j] : T(0);
    const T gh = dhb[j];
    const T gc = cell_grad<T>(Out, dcb[j], gh, o[j], tc, cs[j]);
    T d_i, d_f, d_c;
    dcb[j] = memory_backward<ContentTanh, T>(gc, i[j], f[j], content[j], cp[j], d_i, d_f, d_c);
    dab[j] = d_i;
    dab[H + j] = d_f;
    d_content[j] = d_c;
    if (output_has_gate(Out)) d_o[j] = out_gate_grad<T>(Out, gh, o[j], tc, cs[j]);
  }
}

template <typename T, int Out>
void memory_row_backward_out(const KernelSpec& ks, int64_t H, const T* g, const T* xob,
                             const T* cs, const T* tcs, const T* cp, const T* dhb, T* dcb,
                             T* dab, T* dxob) {
  if (!ks.content_recurrent) {
    memory_row_backward<T, Out, false, false>(ks, H, g, xob, cs, tcs, cp, dhb, dcb, dab, dxob);
  } else if (ks.content_tanh) {
    memory_row_backward<T, Out, true, true>(ks, H, g, xob, cs, tcs, cp, dhb, dcb, dab, dxob);
  } else {
    memory_row_backward<T, Out, true, false>(ks, H, g, xob, cs, tcs, cp, dhb, dcb, dab, dxob);
  }
}

// Element-wise backward of one step for rows [r0, r1); `scratch` holds H values.  dh holds
// dL/dh_t (total), dc holds the carried dL/dc_t; on return da holds dL/d(pre-activations), dxo
// dL/d(input-only blocks) and dc dL/dc_{t-1}.
template <typename T>
void pointwise_backward(const KernelSpec& ks, const Dims& d, const T* gates, const T* xo,
                        const T* c_cur, const T* c_prev, const T* h_pre, T* dh, T* dc, T* da,
                        T* dxo, T* scratch, int64_t r0, int64_t r1) {
  const int64_t H = d.H, P = d.proj_stride;
  const bool need_tc = output_reads_tanh(ks.output);
  T* __restrict__ tcs = scratch;  // H entries: tanh(c_t) of one row
  for (int64_t b = r0; b < r1; ++b) {
    const T* __restrict__ g = gates + b * d.gates_stride;
    T* __restrict__ dab = da + b * P;
    T* __restrict__ dxob = dxo ? dxo + b * P : nullptr;
    const T* __restrict__ xob = xo ? xo + b * d.xo_stride : nullptr;
    T* __restrict__ dhb = dh + b * H;
    T* __restrict__ dcb = dc + b * H;
    const T* __restrict__ cb = c_cur ? c_cur + b * H : nullptr;
    const T* __restrict__ cp = c_prev ? c_prev + b * H : nullptr;
    if (ks.highway) {
      const T* __restrict__ r = g + (d.R - 1) * H;
      const T* __restrict__ hw = xob + (d.X - 1) * H;
      const T* __restrict__ hi = h_pre + b * H;
      T* __restrict__ dr = dab + (d.R - 1) * H;
      T* __restrict__ dhw = dxob + (d.X - 1) * H;
#pragma GCC ivdep
      for (int64_t j = 0; j < H; ++j) {
        dhb[j] = highway_backward<T>(dhb[j], r[j], hi[j], hw[j], dr[j], dhw[j]);
      }
    }
    if (!ks.memory) {  // h_t = c~_t, a recurrent block (already activated)
      const T* __restrict__ content = g + ks.content_block * H;
      T* __restrict__ d_content = dab + ks.content_block * H;
      if (ks.content_tanh) {
#pragma GCC ivdep
        for (int64_t j = 0; j < H; ++j) {
          d_content[j] = content_output_grad<true, T>(dhb[j], content[j]);
        }
      } else {
#pragma GCC ivdep
        for (int64_t j = 0; j < H; ++j) {
          d_content[j] = content_output_grad<false, T>(dhb[j], content[j]);
        }
      }
      continue;
    }
    if (need_tc) tanh_to<T>(cb, tcs, H);
    with_output_rule(ks.output, [&](auto rule) {
      memory_row_backward_out<T, decltype(rule)::value>(ks, H, g, xob, cb, tcs, cp, dhb, dcb,
                                                        dab, dxob);
    });
  }
}

//

#if RNN_ABLATIONS_VEC_KIND != 0
// ---------------------------------------------------------------------------------------------
// The per-step GEMM of the recurrence (float32).  Its shape is small and skinny (M = batch rows,
// e.g. 32; K = H; N = R*H, or K = R*H and N = H in the backward pass).  The weight is packed
// once per layer call into panels of kPanel columns (each panel K x kPanel, contiguous, zero
// padded; see pack_b), and every step streams the panels through a kMr x kPanel
// register-blocked micro-kernel: per k, kNv vector loads of the panel row, one broadcast of A per
// row and kMr * kNv FMAs into accumulators that stay in registers.
//   AVX2 + FMA (16 ymm registers): 4 x 24 = 4 rows x 3 vectors of 8, 12 accumulators.
//   AVX-512F (32 zmm registers): 8 x 32 = 8 rows x 2 vectors of 16, 16 accumulators (2 loads +
//     8 broadcasts per 16 FMAs); 32-column panels waste less of the last panel than 48 would at
//     the experiments' N = 100..2600.
//   emulated AVX-512 (test only, see vec_kernels.h): the AVX-512 blocking with each 16-lane
//     vector held as two 8-lane AVX2 halves, so that the CPUs without AVX-512 run the 8-row
//     blocks, 32-column panels and their tails of the AVX-512 path.
// The micro-kernel below is written once against the vector type VecF of the copy.
#if RNN_ABLATIONS_VEC_KIND == 1
struct VecF {
  using T = __m256;
  static constexpr int W = 8;
  static T zero() { return _mm256_setzero_ps(); }
  static T load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, T v) { _mm256_storeu_ps(p, v); }
  static T bcast(const float* p) { return _mm256_broadcast_ss(p); }
  static T fma(T a, T b, T c) { return _mm256_fmadd_ps(a, b, c); }
  static T add(T a, T b) { return _mm256_add_ps(a, b); }
};
constexpr int kMr = 4, kNv = 3;
#elif RNN_ABLATIONS_VEC_KIND == 2
struct VecF {
  using T = __m512;
  static constexpr int W = 16;
  static T zero() { return _mm512_setzero_ps(); }
  static T load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, T v) { _mm512_storeu_ps(p, v); }
  static T bcast(const float* p) { return _mm512_set1_ps(*p); }
  static T fma(T a, T b, T c) { return _mm512_fmadd_ps(a, b, c); }
  static T add(T a, T b) { return _mm512_add_ps(a, b); }
};
constexpr int kMr = 8, kNv = 2;
#elif RNN_ABLATIONS_VEC_KIND == 3
struct VecF {
  struct T { __m256 lo, hi; };
  static constexpr int W = 16;
  static T zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
  static T load(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
  static void store(float* p, T v) { _mm256_storeu_ps(p, v.lo); _mm256_storeu_ps(p + 8, v.hi); }
  static T bcast(const float* p) { const __m256 a = _mm256_broadcast_ss(p); return {a, a}; }
  static T fma(T a, T b, T c) {
    return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
  }
  static T add(T a, T b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
};
constexpr int kMr = 8, kNv = 2;
#else
#error "unknown RNN_ABLATIONS_VEC_KIND"
#endif
constexpr int64_t kPanel = kNv * VecF::W;  // columns per packed panel of this copy

// C[0:MR, 0:nc] (+)= A[0:MR, 0:K] * panel, for MR in 1..kMr rows (the loops over r and j have
// constant bounds and are unrolled, so the accumulators live in registers).
template <int MR, bool Acc>
inline void micro_kernel(int64_t K, const float* A, int64_t lda, const float* Bp, float* C,
                         int64_t ldc, int64_t nc) {
  using V = typename VecF::T;
  V acc[MR][kNv];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 4
    for (int j = 0; j < kNv; ++j) acc[r][j] = VecF::zero();
  }
  for (int64_t k = 0; k < K; ++k) {
    V b[kNv];
#pragma GCC unroll 4
    for (int j = 0; j < kNv; ++j) b[j] = VecF::load(Bp + j * VecF::W);
    Bp += kPanel;
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const V a = VecF::bcast(A + r * lda + k);
#pragma GCC unroll 4
      for (int j = 0; j < kNv; ++j) acc[r][j] = VecF::fma(a, b[j], acc[r][j]);
    }
  }
  if (nc == kPanel) {
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      float* c = C + r * ldc;
#pragma GCC unroll 4
      for (int j = 0; j < kNv; ++j) {
        V v = acc[r][j];
        if (Acc) v = VecF::add(VecF::load(c + j * VecF::W), v);
        VecF::store(c + j * VecF::W, v);
      }
    }
  } else {  // last panel: only nc < kPanel columns exist in C
    // (constant-bound, unrolled loops here too: an accumulator indexed by a run-time r or j
    // would keep the whole array in memory, stored at every k.)
    alignas(64) float tmp[kPanel];
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 4
      for (int j = 0; j < kNv; ++j) VecF::store(tmp + j * VecF::W, acc[r][j]);
      float* c = C + r * ldc;
      for (int64_t j = 0; j < nc; ++j) c[j] = Acc ? c[j] + tmp[j] : tmp[j];
    }
  }
}

// The rows left over after the blocks of kMr (rows < kMr): one micro-kernel of that height.
template <bool Acc, int MR>
inline void micro_kernel_rows(int64_t rows, int64_t K, const float* A, int64_t lda,
                              const float* Bp, float* C, int64_t ldc, int64_t nc) {
  if constexpr (MR > 0) {
    if (rows == MR) micro_kernel<MR, Acc>(K, A, lda, Bp, C, ldc, nc);
    else micro_kernel_rows<Acc, MR - 1>(rows, K, A, lda, Bp, C, ldc, nc);
  }
}

// C (M x N, row stride ldc) = [C +] A (M x K, row stride lda) * B, B packed by pack_b (panels
// of K x kPanel from bp0); panels [p0, p1) only (the plain schedule splits them over threads).
template <bool Acc>
void gemm_panels_t(int64_t M, const float* A, int64_t lda, const float* bp0, int64_t K, int64_t N,
                   float* C, int64_t ldc, int64_t p0, int64_t p1) {
  for (int64_t p = p0; p < p1; ++p) {
    const float* bp = bp0 + p * K * kPanel;
    const int64_t nc = std::min(kPanel, N - p * kPanel);
    float* cp = C + p * kPanel;
    int64_t m = 0;
    for (; m + kMr <= M; m += kMr) {
      micro_kernel<kMr, Acc>(K, A + m * lda, lda, bp, cp + m * ldc, ldc, nc);
    }
    micro_kernel_rows<Acc, kMr - 1>(M - m, K, A + m * lda, lda, bp, cp + m * ldc, ldc, nc);
  }
}

inline void gemm_panels(bool acc, int64_t M, const float* A, int64_t lda, const float* bp0,
                        int64_t K, int64_t N, float* C, int64_t ldc, int64_t p0, int64_t p1) {
  if (acc) gemm_panels_t<true>(M, A, lda, bp0, K, N, C, ldc, p0, p1);
  else gemm_panels_t<false>(M, A, lda, bp0, K, N, C, ldc, p0, p1);
}
#endif  // RNN_ABLATIONS_VEC_KIND != 0
