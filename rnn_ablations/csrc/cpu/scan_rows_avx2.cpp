// AVX2 + FMA rows of the element-wise scan (float32), chosen at run time by scan.cpp when
// the kernel's vector path executes AVX2 (avx2, avx512: isa_runs_avx2(); RNN_ABLATIONS_ISA=portable
// forces the portable loops of scan.cpp).  Only the functions below are compiled for AVX2 + FMA
// (`#pragma GCC target`), after every header is included, so the module never executes an AVX2
// instruction on a CPU without it (the same scheme as vec_kernels.cpp).
//
// The row loops are scan_rows_impl.h's, on 8 float lanes (Avx2Lanes): V8, a value of 8 float
// lanes with +, - and *, runs the per-element templates of common/elementwise.h
// (scan_forward_element, scan_backward_element: the maths the portable rows and the CUDA scan
// run too); the last H mod 8 units use masked loads and stores.  exp is cpu/fast_exp.h's, as
// in the portable rows (relative error about 2e-7), sigmoid(x) = 1 / (1 + exp(-x)), tanh(x) =
// sign(x) (1 - e^{-2|x|}) / (1 + e^{-2|x|}), so both paths agree to float32 rounding.
#include "scan_rows.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__) && !defined(__clang__)
#define RNN_ABLATIONS_SCAN_AVX2 1
#include <immintrin.h>
#else
#define RNN_ABLATIONS_SCAN_AVX2 0
#endif

namespace rnn_ablations {
namespace scan {

#if RNN_ABLATIONS_SCAN_AVX2
#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace {

#include "../common/elementwise.h"  // scan_forward_element, scan_backward_element (on V8)
#include "fast_exp.h"                // exp_reduce, exp_reduced: the float exp's polynomial

// 8 float lanes as a value: construction from a float (so that T(1) - r broadcasts) and the
// arithmetic the element-wise templates use; GCC fuses a * b + c into an FMA.
struct V8 {
  __m256 v;
  V8() = default;
  V8(__m256 x) : v(x) {}
  V8(float x) : v(_mm256_set1_ps(x)) {}
};
inline V8 operator+(V8 a, V8 b) { return _mm256_add_ps(a.v, b.v); }
inline V8 operator-(V8 a, V8 b) { return _mm256_sub_ps(a.v, b.v); }
inline V8 operator*(V8 a, V8 b) { return _mm256_mul_ps(a.v, b.v); }

// exp on 8 lanes: cpu/fast_exp.h's polynomial on V8 (GCC fuses its a * b + c into FMAs)
inline __m256 exp8(__m256 x) {
  // max_ps / min_ps return their second operand when either is NaN: x goes second, so that a
  // NaN stays NaN (common/elementwise.h: non-finite numbers)
  x = _mm256_min_ps(_mm256_set1_ps(kExpMax), _mm256_max_ps(_mm256_set1_ps(kExpMin), x));
  const __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kExpLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const V8 p = exp_reduced(exp_reduce(V8(x), V8(k)));
  const __m256i e = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p.v, _mm256_castsi256_ps(e));
}

inline __m256 sigmoid8(__m256 x) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 s =
      _mm256_div_ps(one, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), x))));
  // exactly 0 where torch's exp(-x) overflows (-Inf included); a NaN compares false and stays
  const __m256 zero = _mm256_cmp_ps(x, _mm256_set1_ps(kSigmoidZeroBelow), _CMP_LT_OQ);
  return _mm256_andnot_ps(zero, s);
}

inline __m256 tanh8(__m256 x) {
  const __m256 sign = _mm256_set1_ps(-0.0f), one = _mm256_set1_ps(1.0f);
  const __m256 e = exp8(_mm256_mul_ps(_mm256_set1_ps(-2.0f), _mm256_andnot_ps(sign, x)));
  const __m256 t = _mm256_div_ps(_mm256_sub_ps(one, e), _mm256_add_ps(one, e));
  return _mm256_or_ps(t, _mm256_and_ps(sign, x));
}

// The activations of these rows (the Act of the element-wise templates).
struct Avx2Act {
  static inline V8 sigmoid(V8 x) { return sigmoid8(x.v); }
  static inline V8 tanh(V8 x) { return tanh8(x.v); }
};


// The lane policy of scan_rows_impl.h: 8 float lanes; a row's last H mod 8 units use masked
// loads and stores.
struct Avx2Lanes {
  using S = float;
  using V = V8;
  using Act = Avx2Act;
  using Mask = __m256i;
  static constexpr int64_t N = 8;
  static inline Mask mask(int64_t rem) {
    alignas(32) int32_t m[8];
    for (int j = 0; j < 8; ++j) m[j] = j < rem ? -1 : 0;
    return _mm256_load_si256(reinterpret_cast<const __m256i*>(m));
  }
  static inline Mask all() { return _mm256_set1_epi32(-1); }
  template <bool Tail>
  static inline V8 ld(const float* p, Mask m) {
    return Tail ? _mm256_maskload_ps(p, m) : _mm256_loadu_ps(p);
  }
  template <bool Tail>
  static inline void st(float* p, Mask m, V8 v) {
    if (Tail) _mm256_maskstore_ps(p, m, v.v);
    else _mm256_storeu_ps(p, v.v);
  }
};

#include "scan_rows_impl.h"  // the row loops on Avx2Lanes

}  // namespace

void forward_rows_avx2(const ScanArgs<float>& a, int64_t k0, int64_t k1) {
  run_forward_rows<Avx2Lanes>(a, k0, k1);
}

void backward_rows_avx2(const ScanArgs<float>& a, int64_t k0, int64_t k1) {
  run_backward_rows<Avx2Lanes>(a, k0, k1);
}

#pragma GCC pop_options

bool avx2_rows_built() { return true; }

#else  // no AVX2 path in this build

bool avx2_rows_built() { return false; }
void forward_rows_avx2(const ScanArgs<float>&, int64_t, int64_t) {}
void backward_rows_avx2(const ScanArgs<float>&, int64_t, int64_t) {}

#endif

}  // namespace scan
}  // namespace rnn_ablations
