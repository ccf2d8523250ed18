// The element-wise maths that every kernel family shares: the cell update, the output rules
// (forward and backward), the highway mix, the memory's backward, per element, written once.
// Users: the CPU step kernel (cpu/vec_impl.h), the CUDA step and persistent kernels
// (cuda/forward_element.cuh, cuda/backward_element.cuh) and the element-wise scan (the composition
// at the end of this file: cpu/scan.cpp's portable rows, cpu/scan_rows_avx2.cpp on 8 lanes,
// cuda/scan_kernel.cuh).  The activations themselves (sigmoid, tanh) stay per family: the CPU has
// its own vectorised transcendentals, CUDA uses the device's.  T is a float, a double, or any
// value type with +, -, * and construction from a float (the AVX2 scan's 8-lane wrapper).
//
// No include guard on purpose: cpu/vec_portable.cpp, cpu/vec_avx2.cpp and cpu/vec_avx512.cpp
// include cpu/vec_impl.h (and so this file) inside a namespace of their own, so that each copy is
// compiled for its instruction set (cpu/scan_rows_avx2.cpp likewise, under its target pragma);
// each CUDA file includes it once.  It needs kernel_spec.h (OutputRule, ScanSpec) included
// before.  The output rules' numbering is kernel_spec.h's; each rule's maths is here only.
//
// Notation: i, f, o gate activations; content = c~_t; c_prev = c_{t-1}; tc = tanh(c_t); gh =
// dL/dh_t; r, hw the highway gate and projection; h_pre = h_t before the highway mix.

// Non-finite numbers: every family computes exactly what the generic path (PyTorch's IEEE float
// operations) computes, NaN and +-Inf included, so that a diverging model is seen diverging.
// The rules below are plain IEEE arithmetic; what the families' own activations must give:
// sigmoid(NaN) = tanh(NaN) = NaN (a clamp must keep a NaN: a vector max/min returns one of its
// operands when the other is NaN, so the NaN must be the one it returns), sigmoid(+Inf) = 1,
// tanh(+-Inf) = +-1, and sigmoid(x) = 0 exactly below kSigmoidZeroBelow (-Inf included), where
// torch's float exp(-x) overflows: a gate shut by -Inf then times an infinite content gives
// 0 * Inf = NaN, as in torch (a clamped exp would give 6e-39 * Inf = Inf).  Double precision uses
// libm's exp and tanh, which already give these.  tests/kernels/test_nonfinite.py checks every path.
constexpr float kSigmoidZeroBelow = -88.72283905f;  // -ln(FLT_MAX)

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

// The output rules of a memory cell (OutputRule; what each reads: kernel_spec.h
// output_has_gate, output_reads_tanh): h_t, dL/dc_t and dL/d(o's pre-activation), each from
// what the forward read: (o, tc, c).  `out` is a compile-time constant where the caller's loop is
// a template on the rule (the branches then fold away), else a uniform run-time value.  A rule
// is these three functions; the kernels call them and name no rule.

// h_t from the output gate o (read by o_tanh only), tc = tanh(c_t) (read by o_tanh and tanh)
// and c_t
template <typename T>
RNN_ABLATIONS_HD T cell_output(int out, T o, T tc, T c) {
  if (out == kOutGatedTanh) return o * tc;  // h_t = o*tanh(c_t)
  if (out == kOutTanh) return tc;           // h_t = tanh(c_t)
  return c;                                 // kOutCell: h_t = c_t
}

// dL/dc_t in total: the carried dc plus what reaches c_t from gh = dL/dh_t through the rule.
template <typename T>
RNN_ABLATIONS_HD T cell_grad(int out, T dc, T gh, T o, T tc, T c) {
  (void)c;
  if (out == kOutGatedTanh) return dc + gh * o * (T(1) - tc * tc);
  if (out == kOutTanh) return dc + gh * (T(1) - tc * tc);
  return dc + gh;  // kOutCell: h_t = c_t
}

// dL/d(o's pre-activation), for a rule with an output gate (output_has_gate): gh times what o
// multiplies, times o*(1 - o).
template <typename T>
RNN_ABLATIONS_HD T out_gate_grad(int out, T gh, T o, T tc, T c) {
  (void)out;
  (void)c;
  return gh * tc * o * (T(1) - o);  // kOutGatedTanh: h_t = o*tanh(c_t)
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

// ---------------------------------------------------------------------------------------------
// The element-wise scan: one unit of one step of a memory cell whose gates read x_t only
// (ScanSpec), composed of the rules above; the families differ only in how they load and store
// (pre, put) and in their activations (Act).
//   Act::sigmoid(x), Act::tanh(x)  the family's activations
//   pre(role)     the pre-activation of block `role` (ScanBlock; its offset is
//                 ScanSpec::block[role]), its bias added
//   put(role, v)  store v = dL/d(pre-activation of block `role`)
// The roles are constants, so a family may keep per-role values in registers.
// Out (OutputRule) and HW (highway) are template arguments: the loops have no branch on them.

// c: c_{t-1} on entry, c_t on return; returns h_t.
template <int Out, bool HW, typename Act, typename T, typename Pre>
RNN_ABLATIONS_HD T scan_forward_element(const Pre& pre, T& c) {
  const T i = Act::sigmoid(pre(kScanI));
  const T f = Act::sigmoid(pre(kScanF));
  c = cell_update<T>(i, pre(kScanContent), f, c);
  T o(0), tc(0);
  if constexpr (output_has_gate(Out)) o = Act::sigmoid(pre(kScanO));
  if constexpr (output_reads_tanh(Out)) tc = Act::tanh(c);
  T h = cell_output<T>(Out, o, tc, c);
  if constexpr (HW) h = highway_mix<T>(Act::sigmoid(pre(kScanR)), h, pre(kScanHw));
  return h;
}

// gh: dL/dh_t (total); c, c_prev: c_t, c_{t-1}; dc: the carried dL/dc_t.  Stores the gradients
// of every block's pre-activation through put; returns dL/dc_{t-1}.
template <int Out, bool HW, typename Act, typename T, typename Pre, typename Put>
RNN_ABLATIONS_HD T scan_backward_element(const Pre& pre, const Put& put, T gh, T c, T c_prev,
                                         T dc) {
  T o(0), tc(0);
  if constexpr (output_has_gate(Out)) o = Act::sigmoid(pre(kScanO));
  if constexpr (output_reads_tanh(Out)) tc = Act::tanh(c);
  if constexpr (HW) {
    T d_r, d_hw;
    gh = highway_backward<T>(gh, Act::sigmoid(pre(kScanR)), cell_output<T>(Out, o, tc, c),
                             pre(kScanHw), d_r, d_hw);
    put(kScanR, d_r);
    put(kScanHw, d_hw);
  }
  const T gc = cell_grad<T>(Out, dc, gh, o, tc, c);
  if constexpr (output_has_gate(Out)) put(kScanO, out_gate_grad<T>(Out, gh, o, tc, c));
  T d_i, d_f, d_content;
  const T dc_prev = memory_backward<false, T>(gc, Act::sigmoid(pre(kScanI)),
                                              Act::sigmoid(pre(kScanF)), pre(kScanContent),
                                              c_prev, d_i, d_f, d_content);
  put(kScanI, d_i);
  put(kScanF, d_f);
  put(kScanContent, d_content);
  return dc_prev;
}
