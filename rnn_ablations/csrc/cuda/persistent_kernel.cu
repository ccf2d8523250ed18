// Persistent recurrent kernels (CUDA): the FORWARD pass of one layer in one direction of every
// step-kernel variant in ONE cooperative launch that keeps W_hh on chip and loops over the time
// steps (Diamos et al. 2016, "Persistent RNNs"; cuDNN's persistent algorithms), and the
// recurrence of its BACKWARD pass the same way.  Same functions, arguments and results as
// cuda_forward / cuda_backward in step_kernel.cu (the step kernel: one cuBLAS GEMM and one
// element-wise kernel per step, 2+ launches per step); the saved tensors (gates, cs, hin) are laid
// out as that kernel saves them, so either backward consumes either forward's.  Status: compiled,
// NOT yet run on a GPU; off by default (rnn_ablations/cuda_recurrence.py selects the forward only
// when asked: set_cuda_recurrence("persistent"), and the backward only with PERSISTENT_BACKWARD).
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
//      (forward_element.h, the step kernel's own per-element code) and writes h_t, c_t, the
//      saved activations and, on a row's last step, its final states h_n / c_n.
// Then the grid synchronises once, and the next step reads h_t.  The backward
// (persistent_backward_kernel) mirrors it with the W_hh COLUMNS of the block's units: see there.
//
// Grid barrier: cooperative_groups' grid.sync() under cudaLaunchCooperativeKernel.  Chosen over
// an own atomic-counter barrier because (a) a grid-wide barrier is only safe when every block of
// the grid is resident at once; a cooperative launch guarantees exactly that and FAILS
// (cudaErrorCooperativeLaunchTooLarge) instead of deadlocking when it cannot, whereas an
// ordinary launch of an own barrier may hang if another stream's kernels hold SMs; (b) grid.sync
// has documented memory semantics (the writes before it are visible to every block after it),
// while a hand-written barrier must get the fences right; (c) its cost is the same design (one
// arrival per block on a global counter, the other threads wait at a block barrier).  Cooperative
// launches can be captured in a CUDA graph (kernel nodes with the cooperative attribute); if a
// capture fails, rnn_ablations/cuda_graphs.py runs the call eagerly.
//
// Applicability (persistent_plan; otherwise the step kernel runs, or a forced "persistent"
// raises naming the reason): float32, bfloat16 or float16 (float64 runs the step kernel); a
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

#include <torch/extension.h>
#include <ATen/OpMathType.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cooperative_groups.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "../common/layer_tensors.h"

