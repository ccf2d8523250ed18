// Element-wise scan (CPU) of a gated memory whose gates read x_t only: the recurrence of
// LSTM - S-RNN - HIDDEN (rnn_ablations/variants.py; the generic reference is
// rnn_ablations/functional.py, the autograd wrapper rnn_ablations/scan.py).
//
//   proj (T, B, D*G*H) all input projections of one layer, D = 1 or 2 directions side by side
//                     (biases included); per direction, blocks of H columns at the offsets of
//                     `layout` (in units of H, -1 = absent):
//     layout = {i, f, o, c, r, hw, output}
//       i, f     input and forget gates (sigmoid)
//       o        output gate (sigmoid), present iff output == kOTanh
//       c        content c~ (used as is)
//       r, hw    highway gate (sigmoid) and projection, both present or both absent
//       output   h_t = o * tanh(c_t) (kOTanh), tanh(c_t) (kTanh) or c_t (kIdentity)
//   c_t = i * c~ + f * c_{t-1};   with highway h_t <- r * h_t + (1 - r) * hw
//   batch_sizes (T)   CPU int64, non-increasing: rows [0, batch_sizes[t]) are active at step t;
//                     an inactive row keeps its state and outputs 0.
//   h0, c0 (D, B, H)  initial states; outputs out (T, B, D*H) (directions side by side, as a
//                     bidirectional layer's output), h_n, c_n (D, B, H).
// Direction 1 runs each row backwards within its length L_b (positions L_b-1 .. 0), so a
// bidirectional layer needs no reversed copies of its input or output.
//
// Nothing reads h_{t-1}, so there is no per-step matrix product: every (row, unit) is an
// independent linear recurrence in c.  The (direction, row) pairs are split over the threads
// (at::parallel_for), each runs its steps in order with a vectorisable loop over the H units; its
// running c stays in its c_n row (L1-resident).  The backward recomputes the activations from proj (cheaper than
// storing them: the pass is memory-bound) and reads the saved memories c_t.

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common.h"

