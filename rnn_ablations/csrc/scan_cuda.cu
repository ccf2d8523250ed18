// Element-wise scan (CUDA) of a gated memory whose gates read x_t only: the recurrence of
// LSTM - S-RNN - HIDDEN.  The same function, layout and entry points as the CPU scan in
// scan.cpp (read its header for the layout); the reference is rnn_ablations/functional.py.
//
// Nothing reads h_{t-1}, so every (direction d, row b, unit j) is an independent linear
// recurrence in c: one thread per (d, b, j) loops over its row's steps (one launch for the whole
// sequence and both directions, no per-step launches); direction 1 runs backwards within the
// row's length.  Consecutive threads read consecutive units of a block, so loads are
// coalesced.  float16/bfloat16 compute in float (at::opmath_type); the saved memories c_t are
// kept in that accumulation type.

#include <torch/extension.h>
#include <ATen/OpMathType.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "common.h"

namespace {

enum ScanOutput : int64_t { kOTanh = 0, kTanh = 1, kIdentity = 2 };

struct Layout {
  int64_t i, f, o, c, r, hw, output;
};

template <typename A> __device__ __forceinline__ A sigm(A x) { return A(1) / (A(1) + exp(-x)); }

constexpr int kThreads = 256;

// Dimensions of one call: T steps, B rows, D directions, H units, G blocks per direction.
struct Dims {
  int64_t T, B, D, H, G;
};

__device__ __forceinline__ int64_t position(int64_t d, int64_t s, int64_t L) {
  return d == 0 ? s : L - 1 - s;
}

template <typename scalar_t, typename acc_t, int64_t OUT, bool HW, bool SAVE>
__global__ void scan_forward_kernel(Layout L, Dims n, const int64_t* __restrict__ len,
                                    const scalar_t* __restrict__ proj,
                                    const scalar_t* __restrict__ h0,
                                    const scalar_t* __restrict__ c0, scalar_t* __restrict__ out,
                                    scalar_t* __restrict__ h_n, scalar_t* __restrict__ c_n,
                                    acc_t* __restrict__ cs) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t H = n.H;
  if (idx >= n.D * n.B * H) return;  // idx = (d * B + b) * H + j, the (D, B, H) state index
  const int64_t j = idx % H, b = (idx / H) % n.B, d = idx / (H * n.B);
  const int64_t steps = len[b];
  const int64_t proj_row = n.D * n.G * H, out_row = n.D * H;
  acc_t c = static_cast<acc_t>(c0[idx]);
  acc_t h = static_cast<acc_t>(h0[idx]);
  for (int64_t s = 0; s < steps; ++s) {
    const int64_t t = position(d, s, steps);
    const scalar_t* p = proj + (t * n.B + b) * proj_row + d * n.G * H + j;
    const int64_t o = (t * n.B + b) * out_row + d * H + j;
    const acc_t i = sigm(static_cast<acc_t>(p[L.i * H]));
    const acc_t f = sigm(static_cast<acc_t>(p[L.f * H]));
    c = i * static_cast<acc_t>(p[L.c * H]) + f * c;
    if (SAVE) cs[o] = c;
    if (OUT == kOTanh) h = sigm(static_cast<acc_t>(p[L.o * H])) * tanh(c);
    else if (OUT == kTanh) h = tanh(c);
    else h = c;
    if (HW) {
      const acc_t r = sigm(static_cast<acc_t>(p[L.r * H]));
      h = r * h + (acc_t(1) - r) * static_cast<acc_t>(p[L.hw * H]);
    }
    out[o] = static_cast<scalar_t>(h);
  }
  for (int64_t t = steps; t < n.T; ++t) out[(t * n.B + b) * out_row + d * H + j] = scalar_t(0);
  h_n[idx] = static_cast<scalar_t>(h);
  c_n[idx] = static_cast<scalar_t>(c);
}