namespace {

using namespace rnn_ablations;  // KernelSpec, input checks
namespace cg = cooperative_groups;

#include "../common/elementwise.h"  // cell_update, highway_mix (shared with the CPU kernel)
#include "forward_element.h"   // forward_element (shared with the step kernel)
#include "backward_element.h"  // backward_element (shared with the step kernel)

constexpr int kThreads = 512;  // threads per block (16 warps)
constexpr int kWarps = kThreads / 32;
constexpr int kTileRows = 2;   // W rows per warp tile
constexpr int kTileBatch = 4;  // batch rows per warp tile
constexpr int kChunkSteps = 1024;  // steps per launch (active row counts in the parameters)
constexpr int64_t kMaxRows = 65535;

// Everything one launch needs, passed by value (__grid_constant__: read in place from the
// parameter space, ~2.3 KB of the 4 KB a launch may pass).
template <typename T, typename A>
struct PersistentArgs {
  KernelSpec ks;
  int H, B, P, U, bt;      // units, rows, projection width, units per block, rows per tile
  int t0, steps, n_after;  // first step, steps in this launch, active rows after the last one
  const T* proj;           // (T, B, P): recurrent blocks then input-only blocks
  const T* w_hh;           // (R*H, H)
  const T* h0;             // (B, H)
  const A* c0;             // (B, H), acc_t
  const T* mask;           // (B, H) recurrent-dropout mask, or null
  T* out;                  // (T, B, H), zero-initialised
  A* cs;                   // (T, B, H)
  A* gates;                // (T, B, R*H) activations, or null (inference)
  A* hin;                  // (T, B, H) h before the highway mix, or null
  T* h_n;                  // (B, H), initialised to h0
  T* c_n;                  // (B, H), initialised to c0 (to h0 without memory)
  uint16_t n[kChunkSteps];  // active rows of step t0 + s
};

template <typename T> __device__ __forceinline__ T load_cg(const T* p) {
  // the 2-byte storage types (at::Half, at::BFloat16): load the bits through L2
  const unsigned short bits = __ldcg(reinterpret_cast<const unsigned short*>(p));
  return T(bits, T::from_bits());
}
template <> __device__ __forceinline__ float load_cg<float>(const float* p) { return __ldcg(p); }

__host__ __device__ inline size_t align16(size_t bytes) { return (bytes + 15) / 16 * 16; }

// Dynamic shared memory of a block.  Forward: the W_hh slice (R*U rows of H, storage dtype),
// the staged h_{t-1} (bt rows of H, acc_t) and the pre-activations (bt rows of R*U, acc_t).
// Backward: the W_hh columns of the block's units (U columns of R*H, storage dtype), the staged
// d_proj_t (bt rows of R*H, acc_t) and dh_{t-1} of the block's units (bt rows of U, acc_t).
inline size_t smem_bytes(bool backward, int64_t R, int64_t U, int64_t H, int64_t bt, size_t elem,
                         size_t acc) {
  const size_t w = align16(static_cast<size_t>(R * U * H) * elem);
  return backward ? w + static_cast<size_t>(bt * R * H) * acc + static_cast<size_t>(bt * U) * acc
                  : w + static_cast<size_t>(bt * H) * acc + static_cast<size_t>(bt * R * U) * acc;
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
  extern __shared__ __align__(16) unsigned char smem[];
  const KernelSpec& ks = a.ks;
  const int H = a.H, U = a.U, bt = a.bt;
  const int R = static_cast<int>(ks.R);
  const int RU = R * U;
  const int64_t B = a.B, P = a.P;
  T* ws = reinterpret_cast<T*>(smem);
  A* hs = reinterpret_cast<A*>(smem + align16(static_cast<size_t>(RU) * H * sizeof(T)));
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

  cg::grid_group grid = cg::this_grid();
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
    if (s + 1 < a.steps) grid.sync();  // h_t complete everywhere before step t + 1 reads it
  }
}

// The backward's arguments (as PersistentArgs; steps run from t_hi down).
template <typename T, typename A>
struct PersistentBackwardArgs {
  KernelSpec ks;
  int H, B, P, U, bt;
  int t_hi, steps;         // steps t_hi, t_hi - 1, ..., t_hi - steps + 1
  const T* proj;           // (T, B, P): the input-only blocks (content, highway projection)
  const T* w_hh;           // (R*H, H)
  const A* gates;          // (T, B, R*H) the forward's activations
  const A* cs;             // (T, B, H)
  const A* c0;             // (B, H)
  const A* hin;            // (T, B, H) with highway, else null
  const T* g_out;          // (T, B, H) dL/d out
  const T* mask;           // (B, H) or null
  T* dproj;                // (T, B, P), zero-initialised
  A* dh;                   // (B, H) carried dL/dh: grad_hn on entry, dL/dh0 on exit
  A* dc;                   // (B, H) carried dL/dc: grad_cn on entry, dL/dc0 on exit
  uint16_t n[kChunkSteps];  // active rows of step t_hi - s
};

