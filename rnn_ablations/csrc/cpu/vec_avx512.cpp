// The AVX-512 vector path (vec_kernels.h): vec_impl.h compiled under `#pragma GCC target` with
// AVX-512F (and VL/BW/DQ, which every AVX-512 server CPU has, so that the compiler may use them
// in the element-wise loops) and 512-bit vectors in the auto-vectorised loops too (GCC's tuning
// for some CPUs would otherwise keep them at 256 bits); GCC on x86-64 only.  Only reached when
// the running CPU (and its OS) has those extensions (vec_kernels.cpp checks).
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
#pragma GCC target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma,prefer-vector-width=512")
namespace rnn_ablations {
namespace avx512 {
namespace {
#define RNN_ABLATIONS_VEC_KIND 2
#include "vec_impl.h"
#undef RNN_ABLATIONS_VEC_KIND
}  // namespace
}  // namespace avx512
}  // namespace rnn_ablations
#pragma GCC pop_options

namespace rnn_ablations {
const VecOps kAvx512Ops =
    RNN_ABLATIONS_VEC_OPS(avx512, "avx512", true, avx512::kPanel, &avx512::gemm_panels);
}  // namespace rnn_ablations
#endif  // RNN_ABLATIONS_HAVE_X86_PATHS