template <typename scalar_t, typename acc_t, int64_t OUT, bool HW>
__global__ void scan_backward_kernel(Layout L, Dims n, const int64_t* __restrict__ len,
                                     const scalar_t* __restrict__ g_out,
                                     const scalar_t* __restrict__ g_hn,
                                     const scalar_t* __restrict__ g_cn,
                                     const scalar_t* __restrict__ proj,
                                     const scalar_t* __restrict__ c0,
                                     const acc_t* __restrict__ cs, scalar_t* __restrict__ dproj,
                                     scalar_t* __restrict__ dc0) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t H = n.H;
  if (idx >= n.D * n.B * H) return;
  const int64_t j = idx % H, b = (idx / H) % n.B, d = idx / (H * n.B);
  const int64_t steps = len[b];
  const int64_t proj_row = n.D * n.G * H, out_row = n.D * H;
  acc_t dc = static_cast<acc_t>(g_cn[idx]);
  for (int64_t s = steps - 1; s >= 0; --s) {
    const int64_t t = position(d, s, steps);
    const int64_t o = (t * n.B + b) * out_row + d * H + j;
    const scalar_t* p = proj + (t * n.B + b) * proj_row + d * n.G * H + j;
    scalar_t* dq = dproj + (t * n.B + b) * proj_row + d * n.G * H + j;
    acc_t dh = static_cast<acc_t>(g_out[o]);
    if (s == steps - 1) dh += static_cast<acc_t>(g_hn[idx]);
    const acc_t cn = cs[o];
    const acc_t cp = s > 0 ? cs[(position(d, s - 1, steps) * n.B + b) * out_row + d * H + j]
                           : static_cast<acc_t>(c0[idx]);
    acc_t tc = acc_t(0), og = acc_t(0), cell = cn;
    if (OUT == kOTanh) {
      tc = tanh(cn);
      og = sigm(static_cast<acc_t>(p[L.o * H]));
      cell = og * tc;
    } else if (OUT == kTanh) {
      tc = tanh(cn);
      cell = tc;
    }
    if (HW) {
      const acc_t r = sigm(static_cast<acc_t>(p[L.r * H]));
      dq[L.r * H] = static_cast<scalar_t>(dh * (cell - static_cast<acc_t>(p[L.hw * H])) * r *
                                          (acc_t(1) - r));
      dq[L.hw * H] = static_cast<scalar_t>(dh * (acc_t(1) - r));
      dh = dh * r;
    }
    if (OUT == kOTanh) {
      dq[L.o * H] = static_cast<scalar_t>(dh * tc * og * (acc_t(1) - og));
      dc += dh * og * (acc_t(1) - tc * tc);
    } else if (OUT == kTanh) {
      dc += dh * (acc_t(1) - tc * tc);
    } else {
      dc += dh;
    }
    const acc_t ig = sigm(static_cast<acc_t>(p[L.i * H]));
    const acc_t fg = sigm(static_cast<acc_t>(p[L.f * H]));
    dq[L.i * H] = static_cast<scalar_t>(dc * static_cast<acc_t>(p[L.c * H]) * ig * (acc_t(1) - ig));
    dq[L.c * H] = static_cast<scalar_t>(dc * ig);
    dq[L.f * H] = static_cast<scalar_t>(dc * cp * fg * (acc_t(1) - fg));
    dc = dc * fg;
  }
  // padded steps: no gradient (every block of this direction; blocks a layout does not use are
  // zeroed by the caller)
  for (int64_t t = steps; t < n.T; ++t) {
    scalar_t* dq = dproj + (t * n.B + b) * proj_row + d * n.G * H + j;
    for (int64_t g = 0; g < n.G; ++g) dq[g * H] = scalar_t(0);
  }
  dc0[idx] = static_cast<scalar_t>(dc);
}

Layout check_layout(const std::vector<int64_t>& v, int64_t G, const char* who,
                    std::vector<bool>* used_out) {
  TORCH_CHECK(v.size() == 7, who, ": layout must be {i, f, o, c, r, hw, output}, got ", v.size(),
              " entries");
  Layout L{v[0], v[1], v[2], v[3], v[4], v[5], v[6]};
  TORCH_CHECK(L.output == kOTanh || L.output == kTanh || L.output == kIdentity, who,
              ": output rule must be 0 (o*tanh(c)), 1 (tanh(c)) or 2 (c), got ", L.output);
  TORCH_CHECK((L.o >= 0) == (L.output == kOTanh), who,
              ": an output gate block is given iff the output rule is o*tanh(c)");
  TORCH_CHECK((L.r >= 0) == (L.hw >= 0), who, ": highway needs both r and hw (or neither)");
  TORCH_CHECK(L.i >= 0 && L.f >= 0 && L.c >= 0, who, ": i, f and c blocks are required");
  std::vector<bool> used(G, false);
  for (int64_t off : {L.i, L.f, L.o, L.c, L.r, L.hw}) {
    if (off < 0) continue;
    TORCH_CHECK(off < G, who, ": block offset ", off, " outside the ", G, " blocks of proj");
    TORCH_CHECK(!used[off], who, ": two blocks share offset ", off);
    used[off] = true;
  }
  if (used_out) *used_out = used;
  return L;
}

