// Fused CPU kernel for one recurrent layer in one direction of every variant in
// rnn_ablations/variants.py (the equations live there; this file only follows them).
//
// Layout (see rnn_ablations/functional.py, the reference implementation):
//   proj (T, B, (R+X)*H)  input projections: first the R recurrent blocks (bias included),
//                         then the X input-only blocks (content c~ = W_cx x, highway projection)
//   w_hh (R*H, H)    recurrent weights
//   batch_sizes (T)  int64, non-increasing; rows [0, batch_sizes[t]) are active at step t
//   rec_mask (B, H)  variational dropout mask on h_{t-1}, or empty
// Per step: one GEMM (active rows x R*H) against h_{t-1}, then one fused element-wise pass.
// Backward: per step one GEMM for dh_{t-1}; the weight gradient is one GEMM after the loop.

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

enum Kind : int64_t { kLstm = 0, kSrnn = 1, kMinusSrnn = 2, kRan = 3, kIdentityRan = 4 };

// ---------------------------------------------------------------------------------------------
// Transcendentals.  float: a branch-free Cephes-style exp that GCC vectorises (relative error
// about 2e-7); double: libm (used by gradcheck and float64 users).
inline float fast_exp(float x) {
  x = std::min(std::max(x, -87.0f), 88.0f);
  float fx = std::floor(x * 1.44269504088896341f + 0.5f);
  float r = x - fx * 0.693359375f + fx * 2.12194440e-4f;
  float r2 = r * r;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r2 + r + 1.0f;
  int32_t e = static_cast<int32_t>(fx) + 127;
  e <<= 23;
  float scale;
  std::memcpy(&scale, &e, sizeof(scale));
  return p * scale;
}

template <typename T> inline T sigm(T x);
template <> inline float sigm<float>(float x) { return 1.0f / (1.0f + fast_exp(-x)); }
template <> inline double sigm<double>(double x) { return 1.0 / (1.0 + std::exp(-x)); }

template <typename T> inline T tanh_(T x);
template <> inline float tanh_<float>(float x) {
  // tanh(x) = sign(x) (1 - e^{-2|x|}) / (1 + e^{-2|x|})
  float a = std::fabs(x);
  float e = fast_exp(-2.0f * a);
  float t = (1.0f - e) / (1.0f + e);
  return std::copysign(t, x);
}
template <> inline double tanh_<double>(double x) { return std::tanh(x); }

// Rows per task of the element-wise pass: one task when the step is small (a parallel region
// costs more than it saves), otherwise the rows split evenly over the threads.
inline int64_t grain_rows(int64_t rows, int64_t hidden) {
  const int64_t threads = std::max<int64_t>(1, at::get_num_threads());
  if (threads == 1 || rows * hidden < 16384) return std::max<int64_t>(rows, 1);
  return std::max<int64_t>(1, (rows + threads - 1) / threads);
}

struct Dims {
  int64_t T, B, H, R, X;
  int64_t P;  // row stride of proj / d_proj: (R + X) * H
};

// ---------------------------------------------------------------------------------------------
// Simple loops over contiguous memory, which GCC vectorises reliably (checked with
// -fopt-info-vec); the variant-specific combinations below are then plain arithmetic.
template <typename T>
void sigmoid_inplace(T* __restrict__ p, int64_t n) {
#pragma GCC ivdep
  for (int64_t j = 0; j < n; ++j) p[j] = sigm<T>(p[j]);
}
template <typename T>
void tanh_inplace(T* __restrict__ p, int64_t n) {
#pragma GCC ivdep
  for (int64_t j = 0; j < n; ++j) p[j] = tanh_<T>(p[j]);
}
template <typename T>
void tanh_to(const T* __restrict__ src, T* __restrict__ dst, int64_t n) {
#pragma GCC ivdep
  for (int64_t j = 0; j < n; ++j) dst[j] = tanh_<T>(src[j]);
}

