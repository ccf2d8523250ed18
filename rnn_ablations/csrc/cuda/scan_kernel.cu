// Element-wise scan (CUDA) of a gated memory whose gates read x_t only: the recurrence of
// LSTM - S-RNN - HIDDEN.  The same function, arguments and entry points as the CPU scan in
// cpu/scan.cpp (read its header for the arguments): the variant arrives as (spec, highway),
// decoded by common/kernel_spec.h decode_scan_spec, and the per-element maths is
// common/elementwise.h's (scan_forward_element, scan_backward_element), as on the CPU; the
// reference is rnn_ablations/functional.py.
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

#include "../common/kernel_spec.h"
#include "../common/layer_tensors.h"

namespace {

using namespace rnn_ablations;

#include "../common/elementwise.h"  // scan_forward_element, scan_backward_element

// The device's activations (the Act of the element-wise templates).
struct CudaAct {
  template <typename A> __device__ static __forceinline__ A sigmoid(A x) {
    return A(1) / (A(1) + exp(-x));
  }
  template <typename A> __device__ static __forceinline__ A tanh(A x) { return ::tanh(x); }
};

constexpr int kThreads = 256;

// Dimensions of one call: T steps, B rows, D directions, H units, G blocks per direction.
struct Dims {
  int64_t T, B, D, H, G;
};

__device__ __forceinline__ int64_t position(int64_t d, int64_t s, int64_t L) {
  return d == 0 ? s : L - 1 - s;
}

// Row strides (elements) of the (T, B, W) tensors: proj / d_proj, out / cs, g_out.  proj is
// time-major contiguous or the time-major view of a batch-major (B, T, W) tensor; out, cs and
// d_proj are laid out like it.
struct Strides {
  int64_t p_st, p_sb, o_st, o_sb, g_st, g_sb;
};

// `len` null: every row runs all T steps (no copy of the lengths to the device).
__device__ __forceinline__ int64_t row_steps(const int64_t* len, int64_t b, int64_t T) {
  return len ? len[b] : T;
}

template <typename scalar_t>
__device__ __forceinline__ at::opmath_type<scalar_t> bias_at(const scalar_t* bias, int64_t k) {
  using acc_t = at::opmath_type<scalar_t>;
  return bias ? static_cast<acc_t>(bias[k]) : acc_t(0);
}

template <typename scalar_t, typename acc_t, int Out, bool HW, bool SAVE>
__global__ void scan_forward_kernel(ScanSpec sp, Dims n, Strides z, const int64_t* __restrict__ len,
                                    const scalar_t* __restrict__ proj,
                                    const scalar_t* __restrict__ bias,
                                    const scalar_t* __restrict__ h0,
                                    const scalar_t* __restrict__ c0, scalar_t* __restrict__ out,
                                    scalar_t* __restrict__ h_n, scalar_t* __restrict__ c_n,
                                    acc_t* __restrict__ cs) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t H = n.H;
  if (idx >= n.D * n.B * H) return;  // idx = (d * B + b) * H + j, the (D, B, H) state index
  const int64_t j = idx % H, b = (idx / H) % n.B, d = idx / (H * n.B);
  const int64_t steps = row_steps(len, b, n.T);
  const int64_t base = d * n.G * H + j;  // this unit's column in a proj row (block 0)
  acc_t bv[kScanBlocks];  // the blocks' biases (registers: every index below is a constant)
#pragma unroll
  for (int role = 0; role < kScanBlocks; ++role)
    bv[role] = sp.block[role] >= 0 ? bias_at(bias, base + sp.block[role] * H) : acc_t(0);
  acc_t c = static_cast<acc_t>(c0[idx]);
  acc_t h = static_cast<acc_t>(h0[idx]);
  for (int64_t s = 0; s < steps; ++s) {
    const int64_t t = position(d, s, steps);
    const scalar_t* p = proj + t * z.p_st + b * z.p_sb + base;
    const int64_t o = t * z.o_st + b * z.o_sb + d * H + j;
    const auto pre = [&](int role) {
      return static_cast<acc_t>(p[sp.block[role] * H]) + bv[role];
    };
    h = scan_forward_element<Out, HW, CudaAct>(pre, c);
    if (SAVE) cs[o] = c;
    out[o] = static_cast<scalar_t>(h);
  }
  for (int64_t t = steps; t < n.T; ++t) out[t * z.o_st + b * z.o_sb + d * H + j] = scalar_t(0);
  h_n[idx] = static_cast<scalar_t>(h);
  c_n[idx] = static_cast<scalar_t>(c);
}

