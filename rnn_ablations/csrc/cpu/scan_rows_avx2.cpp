// AVX2 + FMA rows of the element-wise scan (float32), chosen at run time by scan.cpp when
// the kernel's vector path executes AVX2 (avx2, avx512: isa_runs_avx2(); RNN_ABLATIONS_ISA=portable
// forces the portable loops of scan.cpp).  Only the functions below are compiled for AVX2 + FMA
// (`#pragma GCC target`), after every header is included, so the module never executes an AVX2
// instruction on a CPU without it (the same scheme as vec_kernels.cpp).
//
// One iteration handles 8 units of one (row, step) with explicit 256-bit intrinsics; the last
// H mod 8 units use masked loads and stores.  exp is the same Cephes polynomial as the portable
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

// Block pointers of one direction: proj's blocks (offset per step) and their biases.
struct Blocks {
  int64_t i, f, o, c, r, hw;  // offsets in elements within a direction's G * H
  const float *bi, *bf, *bo, *bc, *br, *bhw;
};

Blocks blocks_of(const ScanArgs<float>& a, int64_t d) {
  const int64_t H = a.H;
  const float* bias = a.bias ? a.bias + d * a.G * H : nullptr;
  auto off = [&](int64_t blk) { return blk >= 0 ? blk * H : 0; };
  auto bp = [&](int64_t blk) { return bias && blk >= 0 ? bias + blk * H : a.zeros; };
  return Blocks{off(a.i), off(a.f), off(a.o), off(a.c), off(a.r), off(a.hw),
                bp(a.i), bp(a.f), bp(a.o), bp(a.c), bp(a.r), bp(a.hw)};
}

template <int64_t OUT, bool HW, bool SAVE, bool Tail>
inline void forward_units(const Blocks& q, const float* p, float* c, float* h, float* saved,
                          int64_t j, __m256i m) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 ig = sigmoid8(_mm256_add_ps(ld<Tail>(p + q.i + j, m), ld<Tail>(q.bi + j, m)));
  const __m256 fg = sigmoid8(_mm256_add_ps(ld<Tail>(p + q.f + j, m), ld<Tail>(q.bf + j, m)));
  const __m256 content = _mm256_add_ps(ld<Tail>(p + q.c + j, m), ld<Tail>(q.bc + j, m));
  const __m256 cn = _mm256_fmadd_ps(ig, content, _mm256_mul_ps(fg, ld<Tail>(c + j, m)));
  st<Tail>(c + j, m, cn);
  if (SAVE) st<Tail>(saved + j, m, cn);
  __m256 hv;
  if (OUT == kOTanh) {
    const __m256 og = sigmoid8(_mm256_add_ps(ld<Tail>(p + q.o + j, m), ld<Tail>(q.bo + j, m)));
    hv = _mm256_mul_ps(og, tanh8(cn));
  } else if (OUT == kTanh) {
    hv = tanh8(cn);
  } else {
    hv = cn;
  }
  if (HW) {
    const __m256 r = sigmoid8(_mm256_add_ps(ld<Tail>(p + q.r + j, m), ld<Tail>(q.br + j, m)));
    const __m256 hw = _mm256_add_ps(ld<Tail>(p + q.hw + j, m), ld<Tail>(q.bhw + j, m));
    hv = _mm256_fmadd_ps(r, hv, _mm256_mul_ps(_mm256_sub_ps(one, r), hw));
  }
  st<Tail>(h + j, m, hv);
}

template <int64_t OUT, bool HW, bool SAVE>
void forward_rows_t(const ScanArgs<float>& a, int64_t k0, int64_t k1) {
  const int64_t H = a.H, full = H / 8 * 8;
  const __m256i m = tail_mask(H - full);
  const __m256i none = _mm256_setzero_si256();
  for (int64_t k = k0; k < k1; ++k) {
    const int64_t d = k / a.nB, b = k % a.nB;
    const Blocks q = blocks_of(a, d);
    float* c = a.c_n + k * H;
    std::memcpy(c, a.c0 + k * H, sizeof(float) * H);
    const int64_t steps = a.len[b];
    const float* last = a.h0 + k * H;
    for (int64_t s = 0; s < steps; ++s) {
      const int64_t t = d == 0 ? s : steps - 1 - s;
      const float* p = a.proj + t * a.p_st + b * a.p_sb + d * a.G * H;
      const int64_t o = t * a.o_st + b * a.o_sb + d * H;
      float* h = a.out + o;
      float* saved = SAVE ? a.cs + o : nullptr;
      for (int64_t j = 0; j < full; j += 8)
        forward_units<OUT, HW, SAVE, false>(q, p, c, h, saved, j, none);
      if (full < H) forward_units<OUT, HW, SAVE, true>(q, p, c, h, saved, full, m);
      last = h;
    }
    std::memcpy(a.h_n + k * H, last, sizeof(float) * H);
  }
}