// Element-wise forward of one step for rows [r0, r1).
template <typename T>
void pointwise_forward(int64_t kind, bool highway, const Dims& d, T* gates, const T* xo,
                       const T* c_prev, T* c_out, T* h_out, T* hin_out, int64_t r0, int64_t r1) {
  const int64_t H = d.H, RH = d.R * d.H, P = d.P;
  for (int64_t b = r0; b < r1; ++b) {
    T* __restrict__ g = gates + b * RH;
    const T* __restrict__ xob = xo ? xo + b * P : nullptr;
    const T* __restrict__ cp = c_prev + b * H;
    T* __restrict__ cb = c_out + b * H;
    T* __restrict__ hb = h_out + b * H;
    T* __restrict__ hinb = hin_out ? hin_out + b * H : nullptr;
    if (kind == kSrnn) {
      tanh_inplace<T>(g, H);
      if (highway) sigmoid_inplace<T>(g + H, H);
      std::memcpy(hb, g, sizeof(T) * H);
    } else {
      // activations: all recurrent blocks are sigmoid gates except the LSTM's g (block 2)
      if (kind == kLstm) {
        sigmoid_inplace<T>(g, 2 * H);
        tanh_inplace<T>(g + 2 * H, H);
        sigmoid_inplace<T>(g + 3 * H, (d.R - 3) * H);
      } else {
        sigmoid_inplace<T>(g, RH);
      }
      const T* __restrict__ gi = g;
      const T* __restrict__ gf = g + H;
      const T* __restrict__ content = kind == kLstm ? g + 2 * H : xob;
#pragma GCC ivdep
      for (int64_t j = 0; j < H; ++j) cb[j] = gi[j] * content[j] + gf[j] * cp[j];
      if (kind == kIdentityRan) {
        std::memcpy(hb, cb, sizeof(T) * H);
      } else {
        tanh_to<T>(cb, hb, H);
        if (kind == kLstm || kind == kMinusSrnn) {
          const T* __restrict__ go = g + (kind == kLstm ? 3 : 2) * H;
#pragma GCC ivdep
          for (int64_t j = 0; j < H; ++j) hb[j] *= go[j];
        }
      }
    }
    if (highway) {
      const T* __restrict__ gr = g + (d.R - 1) * H;       // already a sigmoid
      const T* __restrict__ hw = xob + (d.X - 1) * H;
      if (hinb) std::memcpy(hinb, hb, sizeof(T) * H);
#pragma GCC ivdep
      for (int64_t j = 0; j < H; ++j) hb[j] = gr[j] * hb[j] + (T(1) - gr[j]) * hw[j];
      if (kind == kSrnn) std::memcpy(cb, hb, sizeof(T) * H);
    }
  }
}

