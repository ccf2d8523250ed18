// Run-time choice of the CPU kernel's vector code (see vec_kernels.h) among the paths compiled in
// vec_portable.cpp, vec_avx2.cpp (AVX2 + FMA, and the test path emulated_avx512) and
// vec_avx512.cpp; the packing of the step GEMM's weight and the entry points that forward to the
// path in use.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#if defined(__SSE2__)
#include <xmmintrin.h>  // _MM_TRANSPOSE4_PS (pack_b)
#endif

#include "layer_tensors.h"
#include "vec_kernels.h"
#include "vec_ops.h"

namespace rnn_ablations {
namespace {

#if RNN_ABLATIONS_HAVE_X86_PATHS
bool cpu_has_avx2_fma() {
  __builtin_cpu_init();  // may run before libgcc's constructor
  // libgcc reports AVX2 only when the OS saves the YMM registers (XGETBV).
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

bool cpu_has_avx512() {
  // libgcc reports the AVX-512 features only when the OS saves the ZMM and mask registers
  // (XGETBV); the element-wise loops of the avx512 copy may use VL/BW/DQ instructions.
  return cpu_has_avx2_fma() && __builtin_cpu_supports("avx512f") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512dq");
}
#endif

const VecOps* lookup(const std::string& name) {
  const char* choices = "choose one of avx512, avx2, portable, auto (or emulated_avx512, a test "
                        "path)";
  if (name == "portable") return &kPortableOps;
#if RNN_ABLATIONS_HAVE_X86_PATHS
  if (name == "avx512") {
    TORCH_CHECK(cpu_has_avx512(),
                "rnn_ablations: kernel ISA 'avx512' requested (RNN_ABLATIONS_ISA / "
                "set_kernel_isa), but this CPU (or its OS) has no AVX-512F/VL/BW/DQ; use ",
                cpu_has_avx2_fma() ? "'avx2', " : "", "'portable' or 'auto' (unset "
                "RNN_ABLATIONS_ISA)");
    return &kAvx512Ops;
  }
  if (name == "avx2" || name == "emulated_avx512") {
    TORCH_CHECK(cpu_has_avx2_fma(), "rnn_ablations: kernel ISA '", name,
                "' requested (RNN_ABLATIONS_ISA / set_kernel_isa), but this CPU has no AVX2 + "
                "FMA; use 'portable' or 'auto' (unset RNN_ABLATIONS_ISA)");
    return name == "avx2" ? &kAvx2Ops : &kEmulatedAvx512Ops;
  }
  if (name == "auto" || name.empty()) {
    if (cpu_has_avx512()) return &kAvx512Ops;
    if (cpu_has_avx2_fma()) return &kAvx2Ops;
    return &kPortableOps;
  }
#else
  if (name == "avx512" || name == "avx2" || name == "emulated_avx512") {
    TORCH_CHECK(false, "rnn_ablations: kernel ISA '", name,
                "' requested, but this build has no x86 vector paths (they need GCC on x86-64); "
                "use 'portable' or 'auto' (unset RNN_ABLATIONS_ISA)");
  }
  if (name == "auto" || name.empty()) return &kPortableOps;
#endif
  TORCH_CHECK(false, "rnn_ablations: unknown kernel ISA '", name, "' (RNN_ABLATIONS_ISA); ",
              choices);
  return nullptr;
}

std::atomic<const VecOps*> g_ops{nullptr};

const VecOps& ops() {
  const VecOps* o = g_ops.load(std::memory_order_acquire);
  if (o) return *o;
  const char* env = std::getenv("RNN_ABLATIONS_ISA");
  o = lookup(env ? std::string(env) : std::string("auto"));  // throws for a bad value
  g_ops.store(o, std::memory_order_release);
  return *o;
}

}  // namespace

std::string isa_name() { return ops().name; }

void set_isa(const std::string& name) { g_ops.store(lookup(name), std::memory_order_release); }

std::vector<std::string> supported_isas() {
  std::vector<std::string> out;
#if RNN_ABLATIONS_HAVE_X86_PATHS
  if (cpu_has_avx512()) out.push_back("avx512");
  if (cpu_has_avx2_fma()) out.push_back("avx2");
#endif
  out.push_back("portable");
  return out;
}

bool isa_runs_avx2() { return ops().runs_avx2; }

bool packed_gemm_available() { return ops().gemm_panels != nullptr; }

int64_t packed_gemm_panel() { return ops().gemm_panels != nullptr ? ops().panel : 0; }

namespace {
std::atomic<int64_t> g_unit_split_steps{0};
}  // namespace
int64_t unit_split_steps() { return g_unit_split_steps.load(std::memory_order_relaxed); }
void count_unit_split_step() { g_unit_split_steps.fetch_add(1, std::memory_order_relaxed); }

namespace {
// One panel of the transposed packing: out[k * nr + j] = w[(n0 + j) * K + k] for the nc rows
// [n0, n0 + nc) of w (N x K, row-major) and every k; the columns [nc, nr) are left to the caller.
// In 4 x 4 tiles (SSE, which every x86-64 CPU has: a load of 4 consecutive k per row, a
// transpose in registers, a store of 4 consecutive j per k) instead of one strided load per
// element: the forward packs its w_hh at every layer call, where the scalar gather cost more
// than one step's GEMM at PTB-small sizes.
void pack_panel_transposed(const float* src, int64_t K, int64_t n0, int64_t nc, int64_t nr,
                           float* out) {
  int64_t k = 0;
#if defined(__SSE2__)
  const int64_t nc4 = nc & ~int64_t{3};
  for (; k + 4 <= K; k += 4) {
    for (int64_t j = 0; j < nc4; j += 4) {
      const float* s = src + (n0 + j) * K + k;
      __m128 r0 = _mm_loadu_ps(s), r1 = _mm_loadu_ps(s + K);
      __m128 r2 = _mm_loadu_ps(s + 2 * K), r3 = _mm_loadu_ps(s + 3 * K);
      _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
      float* o = out + k * nr + j;
      _mm_storeu_ps(o, r0);
      _mm_storeu_ps(o + nr, r1);
      _mm_storeu_ps(o + 2 * nr, r2);
      _mm_storeu_ps(o + 3 * nr, r3);
    }
    for (int64_t j = nc4; j < nc; ++j) {
      for (int64_t q = 0; q < 4; ++q) out[(k + q) * nr + j] = src[(n0 + j) * K + k + q];
    }
  }
#endif
  for (; k < K; ++k) {
    for (int64_t j = 0; j < nc; ++j) out[k * nr + j] = src[(n0 + j) * K + k];
  }
}
}  // namespace

PackedB pack_b(const at::Tensor& w, bool transposed) {
  const int64_t nr = ops().panel;
  TORCH_CHECK(nr > 0, "rnn_ablations kernel: no packed GEMM on the ", ops().name, " path");
  PackedB pb;
  pb.K = transposed ? w.size(1) : w.size(0);
  pb.N = transposed ? w.size(0) : w.size(1);
  pb.panel = nr;
  const int64_t K = pb.K, N = pb.N, panels = (N + nr - 1) / nr;
  pb.buf = at::empty({panels * K * nr}, w.options());
  const float* src = w.data_ptr<float>();
  float* dst = pb.buf.data_ptr<float>();
  // The panels are independent: split over the threads (each layer call packs its w_hh once;
  // single-threaded this was ~2.5 % of an LSTM's inference at H = 650), in tasks of at least
  // 64 K floats; inside a parallel region (concurrent directions) this runs on the caller.
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(1, K * nr));
  at::parallel_for(0, panels, grain, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t n0 = p * nr, nc = std::min(nr, N - n0);
      float* out = dst + p * K * nr;
      if (transposed) {
        pack_panel_transposed(src, K, n0, nc, nr, out);
      } else {
        for (int64_t k = 0; k < K; ++k) std::memcpy(out + k * nr, src + k * N + n0, sizeof(float) * nc);
      }
      if (nc < nr) {
        for (int64_t k = 0; k < K; ++k) std::memset(out + k * nr + nc, 0, sizeof(float) * (nr - nc));
      }
    }
  });
  return pb;
}