// dbias_rows (D*B, G*H) in acc_t, or null: this (direction, row)'s sum of d_proj over its steps.
template <typename scalar_t, typename acc_t, int Out, bool HW>
__global__ void scan_backward_kernel(ScanSpec sp, Dims n, Strides z, const int64_t* __restrict__ len,
                                     const scalar_t* __restrict__ g_out,
                                     const scalar_t* __restrict__ g_hn,
                                     const scalar_t* __restrict__ g_cn,
                                     const scalar_t* __restrict__ proj,
                                     const scalar_t* __restrict__ bias,
                                     const scalar_t* __restrict__ c0,
                                     const acc_t* __restrict__ cs, scalar_t* __restrict__ dproj,
                                     scalar_t* __restrict__ dc0, acc_t* __restrict__ dbias_rows) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t H = n.H;
  if (idx >= n.D * n.B * H) return;
  const int64_t j = idx % H, b = (idx / H) % n.B, d = idx / (H * n.B);
  const int64_t steps = row_steps(len, b, n.T);
  const int64_t base = d * n.G * H + j;
  acc_t bv[kScanBlocks], sum[kScanBlocks];  // biases, bias-gradient sums (registers)
#pragma unroll
  for (int role = 0; role < kScanBlocks; ++role) {
    bv[role] = sp.block[role] >= 0 ? bias_at(bias, base + sp.block[role] * H) : acc_t(0);
    sum[role] = acc_t(0);
  }
  acc_t dc = static_cast<acc_t>(g_cn[idx]);
  for (int64_t s = steps - 1; s >= 0; --s) {
    const int64_t t = position(d, s, steps);
    const int64_t o = t * z.o_st + b * z.o_sb + d * H + j;
    const scalar_t* p = proj + t * z.p_st + b * z.p_sb + base;
    scalar_t* dq = dproj + t * z.p_st + b * z.p_sb + base;
    acc_t dh = static_cast<acc_t>(g_out[t * z.g_st + b * z.g_sb + d * H + j]);
    if (s == steps - 1) dh += static_cast<acc_t>(g_hn[idx]);
    const acc_t cp = s > 0 ? cs[position(d, s - 1, steps) * z.o_st + b * z.o_sb + d * H + j]
                           : static_cast<acc_t>(c0[idx]);
    const auto pre = [&](int role) {
      return static_cast<acc_t>(p[sp.block[role] * H]) + bv[role];
    };
    const auto put = [&](int role, acc_t v) {
      dq[sp.block[role] * H] = static_cast<scalar_t>(v);
      sum[role] += v;
    };
    dc = scan_backward_element<Out, HW, CudaAct>(pre, put, dh, cs[o], cp, dc);
  }
  // padded steps: no gradient
  for (int64_t t = steps; t < n.T; ++t) {
    scalar_t* dq = dproj + t * z.p_st + b * z.p_sb + base;
    for (int64_t g = 0; g < n.G; ++g) dq[g * H] = scalar_t(0);
  }
  dc0[idx] = static_cast<scalar_t>(dc);
  if (dbias_rows) {  // this (direction, row)'s row of dbias_rows: every block of the spec
    acc_t* db = dbias_rows + (d * n.B + b) * n.G * H + j;
#pragma unroll
    for (int role = 0; role < kScanBlocks; ++role)
      if (sp.block[role] >= 0) db[sp.block[role] * H] = sum[role];
  }
}

