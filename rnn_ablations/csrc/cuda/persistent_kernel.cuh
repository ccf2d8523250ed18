// Persistent recurrent kernels (CUDA): the FORWARD pass of one layer in one direction of every
// step-kernel variant in ONE cooperative launch that keeps W_hh on chip and loops over the time
// steps (Diamos et al. 2016, "Persistent RNNs"; cuDNN's persistent algorithms), and the
// recurrence of its BACKWARD pass the same way.  Same functions, arguments and results as the
// step kernel's forward / backward (step_kernel.cuh, its loop in rnn_ablations/kernels/cuda/
// host.py: one cuBLAS GEMM and one element-wise kernel per step, 2+ launches per step); the
// saved tensors (gates, cs, hin) are laid
// out as that kernel saves them, so either backward consumes either forward's.  Off by default
// (rnn_ablations/kernels/cuda/recurrence.py selects the forward only when asked:
// set_cuda_recurrence("persistent"), and the backward only with PERSISTENT_BACKWARD).
//
// Work split.  Block q owns the hidden units j in [q*U, q*U + U) and holds, in shared memory in
// the storage dtype, the rows of ALL R recurrent gate blocks for those units (local row r*U + u
// = W_hh row r*H + q*U + u), so the element-wise step of its units needs nothing from another
// block.  One step, for each tile of at most `bt` active batch rows:
//   1. stage h_{t-1} (all H units of the tile's rows, times the recurrent-dropout mask, rounded
//      to the storage dtype exactly as the step kernel's mul_kernel does) from global memory
//      (L2: loads with __ldcg, which bypass the SM's non-coherent L1, since other blocks wrote
//      h_{t-1}) into shared memory as acc_t;
//   2. the block's R*U x bt pre-activations: each warp takes tiles of 2 W rows x 4 batch rows,
//      its lanes split the H-long dot products (acc_t = fp32 for the half types; the
//      GEMM-accumulation order differs from cuBLAS', so results agree to rounding), then a
//      butterfly reduction over the warp;
//   3. one thread per (row, unit) adds the input projection and runs forward_element
//      (forward_element.cuh, the step kernel's own per-element code) and writes h_t, c_t, the
//      saved activations and, on a row's last step, its final states h_n / c_n.
// Then the grid synchronises once, and the next step reads h_t.  The backward
// (persistent_backward_kernel) mirrors it with the W_hh COLUMNS of the block's units: see there.
//
// Grid barrier: a hand-written one (grid_barrier below) under a cooperative launch
// (cuLaunchCooperativeKernel, rnn_ablations/kernels/cuda/driver.py).  cooperative_groups.h
// is not available to NVRTC without a CUDA toolkit's headers (its headers include libcu++'s), so
// the kernel does what grid.sync() does itself: one arrival per block on a global counter, the
// block's other threads waiting at a block barrier.  The cooperative launch is kept because a
// grid-wide barrier is only safe when every block of the grid is resident at once: the launch
// guarantees exactly that and FAILS (CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE) instead of
// deadlocking when it cannot, whereas an ordinary launch may hang if another stream's kernels
// hold SMs.  The memory ordering is the barrier's own: every thread's writes before it are made
// visible device-wide (__syncthreads, then __threadfence by the arriving thread: a release), and
// the waiting thread fences again after it sees every arrival (an acquire) before its block goes
// on; the data that other blocks wrote is then read through L2 (load_cg).  The counter is zeroed
// by the host before each launch.  Cooperative launches can be captured in a CUDA graph (kernel
// nodes with the cooperative attribute); if a capture fails, rnn_ablations/kernels/cuda/graphs.py runs
// the call eagerly.
//
// Applicability (persistent_plan in rnn_ablations/kernels/cuda/host.py; otherwise the step kernel
// runs, or a forced "persistent" raises naming the reason): float32, bfloat16 or float16 (float64 runs the step kernel); a
// device with cooperative launch; the W_hh slice of one block plus one batch row of h_{t-1}
// fits in the shared memory a block may opt in to; all blocks resident at once (at most one
// block of kThreads per SM is assumed); batch <= 65535 (per-step active row counts travel as
// uint16 in the kernel's parameters, at most kChunkSteps steps per launch: longer sequences are
// several launches, each continuing from the previous one's last h_t and c_t).
//
// Padding: batch_sizes (CPU, non-increasing) as for the step kernel: row b is active at step t
// while b < batch_sizes[t]; an inactive row's outputs stay zero and its state is frozen (h_n /
// c_n are written at its last active step; rows never active keep h0 / c0).  The loop stops at
// the first step with no active row, as the step kernel's does.
//
// Compiled at run time by NVRTC, one program per dtype and direction
// (rnn_ablations::persistent_forward_kernel<float, float>, ...).  The launcher packs
// PersistentArgs / PersistentBackwardArgs as ctypes Structures of the same layout
// (kernel_args.cuh; tests/kernels/test_nvrtc_kernels.py checks the layouts against these structs).
#pragma once

