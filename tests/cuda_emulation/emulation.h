// The CUDA execution model on the CPU, as far as the package's kernels (rnn_ablations/csrc/cuda)
// use it, so that the host C++ compiler compiles the SAME device sources and the tests run them
// (tests/cuda_emulation/emulator.py builds and loads them).  Included before the device headers.
//
//   threadIdx, blockIdx, blockDim, gridDim   thread-local: each emulated CUDA thread has its own
//   __syncthreads                            a barrier of the block's threads
//   __shfl_xor_sync                          an exchange among the 32 lanes of a warp (each lane
//                                            writes its value, the warp meets, each reads its
//                                            partner's, the warp meets again)
//   dynamic shared memory                    one buffer per block (RNN_ABLATIONS_DYNAMIC_SMEM),
//                                            filled with 0xFF bytes (NaN) at the launch, so that a
//                                            read of an entry no thread wrote shows
//   atomicAdd, __threadfence, __ldcg         GCC's atomics and fences (sequentially consistent)
//   __float_as_uint, __uint_as_float, min, the math functions of <math.h>
//   RNN_ABLATIONS_SPIN_EXPIRED(spins)        the watchdog of a spin wait (the persistent kernels'
//                                            grid barrier): true once the wait has lasted
//                                            `watchdog_ms` (then every later wait of the launch
//                                            ends at once too, the launch returns 3 and the
//                                            emulator raises CudaDriverError naming the wait);
//                                            on a GPU the device code's default, false
//
// How a grid runs (run_grid): kernels that do not synchronise (the step and scan kernels) run
// their threads one after the other in a loop.  Kernels that synchronise (the persistent ones:
// __syncthreads, shuffles, a grid barrier) run every block of the grid at once, each on an OS
// thread of its own (a grid barrier needs every block resident, as a cooperative launch
// guarantees), and within a block either
//   * one OS thread per CUDA thread (Mode::kThreads), or
//   * one fiber (ucontext) per CUDA thread, switched at the barriers only (Mode::kFibers, the
//     default: the same results at a fraction of the cost of waking 512 OS threads per
//     barrier; a block whose threads wait at different barriers is reported, not hung).
#pragma once

#include <math.h>
#include <pthread.h>
#include <ucontext.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#define RNN_ABLATIONS_EMULATION 1
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __grid_constant__
#define __launch_bounds__(...)
#define __align__(n) alignas(n)

struct dim3 {
  unsigned int x = 1, y = 1, z = 1;
};

inline thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;

namespace rnn_emu {

[[noreturn]] inline void fail(const char* what);

// The watchdog (emulation_set_watchdog): the longest a wait may last, in milliseconds.
inline std::atomic<long long> watchdog_ms{20000};
inline long long watchdog_ms_of_barriers() { return watchdog_ms.load(); }
[[noreturn]] inline void fail_barrier() {
  fail("deadlock: a __syncthreads or shuffle of the OS-thread mode waited longer than the "
       "watchdog (a barrier that not every thread of the block or warp reaches)");
}

// A reusable barrier of n threads: the last to arrive opens the next generation and wakes the
// others (futex-backed std::atomic wait; a thread that arrives for the next round cannot overtake
// the waiters of this one, they wait for a generation change only).
class Barrier {
 public:
  void reset(unsigned int n) { n_ = n; count_.store(0); generation_.store(0); }
  void wait() {
    const unsigned int gen = generation_.load(std::memory_order_acquire);
    if (count_.fetch_add(1, std::memory_order_acq_rel) + 1 == n_) {
      count_.store(0, std::memory_order_relaxed);
      generation_.store(gen + 1, std::memory_order_release);
      generation_.notify_all();
      return;
    }
    for (int spin = 0; spin < 64; ++spin) {
      if (generation_.load(std::memory_order_acquire) != gen) return;
    }
    // a bounded wait: a barrier that some thread never reaches fails instead of hanging
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(
        std::max<long long>(watchdog_ms_of_barriers(), 1));
    while (generation_.load(std::memory_order_acquire) == gen) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      if (std::chrono::steady_clock::now() > deadline)
        fail_barrier();
    }
  }

 private:
  unsigned int n_ = 0;
  std::atomic<unsigned int> count_{0};
  std::atomic<unsigned int> generation_{0};
};