// The step kernel's backward (cuda_backward) in one launch.  Block q owns units [q*U, q*U + U):
// per step (from the last) it runs backward_element for its units (d_proj_t of its units, its
// dL/dc), the grid synchronises (d_proj_t complete), then it computes dh_{t-1} of its units,
// sum_q d_proj_t(b, q) W_hh(q, j) over the R*H recurrent rows q, from the W_hh columns of its
// units held in shared memory (and d_proj_t staged from L2), times the mask.  The next step
// reads only its own units of dh and dc, so one grid barrier per step suffices.
template <typename T, typename A>
__global__ void __launch_bounds__(kThreads)
    persistent_backward_kernel(const __grid_constant__ PersistentBackwardArgs<T, A> a) {
  extern __shared__ __align__(16) unsigned char smem[];
  const KernelSpec& ks = a.ks;
  const int H = a.H, U = a.U, bt = a.bt;
  const int RH = static_cast<int>(ks.R) * H;
  const int64_t B = a.B, P = a.P;
  T* wc = reinterpret_cast<T*>(smem);  // wc[u * RH + q] = W_hh(q, j0 + u)
  A* ds = reinterpret_cast<A*>(smem + align16(static_cast<size_t>(U) * RH * sizeof(T)));
  A* sums = ds + static_cast<int64_t>(bt) * RH;  // bt rows of U
  const int j0 = blockIdx.x * U;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  for (int64_t i = threadIdx.x; i < static_cast<int64_t>(U) * RH; i += kThreads) {
    const int u = static_cast<int>(i / RH), q = static_cast<int>(i % RH);
    wc[i] = j0 + u < H ? a.w_hh[static_cast<int64_t>(q) * H + j0 + u] : T(0);
  }
  __syncthreads();

  cg::grid_group grid = cg::this_grid();
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
    grid.sync();  // d_proj_t of every unit written
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

// The launch configuration of one call, or why there is none.
struct Plan {
  bool ok = false;
  std::string why;
  int blocks = 0, units = 0, batch_tile = 0;
  size_t smem = 0;
};

template <typename T, typename A>
const void* kernel_ptr(bool backward) {
  return backward ? reinterpret_cast<const void*>(&persistent_backward_kernel<T, A>)
                  : reinterpret_cast<const void*>(&persistent_forward_kernel<T, A>);
}

const void* kernel_for(at::ScalarType dtype, bool backward) {
  switch (dtype) {
    case at::kFloat: return kernel_ptr<float, float>(backward);
    case at::kBFloat16: return kernel_ptr<at::BFloat16, float>(backward);
    case at::kHalf: return kernel_ptr<at::Half, float>(backward);
    default: return nullptr;
  }
}

// Blocks of `fn` with `smem` bytes of dynamic shared memory resident per SM on the current
// device.  Cached, so that only a call's first use queries the driver (the later ones, e.g. the
// calls that cuda_graphs.py records, make no CUDA API call besides the launch); the kernel's
// shared-memory limit is raised to the device's opt-in maximum once per device.
int resident_per_sm(const void* fn, int device, size_t smem, size_t limit) {
  static std::mutex mutex;
  static std::map<std::tuple<int, const void*, size_t>, int> cache;
  const std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_tuple(device, fn, smem);
  const auto found = cache.find(key);
  if (found != cache.end()) return found->second;
  const auto limit_key = std::make_tuple(device, fn, size_t{0});
  if (cache.find(limit_key) == cache.end()) {
    C10_CUDA_CHECK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(limit)));
    cache[limit_key] = -1;  // marks the attribute as set (smem 0 is never a real query)
  }
  int per_sm = 0;
  C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fn, kThreads, smem));
  cache[key] = per_sm;
  return per_sm;
}

