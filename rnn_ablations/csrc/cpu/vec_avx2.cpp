// The AVX2 + FMA vector path (vec_kernels.h), and the AVX-512 path's GEMM blocking emulated with
// AVX2 instructions (the test path "emulated_avx512"): vec_impl.h compiled under
// `#pragma GCC target("avx2,fma")`, with GCC on x86-64 only.  Only reached when the running CPU
// has AVX2 + FMA (vec_kernels.cpp checks).
#include "vec_ops.h"

// Every header the implementation needs, included before any target pragma: this copy must
// only contain its own functions (a standard-library function instantiated under the pragma
// could be shared with another path, and execute instructions that path's CPU lacks).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#if RNN_ABLATIONS_HAVE_X86_PATHS
#include <immintrin.h>  // usable in functions with the target attribute (GCC >= 4.9)

#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace rnn_ablations {
namespace avx2 {
namespace {
#define RNN_ABLATIONS_VEC_KIND 1
#include "vec_impl.h"
#undef RNN_ABLATIONS_VEC_KIND
}  // namespace
}  // namespace avx2
namespace emulated_avx512 {
namespace {
#define RNN_ABLATIONS_VEC_KIND 3
#include "vec_impl.h"
#undef RNN_ABLATIONS_VEC_KIND
}  // namespace
}  // namespace emulated_avx512
}  // namespace rnn_ablations
#pragma GCC pop_options

namespace rnn_ablations {
const VecOps kAvx2Ops =
    RNN_ABLATIONS_VEC_OPS(avx2, "avx2", true, avx2::kPanel, &avx2::gemm_panels);
const VecOps kEmulatedAvx512Ops =
    RNN_ABLATIONS_VEC_OPS(emulated_avx512, "emulated_avx512", true, emulated_avx512::kPanel,
                          &emulated_avx512::gemm_panels);
}  // namespace rnn_ablations
#endif  // RNN_ABLATIONS_HAVE_X86_PATHS
