// CUDA kernel for one recurrent layer in one direction of every variant in
// rnn_ablations/variants.py; the same function, layout and entry-point signatures as the plain
// CPU kernel in ablated_rnn.cpp (rnn_forward / rnn_backward), which the generic path
// (rnn_ablations/functional.py) defines and the tests compare against.
//
// Per step: one cuBLAS GEMM of the active rows against h_{t-1}, then ONE fused element-wise
// kernel (all activations, the cell update, the output and the highway mix); the backward per
// step: one fused element-wise kernel (which also adds dL/dout_t), then one GEMM for dh_{t-1};
// the weight gradient is one GEMM after the loop.  The step loop works on raw pointers and calls
// cuBLAS directly, on torch's handle for the current stream (no tensor views or dispatcher calls per step: at these
// sizes a step is bound by the host's launch overhead); it launches asynchronously (no
// synchronisation per step); batch_sizes lives on the CPU.

#include <torch/extension.h>
#include <ATen/cuda/CUDAContextLight.h>
#include <cublas_v2.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <vector>

#include "common.h"

namespace {

using namespace rnn_ablations;  // Kind codes, input checks, final_states, previous_hidden

template <typename T> __device__ __forceinline__ T sigm(T x) { return T(1) / (T(1) + exp(-x)); }

// Forward of element (b, j) of one step; gates hold the pre-activations of the R recurrent
// blocks on entry and their activations on exit (the backward reads them).
template <typename T>
__global__ void forward_kernel(int kind, bool highway, int64_t n, int64_t H, int64_t R,
                               int64_t X, int64_t XS, T* __restrict__ gates,
                               const T* __restrict__ xo, const T* __restrict__ c_prev,
                               T* __restrict__ c_out, T* __restrict__ h_out,
                               T* __restrict__ hin_out) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n * H) return;
  const int64_t b = idx / H, j = idx % H;
  T* g = gates + b * R * H;
  const T* xob = xo ? xo + b * XS : nullptr;
  T h, c;
  if (kind == kSrnn) {
    h = tanh(g[j]);
    g[j] = h;
    c = h;
  } else {
    const T i = sigm(g[j]);
    const T f = sigm(g[H + j]);
    g[j] = i;
    g[H + j] = f;
    T content;
    if (kind == kLstm) {
      content = tanh(g[2 * H + j]);
      g[2 * H + j] = content;
    } else {
      content = xob[j];
    }
    c = i * content + f * c_prev[b * H + j];
    if (kind == kIdentityRan) {
      h = c;
    } else {
      h = tanh(c);
      if (kind == kLstm || kind == kMinusSrnn) {
        const int64_t ob = kind == kLstm ? 3 : 2;
        const T o = sigm(g[ob * H + j]);
        g[ob * H + j] = o;
        h *= o;
      }
    }
  }
  if (highway) {
    const T r = sigm(g[(R - 1) * H + j]);
    g[(R - 1) * H + j] = r;
    const T hw = xob[(X - 1) * H + j];
    if (hin_out) hin_out[b * H + j] = h;
    h = r * h + (T(1) - r) * hw;
    if (kind == kSrnn) c = h;
  }
  c_out[b * H + j] = c;
  h_out[b * H + j] = h;
}

// Backward of element (b, j) of one step.  dh + g_out: dL/dh_t (carried + from the output); dc: carried dL/dc_t, replaced by
// dL/dc_{t-1}; da: dL/d(pre-activations) of the recurrent blocks, row stride P; dxo = da + R*H:
// dL/d(input-only blocks).
template <typename T>
__global__ void backward_kernel(int kind, bool highway, int64_t n, int64_t H, int64_t R,
                                int64_t X, int64_t P, const T* __restrict__ gates,
                                const T* __restrict__ xo, const T* __restrict__ c_cur,
                                const T* __restrict__ c_prev, const T* __restrict__ hin,
                                const T* __restrict__ dh, const T* __restrict__ g_out,
                                T* __restrict__ dc, T* __restrict__ da) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n * H) return;
  const int64_t b = idx / H, j = idx % H;
  const T* g = gates + b * R * H;
  const T* xob = xo ? xo + b * P : nullptr;
  T* dab = da + b * P;
  T* dxob = dab + R * H;
  T gh = dh[b * H + j] + g_out[b * H + j];
  if (highway) {
    const T r = g[(R - 1) * H + j];
    const T hw = xob[(X - 1) * H + j];
    const T hi = hin[b * H + j];
    dab[(R - 1) * H + j] = gh * (hi - hw) * r * (T(1) - r);
    dxob[(X - 1) * H + j] = gh * (T(1) - r);
    gh *= r;
  }
  if (kind == kSrnn) {
    const T hv = g[j];
    dab[j] = gh * (T(1) - hv * hv);
    return;
  }
  const T i = g[j], f = g[H + j];
  const T cp = c_prev[b * H + j];
  T gc = dc[b * H + j];
  if (kind == kIdentityRan) {
    gc += gh;
  } else {
    const T tc = tanh(c_cur[b * H + j]);
    if (kind == kRan) {
      gc += gh * (T(1) - tc * tc);
    } else {
      const int64_t ob = kind == kLstm ? 3 : 2;
      const T o = g[ob * H + j];
      gc += gh * o * (T(1) - tc * tc);
      dab[ob * H + j] = gh * tc * o * (T(1) - o);
    }
  }
  const T content = kind == kLstm ? g[2 * H + j] : xob[j];
  dab[j] = gc * content * i * (T(1) - i);
  dab[H + j] = gc * cp * f * (T(1) - f);
  if (kind == kLstm) dab[2 * H + j] = gc * i * (T(1) - content * content);
  else dxob[j] = gc * i;
  dc[b * H + j] = gc * f;
}