namespace {
// The packed GEMM of the path in use, for a weight packed on that path.
auto checked_panels_fn(const PackedB& B) {
  const auto panels_fn = ops().gemm_panels;
  TORCH_CHECK(panels_fn != nullptr, "rnn_ablations kernel: no packed GEMM on the ",
              ops().name, " path");
  TORCH_CHECK(B.panel == ops().panel, "rnn_ablations kernel: a weight packed for ", B.panel,
              "-column panels reached the ", ops().name, " path (", ops().panel, " columns): "
              "the kernel ISA changed during a layer call; call set_kernel_isa between calls");
  return panels_fn;
}
}  // namespace

bool worth_splitting(int64_t M, int64_t N, int64_t K) { return M * N * K >= (int64_t{1} << 18); }

void gemm_packed(bool acc, int64_t M, const float* A, int64_t lda, const PackedB& B, float* C,
                 int64_t ldc, bool parallel) {
  const auto panels_fn = checked_panels_fn(B);
  const float* bp = B.buf.data_ptr<float>();
  if (parallel && at::get_num_threads() > 1 && worth_splitting(M, B.N, B.K)) {
    at::parallel_for(0, B.panels(), 1, [&](int64_t p0, int64_t p1) {
      panels_fn(acc, M, A, lda, bp, B.K, B.N, C, ldc, p0, p1);
    });
  } else {
    panels_fn(acc, M, A, lda, bp, B.K, B.N, C, ldc, 0, B.panels());
  }
}

