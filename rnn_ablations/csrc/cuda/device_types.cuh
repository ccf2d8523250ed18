// The CUDA kernels' own scalar types and helpers, so that the device sources need no header of
// torch or of a CUDA toolkit: they are compiled at run time by NVRTC (rnn_ablations/kernels/cuda),
// which knows the CUDA built-ins (threadIdx, __ldcg, __shfl_xor_sync, atomicAdd, the math
// functions) but ships no C++ or toolkit header.
//
//   Half, BFloat16   the 16-bit storage types (float16, bfloat16): a bit pattern with conversions
//                    to and from float (round to nearest even, NaN kept a NaN), as torch's
//                    c10::Half / c10::BFloat16 convert on the device
//   acc_t<T>         the accumulation type of a storage type: float for the half types, else T
//                    (at::opmath_type's rule)
//   DeviceAct        the device's activations (sigmoid, tanh), the Act of common/elementwise.h
//
// Include once, before common/kernel_spec.h, outside any namespace.
#pragma once

#if defined(__CUDACC_RTC__)
// NVRTC has no <cstdint>; the widths the host side (ctypes) packs: 64-bit and 16-bit integers.
typedef long long int64_t;
typedef unsigned long long uint64_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
#endif

// A kernel's dynamic shared memory (the bytes its launch asks for), as a pointer `name`; the
// CPU emulation of the CUDA execution model (tests/cuda_emulation) defines its own.
#if !defined(RNN_ABLATIONS_DYNAMIC_SMEM)
#define RNN_ABLATIONS_DYNAMIC_SMEM(name) extern __shared__ __align__(16) unsigned char name[]
#endif

namespace rnn_ablations {

// float16: 1 sign, 5 exponent, 10 mantissa bits.  The conversions are the PTX instructions that
// cuda_fp16.h's __half2float / __float2half_rn wrap (every architecture has them).
struct Half {
  uint16_t x;
  Half() = default;
  __device__ __forceinline__ Half(float f) {
#if defined(RNN_ABLATIONS_EMULATION)  // host C++ (tests/cuda_emulation): the same rounding
    const _Float16 h = static_cast<_Float16>(f);
    __builtin_memcpy(&x, &h, sizeof(x));
#else
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(x) : "f"(f));
#endif
  }
  __device__ __forceinline__ Half(double d) : Half(static_cast<float>(d)) {}
  __device__ __forceinline__ Half(int i) : Half(static_cast<float>(i)) {}
  __device__ __forceinline__ operator float() const {
#if defined(RNN_ABLATIONS_EMULATION)
    _Float16 h;
    __builtin_memcpy(&h, &x, sizeof(x));
    return static_cast<float>(h);
#else
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x));
    return f;
#endif
  }
  __device__ static __forceinline__ Half from_bits(uint16_t bits) {
    Half h;
    h.x = bits;
    return h;
  }
};

// bfloat16: the upper 16 bits of a float.  Float to bfloat16 rounds to nearest even in integer
// arithmetic (no sm_80 instruction needed); a NaN stays a NaN (quiet).
struct BFloat16 {
  uint16_t x;
  BFloat16() = default;
  __device__ __forceinline__ BFloat16(float f) {
    const uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
      x = static_cast<uint16_t>((u >> 16) | 0x0040u);
    } else {
      const uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
      x = static_cast<uint16_t>((u + rounding) >> 16);
    }
  }
  __device__ __forceinline__ BFloat16(double d) : BFloat16(static_cast<float>(d)) {}
  __device__ __forceinline__ BFloat16(int i) : BFloat16(static_cast<float>(i)) {}
  __device__ __forceinline__ operator float() const {
    return __uint_as_float(static_cast<uint32_t>(x) << 16);
  }
  __device__ static __forceinline__ BFloat16 from_bits(uint16_t bits) {
    BFloat16 h;
    h.x = bits;
    return h;
  }
};

template <typename T> struct AccType { typedef T type; };
template <> struct AccType<Half> { typedef float type; };
template <> struct AccType<BFloat16> { typedef float type; };
template <typename T> using acc_t = typename AccType<T>::type;

// A load through L2 (bypassing the SM's non-coherent L1: other blocks of the grid wrote the value
// since the last barrier).
template <typename T> __device__ __forceinline__ T load_cg(const T* p) { return __ldcg(p); }
template <> __device__ __forceinline__ Half load_cg<Half>(const Half* p) {
  return Half::from_bits(__ldcg(reinterpret_cast<const unsigned short*>(p)));
}
template <> __device__ __forceinline__ BFloat16 load_cg<BFloat16>(const BFloat16* p) {
  return BFloat16::from_bits(__ldcg(reinterpret_cast<const unsigned short*>(p)));
}

// The device's activations in the accumulation type (float or double).
struct DeviceAct {
  template <typename A> __device__ static __forceinline__ A sigmoid(A x) {
    return A(1) / (A(1) + exp(-x));
  }
  template <typename A> __device__ static __forceinline__ A tanh(A x) { return ::tanh(x); }
};

template <typename T> __device__ __forceinline__ T sigm(T x) { return DeviceAct::sigmoid(x); }

}  // namespace rnn_ablations