namespace {

enum ScanOutput : int64_t { kOTanh = 0, kTanh = 1, kIdentity = 2 };

// float: a branch-free exp (Cephes polynomial, relative error about 2e-7) that GCC vectorises
// inside the loops over H; double: libm (gradcheck and float64 users).
inline float scan_exp(float x) {
  x = std::min(std::max(x, -87.0f), 88.0f);
  // k = floor(x log2(e) + 0.5), written as a truncation of a positive number (x log2(e) + 0.5
  // lies in [-125, 128)): a conversion SSE2 vectorises, where std::floor needs SSE4.1 and, in
  // this portable build, became a libm call per element that kept the whole loop scalar.
  const int32_t ki = static_cast<int32_t>(x * 1.44269504088896341f + 128.5f) - 128;
  const float k = static_cast<float>(ki);
  const float r = x - k * 0.693359375f + k * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  int32_t bits = (ki + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}
inline double scan_exp(double x) { return std::exp(x); }

template <typename T> inline T sigmoid(T x) { return T(1) / (T(1) + scan_exp(-x)); }

template <typename T> inline T tanh_of(T x) {
  // tanh(x) = sign(x) (1 - e^{-2|x|}) / (1 + e^{-2|x|})
  const T e = scan_exp(T(-2) * std::fabs(x));
  return std::copysign((T(1) - e) / (T(1) + e), x);
}

struct Layout {
  int64_t i, f, o, c, r, hw, output;
};

// Dimensions of one call: T steps, B rows, D directions, H units, G blocks per direction.
struct Dims {
  int64_t T, B, D, H, G;
  int64_t proj_row() const { return D * G * H; }  // row stride of proj / d_proj
  int64_t out_row() const { return D * H; }        // row stride of out / cs / g_out
};


// Steps each row runs: the number of t with batch_sizes[t] > b.
std::vector<int64_t> row_lengths(const at::Tensor& batch_sizes, int64_t B) {
  std::vector<int64_t> len(B, 0);
  const int64_t* bs = batch_sizes.data_ptr<int64_t>();
  for (int64_t t = 0; t < batch_sizes.size(0); ++t)
    for (int64_t b = 0; b < bs[t]; ++b) ++len[b];
  return len;
}

Layout check_layout(const std::vector<int64_t>& v, int64_t G, const char* who) {
  TORCH_CHECK(v.size() == 7, who, ": layout must be {i, f, o, c, r, hw, output}, got ", v.size(),
              " entries");
  Layout L{v[0], v[1], v[2], v[3], v[4], v[5], v[6]};
  TORCH_CHECK(L.output == kOTanh || L.output == kTanh || L.output == kIdentity, who,
              ": output rule must be 0 (o*tanh(c)), 1 (tanh(c)) or 2 (c), got ", L.output);
  TORCH_CHECK((L.o >= 0) == (L.output == kOTanh), who,
              ": an output gate block is given iff the output rule is o*tanh(c)");
  TORCH_CHECK((L.r >= 0) == (L.hw >= 0), who, ": highway needs both r and hw (or neither)");
  std::vector<int64_t> used;
  for (int64_t off : {L.i, L.f, L.o, L.c, L.r, L.hw}) {
    if (off < 0) continue;
    TORCH_CHECK(off < G, who, ": block offset ", off, " outside the ", G, " blocks of proj");
    TORCH_CHECK(std::find(used.begin(), used.end(), off) == used.end(), who,
                ": two blocks share offset ", off);
    used.push_back(off);
  }
  TORCH_CHECK(L.i >= 0 && L.f >= 0 && L.c >= 0, who, ": i, f and c blocks are required");
  return L;
}

// Rows per task: one task when the whole scan is small (a parallel region costs more than it
// saves), otherwise single rows (parallel_for splits them evenly over the threads).
int64_t grain_rows(const Dims& n) {
  const int64_t tasks = n.D * n.B;
  return tasks * n.T * n.H < 32768 ? std::max<int64_t>(tasks, 1) : 1;
}

// Position of processing step s of a row of length L in direction d.
inline int64_t position(int64_t d, int64_t s, int64_t L) { return d == 0 ? s : L - 1 - s; }

// Tasks k in [k0, k1): direction k / B, row k % B.
template <typename T, int64_t OUT, bool HW, bool SAVE>
void forward_rows(const Layout& L, const Dims& n, int64_t k0, int64_t k1, const int64_t* len,
                  const T* proj, const T* h0, const T* c0, T* out, T* h_n, T* c_n, T* cs) {
  const int64_t H = n.H;
  for (int64_t k = k0; k < k1; ++k) {
    const int64_t d = k / n.B, b = k % n.B;
    T* c = c_n + k * H;
    std::memcpy(c, c0 + k * H, sizeof(T) * H);
    const int64_t steps = len[b];
    int64_t last = -1;
    for (int64_t s = 0; s < steps; ++s) {
      const int64_t t = position(d, s, steps);
      const T* p = proj + (t * n.B + b) * n.proj_row() + d * n.G * H;
      const T* __restrict__ pi = p + L.i * H;
      const T* __restrict__ pf = p + L.f * H;
      const T* __restrict__ po = p + (OUT == kOTanh ? L.o : 0) * H;
      const T* __restrict__ pc = p + L.c * H;
      const T* __restrict__ pr = p + (HW ? L.r : 0) * H;
      const T* __restrict__ phw = p + (HW ? L.hw : 0) * H;
      const int64_t o = (t * n.B + b) * n.out_row() + d * H;
      T* __restrict__ h = out + o;
      T* __restrict__ saved = SAVE ? cs + o : nullptr;
      T* __restrict__ cc = c;
#pragma omp simd
      for (int64_t j = 0; j < H; ++j) {
        const T cn = sigmoid(pi[j]) * pc[j] + sigmoid(pf[j]) * cc[j];
        cc[j] = cn;
        if (SAVE) saved[j] = cn;
        T hv;
        if (OUT == kOTanh) hv = sigmoid(po[j]) * tanh_of(cn);
        else if (OUT == kTanh) hv = tanh_of(cn);
        else hv = cn;
        if (HW) {
          const T r = sigmoid(pr[j]);
          hv = r * hv + (T(1) - r) * phw[j];
        }
        h[j] = hv;
      }
      last = o;
    }
    std::memcpy(h_n + k * H, last >= 0 ? out + last : h0 + k * H, sizeof(T) * H);
  }
}

template <typename T, int64_t OUT, bool HW>
void backward_rows(const Layout& L, const Dims& n, int64_t k0, int64_t k1, const int64_t* len,
                   const T* g_out, const T* g_hn, const T* proj, const T* c0, const T* cs,
                   T* dproj, T* dc0) {
  const int64_t H = n.H;
  // dL/dh_n enters at each row's last step only: elsewhere the loop reads this row of zeros
  // (a conditional load inside the loop kept GCC from vectorising it)
  const std::vector<T> zero_row(static_cast<size_t>(H), T(0));
  for (int64_t k = k0; k < k1; ++k) {
    const int64_t d = k / n.B, b = k % n.B;
    T* __restrict__ dc = dc0 + k * H;  // dL/dc, carried backwards; ends as dL/dc_0
    const int64_t steps = len[b];
    for (int64_t s = steps - 1; s >= 0; --s) {
      const int64_t t = position(d, s, steps);
      const int64_t pr_off = (t * n.B + b) * n.proj_row() + d * n.G * H;
      const T* p = proj + pr_off;
      const T* __restrict__ pi = p + L.i * H;
      const T* __restrict__ pf = p + L.f * H;
      const T* __restrict__ po = p + (OUT == kOTanh ? L.o : 0) * H;
      const T* __restrict__ pc = p + L.c * H;
      const T* __restrict__ pr = p + (HW ? L.r : 0) * H;
      const T* __restrict__ phw = p + (HW ? L.hw : 0) * H;
      T* dq = dproj + pr_off;
      T* __restrict__ di = dq + L.i * H;
      T* __restrict__ df = dq + L.f * H;
      T* __restrict__ dout_gate = dq + (OUT == kOTanh ? L.o : 0) * H;
      T* __restrict__ dcontent = dq + L.c * H;
      T* __restrict__ dr = dq + (HW ? L.r : 0) * H;
      T* __restrict__ dhw = dq + (HW ? L.hw : 0) * H;
      const int64_t o = (t * n.B + b) * n.out_row() + d * H;
      const T* __restrict__ go = g_out + o;
      const T* __restrict__ gh = s == steps - 1 ? g_hn + k * H : zero_row.data();
      const T* __restrict__ ct = cs + o;
      const T* __restrict__ cp =
          s > 0 ? cs + (position(d, s - 1, steps) * n.B + b) * n.out_row() + d * H : c0 + k * H;
#pragma omp simd
      for (int64_t j = 0; j < H; ++j) {
        T dh = go[j] + gh[j];
        const T cn = ct[j];
        T tc = T(0), og = T(0), cell = cn;
        if (OUT == kOTanh) {
          tc = tanh_of(cn);
          og = sigmoid(po[j]);
          cell = og * tc;
        } else if (OUT == kTanh) {
          tc = tanh_of(cn);
          cell = tc;
        }
        if (HW) {
          const T r = sigmoid(pr[j]);
          dr[j] = dh * (cell - phw[j]) * r * (T(1) - r);
          dhw[j] = dh * (T(1) - r);
          dh = dh * r;
        }
        T dcv = dc[j];
        if (OUT == kOTanh) {
          dout_gate[j] = dh * tc * og * (T(1) - og);
          dcv += dh * og * (T(1) - tc * tc);
        } else if (OUT == kTanh) {
          dcv += dh * (T(1) - tc * tc);
        } else {
          dcv += dh;
        }
        const T ig = sigmoid(pi[j]);
        const T fg = sigmoid(pf[j]);
        di[j] = dcv * pc[j] * ig * (T(1) - ig);
        dcontent[j] = dcv * ig;
        df[j] = dcv * cp[j] * fg * (T(1) - fg);
        dc[j] = dcv * fg;
      }
    }
  }
}

// Zero the rows' inactive steps of a (T, B, W) tensor.
template <typename T>
void zero_padding(T* data, const std::vector<int64_t>& len, int64_t T_, int64_t B, int64_t W) {
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = len[b]; t < T_; ++t) std::memset(data + (t * B + b) * W, 0, sizeof(T) * W);
}

void check_common(const at::Tensor& proj, const at::Tensor& h0, const at::Tensor& c0,
                  const at::Tensor& batch_sizes, const char* who) {
  TORCH_CHECK(proj.device().is_cpu(), who, ": proj must be a CPU tensor (the CUDA scan is in _C_cuda)");
  TORCH_CHECK(proj.scalar_type() == at::kFloat || proj.scalar_type() == at::kDouble, who,
              ": float32 or float64 only, got ", proj.scalar_type());
  TORCH_CHECK(proj.dim() == 3 && proj.is_contiguous(), who, ": proj must be contiguous (T, B, D*G*H)");
  for (const at::Tensor* t : {&h0, &c0}) {
    TORCH_CHECK(t->device().is_cpu() && t->scalar_type() == proj.scalar_type(), who,
                ": h0 and c0 must be CPU tensors of proj's dtype");
    TORCH_CHECK(t->dim() == 3 && t->is_contiguous() && (t->size(0) == 1 || t->size(0) == 2) &&
                    t->size(1) == proj.size(1),
                who, ": h0 and c0 must be contiguous (D, B, H) with D = 1 or 2 directions");
  }
  TORCH_CHECK(h0.sizes() == c0.sizes() && c0.size(2) > 0 &&
                  proj.size(2) % (c0.size(0) * c0.size(2)) == 0,
              who, ": proj's width must be a multiple of D*H");
  rnn_ablations::check_batch_sizes(batch_sizes, proj.size(0), proj.size(1), who);
}

Dims dims_of(const at::Tensor& proj, const at::Tensor& c0) {
  const int64_t D = c0.size(0), H = c0.size(2);
  return Dims{proj.size(0), proj.size(1), D, H, proj.size(2) / (D * H)};
}

template <typename F>
void dispatch_rule(const Layout& L, bool highway, F&& f) {
  // f(std::integral_constant<int64_t, OUT>, std::integral_constant<bool, HW>)
  auto with_hw = [&](auto out) {
    if (highway) f(out, std::integral_constant<bool, true>());
    else f(out, std::integral_constant<bool, false>());
  };
  if (L.output == kOTanh) with_hw(std::integral_constant<int64_t, kOTanh>());
  else if (L.output == kTanh) with_hw(std::integral_constant<int64_t, kTanh>());
  else with_hw(std::integral_constant<int64_t, kIdentity>());
}

// -> (out (T,B,D*H), h_n (D,B,H), c_n (D,B,H), cs (T,B,D*H): the memories, empty unless save)
std::vector<at::Tensor> scan_forward(const at::Tensor& proj, const at::Tensor& h0,
                                     const at::Tensor& c0, const at::Tensor& batch_sizes,
                                     const std::vector<int64_t>& layout, bool save) {
  const char* who = "scan_forward";
  check_common(proj, h0, c0, batch_sizes, who);
  const Dims n = dims_of(proj, c0);
  const Layout L = check_layout(layout, n.G, who);
  const bool highway = L.r >= 0;
  at::Tensor out = at::empty({n.T, n.B, n.D * n.H}, proj.options());
  at::Tensor h_n = at::empty({n.D, n.B, n.H}, proj.options());
  at::Tensor c_n = at::empty({n.D, n.B, n.H}, proj.options());
  at::Tensor cs = save ? at::empty({n.T, n.B, n.D * n.H}, proj.options())
                       : at::empty({0}, proj.options());
  const std::vector<int64_t> len = row_lengths(batch_sizes, n.B);
  AT_DISPATCH_FLOATING_TYPES(proj.scalar_type(), "scan_forward", [&] {
    const scalar_t* pp = proj.data_ptr<scalar_t>();
    const scalar_t* h0p = h0.data_ptr<scalar_t>();
    const scalar_t* c0p = c0.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    scalar_t* hnp = h_n.data_ptr<scalar_t>();
    scalar_t* cnp = c_n.data_ptr<scalar_t>();
    scalar_t* csp = save ? cs.data_ptr<scalar_t>() : nullptr;
    dispatch_rule(L, highway, [&](auto out_rule, auto hw) {
      constexpr int64_t OUT = decltype(out_rule)::value;
      constexpr bool HW = decltype(hw)::value;
      at::parallel_for(0, n.D * n.B, grain_rows(n), [&](int64_t k0, int64_t k1) {
        if (save) {
          forward_rows<scalar_t, OUT, HW, true>(L, n, k0, k1, len.data(), pp, h0p, c0p, op, hnp,
                                                cnp, csp);
        } else {
          forward_rows<scalar_t, OUT, HW, false>(L, n, k0, k1, len.data(), pp, h0p, c0p, op, hnp,
                                                 cnp, csp);
        }
      });
    });
    zero_padding(op, len, n.T, n.B, n.out_row());
  });
  return {out, h_n, c_n, cs};
}

// -> (d_proj (T,B,D*G*H), d_c0 (D,B,H)); h0 receives no gradient (nothing reads it)
std::vector<at::Tensor> scan_backward(const at::Tensor& g_out, const at::Tensor& g_hn,
                                      const at::Tensor& g_cn, const at::Tensor& proj,
                                      const at::Tensor& c0, const at::Tensor& cs,
                                      const at::Tensor& batch_sizes,
                                      const std::vector<int64_t>& layout) {
  const char* who = "scan_backward";
  check_common(proj, g_hn, c0, batch_sizes, who);
  const Dims n = dims_of(proj, c0);
  const Layout L = check_layout(layout, n.G, who);
  for (const at::Tensor* t : {&g_out, &cs}) {
    TORCH_CHECK(t->device().is_cpu() && t->scalar_type() == proj.scalar_type() &&
                    t->is_contiguous() && t->dim() == 3 && t->size(0) == n.T &&
                    t->size(1) == n.B && t->size(2) == n.D * n.H,
                who, ": g_out and cs must be contiguous (T, B, D*H) of proj's dtype");
  }
  TORCH_CHECK(g_cn.device().is_cpu() && g_cn.scalar_type() == proj.scalar_type() &&
                  g_cn.is_contiguous() && g_cn.sizes() == c0.sizes(),
              who, ": g_cn must be contiguous (D, B, H) of proj's dtype");
  const bool highway = L.r >= 0;
  at::Tensor dproj = at::empty_like(proj);
  at::Tensor dc0 = g_cn.clone();
  const std::vector<int64_t> len = row_lengths(batch_sizes, n.B);
  AT_DISPATCH_FLOATING_TYPES(proj.scalar_type(), "scan_backward", [&] {
    const scalar_t* gop = g_out.data_ptr<scalar_t>();
    const scalar_t* ghp = g_hn.data_ptr<scalar_t>();
    const scalar_t* pp = proj.data_ptr<scalar_t>();
    const scalar_t* c0p = c0.data_ptr<scalar_t>();
    const scalar_t* csp = cs.data_ptr<scalar_t>();
    scalar_t* dp = dproj.data_ptr<scalar_t>();
    scalar_t* dcp = dc0.data_ptr<scalar_t>();
    dispatch_rule(L, highway, [&](auto out_rule, auto hw) {
      constexpr int64_t OUT = decltype(out_rule)::value;
      constexpr bool HW = decltype(hw)::value;
      at::parallel_for(0, n.D * n.B, grain_rows(n), [&](int64_t k0, int64_t k1) {
        backward_rows<scalar_t, OUT, HW>(L, n, k0, k1, len.data(), gop, ghp, pp, c0p, csp, dp,
                                         dcp);
      });
    });
    zero_padding(dp, len, n.T, n.B, n.proj_row());
    // Blocks of proj the layout does not use get no gradient (they are not read).
    std::vector<bool> used(n.G, false);
    for (int64_t off : {L.i, L.f, L.o, L.c, L.r, L.hw})
      if (off >= 0) used[off] = true;
    for (int64_t d = 0; d < n.D; ++d)
      for (int64_t g = 0; g < n.G; ++g)
        if (!used[g]) dproj.narrow(2, (d * n.G + g) * n.H, n.H).zero_();
  });
  return {dproj, dc0};
}

}  // namespace

// Called from the module init in ablated_rnn.cpp.
void register_scan(pybind11::module_& m) {
  m.def("scan_forward", &scan_forward,
        "element-wise scan of a gated memory whose gates read x_t only (forward), D = h0.size(0) "
        "directions (direction 1 runs each row backwards within its length); layout = "
        "{i, f, o, c, r, hw, output} block offsets in units of H (-1 absent), output 0 o*tanh(c), "
        "1 tanh(c), 2 c",
        py::arg("proj"), py::arg("h0"), py::arg("c0"), py::arg("batch_sizes"), py::arg("layout"),
        py::arg("save"));
  m.def("scan_backward", &scan_backward, "backward of scan_forward: (d_proj, d_c0)",
        py::arg("g_out"), py::arg("g_hn"), py::arg("g_cn"), py::arg("proj"), py::arg("c0"),
        py::arg("cs"), py::arg("batch_sizes"), py::arg("layout"));
}
