// The step GEMM through MKL's packed GEMM (cblas_sgemm_pack once per layer call, then
// cblas_sgemm_compute per step): MKL picks its code for the CPU it runs on (AVX2, AVX-512, ...),
// which the kernel's own packed GEMM (vec_kernels.h) does not.  torch's CPU build links MKL into
// libtorch_cpu and exports these entry points; they are declared weak here, so that a torch
// without MKL loads the module and the kernel keeps its own GEMM (library_gemm_available()).
//
// Which GEMM a call's steps use is a per-shape choice: the library from a number of
// multiply-adds per step (B x N x K), one threshold for training and one for inference, set by
// the caller (set_library_step_gemm; the Python side passes plan.POLICY.library_step_gemm for
// the vector path in use); -1 = never.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/mm.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

extern "C" {
// MKL's CBLAS (LP64: MKL_INT is int; the enums are ints), declared here as MKL's CBLAS header does.
size_t cblas_sgemm_pack_get_size(int identifier, int m, int n, int k) __attribute__((weak));
void cblas_sgemm_pack(int layout, int identifier, int trans, int m, int n, int k, float alpha,
                      const float* src, int ld, float* dest) __attribute__((weak));
void cblas_sgemm_compute(int layout, int transa, int transb, int m, int n, int k,
                         const float* a, int lda, const float* b, int ldb, float beta, float* c,
                         int ldc) __attribute__((weak));
// bfloat16 x bfloat16 -> float32 (MKL_BF16 is an unsigned 16-bit integer holding the bits)
void cblas_gemm_bf16bf16f32(int layout, int transa, int transb, int m, int n, int k, float alpha,
                            const uint16_t* a, int lda, const uint16_t* b, int ldb, float beta,
                            float* c, int ldc) __attribute__((weak));
}