#include "cell_maths.cuh"
#include "kernel_args.cuh"  // PersistentArgs, PersistentBackwardArgs, kChunkSteps

namespace rnn_ablations {

constexpr int kThreads = 512;  // threads per block (16 warps)
constexpr int kWarps = kThreads / 32;
constexpr int kTileRows = 2;   // W rows per warp tile
constexpr int kTileBatch = 4;  // batch rows per warp tile
constexpr int64_t kMaxRows = 65535;

__device__ __forceinline__ uint64_t align16(uint64_t bytes) { return (bytes + 15) / 16 * 16; }

// A spin wait's watchdog: false on a GPU (a wait has no limit there); the CPU emulation of the
// tests (tests/cuda_emulation/emulation.h) defines it to end a wait that lasts too long, so that
// a barrier that never opens fails the launch instead of hanging it.
#ifndef RNN_ABLATIONS_SPIN_EXPIRED
#define RNN_ABLATIONS_SPIN_EXPIRED(spins) ((void)(spins), false)
#endif

// The grid barrier (see the header): `target` is the calling block's count of arrivals to wait
// for, advanced by gridDim.x per barrier (the counter starts at zero; the comparison is modular,
// so it survives the counter's wrap-around).
__device__ __forceinline__ void grid_barrier(unsigned int* counter, unsigned int& target) {
  __syncthreads();
  if (threadIdx.x == 0) {
    target += gridDim.x;
    __threadfence();  // this block's writes, before its arrival
    atomicAdd(counter, 1u);
    for (unsigned int spins = 0;
         static_cast<int>(*reinterpret_cast<volatile unsigned int*>(counter) - target) < 0;
         ++spins) {
      if (RNN_ABLATIONS_SPIN_EXPIRED(spins)) break;
    }
    __threadfence();  // the other blocks' writes, after their arrivals
  }
  __syncthreads();
}

// out[b * rows + r] = sum_{k < K} w[r * K + k] * v[b * K + k] for r < rows, b < bn (w in shared
// memory in the storage type, v in the accumulation type): the block's warps take the
// (kTileRows x kTileBatch) output tiles in turn; in a tile the lanes stride over k, and the
// warp's sums are reduced with shuffles, lane x * kTileBatch + y keeping entry (x, y).  The
// forward's h_{t-1} W_hh^T and the backward's dh_{t-1} = dproj W_hh both run it.
template <typename T, typename A>
__device__ __forceinline__ void block_tile_products(const T* __restrict__ w, int rows, int K,
                                                    const A* __restrict__ v, int bn,
                                                    A* __restrict__ out, int warp, int lane) {
  const int row_tiles = (rows + kTileRows - 1) / kTileRows;
  const int tiles = row_tiles * ((bn + kTileBatch - 1) / kTileBatch);
  for (int tile = warp; tile < tiles; tile += kWarps) {
    const int r0 = (tile % row_tiles) * kTileRows;
    const int b0 = (tile / row_tiles) * kTileBatch;
    const T* wr[kTileRows];
    const A* vr[kTileBatch];
#pragma unroll
    for (int x = 0; x < kTileRows; ++x) wr[x] = w + static_cast<int64_t>(min(r0 + x, rows - 1)) * K;
#pragma unroll
    for (int y = 0; y < kTileBatch; ++y) vr[y] = v + static_cast<int64_t>(min(b0 + y, bn - 1)) * K;
    A acc[kTileRows][kTileBatch];
#pragma unroll
    for (int x = 0; x < kTileRows; ++x)
#pragma unroll
      for (int y = 0; y < kTileBatch; ++y) acc[x][y] = A(0);
    for (int k = lane; k < K; k += 32) {
      A wk[kTileRows], vk[kTileBatch];
#pragma unroll
      for (int x = 0; x < kTileRows; ++x) wk[x] = static_cast<A>(wr[x][k]);
#pragma unroll
      for (int y = 0; y < kTileBatch; ++y) vk[y] = vr[y][k];
#pragma unroll
      for (int x = 0; x < kTileRows; ++x)
#pragma unroll
        for (int y = 0; y < kTileBatch; ++y) acc[x][y] = fma(wk[x], vk[y], acc[x][y]);
    }
    A mine = A(0);
#pragma unroll
    for (int x = 0; x < kTileRows; ++x)
#pragma unroll
      for (int y = 0; y < kTileBatch; ++y) {
        A sum = acc[x][y];
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
        if (lane == x * kTileBatch + y) mine = sum;
      }
    if (lane < kTileRows * kTileBatch) {
      const int x = lane / kTileBatch, y = lane % kTileBatch;
      if (r0 + x < rows && b0 + y < bn) out[(b0 + y) * rows + r0 + x] = mine;
    }
  }
}

template <typename T, typename A>
__global__ void __launch_bounds__(kThreads)
    persistent_forward_kernel(const __grid_constant__ PersistentArgs<T, A> a) {
  RNN_ABLATIONS_DYNAMIC_SMEM(smem);
  const KernelSpec& ks = a.ks;
  const int H = a.H, U = a.U, bt = a.bt;
  const int R = static_cast<int>(ks.R);
  const int RU = R * U;
  const int64_t B = a.B, P = a.P;
  T* ws = reinterpret_cast<T*>(smem);
  A* hs = reinterpret_cast<A*>(smem + align16(static_cast<uint64_t>(RU) * H * sizeof(T)));
  A* pre = hs + static_cast<int64_t>(bt) * H;
  const int j0 = blockIdx.x * U;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  // this block's W_hh rows, once for all steps (rows of units past H: zeros, never written out)
  for (int64_t i = threadIdx.x; i < static_cast<int64_t>(RU) * H; i += kThreads) {
    const int lr = static_cast<int>(i / H), k = static_cast<int>(i % H);
    const int r = lr / U, u = lr % U;
    ws[i] = j0 + u < H ? a.w_hh[(static_cast<int64_t>(r) * H + j0 + u) * H + k] : T(0);
  }
  __syncthreads();

  unsigned int arrivals = 0;
  for (int s = 0; s < a.steps; ++s) {
    const int64_t t = a.t0 + s;
    const int n = a.n[s];
    const int n_next = s + 1 < a.steps ? a.n[s + 1] : a.n_after;
    for (int cb = 0; cb < n; cb += bt) {
      const int bn = min(bt, n - cb);
      // 1. h_{t-1} of rows [cb, cb + bn), masked, into shared memory
      const int64_t base = static_cast<int64_t>(cb) * H;
      for (int i = threadIdx.x; i < bn * H; i += kThreads) {
        A v = t == 0 ? static_cast<A>(a.h0[base + i])
                     : static_cast<A>(load_cg(a.out + (t - 1) * B * H + base + i));
        if (a.mask) v = static_cast<A>(static_cast<T>(v * static_cast<A>(a.mask[base + i])));
        hs[i] = v;
      }
      __syncthreads();
      // 2. pre[bl * RU + lr] = sum_k W(lr, k) h_{t-1}(cb + bl, k)
      block_tile_products<T, A>(ws, RU, H, hs, bn, pre, warp, lane);
      __syncthreads();
      // 3. the element-wise step of (row cb + bl, unit j0 + u)
      for (int i = threadIdx.x; i < bn * U; i += kThreads) {
        const int bl = i / U, u = i % U, j = j0 + u;
        if (j >= H) continue;
        const int64_t b = cb + bl;
        const int64_t row = t * B + b;  // (t, b)
        A* g = pre + bl * RU + u;       // recurrent block r at g[r * U]
        const T* pr = a.proj + row * P + j;
        for (int r = 0; r < R; ++r) g[r * U] += static_cast<A>(pr[static_cast<int64_t>(r) * H]);
        const A c_prev = !ks.memory ? A(0)
                         : t == 0   ? a.c0[b * H + j]
                                    : a.cs[row * H - B * H + j];
        A c, h_pre;
        const A h = forward_element<T, A>(ks, g, U, ks.X > 0 ? pr + R * H : nullptr, H, c_prev, c,
                                          h_pre);
        a.out[row * H + j] = static_cast<T>(h);
        a.cs[row * H + j] = c;
        if (a.gates) {
          for (int r = 0; r < R; ++r) a.gates[row * R * H + static_cast<int64_t>(r) * H + j] = g[r * U];
        }
        if (a.hin) a.hin[row * H + j] = h_pre;
        if (b >= n_next) {  // the row's last active step: its final states
          a.h_n[b * H + j] = static_cast<T>(h);
          a.c_n[b * H + j] = static_cast<T>(c);
        }
      }
      __syncthreads();  // hs and pre are reused by the next tile of rows
    }
    if (s + 1 < a.steps) grid_barrier(a.barrier, arrivals);  // h_t complete everywhere before step t + 1 reads it
  }
}


// The step kernel's backward (cuda_backward) in one launch.  Block q owns units [q*U, q*U + U):
// per step (from the last) it runs backward_element for its units (d_proj_t of its units, its
// dL/dc), the grid synchronises (d_proj_t complete), then it computes dh_{t-1} of its units,
// sum_q d_proj_t(b, q) W_hh(q, j) over the R*H recurrent rows q, from the W_hh columns of its
// units held in shared memory (and d_proj_t staged from L2), times the mask.  The next step
// reads only its own units of dh and dc, so one grid barrier per step suffices.
template <typename T, typename A>
__global__ void __launch_bounds__(kThreads)
    persistent_backward_kernel(const __grid_constant__ PersistentBackwardArgs<T, A> a) {
  RNN_ABLATIONS_DYNAMIC_SMEM(smem);
  const KernelSpec& ks = a.ks;
  const int H = a.H, U = a.U, bt = a.bt;
  const int RH = static_cast<int>(ks.R) * H;
  const int64_t B = a.B, P = a.P;
  T* wc = reinterpret_cast<T*>(smem);  // wc[u * RH + q] = W_hh(q, j0 + u)
  A* ds = reinterpret_cast<A*>(smem + align16(static_cast<uint64_t>(U) * RH * sizeof(T)));
  A* sums = ds + static_cast<int64_t>(bt) * RH;  // bt rows of U
  const int j0 = blockIdx.x * U;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  for (int64_t i = threadIdx.x; i < static_cast<int64_t>(U) * RH; i += kThreads) {
    const int u = static_cast<int>(i / RH), q = static_cast<int>(i % RH);
    wc[i] = j0 + u < H ? a.w_hh[static_cast<int64_t>(q) * H + j0 + u] : T(0);
  }
  __syncthreads();

  unsigned int arrivals = 0;
  for (int s = 0; s < a.steps; ++s) {
    const int64_t t = a.t_hi - s;
    const int n = a.n[s];
    // 1. the element-wise backward of rows [0, n) and this block's units
    for (int i = threadIdx.x; i < n * U; i += kThreads) {
      const int b = i / U, u = i % U, j = j0 + u;
      if (j >= H) continue;
      const int64_t row = t * B + b;
      const A gh = a.dh[b * H + j] + static_cast<A>(a.g_out[row * H + j]);
      const A* c_cur = ks.memory ? a.cs + row * H + j : nullptr;
      const A* c_prev = !ks.memory ? nullptr
                        : t == 0   ? a.c0 + b * H + j
                                   : a.cs + row * H - B * H + j;
      const A dc_prev = backward_element<T, A>(
          ks, H, j, a.gates + row * RH, ks.X > 0 ? a.proj + row * P + RH : nullptr, c_cur,
          c_prev, ks.highway ? a.hin[row * H + j] : A(0), gh, a.dc[b * H + j],
          a.dproj + row * P);
      if (ks.memory) a.dc[b * H + j] = dc_prev;
    }
    grid_barrier(a.barrier, arrivals);  // d_proj_t of every unit written
    // 2. dh_{t-1} of this block's units, rows [0, n), bt rows at a time
    for (int cb = 0; cb < n; cb += bt) {
      const int bn = min(bt, n - cb);
      for (int i = threadIdx.x; i < bn * RH; i += kThreads) {
        const int bl = i / RH, q = i % RH;
        ds[i] = static_cast<A>(load_cg(a.dproj + (t * B + cb + bl) * P + q));
      }
      __syncthreads();
      block_tile_products<T, A>(wc, U, RH, ds, bn, sums, warp, lane);
      __syncthreads();
      for (int i = threadIdx.x; i < bn * U; i += kThreads) {
        const int bl = i / U, u = i % U, j = j0 + u;
        if (j >= H) continue;
        const int64_t b = cb + bl;
        A v = sums[bl * U + u];
        if (a.mask) v = v * static_cast<A>(a.mask[b * H + j]);  // as the step kernel's mul_kernel
        a.dh[b * H + j] = v;
      }
      __syncthreads();  // ds and sums are reused by the next tile of rows
    }
  }
}

}  // namespace rnn_ablations
