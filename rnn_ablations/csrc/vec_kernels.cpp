// Run-time choice of the CPU kernel's vector code (see vec_kernels.h): vec_impl.h compiled for
// the baseline ("portable") and, with GCC on x86-64, for AVX2 + FMA ("avx2") in this one
// translation unit, plus the dispatch between them.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include "common.h"
#include "vec_kernels.h"

// Every header the implementations need, included before any target pragma: the AVX2 copy
// must only contain its own functions (a standard-library function instantiated under the
// pragma would be shared by both copies, and could execute AVX2 code on the portable path).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__) && !defined(__clang__)
#define RNN_ABLATIONS_HAVE_AVX2_PATH 1
#include <immintrin.h>  // usable in functions with the target attribute (GCC >= 4.9)
#else
// Other compilers and CPUs build the portable path only.
#define RNN_ABLATIONS_HAVE_AVX2_PATH 0
#endif

namespace rnn_ablations {

// Each copy in an unnamed namespace: internal linkage, so its helpers are inlined and called
// directly (not through the PLT, as exported symbols of a shared object would be).
namespace portable {
namespace {
#define RNN_ABLATIONS_VEC_AVX2 0
#include "vec_impl.h"
#undef RNN_ABLATIONS_VEC_AVX2
}  // namespace
}  // namespace portable

#if RNN_ABLATIONS_HAVE_AVX2_PATH
#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace avx2 {
namespace {
#define RNN_ABLATIONS_VEC_AVX2 1
#include "vec_impl.h"
#undef RNN_ABLATIONS_VEC_AVX2
}  // namespace
}  // namespace avx2
#pragma GCC pop_options
#endif

namespace {

// One path: its entry points.  gemm_panels is null where the step GEMM is ATen's.
struct VecOps {
  const char* name;
  void (*fwd_f)(const KernelSpec&, const Dims&, float*, const float*, const float*, float*, float*,
                float*, int64_t, int64_t);
  void (*fwd_d)(const KernelSpec&, const Dims&, double*, const double*, const double*, double*,
                double*, double*, int64_t, int64_t);
  void (*bwd_f)(const KernelSpec&, const Dims&, const float*, const float*, const float*,
                const float*, const float*, float*, float*, float*, float*, float*, int64_t,
                int64_t);
  void (*bwd_d)(const KernelSpec&, const Dims&, const double*, const double*, const double*,
                const double*, const double*, double*, double*, double*, double*, double*,
                int64_t, int64_t);
  void (*gemm_panels)(bool, int64_t, const float*, int64_t, const float*, int64_t, int64_t,
                      float*, int64_t, int64_t, int64_t);
};

const VecOps kPortable = {
    "portable",
    &portable::pointwise_forward<float>, &portable::pointwise_forward<double>,
    &portable::pointwise_backward<float>, &portable::pointwise_backward<double>,
    nullptr};

#if RNN_ABLATIONS_HAVE_AVX2_PATH
const VecOps kAvx2 = {
    "avx2",
    &avx2::pointwise_forward<float>, &avx2::pointwise_forward<double>,
    &avx2::pointwise_backward<float>, &avx2::pointwise_backward<double>,
    &avx2::gemm_panels};

bool cpu_has_avx2_fma() {
  __builtin_cpu_init();  // may run before libgcc's constructor
  // libgcc reports AVX2 only when the OS saves the YMM registers (XGETBV).
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
#endif

const VecOps* lookup(const std::string& name) {
  if (name == "portable") return &kPortable;
  if (name == "avx2") {
#if RNN_ABLATIONS_HAVE_AVX2_PATH
    TORCH_CHECK(cpu_has_avx2_fma(),
                "rnn_ablations: RNN_ABLATIONS_ISA/kernel ISA 'avx2' requested, but this CPU has no "
                "AVX2 + FMA; use 'portable' or 'auto' (unset RNN_ABLATIONS_ISA)");
    return &kAvx2;
#else
    TORCH_CHECK(false,
                "rnn_ablations: kernel ISA 'avx2' requested, but this build has no AVX2 path "
                "(it needs GCC on x86-64); use 'portable' or 'auto' (unset RNN_ABLATIONS_ISA)");
#endif
  }
  if (name == "auto" || name.empty()) {
#if RNN_ABLATIONS_HAVE_AVX2_PATH
    if (cpu_has_avx2_fma()) return &kAvx2;
#endif
    return &kPortable;
  }
  TORCH_CHECK(false, "rnn_ablations: unknown kernel ISA '", name,
              "' (RNN_ABLATIONS_ISA); choose one of avx2, portable, auto");
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
#if RNN_ABLATIONS_HAVE_AVX2_PATH
  if (cpu_has_avx2_fma()) out.push_back("avx2");
#endif
  out.push_back("portable");
  return out;
}

bool packed_gemm_available() { return ops().gemm_panels != nullptr; }

PackedB pack_b(const at::Tensor& w, bool transposed) {
  PackedB pb;
  pb.K = transposed ? w.size(1) : w.size(0);
  pb.N = transposed ? w.size(0) : w.size(1);
  const int64_t K = pb.K, N = pb.N, panels = (N + kNr - 1) / kNr;
  pb.buf = at::empty({panels * K * kNr}, w.options());
  const float* src = w.data_ptr<float>();
  float* dst = pb.buf.data_ptr<float>();
  for (int64_t p = 0; p < panels; ++p) {
    const int64_t n0 = p * kNr, nc = std::min(kNr, N - n0);
    float* out = dst + p * K * kNr;
    for (int64_t k = 0; k < K; ++k) {
      float* o = out + k * kNr;
      if (transposed) {
        for (int64_t j = 0; j < nc; ++j) o[j] = src[(n0 + j) * K + k];
      } else {
        std::memcpy(o, src + k * N + n0, sizeof(float) * nc);
      }
      for (int64_t j = nc; j < kNr; ++j) o[j] = 0.f;
    }
  }
  return pb;
}

void gemm_packed(bool acc, int64_t M, const float* A, int64_t lda, const PackedB& B, float* C,
                 int64_t ldc, bool parallel) {
  const auto panels_fn = ops().gemm_panels;
  TORCH_CHECK(panels_fn != nullptr, "rnn_ablations kernel: no packed GEMM on the ",
              ops().name, " path");
  const float* bp = B.buf.data_ptr<float>();
  const int64_t panels = (B.N + kNr - 1) / kNr;
  if (parallel && at::get_num_threads() > 1 && M * B.N * B.K >= (1 << 18)) {
    at::parallel_for(0, panels, 1, [&](int64_t p0, int64_t p1) {
      panels_fn(acc, M, A, lda, bp, B.K, B.N, C, ldc, p0, p1);
    });
  } else {
    panels_fn(acc, M, A, lda, bp, B.K, B.N, C, ldc, 0, panels);
  }
}

void pointwise_forward(const KernelSpec& ks, const Dims& d, float* gates, const float* xo,
                       const float* c_prev, float* c_out, float* h_out, float* h_pre_out,
                       int64_t r0, int64_t r1) {
  ops().fwd_f(ks, d, gates, xo, c_prev, c_out, h_out, h_pre_out, r0, r1);
}
void pointwise_forward(const KernelSpec& ks, const Dims& d, double* gates, const double* xo,
                       const double* c_prev, double* c_out, double* h_out, double* h_pre_out,
                       int64_t r0, int64_t r1) {
  ops().fwd_d(ks, d, gates, xo, c_prev, c_out, h_out, h_pre_out, r0, r1);
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
