// What a kernel's worker threads inherit from the calling thread: grad mode, inference mode and
// the profiler's state, nothing else; and, like the calling thread inside a kernel, they
// dispatch below autograd.
//
// at::parallel_for does not carry thread-local state into its team.  The kernels need some of
// it there: inference mode (under torch.inference_mode() the workers write inference tensors,
// which ATen refuses outside inference mode), grad mode, and the profiler's (its RecordFunction
// callbacks and debug info, C++ state), so that torch.profiler records the workers' products as
// it records the caller's.  Copying the whole at::ThreadLocalState instead would also copy the
// caller's Python-level state (dispatch modes, saved-tensor hooks, torch-function modes), which
// takes the GIL: with the GIL held by the waiting caller that is a deadlock.  The workers get
// exactly the pieces above, so no Python mode or hook a caller installs reaches them, and the
// bindings release the GIL for the whole call.
// The kernels' own ATen calls are never autograd operations (the autograd wrappers own the
// gradient), so the workers, like the entry points on the calling thread, skip the autograd and
// ADInplaceOrView dispatch keys: the step loops make many small views and products, and each
// would otherwise pay for autograd's bookkeeping.
#pragma once

#include <ATen/core/grad_mode.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/record_function.h>
#include <c10/core/InferenceMode.h>
#include <c10/util/ThreadLocalDebugInfo.h>

#include <memory>

namespace rnn_ablations {

// The calling thread's modes, captured where the kernel is entered.
struct CallerModes {
  bool grad = at::GradMode::is_enabled();
  bool inference = c10::InferenceMode::is_enabled();
  at::RecordFunctionTLS record_function = at::get_record_function_tls_();
  std::shared_ptr<c10::ThreadLocalDebugInfo> debug_info = c10::ThreadLocalDebugInfo::current();
};

// Sets a worker thread's modes to the caller's for its lifetime, and restores them after.
// InferenceMode(false) puts a thread into normal mode with grad enabled; the grad-mode guard
// (constructed second, destroyed first) then applies the caller's grad mode.
class CallerModesGuard {
 public:
  explicit CallerModesGuard(const CallerModes& modes)
      : inference_(modes.inference), grad_(modes.grad), debug_info_(modes.debug_info),
        record_function_(at::get_record_function_tls_()) {
    at::set_record_function_tls_(modes.record_function);
  }
  ~CallerModesGuard() { at::set_record_function_tls_(record_function_); }
  CallerModesGuard(const CallerModesGuard&) = delete;
  CallerModesGuard& operator=(const CallerModesGuard&) = delete;

 private:
  c10::InferenceMode inference_;
  at::AutoGradMode grad_;
  at::AutoDispatchBelowADInplaceOrView below_autograd_;
  c10::DebugInfoGuard debug_info_;
  at::RecordFunctionTLS record_function_;  // the worker's own, restored on exit
};

}  // namespace rnn_ablations
