#include "kernels/cuda/emu/block_scheduler.h"

#include <dlfcn.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cuda/emu/cuda_emu.h"

#if !defined(__x86_64__)
#error "the CUDA emulator's fiber switch (below) is written for x86-64"
#endif

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define HS_EMU_ASAN 1
#endif
#endif
#if !defined(HS_EMU_ASAN) && defined(__SANITIZE_ADDRESS__)
#define HS_EMU_ASAN 1
#endif
#if !defined(HS_EMU_ASAN)
#define HS_EMU_ASAN 0
#endif
#if HS_EMU_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

// ---- Fiber switch ----
//
// hs_cuda_emu_switch(save_sp, new_sp) saves the callee-saved registers, MXCSR
// and the x87 control word on the current stack, stores the stack pointer in
// *save_sp, loads new_sp and restores the same frame from there: a function
// call, no syscall (swapcontext would call sigprocmask on every switch).
// A new fiber's stack is laid out as such a frame whose return address is
// hs_cuda_emu_fiber_start, which calls r13(r12) and never returns.
extern "C" {
void hs_cuda_emu_switch(void** save_sp, void* new_sp);
void hs_cuda_emu_fiber_start();
}

asm(R"(
    .pushsection .text
    .p2align 4
    .globl hs_cuda_emu_switch
    .hidden hs_cuda_emu_switch
    .type hs_cuda_emu_switch, @function
hs_cuda_emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $16, %rsp
    stmxcsr 8(%rsp)
    fnstcw (%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr 8(%rsp)
    fldcw (%rsp)
    addq $16, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size hs_cuda_emu_switch, .-hs_cuda_emu_switch

    .p2align 4
    .globl hs_cuda_emu_fiber_start
    .hidden hs_cuda_emu_fiber_start
    .type hs_cuda_emu_fiber_start, @function
hs_cuda_emu_fiber_start:
    movq %r12, %rdi
    callq *%r13
    ud2
    .size hs_cuda_emu_fiber_start, .-hs_cuda_emu_fiber_start
    .popsection
)");

// Bounds of the section holding every __shared__ variable (cuda_emu.h), set
// by the linker; weak, so null where no linked kernel has one.
extern "C" {
extern unsigned char __start_hs_cuda_emu_shared[] __attribute__((weak));
extern unsigned char __stop_hs_cuda_emu_shared[] __attribute__((weak));
}

namespace hybridserve::kernels::cuda_emu {

thread_local uint3 threadIdx;
thread_local uint3 blockIdx;
thread_local dim3 blockDim;
thread_local dim3 gridDim;

namespace internal {

void Fatal(const char* format, ...) {
  std::fflush(stdout);
  std::fputs("cuda_emu: ", stderr);
  va_list args;
  va_start(args, format);
  std::vfprintf(stderr, format, args);
  va_end(args);
  std::fputc('\n', stderr);
  std::fflush(stderr);
  std::abort();
}

uint64_t SeedFromEnvironment() {
  const char* seed = std::getenv("HS_CUDA_EMU_SEED");
  if (seed == nullptr || seed[0] == '\0') return kDefaultSeed;
  char* end = nullptr;
  const uint64_t value = std::strtoull(seed, &end, 0);
  if (end == seed || *end != '\0') Fatal("HS_CUDA_EMU_SEED=%s: expected an unsigned integer", seed);
  return value;
}

namespace {

// ---- Scheduling order (HS_CUDA_EMU_ORDER, HS_CUDA_EMU_SEED) ----

struct OrderConfig {
  ScheduleOrder order = ScheduleOrder::kAscending;
  uint64_t seed = kDefaultSeed;
};

OrderConfig ConfigFromEnvironment() {
  OrderConfig config;
  const char* order = std::getenv("HS_CUDA_EMU_ORDER");
  if (order != nullptr && order[0] != '\0') {
    if (std::strcmp(order, "ascending") == 0) {
      config.order = ScheduleOrder::kAscending;
    } else if (std::strcmp(order, "descending") == 0) {
      config.order = ScheduleOrder::kDescending;
    } else if (std::strcmp(order, "shuffle") == 0) {
      config.order = ScheduleOrder::kShuffle;
    } else {
      Fatal("HS_CUDA_EMU_ORDER=%s: expected ascending, descending or shuffle", order);
    }
  }
  config.seed = SeedFromEnvironment();
  return config;
}

// Read under the launch lock (RunGrid's precondition), so plain statics do.
OrderConfig& Config() {
  static OrderConfig config = ConfigFromEnvironment();
  return config;
}
// Launches since the configuration was set: each launch's shuffle stream is
// seeded from (seed, launch number), so a run is reproducible from its seed.
uint64_t& LaunchCount() {
  static uint64_t count = 0;
  return count;
}

constexpr size_t kFiberStackBytes = 256 * 1024;
constexpr unsigned int kFullMask = 0xffffffffu;

// ---- Contexts and fibers ----

// A stack to switch to or from. The ASan fields describe the stack for
// __sanitizer_start_switch_fiber; the host stack's are learned on the first
// switch away from it.
struct Context {
  void* sp = nullptr;
#if HS_EMU_ASAN
  const void* stack_bottom = nullptr;
  size_t stack_size = 0;
  void* fake_stack = nullptr;
#endif
};

#if HS_EMU_ASAN
// The context the running code switched away from: the resumed side reports
// its stack bounds to it (that is how the host context learns its own).
thread_local Context* t_switched_from = nullptr;
#endif

inline void SwitchContext(Context* from, Context* to) {
#if HS_EMU_ASAN
  t_switched_from = from;
  __sanitizer_start_switch_fiber(&from->fake_stack, to->stack_bottom, to->stack_size);
#endif
  hs_cuda_emu_switch(&from->sp, to->sp);
#if HS_EMU_ASAN
  __sanitizer_finish_switch_fiber(from->fake_stack, &t_switched_from->stack_bottom, &t_switched_from->stack_size);
#endif
}

enum class ThreadState : uint8_t { kReady, kRunning, kAtBarrier, kAtWarp, kExited };

const char* StateName(ThreadState state) {
  switch (state) {
    case ThreadState::kReady:
      return "ready";
    case ThreadState::kRunning:
      return "running";
    case ThreadState::kAtBarrier:
      return "waits at __syncthreads()";
    case ThreadState::kAtWarp:
      return "waits at a warp collective";
    case ThreadState::kExited:
      return "has exited";
  }
  return "?";
}

class BlockScheduler;

// One emulated GPU thread's stack. Owned by the FiberPool of the host thread
// that created it; runs only on that host thread.
struct Fiber {
  Context context;
  void* mapping = nullptr;  // guard page + stack
  size_t mapping_bytes = 0;
  BlockScheduler* scheduler = nullptr;  // of the running launch
  uint3 index;                          // threadIdx
  int linear = 0;                       // linear thread id in the block
  ThreadState state = ThreadState::kExited;
  const uint64_t* warp_lanes = nullptr;  // result of the pending warp collective
};

[[noreturn]] void FiberMain(Fiber* self);

// The fibers of one host thread, reused across blocks and launches.
// Thread-compatible: used only by its own host thread.
class FiberPool {
 public:
  FiberPool() = default;
  FiberPool(const FiberPool&) = delete;
  FiberPool& operator=(const FiberPool&) = delete;
  ~FiberPool() {
    for (auto& fiber : fibers_) {
#if HS_EMU_ASAN
      // The suspended frames left redzones in the shadow; clear them so a later
      // mapping at this address starts clean.
      ASAN_UNPOISON_MEMORY_REGION(fiber->mapping, fiber->mapping_bytes);
#endif
      munmap(fiber->mapping, fiber->mapping_bytes);
    }
  }

  // The first `count` fibers, creating missing ones.
  Fiber* const* Get(size_t count) {
    while (fibers_.size() < count) fibers_.push_back(Create());
    pointers_.clear();
    for (size_t i = 0; i < count; ++i) pointers_.push_back(fibers_[i].get());
    return pointers_.data();
  }

 private:
  static std::unique_ptr<Fiber> Create() {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    auto fiber = std::make_unique<Fiber>();
    fiber->mapping_bytes = kFiberStackBytes + page;
    void* mapping =
        mmap(nullptr, fiber->mapping_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (mapping == MAP_FAILED) Fatal("mmap of a %zu-byte fiber stack failed", fiber->mapping_bytes);
    if (mprotect(mapping, page, PROT_NONE) != 0) Fatal("mprotect of a fiber stack's guard page failed");
    fiber->mapping = mapping;
    unsigned char* bottom = static_cast<unsigned char*>(mapping) + page;
    unsigned char* top = bottom + kFiberStackBytes;  // page aligned
#if HS_EMU_ASAN
    fiber->context.stack_bottom = bottom;
    fiber->context.stack_size = kFiberStackBytes;
#endif
    // The frame hs_cuda_emu_switch pops: x87 cw, mxcsr, r15, r14, r13, r12,
    // rbx, rbp, return address. After the `ret` rsp is 16-byte aligned, as
    // before a call.
    uint64_t* frame = reinterpret_cast<uint64_t*>(top - 88);
    uint32_t mxcsr = 0;
    uint16_t fpu_cw = 0;
    asm volatile("stmxcsr %0" : "=m"(mxcsr));
    asm volatile("fnstcw %0" : "=m"(fpu_cw));
    frame[0] = fpu_cw;
    frame[1] = mxcsr;
    frame[2] = 0;                                        // r15
    frame[3] = 0;                                        // r14
    frame[4] = reinterpret_cast<uint64_t>(&FiberMain);   // r13
    frame[5] = reinterpret_cast<uint64_t>(fiber.get());  // r12
    frame[6] = 0;                                        // rbx
    frame[7] = 0;                                        // rbp: ends frame-pointer unwinding
    frame[8] = reinterpret_cast<uint64_t>(&hs_cuda_emu_fiber_start);
    fiber->context.sp = frame;
    return fiber;
  }

  std::vector<std::unique_ptr<Fiber>> fibers_;
  std::vector<Fiber*> pointers_;
};

FiberPool& ThisThreadFiberPool() {
  thread_local FiberPool pool;
  return pool;
}

// ---- Block scheduler ----

void FormatIndex(char* out, size_t size, uint3 index) {
  std::snprintf(out, size, "(%u,%u,%u)", index.x, index.y, index.z);
}

// Runs the threads of one block after another as fibers on the calling host
// thread: each runs until it waits (__syncthreads, a warp collective) or
// exits; the last thread to arrive at a barrier releases the others. Runnable
// threads are resumed first in, first out; the threads that become runnable
// together (a "round": a block's start, a barrier's or a warp collective's
// release) are queued in the order `order` says. In ascending order the
// releasing thread goes on running ahead of its round (the historical
// behavior); in the other orders it is queued with its round, so the round's
// permutation is complete. Blocks of one launch reuse it. Thread-compatible
// (one host thread).
class BlockScheduler {
 public:
  BlockScheduler(const void* kernel, const std::function<void()>* body, dim3 block, ScheduleOrder order, uint64_t seed)
      : kernel_(kernel),
        body_(body),
        threads_(static_cast<int>(block.x * block.y * block.z)),
        order_(order),
        random_(seed) {
    fibers_ = ThisThreadFiberPool().Get(static_cast<size_t>(threads_));
    ready_.resize(static_cast<size_t>(threads_));
    round_.reserve(static_cast<size_t>(threads_));
    warps_.resize(static_cast<size_t>(threads_ / warpSize));
    for (int i = 0; i < threads_; ++i) {
      Fiber* fiber = fibers_[i];
      fiber->scheduler = this;
      fiber->linear = i;
      fiber->index.x = static_cast<unsigned int>(i) % block.x;
      fiber->index.y = static_cast<unsigned int>(i) / block.x % block.y;
      fiber->index.z = static_cast<unsigned int>(i) / (block.x * block.y);
    }
  }
  BlockScheduler(const BlockScheduler&) = delete;
  BlockScheduler& operator=(const BlockScheduler&) = delete;

  // Runs every thread of the block (blockIdx set by the caller) to its exit;
  // aborts on a deadlock.
  void RunBlock() {
    head_ = 0;
    size_ = 0;
    round_.assign(fibers_, fibers_ + threads_);
    PushRound();
    for (Warp& warp : warps_) warp.arrived = 0;
    live_ = threads_;
    at_barrier_ = 0;
    Fiber* first = Pop();
    Resume(first);
    SwitchContext(&host_, &first->context);
    current_ = nullptr;
    if (live_ != 0) ReportStuck();
  }

  // The body of a fiber's life per block: the kernel, then exit.
  void RunThread(Fiber* self) {
    (*body_)();
    self->state = ThreadState::kExited;
    --live_;
    if (at_barrier_ > 0 && at_barrier_ == live_) ReleaseBarrier(nullptr);
    SwitchAway(self);
  }

  void SyncThreads() {
    Fiber* self = current_;
    self->state = ThreadState::kAtBarrier;
    if (++at_barrier_ == live_) {
      ReleaseBarrier(self);
      if (self->state == ThreadState::kRunning) return;  // ascending: goes on ahead of its round
    }
    SwitchAway(self);
  }

  const uint64_t* WarpExchange(unsigned int mask, uint64_t bits) {
    Fiber* self = current_;
    if (mask != kFullMask) {
      char thread[48];
      FormatIndex(thread, sizeof(thread), self->index);
      char block[48];
      FormatIndex(block, sizeof(block), blockIdx);
      Fatal(
          "divergent warp collective: thread %s of block %s (kernel %s) called a warp collective with mask 0x%08x; "
          "only the full mask 0xffffffff is supported (all 32 lanes)",
          thread, block, KernelName().c_str(), mask);
    }
    Warp& warp = warps_[static_cast<size_t>(self->linear / warpSize)];
    uint64_t* lanes = warp.lanes[warp.parity];
    lanes[self->linear % warpSize] = bits;
    if (++warp.arrived == warpSize) {
      // Everyone has stored: the next collective of this warp writes the other
      // buffer, so slow lanes can still read this one.
      warp.arrived = 0;
      warp.parity ^= 1;
      const int first = self->linear / warpSize * warpSize;
      round_.clear();
      for (int i = first; i < first + warpSize; ++i) {
        Fiber* lane = fibers_[i];
        if (lane != self || order_ != ScheduleOrder::kAscending) round_.push_back(lane);
      }
      PushRound();
      if (order_ == ScheduleOrder::kAscending) return lanes;  // goes on ahead of its round
      SwitchAway(self);
      return lanes;
    }
    self->state = ThreadState::kAtWarp;
    self->warp_lanes = lanes;
    SwitchAway(self);
    return self->warp_lanes;
  }

 private:
  struct Warp {
    int arrived = 0;
    int parity = 0;
    uint64_t lanes[2][32] = {};
  };

  // Queues the fibers of round_ as ready, in the order order_ says (round_ is
  // in ascending thread order).
  void PushRound() {
    const size_t n = round_.size();
    switch (order_) {
      case ScheduleOrder::kAscending:
        for (size_t i = 0; i < n; ++i) Push(round_[i]);
        break;
      case ScheduleOrder::kDescending:
        for (size_t i = n; i > 0; --i) Push(round_[i - 1]);
        break;
      case ScheduleOrder::kShuffle:
        for (size_t i = n; i > 1; --i) std::swap(round_[i - 1], round_[random_.Below(static_cast<uint32_t>(i))]);
        for (size_t i = 0; i < n; ++i) Push(round_[i]);
        break;
    }
  }

  // Every fiber is queued at most once, so the ring never holds more than threads_.
  void Push(Fiber* fiber) {
    fiber->state = ThreadState::kReady;
    size_t tail = head_ + size_;
    if (tail >= ready_.size()) tail -= ready_.size();
    ready_[tail] = fiber;
    ++size_;
  }
  Fiber* Pop() {
    Fiber* fiber = ready_[head_];
    if (++head_ == ready_.size()) head_ = 0;
    --size_;
    return fiber;
  }

  void Resume(Fiber* fiber) {
    fiber->state = ThreadState::kRunning;
    current_ = fiber;
    threadIdx = fiber->index;
  }

  // Releases the threads waiting at __syncthreads(). `self` (the last to
  // arrive, if any) goes on running in ascending order, and is queued with the
  // others in the other orders.
  void ReleaseBarrier(Fiber* self) {
    at_barrier_ = 0;
    round_.clear();
    for (int i = 0; i < threads_; ++i) {
      Fiber* fiber = fibers_[i];
      if (fiber->state != ThreadState::kAtBarrier) continue;
      if (fiber == self && order_ == ScheduleOrder::kAscending) {
        fiber->state = ThreadState::kRunning;
      } else {
        round_.push_back(fiber);
      }
    }
    PushRound();
  }

  // Switches from the waiting, queued or exited `self` to the next ready
  // thread (no switch when that is `self`), or back to the host when none is
  // ready; returns when `self` is resumed.
  void SwitchAway(Fiber* self) {
    if (size_ == 0) {
      SwitchContext(&self->context, &host_);
    } else {
      Fiber* next = Pop();
      Resume(next);
      if (next != self) SwitchContext(&self->context, &next->context);
    }
  }

  std::string KernelName() const {
    char buffer[64];
    std::snprintf(buffer, sizeof(buffer), "%p", kernel_);
    std::string name = buffer;
    Dl_info info;
    if (kernel_ != nullptr && dladdr(kernel_, &info) != 0 && info.dli_sname != nullptr) {
      name += " ";
      name += info.dli_sname;
    }
    return name;
  }

  [[noreturn]] void ReportStuck() const {
    char block[48];
    FormatIndex(block, sizeof(block), blockIdx);
    const std::string kernel = KernelName();
    // A warp whose lanes wait at a collective that an exited lane can never join.
    for (int w = 0; w < threads_ / warpSize; ++w) {
      const Fiber* waiting = nullptr;
      const Fiber* exited = nullptr;
      const Fiber* elsewhere = nullptr;
      int waiting_count = 0;
      for (int i = w * warpSize; i < (w + 1) * warpSize; ++i) {
        const Fiber* fiber = fibers_[i];
        if (fiber->state == ThreadState::kAtWarp) {
          if (waiting == nullptr) waiting = fiber;
          ++waiting_count;
        } else if (fiber->state == ThreadState::kExited) {
          if (exited == nullptr) exited = fiber;
        } else if (elsewhere == nullptr) {
          elsewhere = fiber;
        }
      }
      if (waiting == nullptr || (exited == nullptr && elsewhere == nullptr)) continue;
      char waiting_thread[48];
      FormatIndex(waiting_thread, sizeof(waiting_thread), waiting->index);
      const Fiber* missing = exited != nullptr ? exited : elsewhere;
      char missing_thread[48];
      FormatIndex(missing_thread, sizeof(missing_thread), missing->index);
      Fatal(
          "%s: block %s (kernel %s), warp %d: %d of 32 lanes (first: thread %s, lane %d) wait at a warp collective "
          "(__shfl_*_sync/__syncwarp) that lane %d (thread %s) never reaches: it %s (%d of %d live threads of the "
          "block wait at __syncthreads())",
          exited != nullptr ? "divergent warp collective" : "deadlock", block, kernel.c_str(), w, waiting_count,
          waiting_thread, waiting->linear % warpSize, missing->linear % warpSize, missing_thread,
          StateName(missing->state), at_barrier_, live_);
    }
    // Otherwise some threads wait at __syncthreads() for threads that wait elsewhere.
    const Fiber* at_barrier = nullptr;
    const Fiber* other = nullptr;
    for (int i = 0; i < threads_; ++i) {
      const Fiber* fiber = fibers_[i];
      if (fiber->state == ThreadState::kAtBarrier) {
        if (at_barrier == nullptr) at_barrier = fiber;
      } else if (fiber->state != ThreadState::kExited && other == nullptr) {
        other = fiber;
      }
    }
    char barrier_thread[48] = "none";
    if (at_barrier != nullptr) FormatIndex(barrier_thread, sizeof(barrier_thread), at_barrier->index);
    char other_thread[48] = "none";
    if (other != nullptr) FormatIndex(other_thread, sizeof(other_thread), other->index);
    Fatal(
        "deadlock: block %s (kernel %s): %d of %d live threads wait at __syncthreads() (first: thread %s); "
        "thread %s %s",
        block, kernel.c_str(), at_barrier_, live_, barrier_thread, other_thread,
        other != nullptr ? StateName(other->state) : "-");
  }

  const void* kernel_;
  const std::function<void()>* body_;
  const int threads_;
  const ScheduleOrder order_;
  SplitMix64 random_;  // kShuffle's permutations
  Fiber* const* fibers_ = nullptr;
  std::vector<Fiber*> round_;  // the fibers made runnable together, before PushRound
  std::vector<Fiber*> ready_;  // ring buffer of runnable fibers
  size_t head_ = 0;
  size_t size_ = 0;
  std::vector<Warp> warps_;
  Context host_;
  Fiber* current_ = nullptr;
  int live_ = 0;
  int at_barrier_ = 0;
};

void FiberMain(Fiber* self) {
#if HS_EMU_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &t_switched_from->stack_bottom, &t_switched_from->stack_size);
#endif
  for (;;) self->scheduler->RunThread(self);
}

// The launch running on this host thread, for the device functions.
thread_local BlockScheduler* t_running = nullptr;
thread_local unsigned char* t_dynamic_smem = nullptr;

BlockScheduler& Running(const char* what) {
  if (t_running == nullptr) Fatal("%s called outside a kernel", what);
  return *t_running;
}

// Fills every __shared__ variable of the process with 0xFF bytes.
void PoisonStaticSharedMemory() {
  unsigned char* begin = __start_hs_cuda_emu_shared;
  unsigned char* end = __stop_hs_cuda_emu_shared;
  if (begin != nullptr && end > begin) std::memset(begin, 0xFF, static_cast<size_t>(end - begin));
}

}  // namespace

// ---- Running a grid ----

bool InKernel() { return t_running != nullptr; }

void SetScheduleOrderForTesting(ScheduleOrder order, uint64_t seed) {
  if (t_running != nullptr) Fatal("SetScheduleOrderForTesting called inside a kernel");
  Config() = OrderConfig{order, seed};
  LaunchCount() = 0;
}

void ResetScheduleOrderForTesting() {
  if (t_running != nullptr) Fatal("ResetScheduleOrderForTesting called inside a kernel");
  Config() = ConfigFromEnvironment();
  LaunchCount() = 0;
}

void RunGrid(const void* kernel, dim3 grid, dim3 block, size_t smem_bytes, const std::function<void()>& body) {
  if (t_running != nullptr) Fatal("a kernel launched a kernel (dynamic parallelism is not emulated)");
  void* smem = nullptr;
  if (posix_memalign(&smem, 256, smem_bytes == 0 ? 1 : smem_bytes) != 0) {
    Fatal("out of memory for %zu bytes of dynamic shared memory", smem_bytes);
  }
  OrderConfig& config = Config();
  const uint64_t launch = LaunchCount()++;
  BlockScheduler scheduler(kernel, &body, block, config.order,
                           config.seed ^ (launch * 0xd1b54a32d192ed03u + 0x8bb84b93962eacc9u));
  t_running = &scheduler;
  t_dynamic_smem = static_cast<unsigned char*>(smem);
  blockDim = block;
  gridDim = grid;
  for (unsigned int z = 0; z < grid.z; ++z) {
    for (unsigned int y = 0; y < grid.y; ++y) {
      for (unsigned int x = 0; x < grid.x; ++x) {
        blockIdx = uint3{x, y, z};
        std::memset(smem, 0xFF, smem_bytes);
        PoisonStaticSharedMemory();
        scheduler.RunBlock();
      }
    }
  }
  t_running = nullptr;
  t_dynamic_smem = nullptr;
  threadIdx = uint3{};
  blockIdx = uint3{};
  blockDim = dim3{};
  gridDim = dim3{};
  std::free(smem);
}

}  // namespace internal

// ---- Device side ----

void* DynamicSharedMemory() {
  internal::Running("DynamicSharedMemory()");
  return internal::t_dynamic_smem;
}

void __syncthreads() { internal::Running("__syncthreads()").SyncThreads(); }

void __syncwarp(unsigned int mask) { internal::Running("__syncwarp()").WarpExchange(mask, 0); }

namespace detail {
const uint64_t* WarpExchange(unsigned int mask, uint64_t bits) {
  return internal::Running("a warp collective").WarpExchange(mask, bits);
}
}  // namespace detail

}  // namespace hybridserve::kernels::cuda_emu
