// The element-wise scan's rows (scan.cpp), shared by its portable loops and by the AVX2 + FMA
// copy in scan_rows_avx2.cpp, chosen at run time with the rest of the kernel's vector code
// (rnn_ablations::isa_name(), RNN_ABLATIONS_ISA; see vec_kernels.h).
#pragma once

#include <cstdint>

#include "../common/kernel_spec.h"  // ScanSpec

namespace rnn_ablations {
namespace scan {

// Everything one call of the forward or backward rows reads and writes.  Row (t, b) of proj
// (and d_proj) starts at t * p_st + b * p_sb, of out / cs at t * o_st + b * o_sb, of g_out at
// t * g_st + b * g_sb (elements; the last dimension is contiguous); direction d's blocks start
// d * G * H further into a proj row, its H outputs d * H further into an out row.  Direction 1
// runs each row backwards within its length.
template <typename S>
struct ScanArgs {
  int64_t nT, nB, nD, H, G;
  ScanSpec spec;  // the output rule, highway, and the block offsets (decode_scan_spec)
  int64_t p_st, p_sb, o_st, o_sb, g_st, g_sb;
  const int64_t* len;  // steps of each row
  const S* proj;
  const S* bias;       // (D * G * H) added to proj's blocks, or null (then `zeros` is read)
  const S* h0;
  const S* c0;
  // forward
  S* out;
  S* h_n;
  S* c_n;
  S* cs;  // the memories c_t (same strides as out), or null
  // backward
  const S* g_out;
  const S* g_hn;
  const S* cs_in;
  S* dproj;      // same strides as proj
  S* dc;         // (D, B, H): dL/dc_n on entry, dL/dc_0 on return
  S* dbias_rows; // (D * B, G * H) per-(direction, row) sums of d_proj, or null
  // G * H zeros: the bias when there is none, and the dL/dh_n row of every step but a row's
  // last (dL/dh_n enters there only)
  const S* zeros;
};

// Whether this build has the AVX2 + FMA rows (GCC on x86-64); the caller checks that the CPU
// runs them (rnn_ablations::isa_runs_avx2(): the path in use is avx2 or avx512).
bool avx2_rows_built();
// Tasks k in [k0, k1) (direction k / B, row k % B), float32 only.
void forward_rows_avx2(const ScanArgs<float>& a, int64_t k0, int64_t k1);
void backward_rows_avx2(const ScanArgs<float>& a, int64_t k0, int64_t k1);

}  // namespace scan
}  // namespace rnn_ablations