// A barrier of the fibers of one OS thread (no locking: they never run at the same time).
struct FiberBarrier {
  unsigned int n = 0, count = 0, generation = 0;
};

struct Fiber {
  ucontext_t context;
  std::unique_ptr<char[]> stack;
  dim3 tid;
  bool done = false;
  const unsigned int* wait_on = nullptr;  // a FiberBarrier's generation it waits to change
  unsigned int wait_generation = 0;
};

enum class Mode { kThreads = 0, kFibers = 1 };
inline std::atomic<int> mode{static_cast<int>(Mode::kFibers)};

// What the threads of one block share.
struct Block {
  bool fibers = false;
  Barrier barrier;                   // __syncthreads (OS threads)
  std::vector<Barrier> warps;        // one per warp: __shfl_xor_sync (OS threads)
  FiberBarrier fiber_barrier;        // the same for fibers
  std::vector<FiberBarrier> fiber_warps;
  std::vector<uint64_t> lanes;       // per warp, two banks of 32 exchange slots
  std::vector<unsigned char> bank;   // per thread: the bank of its next exchange
  unsigned char* smem = nullptr;     // dynamic shared memory
  ucontext_t scheduler;              // fibers: the block's OS thread
};

inline thread_local Block* current_block = nullptr;
inline thread_local Fiber* current_fiber = nullptr;

[[noreturn]] inline void fail(const char* what) {
  std::fprintf(stderr, "CUDA emulation: %s\n", what);
  std::abort();
}

inline Block& block() {
  if (current_block == nullptr)
    fail("a kernel that synchronises ran as a loop (emulation_launch runs it threaded only "
         "when its entry says so)");
  return *current_block;
}

inline unsigned char* dynamic_shared_memory() { return block().smem; }

// The spin watchdog: a launch's waits share `expired` (set by the first wait that lasts longer
// than watchdog_ms; every later wait then ends at once, so the launch finishes and reports it).
inline std::atomic<bool> expired{false};
inline thread_local std::chrono::steady_clock::time_point spin_start;

inline bool spin_expired(unsigned int spins) {
  if (spins == 0) {
    spin_start = std::chrono::steady_clock::now();
    return expired.load(std::memory_order_relaxed);
  }
  if ((spins & 63u) != 0) return false;
  sched_yield();  // a spinning block leaves the CPU to the blocks it waits for
  if (expired.load(std::memory_order_relaxed)) return true;
  if (std::chrono::steady_clock::now() - spin_start > std::chrono::milliseconds(watchdog_ms.load())) {
    expired.store(true);
    return true;
  }
  return false;
}

// Fibers: wait until the barrier's last thread arrives (the scheduler resumes this fiber once
// the generation changed).
inline void fiber_wait(Block& b, FiberBarrier& bar) {
  const unsigned int generation = bar.generation;
  if (++bar.count == bar.n) {
    bar.count = 0;
    ++bar.generation;
    return;
  }
  Fiber* self = current_fiber;
  self->wait_on = &bar.generation;
  self->wait_generation = generation;
  swapcontext(&self->context, &b.scheduler);
  self->wait_on = nullptr;
}

inline void block_barrier() {
  Block& b = block();
  if (b.fibers) fiber_wait(b, b.fiber_barrier);
  else b.barrier.wait();
}

inline void warp_barrier(unsigned int warp) {
  Block& b = block();
  if (b.fibers) fiber_wait(b, b.fiber_warps[warp]);
  else b.warps[warp].wait();
}

}  // namespace rnn_emu

#define RNN_ABLATIONS_DYNAMIC_SMEM(name) unsigned char* const name = ::rnn_emu::dynamic_shared_memory()
#define RNN_ABLATIONS_SPIN_EXPIRED(spins) ::rnn_emu::spin_expired(spins)

inline void __syncthreads() { rnn_emu::block_barrier(); }

