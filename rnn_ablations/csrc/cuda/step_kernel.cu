// The CUDA step kernel: one recurrent layer in one direction of every variant in
// rnn_ablations/variants.py; the same function, layout and entry-point signatures as the plain
// CPU entry points in cpu/layer_plain.cpp (rnn_forward / rnn_backward), which the generic path
// (rnn_ablations/functional.py) defines and the tests compare against.
//
// Per step: one cuBLAS GEMM of the active rows against h_{t-1}, then ONE fused element-wise
// kernel (all activations, the cell update, the output and the highway mix); the backward per
// step: one fused element-wise kernel (which also adds dL/dout_t), then one GEMM for dh_{t-1};
// the weight gradient is one GEMM after the loop.  The step loop works on raw pointers and calls
// cuBLAS directly, on torch's handle for the current stream (no tensor views or dispatcher calls per step: at these
// sizes a step is bound by the host's launch overhead); it launches asynchronously (no
// synchronisation per step); batch_sizes lives on the CPU.
//
// Dtypes: float64, float32, and the half types bfloat16 and float16.  Storage follows the input
// dtype (proj, w_hh, h0/c0, the output h_t, dproj); the arithmetic is in acc_t =
// at::opmath_type<scalar_t> (float for the half types): the GEMMs accumulate in fp32
// (cublasGemmEx, CUBLAS_COMPUTE_32F) and write fp32 pre-activations / dh; the buffers that the
// recurrence carries or the backward re-reads are acc_t: the gate activations, the cell state
// c_t (saved for the backward: rounding c to bfloat16 at every step would add 2^-9 relative
// error per step to a sum that is carried over all steps), h before the highway mix, and the
// carried dL/dh, dL/dc.  c_n is returned in the input dtype.
//
// Graph capture: no host synchronisation, no host<->device copy and no allocation outside
// torch's caching allocator, so a caller may capture a call in a CUDA graph (torch.cuda.graph);
// rnn_ablations/cuda_graphs.py replays the whole step loop that way.

#include <torch/extension.h>
#include <ATen/OpMathType.h>
#include <ATen/cuda/CUDAContextLight.h>
#include <cublas_v2.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <library_types.h>

#include <vector>

#include "../common/layer_tensors.h"

namespace {

using namespace rnn_ablations;  // KernelSpec, input checks, final_states, previous_hidden

#include "../common/elementwise.h"  // the per-element maths shared with the CPU (cpu/vec_impl.h)
#include "forward_element.h"   // sigm, forward_element (shared with persistent_kernel.cu)
#include "backward_element.h"  // backward_element (shared with persistent_kernel.cu)

// Forward of element (b, j) of one step; gates (acc_t) hold the pre-activations of the R
// recurrent blocks on entry and their activations on exit (the backward reads them).  The
// branches on the spec are uniform across the launch.  xo: the input-only blocks, row stride
// xo_stride; h_pre_out: h_t before the highway mix (saved for the backward), or null.
template <typename T, typename A>
__global__ void forward_kernel(KernelSpec ks, int64_t n, int64_t H, int64_t xo_stride,
                               A* __restrict__ gates, const T* __restrict__ xo,
                               const A* __restrict__ c_prev, A* __restrict__ c_out,
                               T* __restrict__ h_out, A* __restrict__ h_pre_out) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n * H) return;
  const int64_t b = idx / H, j = idx % H;
  A c, h_pre;
  const A h = forward_element<T, A>(ks, gates + b * ks.R * H + j, H,
                                    xo ? xo + b * xo_stride + j : nullptr, H,
                                    ks.memory ? c_prev[b * H + j] : A(0), c, h_pre);
  if (ks.highway && h_pre_out) h_pre_out[b * H + j] = h_pre;
  c_out[b * H + j] = c;
  h_out[b * H + j] = static_cast<T>(h);
}

