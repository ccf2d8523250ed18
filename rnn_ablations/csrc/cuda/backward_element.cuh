// The backward of ONE element (row b, unit j) of one step, for every kernel spec, as the CUDA
// kernels run it: the step kernel (step_kernel.cuh, backward_kernel) and the persistent
// backward (persistent_kernel.cuh).  Written once so that both compute the same function; the
// per-element maths is common/elementwise.h's (shared with the CPU kernel).
//
// Include inside namespace rnn_ablations, after common/kernel_spec.h and common/elementwise.h.
#pragma once

// g: the gate activations of row b (recurrent block r, unit j at g[r * H + j]); xob: row b of the
// input-only blocks (null without any); c_cur / c_prev: c_t and c_{t-1} of (b, j) (read only with
// a memory); h_pre: h_t before the highway mix (read only with highway); gh: dL/dh_t (carried +
// from the output); dc: the carried dL/dc_t.  Writes dL/d(pre-activations) of (b, j) into dab,
// row b of d_proj (recurrent blocks, then the input-only blocks at dab + R*H).  Returns
// dL/dc_{t-1} (with a memory; else dc unchanged).
template <typename T, typename A>
__device__ __forceinline__ A backward_element(const KernelSpec& ks, int64_t H, int64_t j,
                                              const A* g, const T* xob, const A* c_cur,
                                              const A* c_prev, A h_pre, A gh, A dc, T* dab) {
  const int64_t R = ks.R, X = ks.X;
  T* dxob = dab + R * H;
  if (ks.highway) {
    const A r = g[(R - 1) * H + j];
    const A hw = static_cast<A>(xob[(X - 1) * H + j]);
    A d_r, d_hw;
    gh = highway_backward<A>(gh, r, h_pre, hw, d_r, d_hw);
    dab[(R - 1) * H + j] = static_cast<T>(d_r);
    dxob[(X - 1) * H + j] = static_cast<T>(d_hw);
  }
  const int64_t k = ks.content_block * H + j;
  if (!ks.memory) {  // h_t = c~_t, a recurrent block (activated)
    const A hv = g[k];
    dab[k] = static_cast<T>(ks.content_tanh ? content_output_grad<true, A>(gh, hv)
                                            : content_output_grad<false, A>(gh, hv));
    return dc;
  }
  const A i = g[j], f = g[H + j];
  const int64_t ko = ks.out_gate_block * H + j;  // read with an output gate only
  const A o = output_has_gate(ks.output) ? g[ko] : A(0);
  const A c = *c_cur;
  const A tc = output_reads_tanh(ks.output) ? tanh(c) : A(0);
  const A gc = cell_grad<A>(ks.output, dc, gh, o, tc, c);
  if (output_has_gate(ks.output)) {
    dab[ko] = static_cast<T>(out_gate_grad<A>(ks.output, gh, o, tc, c));
  }
  const A content = ks.content_recurrent ? g[k] : static_cast<A>(xob[k]);
  A d_i, d_f, d_c;
  const A dc_prev =
      ks.content_recurrent && ks.content_tanh
          ? memory_backward<true, A>(gc, i, f, content, *c_prev, d_i, d_f, d_c)
          : memory_backward<false, A>(gc, i, f, content, *c_prev, d_i, d_f, d_c);
  dab[j] = static_cast<T>(d_i);
  dab[H + j] = static_cast<T>(d_f);
  if (ks.content_recurrent) dab[k] = static_cast<T>(d_c);
  else dxob[k] = static_cast<T>(d_c);
  return dc_prev;
}
