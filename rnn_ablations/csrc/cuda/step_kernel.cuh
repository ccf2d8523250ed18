// The CUDA step kernel's device code: one recurrent layer in one direction of every variant in
// rnn_ablations/variants.py; the same function, layout and results as the plain CPU entry points
// in cpu/layer_plain.cpp (plain_forward / plain_backward), which the generic path
// (rnn_ablations/functional.py) defines and the tests compare against.
//
// Per step the host (rnn_ablations/kernels/cuda/host.py) runs one cuBLAS GEMM of the active rows
// against h_{t-1} (torch.addmm into the fp32 / float64 pre-activations), then ONE launch of
// forward_kernel (all activations, the cell update, the output and the highway mix); the
// backward per step: one backward_kernel (which also adds dL/dout_t), then one GEMM for dh_{t-1};
// the weight gradient is one GEMM after the loop.
//
// Dtypes: T = double, float, BFloat16 or Half (device_types.cuh) is the storage (proj, h_t,
// d_proj); A = acc_t<T> (float for the half types) the arithmetic and every buffer the
// recurrence carries or the backward re-reads: the gate activations, the cell state c_t (saved
// for the backward: rounding c to bfloat16 at every step would add 2^-9 relative error per step
// to a sum that is carried over all steps), h before the highway mix, and the carried dL/dh,
// dL/dc.  The kernel spec arrives as the KernelSpec struct (by value; the host decodes
// Variant.kernel_spec, common/kernel_spec.h's decode_kernel_spec).
//
// Compiled at run time by NVRTC, one program per dtype and direction (entry points by name
// expression: rnn_ablations::step_forward_kernel<float, float>, ...).
#pragma once

#include "cell_maths.cuh"

namespace rnn_ablations {

// Forward of element (b, j) of one step; gates (acc_t) hold the pre-activations of the R
// recurrent blocks on entry and their activations on exit (the backward reads them).  The
// branches on the spec are uniform across the launch.  xo: the input-only blocks, row stride
// xo_stride; h_pre_out: h_t before the highway mix (saved for the backward), or null.
template <typename T, typename A>
__global__ void step_forward_kernel(KernelSpec ks, int64_t n, int64_t H, int64_t xo_stride,
                                    A* __restrict__ gates, const T* __restrict__ xo,
                                    const A* __restrict__ c_prev, A* __restrict__ c_out,
                                    T* __restrict__ h_out, A* __restrict__ h_pre_out) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n * H) return;
  const int64_t b = idx / H, j = idx % H;
  A c, h_pre;
  const A h = forward_element<T, A>(ks, gates + b * ks.R * H + j, H,
                                    xo ? xo + b * xo_stride + j : nullptr, H,
                                    ks.memory ? c_prev[b * H + j] : A(0), c, h_pre);
  if (ks.highway && h_pre_out) h_pre_out[b * H + j] = h_pre;
  c_out[b * H + j] = c;
  h_out[b * H + j] = static_cast<T>(h);
}

// Backward of element (b, j) of one step.  dh + g_out: dL/dh_t (carried + from the output); dc:
// carried dL/dc_t, replaced by dL/dc_{t-1}; da: dL/d(pre-activations) of the recurrent blocks,
// row stride P; dxo = da + R*H: dL/d(input-only blocks).  gates, c, h_pre, dh, dc are acc_t.
template <typename T, typename A>
__global__ void step_backward_kernel(KernelSpec ks, int64_t n, int64_t H, int64_t P,
                                     const A* __restrict__ gates, const T* __restrict__ xo,
                                     const A* __restrict__ c_cur, const A* __restrict__ c_prev,
                                     const A* __restrict__ h_pre, const A* __restrict__ dh,
                                     const T* __restrict__ g_out, A* __restrict__ dc,
                                     T* __restrict__ da) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n * H) return;
  const int64_t b = idx / H, j = idx % H;
  const A gh = dh[b * H + j] + static_cast<A>(g_out[b * H + j]);
  const A dc_prev = backward_element<T, A>(
      ks, H, j, gates + b * ks.R * H, xo ? xo + b * P : nullptr,
      c_cur ? c_cur + b * H + j : nullptr, c_prev ? c_prev + b * H + j : nullptr,
      ks.highway ? h_pre[b * H + j] : A(0), gh, dc[b * H + j], da + b * P);
  if (ks.memory) dc[b * H + j] = dc_prev;
}

}  // namespace rnn_ablations
