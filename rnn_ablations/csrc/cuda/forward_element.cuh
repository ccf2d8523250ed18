// The forward of ONE element (row b, unit j) of one step, for every kernel spec, as the CUDA
// kernels run it: the step kernel (step_kernel.cuh, forward_kernel: one thread per element after
// the step's GEMM) and the persistent kernel (persistent_kernel.cuh: the whole recurrence in one
// launch).  Written once so that both compute the same function; the per-element maths of the
// cell and the highway mix are common/elementwise.h's (shared with the CPU kernel).
//
// Include inside namespace rnn_ablations, after device_types.cuh (sigm), common/kernel_spec.h
// (KernelSpec, OutputRule) and common/elementwise.h (cell_update, cell_output, highway_mix), as
// elementwise.h is.
#pragma once

// g: the pre-activation of recurrent block 0 of (b, j), block r at g[r * gs]; on exit the
// activations replace them (the backward reads them).  xo: input-only block 0 of (b, j), block x
// at xo[x * xs] (null when the spec has no input-only block).  c_prev: c_{t-1} (read only with a
// memory).  Returns h_t (after the highway mix); c: c_t (h_t for a cell without memory); h_pre:
// h_t before the highway mix (what the backward of the mix reads).
template <typename T, typename A>
__device__ __forceinline__ A forward_element(const KernelSpec& ks, A* g, int64_t gs, const T* xo,
                                             int64_t xs, A c_prev, A& c, A& h_pre) {
  A content;
  if (ks.content_recurrent) {
    A* gk = g + ks.content_block * gs;
    content = ks.content_tanh ? tanh(*gk) : *gk;
    *gk = content;
  } else {
    content = static_cast<A>(xo[ks.content_block * xs]);
  }
  A h;
  if (!ks.memory) {  // h_t = c~_t
    h = content;
    c = h;
  } else {
    const A i = sigm(g[0]);
    const A f = sigm(g[gs]);
    g[0] = i;
    g[gs] = f;
    c = cell_update<A>(i, content, f, c_prev);
    A o = A(0), tc = A(0);
    if (output_has_gate(ks.output)) {
      A* go = g + ks.out_gate_block * gs;
      o = sigm(*go);
      *go = o;
    }
    if (output_reads_tanh(ks.output)) tc = tanh(c);
    h = cell_output<A>(ks.output, o, tc, c);
  }
  h_pre = h;
  if (ks.highway) {
    A* gr = g + (ks.R - 1) * gs;
    const A r = sigm(*gr);
    *gr = r;
    const A hw = static_cast<A>(xo[(ks.X - 1) * xs]);
    h = highway_mix<A>(r, h, hw);
    if (!ks.memory) c = h;
  }
  return h;
}