// Element-wise backward of one step for rows [r0, r1).  dh holds dL/dh_t (total), dc holds the
// carried dL/dc_t; on return da holds dL/d(pre-activations), dxo dL/d(input-only blocks) and dc
// dL/dc_{t-1}.
template <typename T>
void pointwise_backward(int64_t kind, bool highway, const Dims& d, const T* gates, const T* xo,
                        const T* c_cur, const T* c_prev, const T* hin, T* dh, T* dc, T* da,
                        T* dxo, int64_t r0, int64_t r1) {
  const int64_t H = d.H, RH = d.R * d.H, P = d.P;
  const bool need_tc = !(kind == kSrnn || kind == kIdentityRan);
  std::vector<T> scratch(need_tc ? H : 1);
  T* __restrict__ tcs = scratch.data();
  for (int64_t b = r0; b < r1; ++b) {
    const T* __restrict__ g = gates + b * RH;
    T* __restrict__ dab = da + b * P;
    T* __restrict__ dxob = dxo ? dxo + b * P : nullptr;
    const T* __restrict__ xob = xo ? xo + b * P : nullptr;
    T* __restrict__ dhb = dh + b * H;
    T* __restrict__ dcb = dc + b * H;
    const T* __restrict__ cb = c_cur ? c_cur + b * H : nullptr;
    const T* __restrict__ cp = c_prev ? c_prev + b * H : nullptr;
    if (highway) {
      const T* __restrict__ r = g + (d.R - 1) * H;
      const T* __restrict__ hw = xob + (d.X - 1) * H;
      const T* __restrict__ hi = hin + b * H;
      T* __restrict__ dr = dab + (d.R - 1) * H;
      T* __restrict__ dhw = dxob + (d.X - 1) * H;
#pragma GCC ivdep
      for (int64_t j = 0; j < H; ++j) {
        T gh = dhb[j];
        dr[j] = gh * (hi[j] - hw[j]) * r[j] * (T(1) - r[j]);
        dhw[j] = gh * (T(1) - r[j]);
        dhb[j] = gh * r[j];
      }
    }
    if (need_tc) tanh_to<T>(cb, tcs, H);
    switch (kind) {
      case kLstm: {
        const T* __restrict__ i = g; const T* __restrict__ f = g + H;
        const T* __restrict__ gg = g + 2 * H; const T* __restrict__ o = g + 3 * H;
#pragma GCC ivdep
        for (int64_t j = 0; j < H; ++j) {
          T tc = tcs[j];
          T gh = dhb[j];
          T gc = dcb[j] + gh * o[j] * (T(1) - tc * tc);
          dab[j] = gc * gg[j] * i[j] * (T(1) - i[j]);
          dab[H + j] = gc * cp[j] * f[j] * (T(1) - f[j]);
          dab[2 * H + j] = gc * i[j] * (T(1) - gg[j] * gg[j]);
          dab[3 * H + j] = gh * tc * o[j] * (T(1) - o[j]);
          dcb[j] = gc * f[j];
        }
        break;
      }
      case kSrnn: {
#pragma GCC ivdep
        for (int64_t j = 0; j < H; ++j) {
          T h = g[j];
          dab[j] = dhb[j] * (T(1) - h * h);
        }
        break;
      }
      case kMinusSrnn: {
        const T* __restrict__ i = g; const T* __restrict__ f = g + H; const T* __restrict__ o = g + 2 * H;
        const T* __restrict__ xc = xob;
#pragma GCC ivdep
        for (int64_t j = 0; j < H; ++j) {
          T tc = tcs[j];
          T gh = dhb[j];
          T gc = dcb[j] + gh * o[j] * (T(1) - tc * tc);
          dab[j] = gc * xc[j] * i[j] * (T(1) - i[j]);
          dab[H + j] = gc * cp[j] * f[j] * (T(1) - f[j]);
          dab[2 * H + j] = gh * tc * o[j] * (T(1) - o[j]);
          dxob[j] = gc * i[j];
          dcb[j] = gc * f[j];
        }
        break;
      }
      case kRan:
      case kIdentityRan: {
        const T* __restrict__ i = g; const T* __restrict__ f = g + H;
        const T* __restrict__ xc = xob;
        if (kind == kRan) {
#pragma GCC ivdep
          for (int64_t j = 0; j < H; ++j) dcb[j] += dhb[j] * (T(1) - tcs[j] * tcs[j]);
        } else {
#pragma GCC ivdep
          for (int64_t j = 0; j < H; ++j) dcb[j] += dhb[j];
        }
#pragma GCC ivdep
        for (int64_t j = 0; j < H; ++j) {
          T gc = dcb[j];
          dab[j] = gc * xc[j] * i[j] * (T(1) - i[j]);
          dab[H + j] = gc * cp[j] * f[j] * (T(1) - f[j]);
          dxob[j] = gc * i[j];
          dcb[j] = gc * f[j];
        }
        break;
      }
      default:
        break;
    }
  }
}

void check_inputs(const at::Tensor& proj, const at::Tensor& w_hh, const at::Tensor& h0,
                  const at::Tensor& c0, const at::Tensor& batch_sizes) {
  TORCH_CHECK(proj.device().is_cpu(), "rnn_ablations kernel: CPU tensors only");
  TORCH_CHECK(proj.dim() == 3 && proj.is_contiguous(),
              "rnn_ablations kernel: proj must be contiguous (T, B, (R+X)*H)");
  TORCH_CHECK(w_hh.dim() == 2 && w_hh.is_contiguous() && w_hh.size(0) % w_hh.size(1) == 0,
              "rnn_ablations kernel: w_hh must be contiguous (R*H, H)");
  TORCH_CHECK(proj.size(2) >= w_hh.size(0) && proj.size(2) % w_hh.size(1) == 0,
              "rnn_ablations kernel: proj width must be (R+X)*H");
  TORCH_CHECK(h0.is_contiguous() && c0.is_contiguous() && h0.dim() == 2 && c0.dim() == 2 &&
                  h0.size(0) == proj.size(1) && h0.size(1) == w_hh.size(1) &&
                  c0.sizes() == h0.sizes(),
              "rnn_ablations kernel: h0/c0 must be contiguous (B, H)");
  TORCH_CHECK(batch_sizes.scalar_type() == at::kLong && batch_sizes.dim() == 1 &&
                  batch_sizes.size(0) == proj.size(0),
              "rnn_ablations kernel: batch_sizes must be int64 of length T");
  TORCH_CHECK(proj.scalar_type() == w_hh.scalar_type() && proj.scalar_type() == h0.scalar_type() &&
                  proj.scalar_type() == c0.scalar_type(),
              "rnn_ablations kernel: all tensors must have the same dtype");
  const int64_t* bs = batch_sizes.data_ptr<int64_t>();
  for (int64_t t = 0; t < batch_sizes.size(0); ++t) {
    TORCH_CHECK(bs[t] >= 0 && bs[t] <= proj.size(1) && (t == 0 || bs[t] <= bs[t - 1]),
                "rnn_ablations kernel: batch_sizes must be non-increasing and <= B");
  }
}

}  // namespace

