// The CUDA kernels' by-value arguments that are structs of their own (the cell specs are
// common/kernel_spec.h's): the scan's Dims and Strides, the persistent kernels' parameter blocks.
// The launcher (rnn_ablations/kernels/cuda/structs.py) packs ctypes Structures of the same
// layout; tests/kernels/test_nvrtc_kernels.py checks every size with NVRTC and every field's offset with
// the host C++ compiler (this file is plain data: it compiles as host C++ too, given int64_t and
// uint16_t and kernel_spec.h's plain part).
#pragma once

#include "../common/kernel_spec.h"

namespace rnn_ablations {

// Dimensions of one call: T steps, B rows, D directions, H units, G blocks per direction.
struct Dims {
  int64_t T, B, D, H, G;
};

// Row strides (elements) of the (T, B, W) tensors: proj / d_proj, out / cs, g_out.  proj is
// time-major contiguous or the time-major view of a batch-major (B, T, W) tensor; out, cs and
// d_proj are laid out like it.
struct Strides {
  int64_t p_st, p_sb, o_st, o_sb, g_st, g_sb;
};

constexpr int kChunkSteps = 1024;  // persistent kernels: steps per launch (row counts below)

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
  unsigned int* barrier;   // the grid barrier's counter, zero at the launch
  uint16_t n[kChunkSteps];  // active rows of step t0 + s
};

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
  unsigned int* barrier;   // the grid barrier's counter, zero at the launch
  uint16_t n[kChunkSteps];  // active rows of step t_hi - s
};

}  // namespace rnn_ablations