// rows: the most rows active at a step (batch_sizes[0]); blocks / batch_tile: 0 = automatic
// (one block per SM; as many rows per tile as the shared memory holds), else forced.
Plan make_plan(bool backward, const KernelSpec& ks, int64_t H, int64_t rows,
               at::ScalarType dtype, int device, int64_t blocks, int64_t batch_tile) {
  Plan p;
  const void* fn = kernel_for(dtype, backward);
  if (fn == nullptr) {
    p.why = std::string("the persistent kernel runs float32, bfloat16 and float16, not ") +
            (dtype == at::kDouble ? "float64" : c10::toString(dtype)) +
            " (the step kernel runs it)";
    return p;
  }
  if (rows > kMaxRows) {
    p.why = "batch " + std::to_string(rows) + " > " + std::to_string(kMaxRows) +
            " rows (the per-step row counts are uint16)";
    return p;
  }
  if (blocks < 0 || batch_tile < 0) {
    p.why = "blocks and batch_tile must be >= 0 (0 = automatic)";
    return p;
  }
  const cudaDeviceProp* prop = at::cuda::getDeviceProperties(device);
  if (!prop->cooperativeLaunch) {
    p.why = std::string("device ") + prop->name + " does not support cooperative launches";
    return p;
  }
  const int64_t sms = prop->multiProcessorCount;
  const int64_t want = blocks > 0 ? std::min<int64_t>(blocks, H) : std::min<int64_t>(sms, H);
  const int64_t U = (H + want - 1) / want;
  const int64_t nb = (H + U - 1) / U;
  const size_t elem = c10::elementSize(dtype), acc = sizeof(float);
  const size_t limit = prop->sharedMemPerBlockOptin;
  const size_t w_bytes = smem_bytes(backward, ks.R, U, H, 0, elem, acc);
  const size_t row_bytes = smem_bytes(backward, ks.R, U, H, 1, elem, acc) - w_bytes;
  if (w_bytes + row_bytes > limit) {
    p.why = "the W_hh slice of one block (" + std::to_string(ks.R) + " gate blocks x " +
            std::to_string(U) + " units x H = " + std::to_string(H) + ", " +
            std::to_string(w_bytes / 1024) + " KiB) and one batch row do not fit in the " +
            std::to_string(limit / 1024) + " KiB of shared memory of a block on " + prop->name;
    return p;
  }
  int64_t bt = static_cast<int64_t>((limit - w_bytes) / row_bytes);
  bt = std::max<int64_t>(1, std::min<int64_t>(bt, std::max<int64_t>(rows, 1)));
  if (batch_tile > 0) bt = std::min<int64_t>(bt, batch_tile);
  const size_t smem = smem_bytes(backward, ks.R, U, H, bt, elem, acc);
  const int per_sm = resident_per_sm(fn, device, smem, limit);
  if (per_sm < 1 || nb > per_sm * sms) {
    p.why = std::to_string(nb) + " blocks of " + std::to_string(kThreads) + " threads with " +
            std::to_string(smem / 1024) + " KiB of shared memory cannot all be resident (" +
            std::to_string(per_sm) + " per SM, " + std::to_string(sms) + " SMs)";
    return p;
  }
  p.ok = true;
  p.blocks = static_cast<int>(nb);
  p.units = static_cast<int>(U);
  p.batch_tile = static_cast<int>(bt);
  p.smem = smem;
  return p;
}

template <typename T, typename A, typename Args>
void launch(bool backward, Args& args, const Plan& p, cudaStream_t stream) {
  void* params[] = {&args};
  C10_CUDA_CHECK(cudaLaunchCooperativeKernel(kernel_ptr<T, A>(backward), dim3(p.blocks),
                                             dim3(kThreads), params, p.smem, stream));
}

}  // namespace

// (applicable, reason, blocks, units per block, batch rows per tile, shared memory bytes) of the
// persistent forward (or, with `backward`, backward) kernel for a call with these tensors
// (proj (T, B, (R+X)*H), w_hh (R*H, H) on CUDA).
std::tuple<bool, std::string, int64_t, int64_t, int64_t, int64_t> persistent_plan(
    int64_t spec, bool highway, at::Tensor proj, at::Tensor w_hh, int64_t blocks,
    int64_t batch_tile, bool backward) {
  const char* who = "rnn_ablations persistent CUDA kernel";
  TORCH_CHECK(proj.is_cuda() && w_hh.is_cuda() && proj.dim() == 3, who,
              ": proj (T, B, (R+X)*H) and w_hh must be CUDA tensors");
  const int64_t H = check_w_hh(w_hh, who), R = w_hh.size(0) / H;
  TORCH_CHECK(proj.size(2) % H == 0 && proj.size(2) >= R * H, who,
              ": proj width must be (R+X)*H");
  const KernelSpec ks = check_kernel_spec(spec, highway, R, proj.size(2) / H - R, who);
  const c10::cuda::CUDAGuard guard(proj.device());
  const Plan p = make_plan(backward, ks, H, proj.size(1), proj.scalar_type(), proj.get_device(),
                           blocks, batch_tile);
  return {p.ok, p.why, p.blocks, p.units, p.batch_tile, static_cast<int64_t>(p.smem)};
}