// (B) int64 on proj's device: the number of steps of each row.
at::Tensor row_lengths(const at::Tensor& batch_sizes, int64_t B, const at::Device& device) {
  at::Tensor len = at::zeros({B}, batch_sizes.options());
  int64_t* lp = len.data_ptr<int64_t>();
  const int64_t* bs = batch_sizes.data_ptr<int64_t>();
  for (int64_t t = 0; t < batch_sizes.size(0); ++t)
    for (int64_t b = 0; b < bs[t]; ++b) ++lp[b];
  return len.to(device);
}

void check_common(const at::Tensor& proj, const at::Tensor& h0, const at::Tensor& c0,
                  const at::Tensor& batch_sizes, const char* who) {
  TORCH_CHECK(proj.is_cuda(), who, ": proj must be a CUDA tensor");
  TORCH_CHECK(proj.dim() == 3 && proj.is_contiguous(), who, ": proj must be contiguous (T, B, D*G*H)");
  for (const at::Tensor* t : {&h0, &c0}) {
    TORCH_CHECK(t->device() == proj.device() && t->scalar_type() == proj.scalar_type(), who,
                ": h0 and c0 must be on proj's device, of proj's dtype");
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
void dispatch_rule(const Layout& L, F&& f) {
  auto with_hw = [&](auto out) {
    if (L.r >= 0) f(out, std::integral_constant<bool, true>());
    else f(out, std::integral_constant<bool, false>());
  };
  if (L.output == kOTanh) with_hw(std::integral_constant<int64_t, kOTanh>());
  else if (L.output == kTanh) with_hw(std::integral_constant<int64_t, kTanh>());
  else with_hw(std::integral_constant<int64_t, kIdentity>());
}

unsigned int blocks_for(int64_t n) {
  return static_cast<unsigned int>(std::max<int64_t>(1, (n + kThreads - 1) / kThreads));
}

std::vector<at::Tensor> scan_forward(const at::Tensor& proj, const at::Tensor& h0,
                                     const at::Tensor& c0, const at::Tensor& batch_sizes,
                                     const std::vector<int64_t>& layout, bool save) {
  const char* who = "scan_forward (CUDA)";
  check_common(proj, h0, c0, batch_sizes, who);
  const c10::cuda::CUDAGuard guard(proj.device());
  const Dims n = dims_of(proj, c0);
  const Layout L = check_layout(layout, n.G, who, nullptr);
  const at::ScalarType acc_type = at::toOpMathType(proj.scalar_type());
  at::Tensor out = at::empty({n.T, n.B, n.D * n.H}, proj.options());
  at::Tensor h_n = at::empty({n.D, n.B, n.H}, proj.options());
  at::Tensor c_n = at::empty({n.D, n.B, n.H}, proj.options());
  at::Tensor cs = at::empty({save ? n.T : 0, n.B, n.D * n.H}, proj.options().dtype(acc_type));
  const int64_t threads = n.D * n.B * n.H;
  if (threads == 0) return {out.zero_(), h_n, c_n, cs};
  const at::Tensor len = row_lengths(batch_sizes, n.B, proj.device());
  auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, proj.scalar_type(), "scan_forward", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    dispatch_rule(L, [&](auto out_rule, auto hw) {
      constexpr int64_t OUT = decltype(out_rule)::value;
      constexpr bool HW = decltype(hw)::value;
      if (save) {
        scan_forward_kernel<scalar_t, acc_t, OUT, HW, true>
            <<<blocks_for(threads), kThreads, 0, stream>>>(
                L, n, len.data_ptr<int64_t>(), proj.data_ptr<scalar_t>(),
                h0.data_ptr<scalar_t>(), c0.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(),
                h_n.data_ptr<scalar_t>(), c_n.data_ptr<scalar_t>(), cs.data_ptr<acc_t>());
      } else {
        scan_forward_kernel<scalar_t, acc_t, OUT, HW, false>
            <<<blocks_for(threads), kThreads, 0, stream>>>(
                L, n, len.data_ptr<int64_t>(), proj.data_ptr<scalar_t>(),
                h0.data_ptr<scalar_t>(), c0.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(),
                h_n.data_ptr<scalar_t>(), c_n.data_ptr<scalar_t>(), nullptr);
      }
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
  return {out, h_n, c_n, cs};
}

std::vector<at::Tensor> scan_backward(const at::Tensor& g_out, const at::Tensor& g_hn,
                                      const at::Tensor& g_cn, const at::Tensor& proj,
                                      const at::Tensor& c0, const at::Tensor& cs,
                                      const at::Tensor& batch_sizes,
                                      const std::vector<int64_t>& layout) {
  const char* who = "scan_backward (CUDA)";
  check_common(proj, g_hn, c0, batch_sizes, who);
  const c10::cuda::CUDAGuard guard(proj.device());
  const Dims n = dims_of(proj, c0);
  std::vector<bool> used;
  const Layout L = check_layout(layout, n.G, who, &used);
  const at::ScalarType acc_type = at::toOpMathType(proj.scalar_type());
  TORCH_CHECK(g_out.device() == proj.device() && g_out.scalar_type() == proj.scalar_type() &&
                  g_out.is_contiguous() && g_out.dim() == 3 && g_out.size(0) == n.T &&
                  g_out.size(1) == n.B && g_out.size(2) == n.D * n.H,
              who, ": g_out must be contiguous (T, B, D*H) of proj's dtype");
  TORCH_CHECK(cs.device() == proj.device() && cs.scalar_type() == acc_type && cs.is_contiguous() &&
                  cs.dim() == 3 && cs.size(0) == n.T && cs.size(1) == n.B &&
                  cs.size(2) == n.D * n.H,
              who, ": cs must be the memories saved by scan_forward");
  TORCH_CHECK(g_cn.device() == proj.device() && g_cn.scalar_type() == proj.scalar_type() &&
                  g_cn.is_contiguous() && g_cn.sizes() == c0.sizes(),
              who, ": g_cn must be contiguous (D, B, H) of proj's dtype");
  const bool all_used = std::all_of(used.begin(), used.end(), [](bool u) { return u; });
  at::Tensor dproj = all_used ? at::empty_like(proj) : at::zeros_like(proj);
  at::Tensor dc0 = at::empty_like(c0);
  const int64_t threads = n.D * n.B * n.H;
  if (threads == 0) return {dproj.zero_(), dc0};
  const at::Tensor len = row_lengths(batch_sizes, n.B, proj.device());
  auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, proj.scalar_type(), "scan_backward", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    dispatch_rule(L, [&](auto out_rule, auto hw) {
      constexpr int64_t OUT = decltype(out_rule)::value;
      constexpr bool HW = decltype(hw)::value;
      scan_backward_kernel<scalar_t, acc_t, OUT, HW><<<blocks_for(threads), kThreads, 0, stream>>>(
          L, n, len.data_ptr<int64_t>(), g_out.data_ptr<scalar_t>(), g_hn.data_ptr<scalar_t>(),
          g_cn.data_ptr<scalar_t>(), proj.data_ptr<scalar_t>(), c0.data_ptr<scalar_t>(),
          cs.data_ptr<acc_t>(), dproj.data_ptr<scalar_t>(), dc0.data_ptr<scalar_t>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
  return {dproj, dc0};
}

}  // namespace

// Called from the module init in ablated_rnn_cuda.cu.
void register_scan(pybind11::module_& m) {
  m.def("scan_forward", &scan_forward,
        "element-wise scan of a gated memory whose gates read x_t only (forward, CUDA); see "
        "scan.cpp for the layout",
        py::arg("proj"), py::arg("h0"), py::arg("c0"), py::arg("batch_sizes"), py::arg("layout"),
        py::arg("save"));
  m.def("scan_backward", &scan_backward, "backward of scan_forward (CUDA): (d_proj, d_c0)",
        py::arg("g_out"), py::arg("g_hn"), py::arg("g_cn"), py::arg("proj"), py::arg("c0"),
        py::arg("cs"), py::arg("batch_sizes"), py::arg("layout"));
}