// (B) int64 on proj's device: the number of steps of each row; undefined when every row runs
// all T steps (the kernels then need no lengths).  The copy is asynchronous (from pinned memory,
// held by the caching host allocator until it is done): no synchronisation with the stream.
at::Tensor row_lengths(const at::Tensor& batch_sizes, int64_t B, const at::Device& device) {
  const int64_t T = batch_sizes.size(0);
  const int64_t* bs = batch_sizes.data_ptr<int64_t>();
  if (B == 0 || T == 0 || bs[T - 1] == B) return at::Tensor();
  at::Tensor len = at::zeros({B}, batch_sizes.options().pinned_memory(true));
  int64_t* lp = len.data_ptr<int64_t>();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t b = 0; b < bs[t]; ++b) ++lp[b];
  return len.to(len.options().device(device).pinned_memory(false), /*non_blocking=*/true);
}

const int64_t* len_ptr(const at::Tensor& len) {
  return len.defined() ? len.data_ptr<int64_t>() : nullptr;
}

bool is_batch_major(const at::Tensor& t) {
  return !t.is_contiguous() && t.transpose(0, 1).is_contiguous();
}

// A new (T, B, W) tensor laid out like proj (time- or batch-major).
at::Tensor empty_like_layout(const at::Tensor& proj, int64_t W, const at::TensorOptions& opt) {
  const int64_t T = proj.size(0), B = proj.size(1);
  if (is_batch_major(proj)) return at::empty({B, T, W}, opt).transpose(0, 1);
  return at::empty({T, B, W}, opt);
}

// bias: none/empty or a contiguous (D*G*H) vector of proj's dtype on its device.
bool check_bias(const c10::optional<at::Tensor>& bias, const at::Tensor& proj, const char* who) {
  if (!bias.has_value() || !bias->defined() || bias->numel() == 0) return false;
  TORCH_CHECK(bias->device() == proj.device() && bias->scalar_type() == proj.scalar_type() &&
                  bias->dim() == 1 && bias->is_contiguous() && bias->size(0) == proj.size(2),
              who, ": bias must be a contiguous vector of proj's dtype and device with "
              "proj.size(2) = ", proj.size(2), " entries");
  return true;
}

