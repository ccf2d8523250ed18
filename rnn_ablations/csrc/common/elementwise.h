// The element-wise maths of one step that the CPU kernel (cpu/vec_impl.h) and the CUDA kernels
// (cuda/forward_element.h, cuda/backward_element.h) share: the cell update, the highway mix and
// the backward of every output rule, per element, written once.  The activations themselves
// (sigmoid, tanh) stay per family: the CPU has its own vectorised transcendentals, CUDA uses the
// device's.
//
// No include guard on purpose: cpu/vec_portable.cpp, cpu/vec_avx2.cpp and cpu/vec_avx512.cpp
// include cpu/vec_impl.h (and so this file) inside a namespace of their own, so that each copy is
// compiled for its instruction set; each CUDA file includes it once.  It needs kernel_spec.h
// (OutputRule) included before.
//
// Notation: i, f, o gate activations; content = c~_t; c_prev = c_{t-1}; tc = tanh(c_t); gh =
// dL/dh_t; r, hw the highway gate and projection; h_pre = h_t before the highway mix.

#ifndef RNN_ABLATIONS_HD
#if defined(__CUDACC__)
#define RNN_ABLATIONS_HD __host__ __device__ __forceinline__
#else
#define RNN_ABLATIONS_HD inline __attribute__((always_inline))
#endif
#endif

// c_t = i*c~ + f*c_{t-1}
template <typename T>
RNN_ABLATIONS_HD T cell_update(T i, T content, T f, T c_prev) {
  return i * content + f * c_prev;
}

// h_t <- r*h_t + (1 - r)*hw
template <typename T>
RNN_ABLATIONS_HD T highway_mix(T r, T h_pre, T hw) {
  return r * h_pre + (T(1) - r) * hw;
}

// Highway backward: from gh (dL/d mixed h_t), dL/d(r's pre-activation), dL/d hw, and the
// gradient that flows on into h_pre (returned).
template <typename T>
RNN_ABLATIONS_HD T highway_backward(T gh, T r, T h_pre, T hw, T& d_r, T& d_hw) {
  d_r = gh * (h_pre - hw) * r * (T(1) - r);
  d_hw = gh * (T(1) - r);
  return gh * r;
}

// dL/dc_t in total: the carried dc plus what reaches c_t through the output rule.
template <int Out, typename T>
RNN_ABLATIONS_HD T cell_grad(T dc, T gh, T o, T tc) {
  if (Out == kOutGatedTanh) return dc + gh * o * (T(1) - tc * tc);
  if (Out == kOutTanh) return dc + gh * (T(1) - tc * tc);
  return dc + gh;  // kOutCell: h_t = c_t
}

// dL/d(o's pre-activation) for h_t = o*tanh(c_t)
template <typename T>
RNN_ABLATIONS_HD T out_gate_grad(T gh, T tc, T o) {
  return gh * tc * o * (T(1) - o);
}

// From gc = dL/dc_t: the gradients of the input and forget gates' pre-activations and of the
// content (before its activation when ContentTanh), and dL/dc_{t-1} (returned).
template <bool ContentTanh, typename T>
RNN_ABLATIONS_HD T memory_backward(T gc, T i, T f, T content, T c_prev, T& d_i, T& d_f,
                                   T& d_content) {
  d_i = gc * content * i * (T(1) - i);
  d_f = gc * c_prev * f * (T(1) - f);
  d_content = ContentTanh ? gc * i * (T(1) - content * content) : gc * i;
  return gc * f;
}

// Without memory (h_t = c~_t): dL/d(content's pre-activation) from gh and the activated content.
template <bool ContentTanh, typename T>
RNN_ABLATIONS_HD T content_output_grad(T gh, T content) {
  return ContentTanh ? gh * (T(1) - content * content) : gh;
}