// dst[i] = src[i] * m[i] for i < count (the recurrent-dropout mask on h_{t-1} or on dh_{t-1}).
template <typename T>
__global__ void mul_kernel(int64_t count, const T* src, const T* __restrict__ m,
                           T* dst) {  // src may be dst
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) dst[i] = src[i] * m[i];
}

// C = op(A) op(B) + beta C, column-major, on torch's cuBLAS handle (its stream and math mode).
inline void check_cublas(cublasStatus_t status) {
  TORCH_CHECK(status == CUBLAS_STATUS_SUCCESS, "rnn_ablations CUDA kernel: cuBLAS error ",
              static_cast<int>(status));
}
inline void gemm(cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n, int64_t k,
                 const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                 int64_t ldc) {
  const float one = 1.0f;
  check_cublas(cublasSgemm(at::cuda::getCurrentCUDABlasHandle(), ta, tb, static_cast<int>(m),
                           static_cast<int>(n), static_cast<int>(k), &one, a,
                           static_cast<int>(lda), b, static_cast<int>(ldb), &beta, c,
                           static_cast<int>(ldc)));
}
inline void gemm(cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n, int64_t k,
                 const double* a, int64_t lda, const double* b, int64_t ldb, double beta,
                 double* c, int64_t ldc) {
  const double one = 1.0;
  check_cublas(cublasDgemm(at::cuda::getCurrentCUDABlasHandle(), ta, tb, static_cast<int>(m),
                           static_cast<int>(n), static_cast<int>(k), &one, a,
                           static_cast<int>(lda), b, static_cast<int>(ldb), &beta, c,
                           static_cast<int>(ldc)));
}

constexpr int kThreads = 256;
inline unsigned blocks_for(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

}  // namespace