// Two banks of slots, used in turn: a lane that writes its next value has passed the barrier of
// its previous exchange, which every lane reached after reading that exchange's bank, so one
// barrier per exchange suffices.
template <typename T>
inline T __shfl_xor_sync(unsigned int mask, T value, int lane_mask, int width = 32) {
  static_assert(sizeof(T) <= sizeof(uint64_t), "__shfl_xor_sync: at most 8 bytes");
  if (mask != 0xffffffffu || width != 32) rnn_emu::fail("__shfl_xor_sync: only full warps");
  rnn_emu::Block& b = rnn_emu::block();
  const unsigned int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  unsigned char& bank = b.bank[threadIdx.x];
  uint64_t* slots = b.lanes.data() + (warp * 2 + bank) * 32;
  bank ^= 1;
  std::memcpy(&slots[lane], &value, sizeof(T));
  rnn_emu::warp_barrier(warp);
  T got;
  std::memcpy(&got, &slots[(lane ^ static_cast<unsigned int>(lane_mask)) % 32], sizeof(T));
  return got;
}

inline unsigned int atomicAdd(unsigned int* p, unsigned int v) {
  return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}
inline int atomicAdd(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __nanosleep(unsigned int) { sched_yield(); }

template <typename T>
inline T __ldcg(const T* p) {
  T v;
  __atomic_load(p, &v, __ATOMIC_ACQUIRE);
  return v;
}

inline unsigned int __float_as_uint(float f) {
  unsigned int u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}
inline float __uint_as_float(unsigned int u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

template <typename T>
inline T min(T a, T b) { return b < a ? b : a; }
template <typename T>
inline T max(T a, T b) { return a < b ? b : a; }

namespace rnn_emu {

// Calls a kernel with the arguments of a launch's kernelParams (each entry points at one
// argument, of the kernel's parameter type).
template <typename... Args, size_t... I>
inline void invoke(void (*f)(Args...), void** params, std::index_sequence<I...>) {
  f(*static_cast<std::remove_cv_t<Args>*>(params[I])...);
}

template <typename... Args>
inline void invoke(void (*f)(Args...), void** params) {
  invoke(f, params, std::index_sequence_for<Args...>());
}

template <auto F>
void call(void** params) { invoke(F, params); }

// One kernel instantiation: its name (programs.Program.name), how to call it, and whether its
// threads synchronise (then each runs on an OS thread of its own).
struct Entry {
  const char* name;
  void (*run)(void**);
  bool threaded;
};

inline std::atomic<long long> launch_count{0};

struct Start {  // the threads of a launch start together, or not at all
  std::mutex mutex;
  std::condition_variable cv;
  bool open = false, cancelled = false;
};

struct ThreadArgs {
  void (*run)(void**);
  void** params;
  Block* block;
  Start* start;
  dim3 tid, bid, bdim, gdim;
};

inline bool wait_for_start(Start* start) {
  std::unique_lock<std::mutex> lock(start->mutex);
  start->cv.wait(lock, [&] { return start->open; });
  return !start->cancelled;
}

inline void* thread_main(void* p) {  // one CUDA thread (Mode::kThreads)
  const ThreadArgs& a = *static_cast<ThreadArgs*>(p);
  if (!wait_for_start(a.start)) return nullptr;
  threadIdx = a.tid;
  blockIdx = a.bid;
  blockDim = a.bdim;
  gridDim = a.gdim;
  current_block = a.block;
  a.run(a.params);
  current_block = nullptr;
  return nullptr;
}

inline thread_local const ThreadArgs* fiber_args = nullptr;

inline void fiber_main() {
  fiber_args->run(fiber_args->params);
  current_fiber->done = true;  // returns to the scheduler (uc_link)
}

inline void* block_main(void* p) {  // one block, its threads as fibers (Mode::kFibers)
  const ThreadArgs& a = *static_cast<ThreadArgs*>(p);
  if (!wait_for_start(a.start)) return nullptr;
  blockIdx = a.bid;
  blockDim = a.bdim;
  gridDim = a.gdim;
  current_block = a.block;
  fiber_args = &a;
  Block& b = *a.block;
  const size_t stack = 128 * 1024;
  std::vector<Fiber> fibers(a.bdim.x);
  for (unsigned int t = 0; t < a.bdim.x; ++t) {
    Fiber& f = fibers[t];
    f.tid = dim3{t, 0, 0};
    f.stack.reset(new char[stack]);
    getcontext(&f.context);
    f.context.uc_stack.ss_sp = f.stack.get();
    f.context.uc_stack.ss_size = stack;
    f.context.uc_link = &b.scheduler;
    makecontext(&f.context, fiber_main, 0);
  }
  for (;;) {
    bool running = false, progressed = false;
    for (Fiber& f : fibers) {
      if (f.done) continue;
      running = true;
      if (f.wait_on != nullptr && *f.wait_on == f.wait_generation) continue;
      current_fiber = &f;
      threadIdx = f.tid;
      swapcontext(&b.scheduler, &f.context);
      progressed = true;
    }
    if (!running) break;
    if (!progressed)
      fail("deadlock: the threads of a block wait at different barriers (a __syncthreads or "
           "a shuffle that not every thread of the block or warp reaches)");
  }
  current_fiber = nullptr;
  current_block = nullptr;
  return nullptr;
}

// Runs a grid of `grid` blocks of `block` threads; 0, or an error code (2: an OS thread could
// not be created; 3: a spin wait outlasted the watchdog).
inline int run_grid_once(const Entry& e, unsigned int grid, unsigned int block, size_t smem,
                         void** params);

inline int run_grid(const Entry& e, unsigned int grid, unsigned int block, size_t smem,
                    void** params) {
  expired.store(false);
  const int status = run_grid_once(e, grid, block, smem, params);
  if (status == 0 && expired.load()) return 3;
  return status;
}

inline int run_grid_once(const Entry& e, unsigned int grid, unsigned int block, size_t smem,
                         void** params) {
  launch_count.fetch_add(1);
  dim3 gdim, bdim;
  gdim.x = grid;
  bdim.x = block;
  if (!e.threaded) {
    for (unsigned int b = 0; b < grid; ++b)
      for (unsigned int t = 0; t < block; ++t) {
        threadIdx = dim3{t, 0, 0};
        blockIdx = dim3{b, 0, 0};
        blockDim = bdim;
        gridDim = gdim;
        e.run(params);
      }
    return 0;
  }
  const bool fibers = mode.load() == static_cast<int>(Mode::kFibers);
  const unsigned int warps = (block + 31) / 32;
  std::unique_ptr<Block[]> blocks(new Block[grid]);
  std::vector<std::unique_ptr<unsigned char, decltype(&std::free)>> memories;
  for (unsigned int b = 0; b < grid; ++b) {
    Block& blk = blocks[b];
    blk.fibers = fibers;
    blk.barrier.reset(block);
    blk.warps = std::vector<Barrier>(warps);
    blk.fiber_barrier.n = block;
    blk.fiber_warps = std::vector<FiberBarrier>(warps);
    for (unsigned int w = 0; w < warps; ++w) {
      blk.warps[w].reset(std::min(32u, block - 32 * w));
      blk.fiber_warps[w].n = std::min(32u, block - 32 * w);
    }
    blk.lanes.assign(static_cast<size_t>(warps) * 64, 0);
    blk.bank.assign(block, 0);
    const size_t bytes = (std::max<size_t>(smem, 16) + 15) / 16 * 16;
    memories.emplace_back(static_cast<unsigned char*>(std::aligned_alloc(16, bytes)), &std::free);
    std::memset(memories.back().get(), 0xFF, bytes);
    blk.smem = memories.back().get();
  }
  Start start;
  const unsigned int per_block = fibers ? 1 : block;
  std::vector<ThreadArgs> args(static_cast<size_t>(grid) * per_block);
  std::vector<pthread_t> threads;
  threads.reserve(args.size());
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 256 * 1024);
  int status = 0;
  for (unsigned int b = 0; b < grid && status == 0; ++b)
    for (unsigned int t = 0; t < per_block; ++t) {
      ThreadArgs& a = args[static_cast<size_t>(b) * per_block + t];
      a = ThreadArgs{e.run, params, &blocks[b], &start, dim3{t, 0, 0}, dim3{b, 0, 0}, bdim, gdim};
      pthread_t th;
      if (pthread_create(&th, &attr, fibers ? block_main : thread_main, &a) != 0) {
        status = 2;
        break;
      }
      threads.push_back(th);
    }
  pthread_attr_destroy(&attr);
  {
    std::lock_guard<std::mutex> lock(start.mutex);
    start.open = true;
    start.cancelled = status != 0;
  }
  start.cv.notify_all();
  for (pthread_t th : threads) pthread_join(th, nullptr);
  return status;
}

}  // namespace rnn_emu