// Backward of element (b, j) of one step.  dh + g_out: dL/dh_t (carried + from the output); dc:
// carried dL/dc_t, replaced by dL/dc_{t-1}; da: dL/d(pre-activations) of the recurrent blocks,
// row stride P; dxo = da + R*H: dL/d(input-only blocks).  gates, c, h_pre, dh, dc are acc_t.
template <typename T, typename A>
__global__ void backward_kernel(KernelSpec ks, int64_t n, int64_t H, int64_t P,
                                const A* __restrict__ gates, const T* __restrict__ xo,
                                const A* __restrict__ c_cur, const A* __restrict__ c_prev,
                                const A* __restrict__ h_pre, const A* __restrict__ dh,
                                const T* __restrict__ g_out, A* __restrict__ dc,
                                T* __restrict__ da) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n * H) return;
  const int64_t b = idx / H, j = idx % H;
  const A gh = dh[b * H + j] + static_cast<A>(g_out[b * H + j]);
  const A dc_prev = backward_element<T, A>(
      ks, H, j, gates + b * ks.R * H, xo ? xo + b * P : nullptr,
      c_cur ? c_cur + b * H + j : nullptr, c_prev ? c_prev + b * H + j : nullptr,
      ks.highway ? h_pre[b * H + j] : A(0), gh, dc[b * H + j], da + b * P);
  if (ks.memory) dc[b * H + j] = dc_prev;
}

// dst[i] = src[i] * m[i] for i < count (the recurrent-dropout mask on h_{t-1} or on dh_{t-1}).
template <typename D, typename M>
__global__ void mul_kernel(int64_t count, const D* src, const M* __restrict__ m,
                           D* dst) {  // src may be dst
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) {
    using A = at::opmath_type<D>;
    dst[i] = static_cast<D>(static_cast<A>(src[i]) * static_cast<A>(m[i]));
  }
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