// Returns {out (T,B,H), h_n, c_n, gates (activations), cs (T,B,H), hin}; as rnn_forward (CPU).
std::vector<at::Tensor> cuda_forward(int64_t kind, bool highway, at::Tensor proj, at::Tensor w_hh,
                                     at::Tensor h0, at::Tensor c0, at::Tensor batch_sizes,
                                     at::Tensor rec_mask, bool keep_hin) {
  check_plain_inputs(proj, w_hh, h0, c0, batch_sizes, at::kCUDA, "rnn_ablations CUDA kernel");
  const c10::cuda::CUDAGuard guard(proj.device());
  const int64_t H = w_hh.size(1), R = w_hh.size(0) / H;
  const int64_t T = proj.size(0), B = proj.size(1), P = proj.size(2), X = P / H - R;
  const bool has_mask = rec_mask.defined() && rec_mask.numel() > 0;
  if (has_mask) TORCH_CHECK(rec_mask.sizes() == h0.sizes() && rec_mask.is_contiguous(), "rec_mask shape");
  const int64_t* bs = batch_sizes.data_ptr<int64_t>();
  at::Tensor gates = proj.narrow(2, 0, R * H).contiguous();
  if (X == 0) gates = gates.clone();
  at::Tensor out = at::zeros({T, B, H}, proj.options());
  at::Tensor cs = at::zeros({T, B, H}, proj.options());
  at::Tensor hin = (highway && keep_hin) ? at::empty({T, B, H}, proj.options()) : at::Tensor();
  at::Tensor hp_buf = has_mask ? at::empty({B, H}, proj.options()) : at::Tensor();
  at::Tensor w_t = w_hh.t();
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES(proj.scalar_type(), "rnn_ablations_cuda_forward", [&] {
    scalar_t* G = gates.data_ptr<scalar_t>();
    const scalar_t* PJ = proj.data_ptr<scalar_t>();
    scalar_t* O = out.data_ptr<scalar_t>();
    scalar_t* CS = cs.data_ptr<scalar_t>();
    scalar_t* HIN = hin.defined() ? hin.data_ptr<scalar_t>() : nullptr;
    const scalar_t* W = w_hh.data_ptr<scalar_t>();
    const scalar_t* H0 = h0.data_ptr<scalar_t>();
    const scalar_t* C0 = c0.data_ptr<scalar_t>();
    const scalar_t* M = has_mask ? rec_mask.data_ptr<scalar_t>() : nullptr;
    scalar_t* HP = has_mask ? hp_buf.data_ptr<scalar_t>() : nullptr;
    for (int64_t t = 0; t < T && bs[t] > 0; ++t) {
      const int64_t n = bs[t];
      const scalar_t* h_prev = t == 0 ? H0 : O + (t - 1) * B * H;
      if (has_mask) {
        mul_kernel<scalar_t><<<blocks_for(n * H), kThreads, 0, stream>>>(n * H, h_prev, M, HP);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
        h_prev = HP;
      }
      // column-major: gates_t^T (R*H x n) += W_hh (R*H x H, stored as its transpose) h_prev^T
      scalar_t* g = G + t * B * R * H;
      gemm(CUBLAS_OP_T, CUBLAS_OP_N, R * H, n, H, W, H, h_prev, H, scalar_t(1), g, R * H);
      forward_kernel<scalar_t><<<blocks_for(n * H), kThreads, 0, stream>>>(
          static_cast<int>(kind), highway, n, H, R, X, P, g,
          X > 0 ? PJ + t * B * P + R * H : nullptr, t == 0 ? C0 : CS + (t - 1) * B * H,
          CS + t * B * H, O + t * B * H, HIN ? HIN + t * B * H : nullptr);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
  });
  auto fin = final_states(kind, out, cs, h0, c0, bs);
  return {out, fin.first, fin.second, gates, cs, hin.defined() ? hin : at::empty({0}, proj.options())};
}

// Returns {d_proj, d_w_hh, d_h0, d_c0}; as rnn_backward (CPU).
std::vector<at::Tensor> cuda_backward(int64_t kind, bool highway, at::Tensor grad_out,
                                      at::Tensor grad_hn, at::Tensor grad_cn, at::Tensor gates,
                                      at::Tensor cs, at::Tensor hin, at::Tensor out,
                                      at::Tensor proj, at::Tensor w_hh, at::Tensor h0,
                                      at::Tensor c0, at::Tensor batch_sizes, at::Tensor rec_mask) {
  const c10::cuda::CUDAGuard guard(proj.device());
  const int64_t H = w_hh.size(1), R = w_hh.size(0) / H;
  const int64_t T = proj.size(0), B = proj.size(1), P = proj.size(2), X = P / H - R;
  const bool has_mask = rec_mask.defined() && rec_mask.numel() > 0;
  const int64_t* bs = batch_sizes.data_ptr<int64_t>();
  grad_out = grad_out.contiguous();
  at::Tensor dproj = at::zeros_like(proj);
  at::Tensor dh = grad_hn.clone().contiguous();
  at::Tensor dc = grad_cn.clone().contiguous();
  if (kind == kSrnn) dh.add_(dc);
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES(proj.scalar_type(), "rnn_ablations_cuda_backward", [&] {
    const scalar_t* G = gates.data_ptr<scalar_t>();
    const scalar_t* PJ = proj.data_ptr<scalar_t>();
    const scalar_t* CS = kind == kSrnn ? nullptr : cs.data_ptr<scalar_t>();
    const scalar_t* C0 = c0.data_ptr<scalar_t>();
    const scalar_t* HIN = highway ? hin.data_ptr<scalar_t>() : nullptr;
    const scalar_t* GO = grad_out.data_ptr<scalar_t>();
    const scalar_t* W = w_hh.data_ptr<scalar_t>();
    const scalar_t* M = has_mask ? rec_mask.data_ptr<scalar_t>() : nullptr;
    scalar_t* DP = dproj.data_ptr<scalar_t>();
    scalar_t* DH = dh.data_ptr<scalar_t>();
    scalar_t* DC = dc.data_ptr<scalar_t>();
    for (int64_t t = T - 1; t >= 0; --t) {
      const int64_t n = bs[t];
      if (n == 0) continue;
      scalar_t* dp = DP + t * B * P;
      backward_kernel<scalar_t><<<blocks_for(n * H), kThreads, 0, stream>>>(
          static_cast<int>(kind), highway, n, H, R, X, P, G + t * B * R * H,
          X > 0 ? PJ + t * B * P + R * H : nullptr, CS ? CS + t * B * H : nullptr,
          CS ? (t == 0 ? C0 : CS + (t - 1) * B * H) : nullptr,
          HIN ? HIN + t * B * H : nullptr, DH, GO + t * B * H, DC, dp);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      // column-major: dh^T (H x n) = W_hh^T (H x R*H, stored row-major as R*H x H) dproj_t^T
      gemm(CUBLAS_OP_N, CUBLAS_OP_N, H, n, R * H, W, H, dp, P, scalar_t(0), DH, H);
      if (has_mask) {
        mul_kernel<scalar_t><<<blocks_for(n * H), kThreads, 0, stream>>>(n * H, DH, M, DH);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      }
    }
  });
  at::Tensor dw = at::mm(dproj.view({T * B, P}).narrow(1, 0, R * H).t(),
                         previous_hidden(out, h0, rec_mask, has_mask, 0, T));
  if (kind == kSrnn) dc.zero_();
  return {dproj, dw, dh, dc};
}

void register_scan(pybind11::module_& m);  // scan_cuda.cu: the element-wise scan (no step GEMM)

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "rnn_ablations CUDA recurrence (forward and hand-written backward)";
  register_scan(m);
  m.def("forward", &cuda_forward, "one layer, one direction: forward from the input projections");
  m.def("backward", &cuda_backward, "one layer, one direction: backward to the input projections");
}
