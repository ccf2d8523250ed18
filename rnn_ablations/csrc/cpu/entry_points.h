// The CPU kernel's entry points (bound in ../bindings.cpp): one recurrent layer in one direction
// of every variant with a step kernel, driven by its kernel spec (common/kernel_spec.h).
//   plain (layer_plain.cpp): from the input projections of all steps, computed by the caller;
//   pipelined (layer_pipelined.cpp): from the layer input, with the input projection (forward)
//     and the input / weight gradients (backward) computed on the second core (pipeline.h);
//   directions (layer_directions.cpp): the plain entry points of a bidirectional layer's directions
//     at once, one direction per thread.
// Tensor names: see layer_tensors.h.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace rnn_ablations {

// Returns {out (T,B,H), h_n (B,H), c_n (B,H), gates (T,B,R*H) activations, cs (T,B,H), hin}.
std::vector<at::Tensor> plain_forward(int64_t spec, bool highway, at::Tensor proj, at::Tensor w_hh,
                                    at::Tensor h0, at::Tensor c0, at::Tensor batch_sizes,
                                    at::Tensor rec_mask, bool keep_hin, bool in_place);
// Returns {d_proj (T,B,(R+X)*H), d_w_hh, d_h0, d_c0}.
std::vector<at::Tensor> plain_backward(int64_t spec, bool highway, at::Tensor grad_out,
                                     at::Tensor grad_hn, at::Tensor grad_cn, at::Tensor gates,
                                     at::Tensor cs, at::Tensor hin, at::Tensor out, at::Tensor proj,
                                     at::Tensor w_hh, at::Tensor h0, at::Tensor c0,
                                     at::Tensor batch_sizes, at::Tensor rec_mask);
// Returns {out, h_n, c_n, gates (activations), cs, hin, xo (T,B,X*H) input-only projections}.
std::vector<at::Tensor> pipelined_forward(int64_t spec, bool highway, at::Tensor x, at::Tensor w_ih,
                                      at::Tensor bias, at::Tensor w_hh, at::Tensor h0,
                                      at::Tensor c0, at::Tensor batch_sizes, at::Tensor rec_mask,
                                      bool keep_hin, int64_t chunk);
// Returns {dx (T,B,D) or empty, d_w_ih, d_bias (R*H) or empty, d_w_hh, d_h0, d_c0}.
std::vector<at::Tensor> pipelined_backward(int64_t spec, bool highway, at::Tensor grad_out,
                                       at::Tensor grad_hn, at::Tensor grad_cn, at::Tensor gates,
                                       at::Tensor cs, at::Tensor hin, at::Tensor xo, at::Tensor out,
                                       at::Tensor x, at::Tensor w_ih, at::Tensor w_hh,
                                       at::Tensor h0, at::Tensor c0, at::Tensor batch_sizes,
                                       at::Tensor rec_mask, bool need_dx, bool need_dw,
                                       bool need_bias, int64_t chunk);
// Both directions of a bidirectional layer, concurrently (layer_directions.cpp): plain_forward /
// plain_backward of direction d on the d-th entry of every list, one direction per thread.
// Returns one result list per direction, as plain_forward / plain_backward return it.
std::vector<std::vector<at::Tensor>> plain_directions_forward(
    int64_t spec, bool highway, std::vector<at::Tensor> proj, std::vector<at::Tensor> w_hh,
    std::vector<at::Tensor> h0, std::vector<at::Tensor> c0, at::Tensor batch_sizes,
    std::vector<at::Tensor> rec_mask, bool keep_hin, bool in_place);
std::vector<std::vector<at::Tensor>> plain_directions_backward(
    int64_t spec, bool highway, std::vector<at::Tensor> grad_out, std::vector<at::Tensor> grad_hn,
    std::vector<at::Tensor> grad_cn, std::vector<at::Tensor> gates, std::vector<at::Tensor> cs,
    std::vector<at::Tensor> hin, std::vector<at::Tensor> out, std::vector<at::Tensor> proj,
    std::vector<at::Tensor> w_hh, std::vector<at::Tensor> h0, std::vector<at::Tensor> c0,
    at::Tensor batch_sizes, std::vector<at::Tensor> rec_mask);
// The same from the layer input: pipelined_forward / pipelined_backward of every direction.
std::vector<std::vector<at::Tensor>> pipelined_directions_forward(
    int64_t spec, bool highway, std::vector<at::Tensor> x, std::vector<at::Tensor> w_ih,
    std::vector<at::Tensor> bias, std::vector<at::Tensor> w_hh, std::vector<at::Tensor> h0,
    std::vector<at::Tensor> c0, at::Tensor batch_sizes, std::vector<at::Tensor> rec_mask,
    bool keep_hin, int64_t chunk);
std::vector<std::vector<at::Tensor>> pipelined_directions_backward(
    int64_t spec, bool highway, std::vector<at::Tensor> grad_out, std::vector<at::Tensor> grad_hn,
    std::vector<at::Tensor> grad_cn, std::vector<at::Tensor> gates, std::vector<at::Tensor> cs,
    std::vector<at::Tensor> hin, std::vector<at::Tensor> xo, std::vector<at::Tensor> out,
    std::vector<at::Tensor> x, std::vector<at::Tensor> w_ih, std::vector<at::Tensor> w_hh,
    std::vector<at::Tensor> h0, std::vector<at::Tensor> c0, at::Tensor batch_sizes,
    std::vector<at::Tensor> rec_mask, bool need_dx, bool need_dw, bool need_bias,
    int64_t chunk);
// The element-wise scan of the cells that read no h_{t-1} (scan.cpp): forward
// -> {out (T,B,D*H), h_n (D,B,H), c_n (D,B,H), cs (memories, empty unless save)}, laid out like
// proj; backward -> {d_proj, d_c0, d_bias (empty unless bias_grad)}.  spec: Variant.kernel_spec
// of a cell whose gates read no h_{t-1} (decoded by kernel_spec.h decode_scan_spec).
std::vector<at::Tensor> scan_forward(int64_t spec, bool highway, const at::Tensor& proj,
                                     const at::Tensor& h0, const at::Tensor& c0,
                                     const at::Tensor& batch_sizes, bool save,
                                     const c10::optional<at::Tensor>& bias);
std::vector<at::Tensor> scan_backward(int64_t spec, bool highway, const at::Tensor& g_out,
                                      const at::Tensor& g_hn, const at::Tensor& g_cn,
                                      const at::Tensor& proj, const at::Tensor& c0,
                                      const at::Tensor& cs, const at::Tensor& batch_sizes,
                                      const c10::optional<at::Tensor>& bias, bool bias_grad);
// A weight gradient g^T in, for g (rows, M) and in (rows, K) (layer_plain.cpp).
at::Tensor weight_grad(const at::Tensor& g, const at::Tensor& in);

}  // namespace rnn_ablations
