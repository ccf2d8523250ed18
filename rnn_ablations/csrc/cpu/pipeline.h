// The two-role pipeline of the pipelined entry points (layer_pipelined.cpp).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>

#include "thread_modes.h"

namespace rnn_ablations {
namespace cpu {

// Two-role pipeline.  Role 0 runs the recurrence (inherently sequential, small GEMMs); role 1
// runs the large GEMMs that do not depend on the next step (input projections of later chunks
// of steps in the forward pass; input and weight gradients of finished chunks in the backward
// pass) on the other core at the same time.  Both roles run inside one at::parallel_for of two
// items, i.e. in torch's own OpenMP team; ATen and MKL calls inside a parallel region run
// single-threaded, so each role owns one core.  With one thread the two roles run one after the
// other, and the schedule below is still correct (role 0 never waits for work that only role 1
// can do: it claims unstarted chunks itself).
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

struct Pipeline {
  explicit Pipeline(int64_t chunks) : done(new std::atomic<int>[std::max<int64_t>(chunks, 1)]) {
    for (int64_t i = 0; i < std::max<int64_t>(chunks, 1); ++i) done[i].store(0);
  }
  std::unique_ptr<std::atomic<int>[]> done;  // chunk finished (projected / back-propagated)
  std::atomic<int64_t> next{0};               // next unclaimed chunk or task
  std::atomic<bool> failed{false};            // a role threw: the other stops waiting

  // Wait for chunk k; false when the other role failed.
  bool wait(int64_t k) {
    int64_t spins = 0;
    while (!done[k].load(std::memory_order_acquire)) {
      if (failed.load(std::memory_order_relaxed)) return false;
      if (++spins < 4096) cpu_relax(); else std::this_thread::yield();
    }
    return true;
  }

  // The caller's grad and inference modes are carried into the team's threads, and nothing else
  // of its thread-local state (thread_modes.h).
  template <class F0, class F1>
  void run(F0&& role0, F1&& role1) {
    const CallerModes modes;
    at::parallel_for(0, 2, 1, [&](int64_t begin, int64_t end) {
      CallerModesGuard guard(modes);
      for (int64_t r = begin; r < end; ++r) {
        try {
          at::NoGradGuard no_grad;  // grad mode is thread-local: off in the team's threads too
          if (r == 0) role0(); else role1();
        } catch (...) {
          failed.store(true);
          throw;
        }
      }
    });
    TORCH_CHECK(!failed.load(), "rnn_ablations kernel: a pipeline role failed");
  }
};

inline int64_t auto_chunk(int64_t T, int64_t B, int64_t chunk) {
  if (chunk > 0) return std::min(chunk, std::max<int64_t>(T, 1));
  // about 256 rows per GEMM, and at least 4 chunks so that the roles overlap (an empty batch
  // has nothing to project: one step per chunk)
  int64_t c = B > 0 ? std::max<int64_t>(1, (256 + B - 1) / B) : 1;
  return std::max<int64_t>(1, std::min(c, T / 4));
}

}  // namespace cpu
}  // namespace rnn_ablations
