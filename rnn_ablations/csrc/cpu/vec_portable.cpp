// The portable vector path (vec_kernels.h): vec_impl.h compiled for the build's baseline (any
// CPU); the step GEMM is ATen's.
#include "vec_ops.h"

// Every header the implementation needs, included before any target pragma: this copy must
// only contain its own functions (a standard-library function instantiated under the pragma
// could be shared with another path, and execute instructions that path's CPU lacks).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace rnn_ablations {
// An unnamed namespace: internal linkage, so the helpers are inlined and called directly (not
// through the PLT, as exported symbols of a shared object would be); only the table is exported.
namespace portable {
namespace {
#define RNN_ABLATIONS_VEC_KIND 0
#include "vec_impl.h"
#undef RNN_ABLATIONS_VEC_KIND
}  // namespace
}  // namespace portable

const VecOps kPortableOps = RNN_ABLATIONS_VEC_OPS(portable, "portable", false, 0, nullptr);
}  // namespace rnn_ablations
