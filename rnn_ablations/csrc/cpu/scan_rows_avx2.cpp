// AVX2 + FMA rows of the element-wise scan (float32), chosen at run time by scan.cpp when
// the kernel's vector path executes AVX2 (avx2, avx512: isa_runs_avx2(); RNN_ABLATIONS_ISA=portable
// forces the portable loops of scan.cpp).  Only the functions below are compiled for AVX2 + FMA
// (`#pragma GCC target`), after every header is included, so the module never executes an AVX2
// instruction on a CPU without it (the same scheme as vec_kernels.cpp).
//
// One iteration handles 8 units of one (row, step): V8, a value of 8 float lanes with +, - and
// *, runs the per-element templates of common/elementwise.h (scan_forward_element,
// scan_backward_element: the maths the portable rows and the CUDA scan run too); the last H mod
// 8 units use masked loads and stores.  exp is the same Cephes polynomial as the portable
// scan_exp (relative error about 2e-7), sigmoid(x) = 1 / (1 + exp(-x)), tanh(x) =
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

inline __m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
  const __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fmadd_ps(k, _mm256_set1_ps(2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

inline __m256 sigmoid8(__m256 x) {
  const __m256 one = _mm256_set1_ps(1.0f);
  return _mm256_div_ps(one, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), x))));
}

inline __m256 tanh8(__m256 x) {
  const __m256 sign = _mm256_set1_ps(-0.0f), one = _mm256_set1_ps(1.0f);
  const __m256 e = exp8(_mm256_mul_ps(_mm256_set1_ps(-2.0f), _mm256_andnot_ps(sign, x)));
  const __m256 t = _mm256_div_ps(_mm256_sub_ps(one, e), _mm256_add_ps(one, e));
  return _mm256_or_ps(t, _mm256_and_ps(sign, x));
}

// Loads and stores of 8 units, or of the first `rem` of them (the mask) at a row's end.
template <bool Tail>
inline __m256 ld(const float* p, __m256i m) {
  return Tail ? _mm256_maskload_ps(p, m) : _mm256_loadu_ps(p);
}
template <bool Tail>
inline void st(float* p, __m256i m, __m256 v) {
  if (Tail) _mm256_maskstore_ps(p, m, v);
  else _mm256_storeu_ps(p, v);
}

inline __m256i tail_mask(int64_t rem) {
  alignas(32) int32_t m[8];
  for (int j = 0; j < 8; ++j) m[j] = j < rem ? -1 : 0;
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(m));
}

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

// The activations of these rows (the Act of the element-wise templates).
struct Avx2Act {
  static inline V8 sigmoid(V8 x) { return sigmoid8(x.v); }
  static inline V8 tanh(V8 x) { return tanh8(x.v); }
};

#include "../common/elementwise.h"  // scan_forward_element, scan_backward_element (on V8)

// Units [j, j + 8) (the first `rem` of them, mask m, when Tail) of one (row, step).  p: the
// direction's G*H columns of proj's row, bias: its bias (or zeros).
template <int Out, bool HW, bool SAVE, bool Tail>
inline void forward_units(const ScanSpec& sp, int64_t H, const float* p, const float* bias,
                          float* c, float* h, float* saved, int64_t j, __m256i m) {
  const auto pre = [&](int role) {
    const int64_t at = sp.block[role] * H + j;
    return V8(ld<Tail>(p + at, m)) + V8(ld<Tail>(bias + at, m));
  };
  V8 cn = ld<Tail>(c + j, m);
  const V8 hv = scan_forward_element<Out, HW, Avx2Act>(pre, cn);
  st<Tail>(c + j, m, cn.v);
  if (SAVE) st<Tail>(saved + j, m, cn.v);
  st<Tail>(h + j, m, hv.v);
}

template <int Out, bool HW, bool SAVE>
void forward_rows_t(const ScanArgs<float>& a, int64_t k0, int64_t k1) {
  const int64_t H = a.H, GH = a.G * H, full = H / 8 * 8;
  const ScanSpec sp = a.spec;
  const __m256i m = tail_mask(H - full);
  const __m256i none = _mm256_setzero_si256();
  for (int64_t k = k0; k < k1; ++k) {
    const int64_t d = k / a.nB, b = k % a.nB;
    const float* bias = a.bias ? a.bias + d * GH : a.zeros;
    float* c = a.c_n + k * H;
    std::memcpy(c, a.c0 + k * H, sizeof(float) * H);
    const int64_t steps = a.len[b];
    const float* last = a.h0 + k * H;
    for (int64_t s = 0; s < steps; ++s) {
      const int64_t t = d == 0 ? s : steps - 1 - s;
      const float* p = a.proj + t * a.p_st + b * a.p_sb + d * GH;
      const int64_t o = t * a.o_st + b * a.o_sb + d * H;
      float* h = a.out + o;
      float* saved = SAVE ? a.cs + o : nullptr;
      for (int64_t j = 0; j < full; j += 8)
        forward_units<Out, HW, SAVE, false>(sp, H, p, bias, c, h, saved, j, none);
      if (full < H) forward_units<Out, HW, SAVE, true>(sp, H, p, bias, c, h, saved, full, m);
      last = h;
    }
    std::memcpy(a.h_n + k * H, last, sizeof(float) * H);
  }
}