// Returns {out (T,B,H), h_n (B,H), c_n (B,H), gates (T,B,R*H) activations, cs (T,B,H), hin}.
std::vector<at::Tensor> rnn_forward(int64_t kind, bool highway, at::Tensor proj, at::Tensor w_hh,
                                    at::Tensor h0, at::Tensor c0, at::Tensor batch_sizes,
                                    at::Tensor rec_mask, bool keep_hin) {
  check_inputs(proj, w_hh, h0, c0, batch_sizes);
  const int64_t H = w_hh.size(1);
  const int64_t R = w_hh.size(0) / H;
  const int64_t T = proj.size(0), B = proj.size(1), P = proj.size(2);
  const int64_t X = P / H - R;
  const bool has_mask = rec_mask.defined() && rec_mask.numel() > 0;
  if (has_mask) TORCH_CHECK(rec_mask.sizes() == h0.sizes() && rec_mask.is_contiguous(), "rec_mask shape");
  Dims d{T, B, H, R, X, P};
  const int64_t* bs = batch_sizes.data_ptr<int64_t>();

  // pre-activations of the recurrent blocks, turned into activations in place
  at::Tensor gates = proj.narrow(2, 0, R * H).contiguous();
  if (X == 0) gates = gates.clone();  // narrow of the full width is proj itself
  at::Tensor out = at::zeros({T, B, H}, proj.options());
  at::Tensor cs = at::empty({T, B, H}, proj.options());
  at::Tensor hin = (highway && keep_hin) ? at::empty({T, B, H}, proj.options()) : at::Tensor();
  at::Tensor hp_buf = has_mask ? at::empty({B, H}, proj.options()) : at::Tensor();
  at::Tensor w_t = w_hh.t();

  AT_DISPATCH_FLOATING_TYPES(proj.scalar_type(), "rnn_ablations_forward", [&] {
    for (int64_t t = 0; t < T; ++t) {
      const int64_t n = bs[t];
      if (n == 0) break;
      at::Tensor h_prev = (t == 0 ? h0 : out[t - 1]).narrow(0, 0, n);
      if (has_mask) {
        at::Tensor hp = hp_buf.narrow(0, 0, n);
        at::mul_out(hp, h_prev, rec_mask.narrow(0, 0, n));
        h_prev = hp;
      }
      at::Tensor g = gates[t].narrow(0, 0, n);
      g.addmm_(h_prev, w_t);
      scalar_t* gp = gates[t].data_ptr<scalar_t>();
      const scalar_t* xop = X > 0 ? proj[t].data_ptr<scalar_t>() + R * H : nullptr;
      const scalar_t* cpp = (t == 0 ? c0 : cs[t - 1]).data_ptr<scalar_t>();
      scalar_t* cp = cs[t].data_ptr<scalar_t>();
      scalar_t* hp = out[t].data_ptr<scalar_t>();
      scalar_t* hinp = hin.defined() ? hin[t].data_ptr<scalar_t>() : nullptr;
      at::parallel_for(0, n, grain_rows(n, H), [&](int64_t r0, int64_t r1) {
        pointwise_forward<scalar_t>(kind, highway, d, gp, xop, cpp, cp, hp, hinp, r0, r1);
      });
    }
  });

  // Final states: row b's state after its last active step.
  at::Tensor h_n = h0.clone();
  at::Tensor c_n = c0.clone();
  for (int64_t t = 0; t < T; ++t) {
    const int64_t n = bs[t];
    const int64_t n_next = t + 1 < T ? bs[t + 1] : 0;
    if (n > n_next) {
      h_n.narrow(0, n_next, n - n_next).copy_(out[t].narrow(0, n_next, n - n_next));
      c_n.narrow(0, n_next, n - n_next).copy_(cs[t].narrow(0, n_next, n - n_next));
    }
  }
  if (kind == kSrnn) c_n = h_n.clone();
  return {out, h_n, c_n, gates, cs, hin.defined() ? hin : at::empty({0}, proj.options())};
}

