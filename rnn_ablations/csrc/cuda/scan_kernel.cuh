// The element-wise scan's device code (CUDA) of a gated memory whose gates read x_t only: the
// recurrence of LSTM - S-RNN - HIDDEN.  The same function, arguments and results as the CPU scan
// in cpu/scan.cpp (read its header for the arguments): the variant arrives as a ScanSpec
// (common/kernel_spec.h decode_scan_spec; the host, rnn_ablations/kernels/cuda/host.py, decodes
// Variant.kernel_spec), and the per-element maths is common/elementwise.h's
// (scan_forward_element, scan_backward_element), as on the CPU; the reference is
// rnn_ablations/functional.py.
//
// Nothing reads h_{t-1}, so every (direction d, row b, unit j) is an independent linear
// recurrence in c: one thread per (d, b, j) loops over its row's steps (one launch for the whole
// sequence and both directions, no per-step launches); direction 1 runs backwards within the
// row's length.  Consecutive threads read consecutive units of a block, so loads are
// coalesced.  float16/bfloat16 compute in float (acc_t); the saved memories c_t are kept in that
// accumulation type.
//
// Compiled at run time by NVRTC, one program per (dtype, output rule, highway) and direction
// (rnn_ablations::scan_forward_kernel<float, float, 1, false>, ...).
#pragma once

#include "cell_maths.cuh"
#include "kernel_args.cuh"  // Dims, Strides

namespace rnn_ablations {

__device__ __forceinline__ int64_t position(int64_t d, int64_t s, int64_t L) {
  return d == 0 ? s : L - 1 - s;
}

// `len` null: every row runs all T steps (no copy of the lengths to the device).
__device__ __forceinline__ int64_t row_steps(const int64_t* len, int64_t b, int64_t T) {
  return len ? len[b] : T;
}

template <typename scalar_t>
__device__ __forceinline__ acc_t<scalar_t> bias_at(const scalar_t* bias, int64_t k) {
  return bias ? static_cast<acc_t<scalar_t>>(bias[k]) : acc_t<scalar_t>(0);
}

// cs: the memories c_t (acc_t, laid out like out), or null (inference: nothing saved).
template <typename scalar_t, typename acc_t, int Out, bool HW>
__global__ void scan_forward_kernel(ScanSpec sp, Dims n, Strides z, const int64_t* __restrict__ len,
                                    const scalar_t* __restrict__ proj,
                                    const scalar_t* __restrict__ bias,
                                    const scalar_t* __restrict__ h0,
                                    const scalar_t* __restrict__ c0, scalar_t* __restrict__ out,
                                    scalar_t* __restrict__ h_n, scalar_t* __restrict__ c_n,
                                    acc_t* __restrict__ cs) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t H = n.H;
  if (idx >= n.D * n.B * H) return;  // idx = (d * B + b) * H + j, the (D, B, H) state index
  const int64_t j = idx % H, b = (idx / H) % n.B, d = idx / (H * n.B);
  const int64_t steps = row_steps(len, b, n.T);
  const int64_t base = d * n.G * H + j;  // this unit's column in a proj row (block 0)
  acc_t bv[kScanBlocks];  // the blocks' biases (registers: every index below is a constant)
#pragma unroll
  for (int role = 0; role < kScanBlocks; ++role)
    bv[role] = sp.block[role] >= 0 ? bias_at(bias, base + sp.block[role] * H) : acc_t(0);
  acc_t c = static_cast<acc_t>(c0[idx]);
  acc_t h = static_cast<acc_t>(h0[idx]);
  for (int64_t s = 0; s < steps; ++s) {
    const int64_t t = position(d, s, steps);
    const scalar_t* p = proj + t * z.p_st + b * z.p_sb + base;
    const int64_t o = t * z.o_st + b * z.o_sb + d * H + j;
    const auto pre = [&](int role) {
      return static_cast<acc_t>(p[sp.block[role] * H]) + bv[role];
    };
    h = scan_forward_element<Out, HW, DeviceAct>(pre, c);
    if (cs) cs[o] = c;
    out[o] = static_cast<scalar_t>(h);
  }
  for (int64_t t = steps; t < n.T; ++t) out[t * z.o_st + b * z.o_sb + d * H + j] = scalar_t(0);
  h_n[idx] = static_cast<scalar_t>(h);
  c_n[idx] = static_cast<scalar_t>(c);
}

