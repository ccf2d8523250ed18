// The vector code of the CPU kernel: the element-wise pass of every variant and the packed
// per-step GEMM, compiled for several instruction sets in one build and chosen at run time.
//
// vec_impl.h is compiled once for the build's baseline (vec_portable.cpp: portable x86-64 / any
// other CPU) and, with GCC on x86-64, once with AVX2 + FMA (vec_avx2.cpp) and once with AVX-512F
// (vec_avx512.cpp) enabled for those functions only (`#pragma GCC target`); vec_kernels.cpp
// chooses among them, so one .so (and one wheel) runs on every x86-64 CPU and
// never executes an instruction the CPU lacks.  The running CPU picks (cpuid,
// `__builtin_cpu_supports`, which also checks that the OS saves the registers), not the build
// machine; RNN_ABLATIONS_ISA=avx512|avx2|portable forces a path (an error when this CPU or this
// build lacks it); set_isa() switches in-process (the tests run every path the CPU supports).
// A fourth copy, "emulated_avx512", runs the AVX-512 path's GEMM blocking (8-row blocks,
// 32-column panels, their tails) with AVX2 instructions: never chosen automatically, it lets
// the tests exercise that code on CPUs without AVX-512 (only the 512-bit instructions themselves
// then go unexecuted).
#pragma once

#include <ATen/core/Tensor.h>

#include "../common/kernel_spec.h"
#include "vec_dims.h"

#include <cstdint>
#include <string>
#include <vector>

namespace rnn_ablations {

// ---- instruction-set selection ----------------------------------------------------------
// Name of the path in use ("avx512", "avx2", "portable" or the test path "emulated_avx512");
// the first call chooses it (RNN_ABLATIONS_ISA, else the best this CPU and build support) and
// throws if RNN_ABLATIONS_ISA names a path that this CPU or build cannot run.
std::string isa_name();
// Switch to "avx512", "avx2", "portable", "emulated_avx512" or "auto" (the best supported);
// throws for an unknown or unsupported name.  Not thread-safe against running kernels: call
// between layer calls.
void set_isa(const std::string& name);
// The paths this CPU and build can run, best first (always ends with "portable"; the test path
// is not listed).
std::vector<std::string> supported_isas();
// Whether the path in use executes AVX2 + FMA code (avx2, avx512, emulated_avx512): the scan's
// hand-vectorised AVX2 rows (scan_rows.h, scan_rows_avx2.cpp) follow it.
bool isa_runs_avx2();

// ---- packed per-step GEMM (float32) -------------------------------------------------------
struct PackedB {
  at::Tensor buf;  // (panels * K * panel) float32
  int64_t K = 0, N = 0;
  int64_t panel = 0;  // columns per panel: the path's micro-kernel width (24 AVX2, 32 AVX-512)
  bool defined() const { return buf.defined(); }
  int64_t panels() const { return panel > 0 ? (N + panel - 1) / panel : 0; }
};

// Whether the path in use has a packed micro-kernel (AVX2 or AVX-512); otherwise the step GEMM
// is ATen's.
bool packed_gemm_available();
// The panel width of the path in use (columns per packed panel; 0 without a packed GEMM).
int64_t packed_gemm_panel();
// How many forward steps ran split by hidden units (step_state.h's forward_step), since the
// module was loaded: the tests check that their shapes reach that path.
int64_t unit_split_steps();
void count_unit_split_step();
// Pack B (K x N) for gemm_packed, in the panel width of the path in use.  `w` is float32, contiguous, either (N, K) with B = w^T
// (the forward step: gates += h W_hh^T) or (K, N) with B = w (the backward step: dh = dg W_hh).
PackedB pack_b(const at::Tensor& w, bool transposed);
// C (M x N, row stride ldc) = [C +] A (M x K, row stride lda) * B; `parallel` splits the panels
// over the threads when the product is large enough.  Requires packed_gemm_available().
void gemm_packed(bool acc, int64_t M, const float* A, int64_t lda, const PackedB& B, float* C,
                 int64_t ldc, bool parallel);
// Whether an M x K by K x N product is large enough to split over threads (below it the
// fork/join costs more than it saves); gemm_packed's rule, and the unit-split forward step's.
bool worth_splitting(int64_t M, int64_t N, int64_t K);
// The same for the panels [p0, p1) of B only (columns p0 * panel up to min(p1 * panel, N)), on
// the calling thread: the unit-split forward step (step_state.h) gives each thread its panels.
void gemm_packed_range(bool acc, int64_t M, const float* A, int64_t lda, const PackedB& B,
                       float* C, int64_t ldc, int64_t p0, int64_t p1);

// ---- element-wise pass of one step, rows [r0, r1) -----------------------------------------
// Forward: gates hold the pre-activations of the recurrent blocks (activated in place), xo the
// input-only blocks; writes c_t, h_t and (highway) h_pre, h_t before the highway mix; for the
// hidden units [u0, u1) of every block only (0, H: all of them).
void pointwise_forward(const KernelSpec& ks, const Dims& d, float* gates, const float* xo,
                       const float* c_prev, float* c_out, float* h_out, float* h_pre_out,
                       int64_t r0, int64_t r1, int64_t u0, int64_t u1);
void pointwise_forward(const KernelSpec& ks, const Dims& d, double* gates, const double* xo,
                       const double* c_prev, double* c_out, double* h_out, double* h_pre_out,
                       int64_t r0, int64_t r1, int64_t u0, int64_t u1);
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