// Half types: inputs in bfloat16/float16, fp32 accumulation (CUBLAS_COMPUTE_32F) and an fp32 C.
template <typename T> struct CudaType;
template <> struct CudaType<at::BFloat16> { static constexpr cudaDataType_t value = CUDA_R_16BF; };
template <> struct CudaType<at::Half> { static constexpr cudaDataType_t value = CUDA_R_16F; };
template <typename T>
inline void gemm(cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n, int64_t k,
                 const T* a, int64_t lda, const T* b, int64_t ldb, float beta, float* c,
                 int64_t ldc) {
  const float one = 1.0f;
  check_cublas(cublasGemmEx(at::cuda::getCurrentCUDABlasHandle(), ta, tb, static_cast<int>(m),
                            static_cast<int>(n), static_cast<int>(k), &one, a,
                            CudaType<T>::value, static_cast<int>(lda), b, CudaType<T>::value,
                            static_cast<int>(ldb), &beta, c, CUDA_R_32F,
                            static_cast<int>(ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

constexpr int kThreads = 256;
inline unsigned blocks_for(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

}  // namespace

// Returns {out (T,B,H), h_n, c_n, gates (activations), cs (T,B,H), hin}; as rnn_forward (CPU).
// out, h_n, c_n have the input dtype; gates, cs and hin (the saved tensors) are acc_t (float for
// the half types).
std::vector<at::Tensor> cuda_forward(int64_t spec, bool highway, at::Tensor proj, at::Tensor w_hh,
                                     at::Tensor h0, at::Tensor c0, at::Tensor batch_sizes,
                                     at::Tensor rec_mask, bool keep_hin) {
  check_plain_inputs(proj, w_hh, h0, c0, batch_sizes, at::kCUDA, "rnn_ablations CUDA kernel");
  const c10::cuda::CUDAGuard guard(proj.device());
  const int64_t H = w_hh.size(1), R = w_hh.size(0) / H;
  const int64_t T = proj.size(0), B = proj.size(1), P = proj.size(2), X = P / H - R;
  const KernelSpec ks = check_kernel_spec(spec, highway, R, X, "rnn_ablations CUDA kernel");
  const bool has_mask = rec_mask.defined() && rec_mask.numel() > 0;
  if (has_mask) check_like(rec_mask, h0.sizes(), h0, "rec_mask", "rnn_ablations CUDA kernel");
  const int64_t* bs = batch_sizes.data_ptr<int64_t>();
  const at::ScalarType acc = at::toOpMathType(proj.scalar_type());
  const at::TensorOptions acc_opts = proj.options().dtype(acc);
  // a copy (the kernel turns it into the activations in place), in acc_t
  at::Tensor gates = proj.narrow(2, 0, R * H).to(acc, /*non_blocking=*/false, /*copy=*/true)
                         .contiguous();
  at::Tensor c0a = c0.to(acc);
  at::Tensor out = at::zeros({T, B, H}, proj.options());
  at::Tensor cs = at::zeros({T, B, H}, acc_opts);
  at::Tensor hin = (highway && keep_hin) ? at::empty({T, B, H}, acc_opts) : at::Tensor();
  at::Tensor hp_buf = has_mask ? at::empty({B, H}, proj.options()) : at::Tensor();
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  // Raw pointers of the step loop (suffix _p): the tensors of the same name
  // (common/layer_tensors.h).
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, proj.scalar_type(),
                                  "rnn_ablations_cuda_forward", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    acc_t* gates_p = gates.data_ptr<acc_t>();
    const scalar_t* proj_p = proj.data_ptr<scalar_t>();
    scalar_t* out_p = out.data_ptr<scalar_t>();
    acc_t* cs_p = cs.data_ptr<acc_t>();
    acc_t* hin_p = hin.defined() ? hin.data_ptr<acc_t>() : nullptr;
    const scalar_t* w_hh_p = w_hh.data_ptr<scalar_t>();
    const scalar_t* h0_p = h0.data_ptr<scalar_t>();
    const acc_t* c0_p = c0a.data_ptr<acc_t>();
    const scalar_t* mask_p = has_mask ? rec_mask.data_ptr<scalar_t>() : nullptr;
    scalar_t* h_prev_buf_p = has_mask ? hp_buf.data_ptr<scalar_t>() : nullptr;
    for (int64_t t = 0; t < T && bs[t] > 0; ++t) {
      const int64_t n = bs[t];
      const scalar_t* h_prev = t == 0 ? h0_p : out_p + (t - 1) * B * H;
      if (has_mask) {
        mul_kernel<scalar_t, scalar_t><<<blocks_for(n * H), kThreads, 0, stream>>>(
            n * H, h_prev, mask_p, h_prev_buf_p);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
        h_prev = h_prev_buf_p;
      }
      // column-major: gates_t^T (R*H x n) += W_hh (R*H x H, stored as its transpose) h_prev^T
      acc_t* g = gates_p + t * B * R * H;
      gemm(CUBLAS_OP_T, CUBLAS_OP_N, R * H, n, H, w_hh_p, H, h_prev, H, acc_t(1), g, R * H);
      forward_kernel<scalar_t, acc_t><<<blocks_for(n * H), kThreads, 0, stream>>>(
          ks, n, H, P, g,
          X > 0 ? proj_p + t * B * P + R * H : nullptr,
          t == 0 ? c0_p : cs_p + (t - 1) * B * H,
          cs_p + t * B * H, out_p + t * B * H, hin_p ? hin_p + t * B * H : nullptr);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
  });
  auto fin = final_states(ks.memory, out, cs, h0, c0, bs);  // c_n: cs copied into c0's dtype
  return {out, fin.first, fin.second, gates, cs, hin.defined() ? hin : at::empty({0}, acc_opts)};
}

// Returns {d_proj, d_w_hh, d_h0, d_c0}; as rnn_backward (CPU).  gates, cs, hin: as returned by
// cuda_forward (acc_t); the other tensors and the results have the input dtype.
std::vector<at::Tensor> cuda_backward(int64_t spec, bool highway, at::Tensor grad_out,
                                      at::Tensor grad_hn, at::Tensor grad_cn, at::Tensor gates,
                                      at::Tensor cs, at::Tensor hin, at::Tensor out,
                                      at::Tensor proj, at::Tensor w_hh, at::Tensor h0,
                                      at::Tensor c0, at::Tensor batch_sizes, at::Tensor rec_mask) {
  const char* who = "rnn_ablations CUDA kernel (backward)";
  TORCH_CHECK(proj.dim() == 3, who, ": proj must be (T, B, (R+X)*H)");
  const KernelSpec ks = check_backward_inputs(spec, highway, grad_out, grad_hn, grad_cn, cs, hin,
                                              out, w_hh, h0, c0, batch_sizes, rec_mask,
                                              proj.size(2), at::kCUDA, who);
  check_like(proj, {out.size(0), out.size(1), proj.size(2)}, out, "proj", who);
  // gates: the forward's activations, in the accumulation type (checked below)
  TORCH_CHECK(gates.dim() == 3 && gates.size(0) == out.size(0) && gates.size(1) == out.size(1) &&
                  gates.size(2) == w_hh.size(0),
              who, ": gates must have shape (T, B, R*H) = (", out.size(0), ", ", out.size(1),
              ", ", w_hh.size(0), ")");
  const c10::cuda::CUDAGuard guard(proj.device());
  const int64_t H = w_hh.size(1), R = w_hh.size(0) / H;
  const int64_t T = proj.size(0), B = proj.size(1), P = proj.size(2), X = P / H - R;
  const bool has_mask = rec_mask.defined() && rec_mask.numel() > 0;
  const int64_t* bs = batch_sizes.data_ptr<int64_t>();
  const at::ScalarType acc = at::toOpMathType(proj.scalar_type());
  for (const at::Tensor* t : {&gates, &cs}) {
    TORCH_CHECK(t->scalar_type() == acc && t->is_contiguous() && t->is_cuda(),
                "rnn_ablations CUDA kernel backward: gates and cs must be the contiguous ",
                acc, " tensors returned by the forward");
  }
  TORCH_CHECK(!highway || (hin.scalar_type() == acc && hin.numel() == T * B * H),
              "rnn_ablations CUDA kernel backward: hin must be the ", acc,
              " tensor returned by the forward (keep_hin=True)");
  grad_out = grad_out.to(proj.scalar_type()).contiguous();
  at::Tensor dproj = at::zeros_like(proj);
  // carried gradients in acc_t (a copy: the loop writes them)
  at::Tensor dh = grad_hn.to(acc, /*non_blocking=*/false, /*copy=*/true).contiguous();
  at::Tensor dc = grad_cn.to(acc, /*non_blocking=*/false, /*copy=*/true).contiguous();
  at::Tensor c0a = c0.to(acc);
  if (!ks.memory) dh.add_(dc);  // c_n is a copy of h_n for a cell without memory
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, proj.scalar_type(),
                                  "rnn_ablations_cuda_backward", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const acc_t* gates_p = gates.data_ptr<acc_t>();
    const scalar_t* proj_p = proj.data_ptr<scalar_t>();
    const acc_t* cs_p = ks.memory ? cs.data_ptr<acc_t>() : nullptr;
    const acc_t* c0_p = c0a.data_ptr<acc_t>();
    const acc_t* hin_p = highway ? hin.data_ptr<acc_t>() : nullptr;
    const scalar_t* grad_out_p = grad_out.data_ptr<scalar_t>();
    const scalar_t* w_hh_p = w_hh.data_ptr<scalar_t>();
    const scalar_t* mask_p = has_mask ? rec_mask.data_ptr<scalar_t>() : nullptr;
    scalar_t* dproj_p = dproj.data_ptr<scalar_t>();
    acc_t* dh_p = dh.data_ptr<acc_t>();
    acc_t* dc_p = dc.data_ptr<acc_t>();
    for (int64_t t = T - 1; t >= 0; --t) {
      const int64_t n = bs[t];
      if (n == 0) continue;
      scalar_t* dp = dproj_p + t * B * P;
      backward_kernel<scalar_t, acc_t><<<blocks_for(n * H), kThreads, 0, stream>>>(
          ks, n, H, P, gates_p + t * B * R * H,
          X > 0 ? proj_p + t * B * P + R * H : nullptr, cs_p ? cs_p + t * B * H : nullptr,
          cs_p ? (t == 0 ? c0_p : cs_p + (t - 1) * B * H) : nullptr,
          hin_p ? hin_p + t * B * H : nullptr, dh_p, grad_out_p + t * B * H, dc_p, dp);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      // column-major: dh^T (H x n) = W_hh^T (H x R*H, stored row-major as R*H x H) dproj_t^T
      gemm(CUBLAS_OP_N, CUBLAS_OP_N, H, n, R * H, w_hh_p, H, dp, P, acc_t(0), dh_p, H);
      if (has_mask) {
        mul_kernel<acc_t, scalar_t><<<blocks_for(n * H), kThreads, 0, stream>>>(n * H, dh_p,
                                                                                mask_p, dh_p);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      }
    }
  });
  // dW_hh = sum_t dproj_t(recurrent blocks)^T h_{t-1}: one GEMM (fp32 accumulation in cuBLAS)
  at::Tensor dw = at::mm(dproj.view({T * B, P}).narrow(1, 0, R * H).t(),
                         previous_hidden(out, h0, rec_mask, has_mask, 0, T));
  if (!ks.memory) dc.zero_();
  return {dproj, dw, dh.to(proj.scalar_type()), dc.to(proj.scalar_type())};
}

void register_scan(pybind11::module_& m);  // scan_kernel.cu: the element-wise scan (no step GEMM)
void register_persistent(pybind11::module_& m);  // persistent_kernel.cu: one-launch forward

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "rnn_ablations CUDA recurrence (forward and hand-written backward)";
  register_scan(m);
  register_persistent(m);
  m.def("forward", &cuda_forward, py::call_guard<py::gil_scoped_release>(), "one layer, one direction: forward from the input projections");
  m.def("backward", &cuda_backward, py::call_guard<py::gil_scoped_release>(), "one layer, one direction: backward to the input projections");
}