// As cuda_forward (step_kernel.cu): {out (T,B,H), h_n, c_n, gates, cs, hin}.  gates (the
// activations, acc_t) is returned only with keep_hin (the training call, whose backward reads
// it), else empty; cs is acc_t; hin (acc_t) with highway and keep_hin, else empty.
std::vector<at::Tensor> persistent_forward(int64_t spec, bool highway, at::Tensor proj,
                                           at::Tensor w_hh, at::Tensor h0, at::Tensor c0,
                                           at::Tensor batch_sizes, at::Tensor rec_mask,
                                           bool keep_hin, int64_t blocks, int64_t batch_tile) {
  const char* who = "rnn_ablations persistent CUDA kernel";
  check_plain_inputs(proj, w_hh, h0, c0, batch_sizes, at::kCUDA, who);
  const c10::cuda::CUDAGuard guard(proj.device());
  const int64_t H = w_hh.size(1), R = w_hh.size(0) / H;
  const int64_t T = proj.size(0), B = proj.size(1), P = proj.size(2), X = P / H - R;
  const KernelSpec ks = check_kernel_spec(spec, highway, R, X, who);
  const bool has_mask = rec_mask.defined() && rec_mask.numel() > 0;
  if (has_mask) check_like(rec_mask, h0.sizes(), h0, "rec_mask", who);
  const int64_t* bs = batch_sizes.data_ptr<int64_t>();
  int64_t steps = 0;  // as the step kernel: up to the first step without an active row
  while (steps < T && bs[steps] > 0) ++steps;
  const Plan p = make_plan(false, ks, H, steps > 0 ? bs[0] : 0, proj.scalar_type(),
                           proj.get_device(), blocks, batch_tile);
  TORCH_CHECK(p.ok, who, " does not apply: ", p.why,
              " (rnn_ablations.set_cuda_recurrence('steps') runs the step kernel)");
  TORCH_CHECK(H <= INT32_MAX / (R + X) && B * H <= INT32_MAX, who, ": shape too large");
  const at::ScalarType acc = at::toOpMathType(proj.scalar_type());
  const at::TensorOptions acc_opts = proj.options().dtype(acc);
  at::Tensor c0a = c0.to(acc);
  at::Tensor out = at::zeros({T, B, H}, proj.options());
  at::Tensor cs = at::zeros({T, B, H}, acc_opts);
  at::Tensor gates = keep_hin ? at::zeros({T, B, R * H}, acc_opts) : at::empty({0}, acc_opts);
  at::Tensor hin = (highway && keep_hin) ? at::zeros({T, B, H}, acc_opts) : at::empty({0}, acc_opts);
  at::Tensor h_n = h0.clone();
  at::Tensor c_n = ks.memory ? c0.clone() : h0.clone();  // final_states: c_n = h_n without memory
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, proj.scalar_type(),
                                  "rnn_ablations_persistent_forward", [&] {
    if constexpr (!std::is_same_v<scalar_t, double>) {
      using acc_t = at::opmath_type<scalar_t>;
      PersistentArgs<scalar_t, acc_t> args{};
      args.ks = ks;
      args.H = static_cast<int>(H);
      args.B = static_cast<int>(B);
      args.P = static_cast<int>(P);
      args.U = p.units;
      args.bt = p.batch_tile;
      args.proj = proj.data_ptr<scalar_t>();
      args.w_hh = w_hh.data_ptr<scalar_t>();
      args.h0 = h0.data_ptr<scalar_t>();
      args.c0 = c0a.data_ptr<acc_t>();
      args.mask = has_mask ? rec_mask.data_ptr<scalar_t>() : nullptr;
      args.out = out.data_ptr<scalar_t>();
      args.cs = cs.data_ptr<acc_t>();
      args.gates = keep_hin ? gates.data_ptr<acc_t>() : nullptr;
      args.hin = hin.numel() > 0 ? hin.data_ptr<acc_t>() : nullptr;
      args.h_n = h_n.data_ptr<scalar_t>();
      args.c_n = c_n.data_ptr<scalar_t>();
      for (int64_t t0 = 0; t0 < steps; t0 += kChunkSteps) {
        const int64_t len = std::min<int64_t>(kChunkSteps, steps - t0);
        args.t0 = static_cast<int>(t0);
        args.steps = static_cast<int>(len);
        args.n_after = t0 + len < T ? static_cast<int>(bs[t0 + len]) : 0;
        for (int64_t s = 0; s < len; ++s) args.n[s] = static_cast<uint16_t>(bs[t0 + s]);
        launch<scalar_t, acc_t>(false, args, p, stream);
      }
    }
  });
  return {out, h_n, c_n, gates, cs, hin};
}

