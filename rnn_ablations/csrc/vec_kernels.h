// The vector code of the CPU kernel: the element-wise pass of every variant and the packed
// per-step GEMM, compiled for several instruction sets in one build and chosen at run time.
//
// vec_kernels.cpp compiles vec_impl.h twice: once for the build's baseline (portable x86-64 /
// any other CPU) and, with GCC on x86-64, once more with AVX2 + FMA enabled for those functions
// only (`#pragma GCC target`), so the .so never executes an AVX2 instruction on a CPU without it.
// The running CPU picks (cpuid, `__builtin_cpu_supports`); RNN_ABLATIONS_ISA=avx2|portable
// forces a path (an error when this CPU or this build lacks it); set_isa() switches in-process
// (the tests run every path the CPU supports).
#pragma once

#include <torch/extension.h>

#include "kernel_spec.h"

#include <cstdint>
#include <string>
#include <vector>

namespace rnn_ablations {

// Sizes of one layer call: T steps, B rows, H hidden units, R recurrent and X input-only blocks
// of H rows (KernelSpec), and the row strides of the three row-major buffers a step reads.
struct Dims {
  int64_t T, B, H, R, X;
  int64_t proj_stride;   // row stride of proj / d_proj: (R + X) * H
  int64_t xo_stride;     // row stride of the input-only blocks ("xo": proj_stride inside proj,
                         // X*H in a buffer of their own)
  int64_t gates_stride;  // row stride of the gate activations: R*H in a buffer of their own,
                         // proj_stride when they live in proj
};

// ---- instruction-set selection ----------------------------------------------------------
// Name of the path in use ("avx2" or "portable"); the first call chooses it (RNN_ABLATIONS_ISA,
// else the best this CPU and build support) and throws if RNN_ABLATIONS_ISA names a path that
// this CPU or build cannot run.
std::string isa_name();
// Switch to "avx2", "portable" or "auto" (the best supported); throws for an unknown or
// unsupported name.  Not thread-safe against running kernels: call between layer calls.
void set_isa(const std::string& name);
// The paths this CPU and build can run, best first (always ends with "portable").
std::vector<std::string> supported_isas();

// ---- packed per-step GEMM (float32) -------------------------------------------------------
constexpr int64_t kNr = 24;  // columns per packed panel

struct PackedB {
  at::Tensor buf;  // (panels * K * kNr) float32
  int64_t K = 0, N = 0;
  bool defined() const { return buf.defined(); }
};

// Whether the path in use has a packed micro-kernel (AVX2 + FMA); otherwise the step GEMM is
// ATen's.
bool packed_gemm_available();
// Pack B (K x N) for gemm_packed.  `w` is float32, contiguous, either (N, K) with B = w^T
// (the forward step: gates += h W_hh^T) or (K, N) with B = w (the backward step: dh = dg W_hh).
PackedB pack_b(const at::Tensor& w, bool transposed);
// C (M x N, row stride ldc) = [C +] A (M x K, row stride lda) * B; `parallel` splits the panels
// over the threads when the product is large enough.  Requires packed_gemm_available().
void gemm_packed(bool acc, int64_t M, const float* A, int64_t lda, const PackedB& B, float* C,
                 int64_t ldc, bool parallel);

// ---- element-wise pass of one step, rows [r0, r1) -----------------------------------------
// Forward: gates hold the pre-activations of the recurrent blocks (activated in place), xo the
// input-only blocks; writes c_t, h_t and (highway) h_pre, h_t before the highway mix.
void pointwise_forward(const KernelSpec& ks, const Dims& d, float* gates, const float* xo,
                       const float* c_prev, float* c_out, float* h_out, float* h_pre_out,
                       int64_t r0, int64_t r1);
void pointwise_forward(const KernelSpec& ks, const Dims& d, double* gates, const double* xo,
                       const double* c_prev, double* c_out, double* h_out, double* h_pre_out,
                       int64_t r0, int64_t r1);
// Backward: dh holds dL/dh_t (total), dc the carried dL/dc_t; on return da holds
// dL/d(pre-activations), dxo dL/d(input-only blocks) and dc dL/dc_{t-1}.
void pointwise_backward(const KernelSpec& ks, const Dims& d, const float* gates,
                        const float* xo, const float* c_cur, const float* c_prev,
                        const float* h_pre, float* dh, float* dc, float* da, float* dxo,
                        int64_t r0, int64_t r1);
void pointwise_backward(const KernelSpec& ks, const Dims& d, const double* gates,
                        const double* xo, const double* c_cur, const double* c_prev,
                        const double* h_pre, double* dh, double* dc, double* da, double* dxo,
                        int64_t r0, int64_t r1);

}  // namespace rnn_ablations