void gemm_packed_range(bool acc, int64_t M, const float* A, int64_t lda, const PackedB& B,
                       float* C, int64_t ldc, int64_t p0, int64_t p1) {
  const auto panels_fn = checked_panels_fn(B);
  TORCH_CHECK(0 <= p0 && p0 <= p1 && p1 <= B.panels(), "rnn_ablations kernel: panel range [",
              p0, ", ", p1, ") outside the ", B.panels(), " panels of the packed weight");
  panels_fn(acc, M, A, lda, B.buf.data_ptr<float>(), B.K, B.N, C, ldc, p0, p1);
}

void pointwise_forward(const KernelSpec& ks, const Dims& d, float* gates, const float* xo,
                       const float* c_prev, float* c_out, float* h_out, float* h_pre_out,
                       int64_t r0, int64_t r1, int64_t u0, int64_t u1) {
  ops().fwd_f(ks, d, gates, xo, c_prev, c_out, h_out, h_pre_out, r0, r1, u0, u1);
}
void pointwise_forward(const KernelSpec& ks, const Dims& d, double* gates, const double* xo,
                       const double* c_prev, double* c_out, double* h_out, double* h_pre_out,
                       int64_t r0, int64_t r1, int64_t u0, int64_t u1) {
  ops().fwd_d(ks, d, gates, xo, c_prev, c_out, h_out, h_pre_out, r0, r1, u0, u1);
}
void pointwise_backward(const KernelSpec& ks, const Dims& d, const float* gates,
                        const float* xo, const float* c_cur, const float* c_prev,
                        const float* h_pre, float* dh, float* dc, float* da, float* dxo,
                        int64_t r0, int64_t r1) {
  std::vector<float> scratch(static_cast<size_t>(std::max<int64_t>(d.H, 1)));
  ops().bwd_f(ks, d, gates, xo, c_cur, c_prev, h_pre, dh, dc, da, dxo, scratch.data(), r0, r1);
}
void pointwise_backward(const KernelSpec& ks, const Dims& d, const double* gates,
                        const double* xo, const double* c_cur, const double* c_prev,
                        const double* h_pre, double* dh, double* dc, double* da, double* dxo,
                        int64_t r0, int64_t r1) {
  std::vector<double> scratch(static_cast<size_t>(std::max<int64_t>(d.H, 1)));
  ops().bwd_d(ks, d, gates, xo, c_cur, c_prev, h_pre, dh, dc, da, dxo, scratch.data(), r0, r1);
}

}  // namespace rnn_ablations