namespace rnn_ablations {
namespace cpu {

namespace mkl_enum {
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112, kPacked = 151, kBMatrix = 162;
}

inline bool library_gemm_available() {
  return cblas_sgemm_pack_get_size != nullptr && cblas_sgemm_pack != nullptr &&
         cblas_sgemm_compute != nullptr;
}

// Multiply-adds per step from which the step GEMM goes through the library, for the steps of a
// call that keeps what a backward needs (training: forward and backward) and for a no-gradient
// forward (inference); -1 = never.
inline std::atomic<int64_t>& library_step_min_macs(bool inference) {
  static std::atomic<int64_t> train{-1}, infer{-1};
  return inference ? infer : train;
}
inline void set_library_step_gemm(int64_t train_min_macs, int64_t inference_min_macs) {
  TORCH_CHECK(train_min_macs >= -1 && inference_min_macs >= -1,
              "set_library_step_gemm: give the multiply-adds per step from which the library GEMM "
              "is used (>= 0), or -1 for never; got ", train_min_macs, " and ", inference_min_macs);
  library_step_min_macs(false).store(train_min_macs, std::memory_order_relaxed);
  library_step_min_macs(true).store(inference_min_macs, std::memory_order_relaxed);
}
inline std::vector<int64_t> library_step_gemm() {
  return {library_step_min_macs(false).load(std::memory_order_relaxed),
          library_step_min_macs(true).load(std::memory_order_relaxed)};
}

// Whether the float32 step GEMMs rows x N x K of a training (inference = false) or no-gradient
// call take the library.
inline bool library_step_applies(bool inference, int64_t rows, int64_t N, int64_t K) {
  const int64_t min_macs = library_step_min_macs(inference).load(std::memory_order_relaxed);
  return min_macs >= 0 && library_gemm_available() && rows * N * K >= min_macs &&
         rows < (int64_t{1} << 31) && N < (int64_t{1} << 31) && K < (int64_t{1} << 31);
}

// A weight packed by MKL as the B operand of C (rows x N) [+]= A (rows x K) * B, where B is
// w^T (transposed, w (N x K)) or w itself (w (K x N)), row-major, float32, contiguous.
struct LibraryPackedB {
  at::Tensor buf;  // MKL's packed format (bytes)
  int64_t N = 0, K = 0;
  bool defined() const { return buf.defined(); }
};

inline LibraryPackedB library_pack_b(const at::Tensor& w, bool transposed, int64_t rows) {
  TORCH_CHECK(w.scalar_type() == at::kFloat && w.is_contiguous() && w.dim() == 2,
              "library_pack_b: w must be a contiguous float32 matrix");
  LibraryPackedB p;
  p.N = transposed ? w.size(0) : w.size(1);
  p.K = transposed ? w.size(1) : w.size(0);
  const int m = static_cast<int>(std::max<int64_t>(rows, 1));
  const size_t bytes = cblas_sgemm_pack_get_size(mkl_enum::kBMatrix, m, static_cast<int>(p.N),
                                                 static_cast<int>(p.K));
  // float storage keeps MKL's buffer 4-byte aligned at least; at::empty aligns to 64 bytes
  p.buf = at::empty({static_cast<int64_t>((bytes + sizeof(float) - 1) / sizeof(float))},
                    w.options());
  cblas_sgemm_pack(mkl_enum::kRowMajor, mkl_enum::kBMatrix,
                   transposed ? mkl_enum::kTrans : mkl_enum::kNoTrans, m, static_cast<int>(p.N),
                   static_cast<int>(p.K), 1.0f, w.data_ptr<float>(), static_cast<int>(w.size(1)),
                   p.buf.data_ptr<float>());
  return p;
}

// C (rows x N, row stride ldc) [+]= A (rows x K, row stride lda) * B.  MKL uses torch's
// threads; called inside a parallel region (a pipeline role, a concurrent direction: torch's
// OpenMP team) it runs on the calling thread alone.
inline void library_gemm(bool accumulate, int64_t rows, const float* A, int64_t lda,
                         const LibraryPackedB& b, float* C, int64_t ldc) {
  if (rows == 0) return;
  cblas_sgemm_compute(mkl_enum::kRowMajor, mkl_enum::kNoTrans, mkl_enum::kPacked,
                      static_cast<int>(rows), static_cast<int>(b.N), static_cast<int>(b.K), A,
                      static_cast<int>(lda), b.buf.data_ptr<float>(), static_cast<int>(b.N),
                      accumulate ? 1.0f : 0.0f, C, static_cast<int>(ldc));
}

// ---------------------------------------------------------------------------------------------
// The step GEMM in bfloat16 (w_hh given in bfloat16 with float32 projections and states,
// layer_tensors.h check_w_hh_dtype): the operand A (h_{t-1}, or d_proj in the backward; float32)
// is rounded to bfloat16 into a small buffer per step, and C += A_bf16 * B_bf16 accumulates in
// float32 straight into the float32 gates (or dh), so nothing but the GEMM's operands is
// bfloat16.  Where the CPU has AVX512-BF16 or AMX this halves the bytes of w_hh each step reads
// and runs on the bfloat16 dot-product instructions; the plan takes it only there
// (plan.bf16_gemm_applies), elsewhere bfloat16 is converted back to float32 inside the library.
//
// The library is MKL's cblas_gemm_bf16bf16f32 (exported by torch's CPU build, the same call
// ATen's own bfloat16 x bfloat16 -> float32 GEMM makes on x86; MKL picks AMX, AVX512-BF16 or a
// conversion path per CPU).  Without it, or with RNN_ABLATIONS_PACKED_GEMM=0, ATen's float32
// GEMM runs on the bfloat16 values widened to float32 (w_hh widened once per call): the same
// products (a product of two bfloat16 values is exact in float32), for the tests and for a torch
// without MKL.
inline bool library_bf16_gemm_available() { return cblas_gemm_bf16bf16f32 != nullptr; }

struct Bf16StepB {
  at::Tensor w;        // w_hh (N x K, B = w^T) or (K x N, B = w), bfloat16, contiguous
  at::Tensor w_float;  // w widened to float32, where the library is not used
  at::Tensor a_buf;    // A rounded to bfloat16 (library) or to bfloat16 values in float32 (ATen)
  bool transposed = false;
  int64_t N = 0, K = 0;
  bool defined() const { return w.defined(); }
};

inline Bf16StepB bf16_step_b(const at::Tensor& w, bool transposed, int64_t rows,
                             bool use_library) {
  TORCH_CHECK(w.scalar_type() == at::kBFloat16 && w.is_contiguous() && w.dim() == 2,
              "bf16_step_b: w must be a contiguous bfloat16 matrix");
  Bf16StepB b;
  b.w = w;
  b.transposed = transposed;
  b.N = transposed ? w.size(0) : w.size(1);
  b.K = transposed ? w.size(1) : w.size(0);
  const bool library = use_library && library_bf16_gemm_available() && b.N < (int64_t{1} << 31) &&
                       b.K < (int64_t{1} << 31) && rows < (int64_t{1} << 31);
  if (!library) b.w_float = w.to(at::kFloat);
  b.a_buf = at::empty({std::max<int64_t>(rows, 1), b.K},
                      w.options().dtype(library ? at::kBFloat16 : at::kFloat));
  return b;
}

// C (rows x N, row stride ldc) [+]= bf16(A) (rows x K, row stride lda) * B, accumulated in
// float32.  MKL uses torch's threads (alone on the calling thread inside a parallel region).
inline void bf16_step_gemm(bool accumulate, int64_t rows, const float* A, int64_t lda,
                           Bf16StepB& b, float* C, int64_t ldc) {
  if (rows == 0) return;
  const int64_t K = b.K, N = b.N;
  at::Tensor a_src = at::from_blob(const_cast<float*>(A), {rows, K}, {lda, 1},
                                   b.a_buf.options().dtype(at::kFloat));
  at::Tensor a = b.a_buf.narrow(0, 0, rows);
  if (!b.w_float.defined()) {
    a.copy_(a_src);  // round to nearest even, vectorised by ATen
    cblas_gemm_bf16bf16f32(mkl_enum::kRowMajor, mkl_enum::kNoTrans,
                           b.transposed ? mkl_enum::kTrans : mkl_enum::kNoTrans,
                           static_cast<int>(rows), static_cast<int>(N), static_cast<int>(K), 1.0f,
                           reinterpret_cast<const uint16_t*>(a.data_ptr<at::BFloat16>()),
                           static_cast<int>(K),
                           reinterpret_cast<const uint16_t*>(b.w.data_ptr<at::BFloat16>()),
                           static_cast<int>(b.w.size(1)), accumulate ? 1.0f : 0.0f, C,
                           static_cast<int>(ldc));
    return;
  }
  a.copy_(a_src.to(at::kBFloat16));  // the bfloat16 values, in float32
  at::Tensor c = at::from_blob(C, {rows, N}, {ldc, 1}, a.options());
  const at::Tensor bm = b.transposed ? b.w_float.t() : b.w_float;
  if (accumulate) c.addmm_(a, bm);
  else at::mm_out(c, a, bm);
}

}  // namespace cpu
}  // namespace rnn_ablations
