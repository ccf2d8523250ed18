// The sizes of one layer call as the vector code reads them (vec_kernels.h, vec_impl.h): plain
// data, no torch headers (the per-instruction-set files include only this and
// common/kernel_spec.h).
#pragma once

#include <cstdint>

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

}  // namespace rnn_ablations
