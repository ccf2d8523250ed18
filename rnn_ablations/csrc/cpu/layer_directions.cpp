// Both directions of a bidirectional layer at once: the plain entry points (layer_plain.cpp) of
// the two directions submitted together and run concurrently, one direction per thread, inside
// one at::parallel_for over the directions.  There is one fork/join per layer call (forward or
// backward), not one per time step: each direction runs its whole recurrence on its own thread.
// Inside the parallel region ATen's nested parallel_for (the element-wise pass, the packed step
// GEMM's panels) and MKL run single-threaded, so each direction owns one core; with one thread
// the directions run one after the other, which computes the same numbers.
//
// Two forms, as for one direction: from the input projections (rnn_*_directions: the caller,
// rnn_ablations/kernels/autograd.py, computes both directions' projections before, as large GEMMs
// on all threads, and their input / w_ih gradients after), or from the layer input
// (pipelined_directions_*: each direction's pipelined entry point, whose two roles then run one
// after the other on the direction's thread, projecting each chunk of steps just before the
// recurrence reaches it, and computing the input and weight gradients in the backward).

#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <ATen/Parallel.h>

#include <atomic>
#include <cstdint>
#include <utility>
#include <vector>

#include "entry_points.h"
#include "thread_modes.h"

namespace rnn_ablations {

namespace {

// Run f(d) for d in [0, n) concurrently, one direction per thread where there are threads.  The
// threads claim the directions from a counter instead of being handed one each: on a busy
// machine a thread of the team that starts late finds the work taken and leaves, instead of
// the call waiting for it (the numbers do not depend on which thread runs a direction).  The
// caller's grad and inference modes are carried into the team's threads (thread_modes.h), so
// that a call made under torch.inference_mode() may write its inference tensors there too.  An exception in one
// direction is rethrown here after the others finished (at::parallel_for collects it).
template <class F>
void for_each_direction(int64_t n, const F& f) {
  const CallerModes modes;
  std::atomic<int64_t> next{0};
  at::parallel_for(0, n, 1, [&](int64_t, int64_t) {
    CallerModesGuard guard(modes);
    for (int64_t d = next.fetch_add(1); d < n; d = next.fetch_add(1)) f(d);
  });
}

void check_count(size_t got, size_t n, const char* name, const char* who) {
  TORCH_CHECK(got == n, who, ": ", name, " must be a list of one tensor per direction (", n,
              "), got ", got);
}

}  // namespace

std::vector<std::vector<at::Tensor>> plain_directions_forward(
    int64_t spec, bool highway, std::vector<at::Tensor> proj, std::vector<at::Tensor> w_hh,
    std::vector<at::Tensor> h0, std::vector<at::Tensor> c0, at::Tensor batch_sizes,
    std::vector<at::Tensor> rec_mask, bool keep_hin, bool in_place) {
  const char* who = "rnn_ablations kernel (directions)";
  const size_t n = proj.size();
  TORCH_CHECK(n >= 1, who, ": proj must hold one tensor per direction");
  check_count(w_hh.size(), n, "w_hh", who);
  check_count(h0.size(), n, "h0", who);
  check_count(c0.size(), n, "c0", who);
  check_count(rec_mask.size(), n, "rec_mask", who);
  for (size_t d = 1; d < n; ++d) {
    TORCH_CHECK(proj[d].sizes() == proj[0].sizes() && w_hh[d].sizes() == w_hh[0].sizes(), who,
                ": the directions must have the same shapes");
  }
  std::vector<std::vector<at::Tensor>> result(n);
  for_each_direction(static_cast<int64_t>(n), [&](int64_t d) {
    result[d] = plain_forward(spec, highway, proj[d], w_hh[d], h0[d], c0[d], batch_sizes,
                            rec_mask[d], keep_hin, in_place);
  });
  return result;
}

std::vector<std::vector<at::Tensor>> plain_directions_backward(
    int64_t spec, bool highway, std::vector<at::Tensor> grad_out, std::vector<at::Tensor> grad_hn,
    std::vector<at::Tensor> grad_cn, std::vector<at::Tensor> gates, std::vector<at::Tensor> cs,
    std::vector<at::Tensor> hin, std::vector<at::Tensor> out, std::vector<at::Tensor> proj,
    std::vector<at::Tensor> w_hh, std::vector<at::Tensor> h0, std::vector<at::Tensor> c0,
    at::Tensor batch_sizes, std::vector<at::Tensor> rec_mask) {
  const char* who = "rnn_ablations kernel (directions, backward)";
  const size_t n = out.size();
  TORCH_CHECK(n >= 1, who, ": out must hold one tensor per direction");
  for (const auto& named : std::vector<std::pair<const char*, size_t>>{
           {"grad_out", grad_out.size()}, {"grad_hn", grad_hn.size()},
           {"grad_cn", grad_cn.size()}, {"gates", gates.size()}, {"cs", cs.size()},
           {"hin", hin.size()}, {"proj", proj.size()}, {"w_hh", w_hh.size()},
           {"h0", h0.size()}, {"c0", c0.size()}, {"rec_mask", rec_mask.size()}}) {
    check_count(named.second, n, named.first, who);
  }
  std::vector<std::vector<at::Tensor>> result(n);
  for_each_direction(static_cast<int64_t>(n), [&](int64_t d) {
    // The backward's ATen calls must not be recorded (the caller is autograd's backward, but
    // grad mode is per thread).
    at::NoGradGuard no_grad;
    result[d] = plain_backward(spec, highway, grad_out[d], grad_hn[d], grad_cn[d], gates[d], cs[d],
                             hin[d], out[d], proj[d], w_hh[d], h0[d], c0[d], batch_sizes,
                             rec_mask[d]);
  });
  return result;
}

std::vector<std::vector<at::Tensor>> pipelined_directions_forward(
    int64_t spec, bool highway, std::vector<at::Tensor> x, std::vector<at::Tensor> w_ih,
    std::vector<at::Tensor> bias, std::vector<at::Tensor> w_hh, std::vector<at::Tensor> h0,
    std::vector<at::Tensor> c0, at::Tensor batch_sizes, std::vector<at::Tensor> rec_mask,
    bool keep_hin, int64_t chunk) {
  const char* who = "rnn_ablations kernel (pipelined directions)";
  const size_t n = x.size();
  TORCH_CHECK(n >= 1, who, ": x must hold one tensor per direction");
  for (const auto& named : std::vector<std::pair<const char*, size_t>>{
           {"w_ih", w_ih.size()}, {"bias", bias.size()}, {"w_hh", w_hh.size()},
           {"h0", h0.size()}, {"c0", c0.size()}, {"rec_mask", rec_mask.size()}}) {
    check_count(named.second, n, named.first, who);
  }
  for (size_t d = 1; d < n; ++d) {
    TORCH_CHECK(x[d].sizes() == x[0].sizes() && w_ih[d].sizes() == w_ih[0].sizes() &&
                    w_hh[d].sizes() == w_hh[0].sizes(),
                who, ": the directions must have the same shapes");
  }
  // Inside the parallel region each direction's pipeline runs its two roles one after the
  // other on its thread: the recurrence projects each chunk of steps just before it runs it.
  std::vector<std::vector<at::Tensor>> result(n);
  for_each_direction(static_cast<int64_t>(n), [&](int64_t d) {
    result[d] = pipelined_forward(spec, highway, x[d], w_ih[d], bias[d], w_hh[d], h0[d], c0[d],
                              batch_sizes, rec_mask[d], keep_hin, chunk);
  });
  return result;
}

std::vector<std::vector<at::Tensor>> pipelined_directions_backward(
    int64_t spec, bool highway, std::vector<at::Tensor> grad_out, std::vector<at::Tensor> grad_hn,
    std::vector<at::Tensor> grad_cn, std::vector<at::Tensor> gates, std::vector<at::Tensor> cs,
    std::vector<at::Tensor> hin, std::vector<at::Tensor> xo, std::vector<at::Tensor> out,
    std::vector<at::Tensor> x, std::vector<at::Tensor> w_ih, std::vector<at::Tensor> w_hh,
    std::vector<at::Tensor> h0, std::vector<at::Tensor> c0, at::Tensor batch_sizes,
    std::vector<at::Tensor> rec_mask, bool need_dx, bool need_dw, bool need_bias,
    int64_t chunk) {
  const char* who = "rnn_ablations kernel (pipelined directions, backward)";
  const size_t n = out.size();
  TORCH_CHECK(n >= 1, who, ": out must hold one tensor per direction");
  for (const auto& named : std::vector<std::pair<const char*, size_t>>{
           {"grad_out", grad_out.size()}, {"grad_hn", grad_hn.size()},
           {"grad_cn", grad_cn.size()}, {"gates", gates.size()}, {"cs", cs.size()},
           {"hin", hin.size()}, {"xo", xo.size()}, {"x", x.size()}, {"w_ih", w_ih.size()},
           {"w_hh", w_hh.size()}, {"h0", h0.size()}, {"c0", c0.size()},
           {"rec_mask", rec_mask.size()}}) {
    check_count(named.second, n, named.first, who);
  }
  std::vector<std::vector<at::Tensor>> result(n);
  for_each_direction(static_cast<int64_t>(n), [&](int64_t d) {
    at::NoGradGuard no_grad;
    result[d] = pipelined_backward(spec, highway, grad_out[d], grad_hn[d], grad_cn[d], gates[d],
                               cs[d], hin[d], xo[d], out[d], x[d], w_ih[d], w_hh[d], h0[d],
                               c0[d], batch_sizes, rec_mask[d], need_dx, need_dw, need_bias,
                               chunk);
  });
  return result;
}

}  // namespace rnn_ablations