void check_common(const at::Tensor& proj, const at::Tensor& h0, const at::Tensor& c0,
                  const at::Tensor& batch_sizes, const char* who) {
  TORCH_CHECK(proj.is_cuda(), who, ": proj must be a CUDA tensor");
  TORCH_CHECK(proj.dim() == 3 && (proj.is_contiguous() || is_batch_major(proj)), who,
              ": proj must be (T, B, D*G*H), contiguous or the transpose of a contiguous "
              "(B, T, D*G*H)");
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

// f(std::integral_constant<int, Out>, std::integral_constant<bool, HW>) for the spec's output
// rule (kernel_spec.h with_output_rule) and highway.
template <typename F>
void dispatch_rule(const ScanSpec& sp, F&& f) {
  with_output_rule(sp.output, [&](auto out) {
    if (sp.highway) f(out, std::integral_constant<bool, true>());
    else f(out, std::integral_constant<bool, false>());
  });
}

unsigned int blocks_for(int64_t n) {
  return static_cast<unsigned int>(std::max<int64_t>(1, (n + kThreads - 1) / kThreads));
}

Strides strides_of(const at::Tensor& proj, const at::Tensor& out_like, const at::Tensor* g_out) {
  return Strides{proj.stride(0), proj.stride(1), out_like.stride(0), out_like.stride(1),
                 g_out ? g_out->stride(0) : 0, g_out ? g_out->stride(1) : 0};
}

// -> (out, h_n, c_n, cs); out and cs laid out like proj (time- or batch-major); bias (D*G*H)
// added to proj's blocks when given
std::vector<at::Tensor> scan_forward(int64_t spec, bool highway, const at::Tensor& proj,
                                     const at::Tensor& h0, const at::Tensor& c0,
                                     const at::Tensor& batch_sizes, bool save,
                                     const c10::optional<at::Tensor>& bias) {
  const char* who = "scan_forward (CUDA)";
  check_common(proj, h0, c0, batch_sizes, who);
  const bool has_bias = check_bias(bias, proj, who);
  const c10::cuda::CUDAGuard guard(proj.device());
  const Dims n = dims_of(proj, c0);
  const ScanSpec sp = check_scan_spec(spec, highway, n.G, n.H, n.D, who);
  const at::ScalarType acc_type = at::toOpMathType(proj.scalar_type());
  at::Tensor out = empty_like_layout(proj, n.D * n.H, proj.options());
  at::Tensor h_n = at::empty({n.D, n.B, n.H}, proj.options());
  at::Tensor c_n = at::empty({n.D, n.B, n.H}, proj.options());
  at::Tensor cs = save ? empty_like_layout(proj, n.D * n.H, proj.options().dtype(acc_type))
                       : at::empty({0}, proj.options().dtype(acc_type));  // as the CPU scan
  const int64_t threads = n.D * n.B * n.H;
  if (threads == 0) return {out.zero_(), h_n, c_n, cs};
  const at::Tensor len = row_lengths(batch_sizes, n.B, proj.device());
  const Strides z = strides_of(proj, out, nullptr);
  auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, proj.scalar_type(), "scan_forward", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* bp = has_bias ? bias->data_ptr<scalar_t>() : nullptr;
    dispatch_rule(sp, [&](auto out_rule, auto hw) {
      constexpr int OUT = decltype(out_rule)::value;
      constexpr bool HW = decltype(hw)::value;
      if (save) {
        scan_forward_kernel<scalar_t, acc_t, OUT, HW, true>
            <<<blocks_for(threads), kThreads, 0, stream>>>(
                sp, n, z, len_ptr(len), proj.data_ptr<scalar_t>(), bp,
                h0.data_ptr<scalar_t>(), c0.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(),
                h_n.data_ptr<scalar_t>(), c_n.data_ptr<scalar_t>(), cs.data_ptr<acc_t>());
      } else {
        scan_forward_kernel<scalar_t, acc_t, OUT, HW, false>
            <<<blocks_for(threads), kThreads, 0, stream>>>(
                sp, n, z, len_ptr(len), proj.data_ptr<scalar_t>(), bp,
                h0.data_ptr<scalar_t>(), c0.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(),
                h_n.data_ptr<scalar_t>(), c_n.data_ptr<scalar_t>(), nullptr);
      }
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
  return {out, h_n, c_n, cs};
}

// -> (d_proj laid out like proj, d_c0, d_bias (D*G*H) when bias_grad, else empty)
std::vector<at::Tensor> scan_backward(int64_t spec, bool highway, const at::Tensor& g_out,
                                      const at::Tensor& g_hn, const at::Tensor& g_cn,
                                      const at::Tensor& proj, const at::Tensor& c0,
                                      const at::Tensor& cs, const at::Tensor& batch_sizes,
                                      const c10::optional<at::Tensor>& bias, bool bias_grad) {
  const char* who = "scan_backward (CUDA)";
  check_common(proj, g_hn, c0, batch_sizes, who);
  const bool has_bias = check_bias(bias, proj, who);
  const c10::cuda::CUDAGuard guard(proj.device());
  const Dims n = dims_of(proj, c0);
  const ScanSpec sp = check_scan_spec(spec, highway, n.G, n.H, n.D, who);
  const at::ScalarType acc_type = at::toOpMathType(proj.scalar_type());
  TORCH_CHECK(g_out.device() == proj.device() && g_out.scalar_type() == proj.scalar_type() &&
                  g_out.dim() == 3 && g_out.size(0) == n.T && g_out.size(1) == n.B &&
                  g_out.size(2) == n.D * n.H && (g_out.numel() == 0 || g_out.stride(2) == 1),
              who, ": g_out must be (T, B, D*H) of proj's dtype, contiguous rows");
  const bool bm = is_batch_major(proj);
  TORCH_CHECK(cs.device() == proj.device() && cs.scalar_type() == acc_type && cs.dim() == 3 &&
                  cs.size(0) == n.T && cs.size(1) == n.B && cs.size(2) == n.D * n.H &&
                  (cs.numel() == 0 ||
                   (cs.stride(2) == 1 && cs.stride(0) == (bm ? n.D * n.H : n.B * n.D * n.H) &&
                    cs.stride(1) == (bm ? n.T * n.D * n.H : n.D * n.H))),
              who, ": cs must be the memories saved by scan_forward (laid out like proj)");
  TORCH_CHECK(g_cn.device() == proj.device() && g_cn.scalar_type() == proj.scalar_type() &&
                  g_cn.is_contiguous() && g_cn.sizes() == c0.sizes(),
              who, ": g_cn must be contiguous (D, B, H) of proj's dtype");
  // every block of proj is the spec's (check_scan_spec): each is written, at the active steps and
  // (zeros) at the padded ones
  at::Tensor dproj = empty_like_layout(proj, proj.size(2), proj.options());
  at::Tensor dc0 = at::empty_like(c0);
  at::Tensor dbias_rows;
  if (bias_grad) {
    const auto opt = proj.options().dtype(acc_type);
    dbias_rows = at::empty({n.D * n.B, n.G * n.H}, opt);
  }
  auto dbias = [&]() {
    return bias_grad ? dbias_rows.view({n.D, n.B, n.G * n.H}).sum(1).view({-1})
                           .to(proj.scalar_type())
                     : at::empty({0}, proj.options());
  };
  const int64_t threads = n.D * n.B * n.H;
  if (threads == 0) {
    if (bias_grad) dbias_rows.zero_();
    return {dproj.zero_(), dc0, dbias()};
  }
  const at::Tensor len = row_lengths(batch_sizes, n.B, proj.device());
  const Strides z = strides_of(proj, cs, &g_out);
  auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, proj.scalar_type(), "scan_backward", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* bp = has_bias ? bias->data_ptr<scalar_t>() : nullptr;
    dispatch_rule(sp, [&](auto out_rule, auto hw) {
      constexpr int OUT = decltype(out_rule)::value;
      constexpr bool HW = decltype(hw)::value;
      scan_backward_kernel<scalar_t, acc_t, OUT, HW><<<blocks_for(threads), kThreads, 0, stream>>>(
          sp, n, z, len_ptr(len), g_out.data_ptr<scalar_t>(), g_hn.data_ptr<scalar_t>(),
          g_cn.data_ptr<scalar_t>(), proj.data_ptr<scalar_t>(), bp, c0.data_ptr<scalar_t>(),
          cs.data_ptr<acc_t>(), dproj.data_ptr<scalar_t>(), dc0.data_ptr<scalar_t>(),
          bias_grad ? dbias_rows.data_ptr<acc_t>() : nullptr);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
  return {dproj, dc0, dbias()};
}

}  // namespace

// Called from the module init in step_kernel.cu.
void register_scan(pybind11::module_& m) {
  m.def("scan_forward", &scan_forward, py::call_guard<py::gil_scoped_release>(),
        "element-wise scan of a gated memory whose gates read x_t only (forward, CUDA); spec: "
        "Variant.kernel_spec (see csrc/cpu/scan.cpp for the arguments)",
        py::arg("spec"), py::arg("highway"), py::arg("proj"), py::arg("h0"), py::arg("c0"),
        py::arg("batch_sizes"), py::arg("save"), py::arg("bias") = py::none());
  m.def("scan_backward", &scan_backward, py::call_guard<py::gil_scoped_release>(),
        "backward of scan_forward (CUDA): (d_proj, d_c0, d_bias); d_bias computed when bias_grad",
        py::arg("spec"), py::arg("highway"), py::arg("g_out"), py::arg("g_hn"), py::arg("g_cn"),
        py::arg("proj"), py::arg("c0"), py::arg("cs"), py::arg("batch_sizes"),
        py::arg("bias") = py::none(), py::arg("bias_grad") = false);
  // 2: bias inside the scan, batch-major layouts, (d_proj, d_c0, d_bias) from the backward;
  // 3: the variant as (spec, highway), decoded by kernel_spec.h
  m.attr("scan_abi") = 3;
}