// dq: the direction's G*H columns of d_proj's row; db: its bias-gradient sums (when DB).
template <int Out, bool HW, bool DB, bool Tail>
inline void backward_units(const ScanSpec& sp, int64_t H, const float* p, const float* bias,
                           float* dq, const float* go, const float* gh, const float* ct,
                           const float* cp, float* dc, float* db, int64_t j, __m256i m) {
  const auto pre = [&](int role) {
    const int64_t at = sp.block[role] * H + j;
    return V8(ld<Tail>(p + at, m)) + V8(ld<Tail>(bias + at, m));
  };
  const auto put = [&](int role, V8 v) {
    const int64_t at = sp.block[role] * H + j;
    st<Tail>(dq + at, m, v.v);
    if (DB) st<Tail>(db + at, m, _mm256_add_ps(ld<Tail>(db + at, m), v.v));
  };
  const V8 dh = V8(ld<Tail>(go + j, m)) + V8(ld<Tail>(gh + j, m));
  const V8 dc_prev = scan_backward_element<Out, HW, Avx2Act>(
      pre, put, dh, V8(ld<Tail>(ct + j, m)), V8(ld<Tail>(cp + j, m)),
      V8(ld<Tail>(dc + j, m)));
  st<Tail>(dc + j, m, dc_prev.v);
}

template <int Out, bool HW, bool DB>
void backward_rows_t(const ScanArgs<float>& a, int64_t k0, int64_t k1) {
  const int64_t H = a.H, GH = a.G * H, full = H / 8 * 8;
  const ScanSpec sp = a.spec;
  const __m256i m = tail_mask(H - full);
  const __m256i none = _mm256_setzero_si256();
  for (int64_t k = k0; k < k1; ++k) {
    const int64_t d = k / a.nB, b = k % a.nB;
    const float* bias = a.bias ? a.bias + d * GH : a.zeros;
    float* dc = a.dc + k * H;
    float* db = DB ? a.dbias_rows + k * GH : nullptr;
    const int64_t steps = a.len[b];
    for (int64_t s = steps - 1; s >= 0; --s) {
      const int64_t t = d == 0 ? s : steps - 1 - s;
      const int64_t po = t * a.p_st + b * a.p_sb + d * GH;
      const float* p = a.proj + po;
      float* dq = a.dproj + po;
      const int64_t o = t * a.o_st + b * a.o_sb + d * H;
      const float* go = a.g_out + t * a.g_st + b * a.g_sb + d * H;
      const float* gh = s == steps - 1 ? a.g_hn + k * H : a.zeros;
      const float* ct = a.cs_in + o;
      const int64_t tp = d == 0 ? s - 1 : steps - s;  // the previous step's position
      const float* cp = s > 0 ? a.cs_in + tp * a.o_st + b * a.o_sb + d * H : a.c0 + k * H;
      for (int64_t j = 0; j < full; j += 8)
        backward_units<Out, HW, DB, false>(sp, H, p, bias, dq, go, gh, ct, cp, dc, db, j, none);
      if (full < H)
        backward_units<Out, HW, DB, true>(sp, H, p, bias, dq, go, gh, ct, cp, dc, db, full, m);
    }
  }
}

// f(std::integral_constant<int, Out>, std::integral_constant<bool, HW>) for the spec's output
// rule (kernel_spec.h with_output_rule) and highway.
template <typename F>
void with_rule(const ScanArgs<float>& a, F&& f) {
  with_output_rule(a.spec.output, [&](auto out) {
    if (a.spec.highway) f(out, std::true_type());
    else f(out, std::false_type());
  });
}

}  // namespace

void forward_rows_avx2(const ScanArgs<float>& a, int64_t k0, int64_t k1) {
  with_rule(a, [&](auto out, auto hw) {
    constexpr int OUT = decltype(out)::value;
    constexpr bool HW = decltype(hw)::value;
    if (a.cs) forward_rows_t<OUT, HW, true>(a, k0, k1);
    else forward_rows_t<OUT, HW, false>(a, k0, k1);
  });
}

void backward_rows_avx2(const ScanArgs<float>& a, int64_t k0, int64_t k1) {
  with_rule(a, [&](auto out, auto hw) {
    constexpr int OUT = decltype(out)::value;
    constexpr bool HW = decltype(hw)::value;
    if (a.dbias_rows) backward_rows_t<OUT, HW, true>(a, k0, k1);
    else backward_rows_t<OUT, HW, false>(a, k0, k1);
  });
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
