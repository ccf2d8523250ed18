// The table of one vector path of the CPU kernel (vec_kernels.h): its name, its packed-panel
// width and its entry points.  Each path is one translation unit (vec_portable.cpp,
// vec_avx2.cpp, vec_avx512.cpp) that compiles vec_impl.h for its instruction set and exports
// only its table; vec_kernels.cpp picks one at run time.  Internal to the kernel.
#pragma once

#include <cstdint>

#include "../common/kernel_spec.h"
#include "vec_dims.h"

namespace rnn_ablations {

// One path: its entry points.  gemm_panels is null where the step GEMM is ATen's; panel is the
// width of its packed panels (pack_b).
struct VecOps {
  const char* name;
  bool runs_avx2;  // whether the path executes AVX2 + FMA instructions (the scan's rows follow it)
  int64_t panel;
  void (*fwd_f)(const KernelSpec&, const Dims&, float*, const float*, const float*, float*, float*,
                float*, int64_t, int64_t, int64_t, int64_t);
  void (*fwd_d)(const KernelSpec&, const Dims&, double*, const double*, const double*, double*,
                double*, double*, int64_t, int64_t, int64_t, int64_t);
  void (*bwd_f)(const KernelSpec&, const Dims&, const float*, const float*, const float*,
                const float*, const float*, float*, float*, float*, float*, float*, int64_t,
                int64_t);
  void (*bwd_d)(const KernelSpec&, const Dims&, const double*, const double*, const double*,
                const double*, const double*, double*, double*, double*, double*, double*,
                int64_t, int64_t);
  void (*gemm_panels)(bool, int64_t, const float*, int64_t, const float*, int64_t, int64_t,
                      float*, int64_t, int64_t, int64_t);
};

#define RNN_ABLATIONS_VEC_OPS(ns, name, runs_avx2, panel, gemm)                              \
  ::rnn_ablations::VecOps {                                                                \
    name, runs_avx2, panel, &ns::pointwise_forward<float>, &ns::pointwise_forward<double>,   \
        &ns::pointwise_backward<float>, &ns::pointwise_backward<double>, gemm                \
  }

// The paths' tables (defined in their translation units; the x86 ones only with GCC on x86-64,
// RNN_ABLATIONS_HAVE_X86_PATHS).
extern const VecOps kPortableOps;
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__) && !defined(__clang__)
#define RNN_ABLATIONS_HAVE_X86_PATHS 1
extern const VecOps kAvx2Ops;
extern const VecOps kEmulatedAvx512Ops;
extern const VecOps kAvx512Ops;
#else
#define RNN_ABLATIONS_HAVE_X86_PATHS 0
#endif

}  // namespace rnn_ablations