// dbias_rows (D*B, G*H) in acc_t, or null: this (direction, row)'s sum of d_proj over its steps.
template <typename scalar_t, typename acc_t, int Out, bool HW>
__global__ void scan_backward_kernel(ScanSpec sp, Dims n, Strides z, const int64_t* __restrict__ len,
                                     const scalar_t* __restrict__ g_out,
                                     const scalar_t* __restrict__ g_hn,
                                     const scalar_t* __restrict__ g_cn,
                                     const scalar_t* __restrict__ proj,
                                     const scalar_t* __restrict__ bias,
                                     const scalar_t* __restrict__ c0,
                                     const acc_t* __restrict__ cs, scalar_t* __restrict__ dproj,
                                     scalar_t* __restrict__ dc0, acc_t* __restrict__ dbias_rows) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t H = n.H;
  if (idx >= n.D * n.B * H) return;
  const int64_t j = idx % H, b = (idx / H) % n.B, d = idx / (H * n.B);
  const int64_t steps = row_steps(len, b, n.T);
  const int64_t base = d * n.G * H + j;
  acc_t bv[kScanBlocks], sum[kScanBlocks];  // biases, bias-gradient sums (registers)
#pragma unroll
  for (int role = 0; role < kScanBlocks; ++role) {
    bv[role] = sp.block[role] >= 0 ? bias_at(bias, base + sp.block[role] * H) : acc_t(0);
    sum[role] = acc_t(0);
  }
  acc_t dc = static_cast<acc_t>(g_cn[idx]);
  for (int64_t s = steps - 1; s >= 0; --s) {
    const int64_t t = position(d, s, steps);
    const int64_t o = t * z.o_st + b * z.o_sb + d * H + j;
    const scalar_t* p = proj + t * z.p_st + b * z.p_sb + base;
    scalar_t* dq = dproj + t * z.p_st + b * z.p_sb + base;
    acc_t dh = static_cast<acc_t>(g_out[t * z.g_st + b * z.g_sb + d * H + j]);
    if (s == steps - 1) dh += static_cast<acc_t>(g_hn[idx]);
    const acc_t cp = s > 0 ? cs[position(d, s - 1, steps) * z.o_st + b * z.o_sb + d * H + j]
                           : static_cast<acc_t>(c0[idx]);
    const auto pre = [&](int role) {
      return static_cast<acc_t>(p[sp.block[role] * H]) + bv[role];
    };
    const auto put = [&](int role, acc_t v) {
      dq[sp.block[role] * H] = static_cast<scalar_t>(v);
      sum[role] += v;
    };
    dc = scan_backward_element<Out, HW, DeviceAct>(pre, put, dh, cs[o], cp, dc);
  }
  // padded steps: no gradient
  for (int64_t t = steps; t < n.T; ++t) {
    scalar_t* dq = dproj + t * z.p_st + b * z.p_sb + base;
    for (int64_t g = 0; g < n.G; ++g) dq[g * H] = scalar_t(0);
  }
  dc0[idx] = static_cast<scalar_t>(dc);
  if (dbias_rows) {  // this (direction, row)'s row of dbias_rows: every block of the spec
    acc_t* db = dbias_rows + (d * n.B + b) * n.G * H + j;
#pragma unroll
    for (int role = 0; role < kScanBlocks; ++role)
      if (sp.block[role] >= 0) db[sp.block[role] * H] = sum[role];
  }
}

}  // namespace rnn_ablations