// Returns {d_proj (T,B,(R+X)*H), d_w_hh, d_h0, d_c0}.
std::vector<at::Tensor> rnn_backward(int64_t kind, bool highway, at::Tensor grad_out,
                                     at::Tensor grad_hn, at::Tensor grad_cn, at::Tensor gates,
                                     at::Tensor cs, at::Tensor hin, at::Tensor out, at::Tensor proj,
                                     at::Tensor w_hh, at::Tensor h0, at::Tensor c0,
                                     at::Tensor batch_sizes, at::Tensor rec_mask) {
  const int64_t H = w_hh.size(1);
  const int64_t R = w_hh.size(0) / H;
  const int64_t T = proj.size(0), B = proj.size(1), P = proj.size(2);
  const int64_t X = P / H - R;
  const bool has_mask = rec_mask.defined() && rec_mask.numel() > 0;
  Dims d{T, B, H, R, X, P};
  const int64_t* bs = batch_sizes.data_ptr<int64_t>();
  grad_out = grad_out.contiguous();

  // Every element of an active row is written by the element-wise pass; only the rows that are
  // inactive at a step (padding) are zeroed.
  at::Tensor dproj = at::empty_like(proj);
  at::Tensor dh = grad_hn.clone().contiguous();
  at::Tensor dc = grad_cn.clone().contiguous();
  if (kind == kSrnn) dh.add_(dc);  // c_n is a copy of h_n for the S-RNN

  AT_DISPATCH_FLOATING_TYPES(proj.scalar_type(), "rnn_ablations_backward", [&] {
    for (int64_t t = T - 1; t >= 0; --t) {
      const int64_t n = bs[t];
      if (n < B) dproj[t].narrow(0, n, B - n).zero_();
      if (n == 0) continue;
      dh.narrow(0, 0, n).add_(grad_out[t].narrow(0, 0, n));
      const scalar_t* gp = gates[t].data_ptr<scalar_t>();
      const scalar_t* xop = X > 0 ? proj[t].data_ptr<scalar_t>() + R * H : nullptr;
      const scalar_t* ccur = kind == kSrnn ? nullptr : cs[t].data_ptr<scalar_t>();
      const scalar_t* cprev = kind == kSrnn ? nullptr : (t == 0 ? c0 : cs[t - 1]).data_ptr<scalar_t>();
      const scalar_t* hinp = highway ? hin[t].data_ptr<scalar_t>() : nullptr;
      scalar_t* dhp = dh.data_ptr<scalar_t>();
      scalar_t* dcp = dc.data_ptr<scalar_t>();
      scalar_t* dap = dproj[t].data_ptr<scalar_t>();
      scalar_t* dxop = X > 0 ? dap + R * H : nullptr;
      at::parallel_for(0, n, grain_rows(n, H), [&](int64_t r0, int64_t r1) {
        pointwise_backward<scalar_t>(kind, highway, d, gp, xop, ccur, cprev, hinp, dhp, dcp, dap,
                                     dxop, r0, r1);
      });
      at::Tensor dh_n = dh.narrow(0, 0, n);
      at::mm_out(dh_n, dproj[t].narrow(0, 0, n).narrow(1, 0, R * H), w_hh);
      if (has_mask) dh_n.mul_(rec_mask.narrow(0, 0, n));
    }
  });

  // Weight gradient: one GEMM over all steps, against h_{t-1} (masked) of every row.
  at::Tensor h_prev = T > 1 ? at::cat({h0.unsqueeze(0), out.narrow(0, 0, T - 1)}, 0) : h0.unsqueeze(0);
  if (has_mask) h_prev = h_prev * rec_mask.unsqueeze(0);
  at::Tensor dw = at::mm(dproj.view({T * B, P}).narrow(1, 0, R * H).t(), h_prev.reshape({T * B, H}));
  if (kind == kSrnn) dc.zero_();
  return {dproj, dw, dh, dc};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "rnn_ablations fused CPU recurrence (forward and hand-written backward)";
  m.def("forward", &rnn_forward, "one layer, one direction: forward");
  m.def("backward", &rnn_backward, "one layer, one direction: backward");
}
