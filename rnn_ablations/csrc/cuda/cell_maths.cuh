// Everything the CUDA kernels share, in one include: the device's scalar types (device_types.cuh),
// the kernel spec's plain data (common/kernel_spec.h), the per-element maths of the cells
// (common/elementwise.h, shared with the CPU kernel) and the one-element forward and backward of
// a step (forward_element.cuh, backward_element.cuh).  Header-free: NVRTC compiles it.
#pragma once

#include "device_types.cuh"
#include "../common/kernel_spec.h"

namespace rnn_ablations {
#include "../common/elementwise.h"
#include "forward_element.cuh"
#include "backward_element.cuh"
}  // namespace rnn_ablations