// As cuda_backward (step_kernel.cu): {d_proj, d_w_hh, d_h0, d_c0} from what the forward
// (either kernel, with keep_hin) saved, the recurrence in one persistent launch per kChunkSteps
// steps; the weight gradient is one GEMM after it, as there.
std::vector<at::Tensor> persistent_backward(int64_t spec, bool highway, at::Tensor grad_out,
                                            at::Tensor grad_hn, at::Tensor grad_cn,
                                            at::Tensor gates, at::Tensor cs, at::Tensor hin,
                                            at::Tensor out, at::Tensor proj, at::Tensor w_hh,
                                            at::Tensor h0, at::Tensor c0, at::Tensor batch_sizes,
                                            at::Tensor rec_mask, int64_t blocks,
                                            int64_t batch_tile) {
  const char* who = "rnn_ablations persistent CUDA kernel (backward)";
  TORCH_CHECK(proj.dim() == 3, who, ": proj must be (T, B, (R+X)*H)");
  const KernelSpec ks = check_backward_inputs(spec, highway, grad_out, grad_hn, grad_cn, cs, hin,
                                              out, w_hh, h0, c0, batch_sizes, rec_mask,
                                              proj.size(2), at::kCUDA, who);
  check_like(proj, {out.size(0), out.size(1), proj.size(2)}, out, "proj", who);
  const c10::cuda::CUDAGuard guard(proj.device());
  const int64_t H = w_hh.size(1), R = w_hh.size(0) / H;
  const int64_t T = proj.size(0), B = proj.size(1), P = proj.size(2);
  const at::ScalarType acc = at::toOpMathType(proj.scalar_type());
  TORCH_CHECK(gates.scalar_type() == acc && gates.is_contiguous() && gates.is_cuda() &&
                  gates.dim() == 3 && gates.size(0) == T && gates.size(1) == B &&
                  gates.size(2) == R * H,
              who, ": gates must be the contiguous ", acc, " (T, B, R*H) tensor the forward "
              "returned with keep_hin=True");
  TORCH_CHECK(cs.scalar_type() == acc && cs.is_cuda(), who, ": cs must be the forward's ", acc,
              " tensor");
  TORCH_CHECK(!highway || (hin.scalar_type() == acc && hin.numel() == T * B * H), who,
              ": hin must be the ", acc, " tensor returned by the forward (keep_hin=True)");
  const bool has_mask = rec_mask.defined() && rec_mask.numel() > 0;
  const int64_t* bs = batch_sizes.data_ptr<int64_t>();
  int64_t steps = 0;
  while (steps < T && bs[steps] > 0) ++steps;
  const Plan p = make_plan(true, ks, H, steps > 0 ? bs[0] : 0, proj.scalar_type(),
                           proj.get_device(), blocks, batch_tile);
  TORCH_CHECK(p.ok, who, " does not apply: ", p.why,
              " (rnn_ablations.cuda_recurrence.PERSISTENT_BACKWARD = False runs the step "
              "kernel's backward)");
  TORCH_CHECK(R * H <= INT32_MAX && B * H <= INT32_MAX, who, ": shape too large");
  grad_out = grad_out.to(proj.scalar_type()).contiguous();
  at::Tensor dproj = at::zeros_like(proj);
  at::Tensor dh = grad_hn.to(acc, /*non_blocking=*/false, /*copy=*/true).contiguous();
  at::Tensor dc = grad_cn.to(acc, /*non_blocking=*/false, /*copy=*/true).contiguous();
  at::Tensor c0a = c0.to(acc).contiguous();
  if (!ks.memory) dh.add_(dc);  // c_n is a copy of h_n for a cell without memory
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, proj.scalar_type(),
                                  "rnn_ablations_persistent_backward", [&] {
    if constexpr (!std::is_same_v<scalar_t, double>) {
      using acc_t = at::opmath_type<scalar_t>;
      PersistentBackwardArgs<scalar_t, acc_t> args{};
      args.ks = ks;
      args.H = static_cast<int>(H);
      args.B = static_cast<int>(B);
      args.P = static_cast<int>(P);
      args.U = p.units;
      args.bt = p.batch_tile;
      args.proj = proj.data_ptr<scalar_t>();
      args.w_hh = w_hh.data_ptr<scalar_t>();
      args.gates = gates.data_ptr<acc_t>();
      args.cs = cs.data_ptr<acc_t>();
      args.c0 = c0a.data_ptr<acc_t>();
      args.hin = highway ? hin.data_ptr<acc_t>() : nullptr;
      args.g_out = grad_out.data_ptr<scalar_t>();
      args.mask = has_mask ? rec_mask.data_ptr<scalar_t>() : nullptr;
      args.dproj = dproj.data_ptr<scalar_t>();
      args.dh = dh.data_ptr<acc_t>();
      args.dc = dc.data_ptr<acc_t>();
      for (int64_t hi = steps - 1; hi >= 0; hi -= kChunkSteps) {
        const int64_t len = std::min<int64_t>(kChunkSteps, hi + 1);
        args.t_hi = static_cast<int>(hi);
        args.steps = static_cast<int>(len);
        for (int64_t s = 0; s < len; ++s) args.n[s] = static_cast<uint16_t>(bs[hi - s]);
        launch<scalar_t, acc_t>(true, args, p, stream);
      }
    }
  });
  // dW_hh = sum_t dproj_t(recurrent blocks)^T h_{t-1}: one GEMM, as the step kernel's backward
  at::Tensor dw = at::mm(dproj.view({T * B, P}).narrow(1, 0, R * H).t(),
                         previous_hidden(out, h0, rec_mask, has_mask, 0, T));
  if (!ks.memory) dc.zero_();
  return {dproj, dw, dh.to(proj.scalar_type()), dc.to(proj.scalar_type())};
}

void register_persistent(pybind11::module_& m) {
  m.def("persistent_plan", &persistent_plan,
        "(applicable, reason, blocks, units, batch_tile, smem_bytes) of the persistent forward "
        "(backward=True: backward) kernel for (spec, highway, proj, w_hh, blocks, batch_tile, "
        "backward); 0 = automatic");
  m.def("persistent_forward", &persistent_forward, py::call_guard<py::gil_scoped_release>(),
        "one layer, one direction: the forward in one persistent cooperative launch (W_hh on "
        "chip, a grid barrier per step); same results as forward, gates only with keep_hin");
  m.def("persistent_backward", &persistent_backward, py::call_guard<py::gil_scoped_release>(),
        "one layer, one direction: backward's recurrence in one persistent cooperative launch "
        "(W_hh columns on chip); same arguments as backward plus blocks, batch_tile");
}