template <int64_t OUT, bool HW, bool DB, bool Tail>
inline void backward_units(const Blocks& q, const float* p, float* dq, const float* go,
                           const float* gh, const float* ct, const float* cp, float* dc,
                           float* db, int64_t j, __m256i m) {
  const __m256 one = _mm256_set1_ps(1.0f);
  auto acc = [&](int64_t off, __m256 v) {
    if (DB) st<Tail>(db + off + j, m, _mm256_add_ps(ld<Tail>(db + off + j, m), v));
  };
  __m256 dh = _mm256_add_ps(ld<Tail>(go + j, m), ld<Tail>(gh + j, m));
  const __m256 cn = ld<Tail>(ct + j, m);
  __m256 tc = _mm256_setzero_ps(), og = tc, cell = cn;
  if (OUT == kOTanh) {
    tc = tanh8(cn);
    og = sigmoid8(_mm256_add_ps(ld<Tail>(p + q.o + j, m), ld<Tail>(q.bo + j, m)));
    cell = _mm256_mul_ps(og, tc);
  } else if (OUT == kTanh) {
    tc = tanh8(cn);
    cell = tc;
  }
  if (HW) {
    const __m256 r = sigmoid8(_mm256_add_ps(ld<Tail>(p + q.r + j, m), ld<Tail>(q.br + j, m)));
    const __m256 hw = _mm256_add_ps(ld<Tail>(p + q.hw + j, m), ld<Tail>(q.bhw + j, m));
    const __m256 omr = _mm256_sub_ps(one, r);
    const __m256 dr = _mm256_mul_ps(_mm256_mul_ps(dh, _mm256_sub_ps(cell, hw)), _mm256_mul_ps(r, omr));
    const __m256 dhw = _mm256_mul_ps(dh, omr);
    st<Tail>(dq + q.r + j, m, dr);
    st<Tail>(dq + q.hw + j, m, dhw);
    acc(q.r, dr);
    acc(q.hw, dhw);
    dh = _mm256_mul_ps(dh, r);
  }
  __m256 dcv = ld<Tail>(dc + j, m);
  if (OUT == kOTanh) {
    const __m256 dog = _mm256_mul_ps(_mm256_mul_ps(dh, tc), _mm256_mul_ps(og, _mm256_sub_ps(one, og)));
    st<Tail>(dq + q.o + j, m, dog);
    acc(q.o, dog);
    dcv = _mm256_fmadd_ps(_mm256_mul_ps(dh, og), _mm256_fnmadd_ps(tc, tc, one), dcv);
  } else if (OUT == kTanh) {
    dcv = _mm256_fmadd_ps(dh, _mm256_fnmadd_ps(tc, tc, one), dcv);
  } else {
    dcv = _mm256_add_ps(dcv, dh);
  }
  const __m256 ig = sigmoid8(_mm256_add_ps(ld<Tail>(p + q.i + j, m), ld<Tail>(q.bi + j, m)));
  const __m256 fg = sigmoid8(_mm256_add_ps(ld<Tail>(p + q.f + j, m), ld<Tail>(q.bf + j, m)));
  const __m256 content = _mm256_add_ps(ld<Tail>(p + q.c + j, m), ld<Tail>(q.bc + j, m));
  const __m256 di = _mm256_mul_ps(_mm256_mul_ps(dcv, content), _mm256_mul_ps(ig, _mm256_sub_ps(one, ig)));
  const __m256 dcont = _mm256_mul_ps(dcv, ig);
  const __m256 df = _mm256_mul_ps(_mm256_mul_ps(dcv, ld<Tail>(cp + j, m)),
                                  _mm256_mul_ps(fg, _mm256_sub_ps(one, fg)));
  st<Tail>(dq + q.i + j, m, di);
  st<Tail>(dq + q.c + j, m, dcont);
  st<Tail>(dq + q.f + j, m, df);
  st<Tail>(dc + j, m, _mm256_mul_ps(dcv, fg));
  acc(q.i, di);
  acc(q.c, dcont);
  acc(q.f, df);
}

template <int64_t OUT, bool HW, bool DB>
void backward_rows_t(const ScanArgs<float>& a, int64_t k0, int64_t k1) {
  const int64_t H = a.H, GH = a.G * H, full = H / 8 * 8;
  const __m256i m = tail_mask(H - full);
  const __m256i none = _mm256_setzero_si256();
  for (int64_t k = k0; k < k1; ++k) {
    const int64_t d = k / a.nB, b = k % a.nB;
    const Blocks q = blocks_of(a, d);
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
        backward_units<OUT, HW, DB, false>(q, p, dq, go, gh, ct, cp, dc, db, j, none);
      if (full < H) backward_units<OUT, HW, DB, true>(q, p, dq, go, gh, ct, cp, dc, db, full, m);
    }
  }
}

template <typename F>
void with_rule(const ScanArgs<float>& a, F&& f) {
  auto hw = [&](auto out) {
    if (a.r >= 0) f(out, std::true_type());
    else f(out, std::false_type());
  };
  if (a.output == kOTanh) hw(std::integral_constant<int64_t, kOTanh>());
  else if (a.output == kTanh) hw(std::integral_constant<int64_t, kTanh>());
  else hw(std::integral_constant<int64_t, kIdentity>());
}

}  // namespace

void forward_rows_avx2(const ScanArgs<float>& a, int64_t k0, int64_t k1) {
  with_rule(a, [&](auto out, auto hw) {
    constexpr int64_t OUT = decltype(out)::value;
    constexpr bool HW = decltype(hw)::value;
    if (a.cs) forward_rows_t<OUT, HW, true>(a, k0, k1);
    else forward_rows_t<OUT, HW, false>(a, k0, k1);
  });
}

void backward_rows_avx2(const ScanArgs<float>& a, int64_t k0, int64_t k1) {
  with_rule(a, [&](auto out, auto hw) {
    constexpr int64_t OUT = decltype(out)::value;
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
