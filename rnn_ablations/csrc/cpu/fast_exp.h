// The float exp of the CPU kernels, written once: e^x = 2^k e^r with k = round(x log2 e) and
// r = x - k ln 2 (ln 2 in two parts, so that r keeps float precision), e^r by Cephes' degree-7
// polynomial on |r| <= ln 2 / 2; relative error about 2e-7 on [kExpMin, kExpMax], the clamp
// applied to every input first (a clamp that keeps a NaN: common/elementwise.h, non-finite
// numbers).  Each user writes the clamp, the rounding of k and the scaling by 2^k with its own
// instructions and calls exp_reduced for the rest: cpu/vec_impl.h (scalar code that GCC
// vectorises for each instruction set), cpu/scan.cpp (the portable rows' GCC vector lanes),
// cpu/scan_rows_avx2.cpp (8 lanes of AVX2 intrinsics).  Double precision uses libm's exp.
//
// No include guard on purpose, as common/elementwise.h: each user includes it once, inside the
// namespace (and under the target pragma) of the code it is compiled for.

constexpr float kExpMin = -87.0f, kExpMax = 88.0f;  // inputs clamped to [kExpMin, kExpMax]
constexpr float kExpLog2e = 1.44269504088896341f;
constexpr float kExpLn2Hi = 0.693359375f;           // ln 2 = kExpLn2Hi + kExpLn2Lo
constexpr float kExpLn2Lo = -2.12194440e-4f;

// e^x for x = k ln 2 + r: the reduced argument r = x - k ln 2 (k a whole number, as V)
template <typename V>
inline V exp_reduce(V x, V k) {
  return x - k * kExpLn2Hi - k * kExpLn2Lo;
}

// e^r for |r| <= ln 2 / 2.  V: float, or a vector value type with +, * and a float operand
template <typename V>
inline V exp_reduced(V r) {
  V p = r * 1.9875691500e-4f + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  return p * (r * r) + r + 1.0f;
}
