#ifndef HYBRIDSERVE_KERNELS_CUDA_EMU_CUDA_EMU_H_
#define HYBRIDSERVE_KERNELS_CUDA_EMU_CUDA_EMU_H_

// A host emulation of the part of the CUDA programming model our kernels use,
// so the .cu sources compile with the host compiler and run on the CPU (tests
// of every kernel's logic on machines without a GPU; kernels/cuda/launchers.h).
// Not a simulator of timing or of memory ordering inside a kernel: blocks run
// one after another; the threads of a block run as fibers on the host thread
// that runs the launch (see "Asynchrony"), which switch only at
// __syncthreads(), at warp collectives and at exit. That is enough to check
// indexing, barriers, shared-memory use, reduction order and launch
// configuration; the order of work between streams and the host is emulated
// ("Asynchrony" below). What it enforces, as a GPU would (a violation makes
// the launch fail, or aborts with a message naming the kernel's fault):
//   - block size <= 1024 threads and a multiple of 32 (our kernels' rule);
//     grid.y, grid.z <= 65535; dynamic shared memory <= 48 KiB unless raised
//     with cudaFuncSetAttribute(cudaFuncAttributeMaxDynamicSharedMemorySize),
//     and never above the opt-in limit (227 KiB, an sm_90's; tests may lower
//     it to another GPU's): cudaErrorInvalidConfiguration /
//     cudaErrorInvalidValue from cudaGetLastError();
//   - a __syncthreads() not reached by every live thread of the block, or a
//     warp collective not reached by all 32 lanes with a full mask: abort
//     ("deadlock" / "divergent warp collective");
//   - shared memory, dynamic and static (__shared__ variables), starts every
//     block filled with 0xFF bytes (NaN floats, -1 integers), so a read
//     before a write shows.
//
// Scheduling order. Between two switch points a fiber runs alone, so a thread
// that reads memory another thread of its block writes, with no barrier (or
// warp collective, for lanes of one warp) in between, sees the write exactly
// when the writer ran first: a race on a GPU, and invisible here in any one
// fixed order. The environment variable HS_CUDA_EMU_ORDER chooses the order in
// which the threads made runnable together (by a block's start, a barrier's
// release, a warp collective's release: a "round") are resumed:
//   ascending   thread id order (the default). The thread whose arrival
//               released a barrier or collective goes on first, then the rest.
//   descending  reverse thread id order, the releasing thread included.
//   shuffle     a pseudo-random permutation per round, the releasing thread
//               included; the stream is seeded per launch from
//               HS_CUDA_EMU_SEED (an unsigned integer, decimal or 0x-hex;
//               default a fixed constant) and the launch's number in the
//               process, so a failing run repeats with the same seed.
// A race-free kernel gives the same bits in every order; run the tests under
// descending and a few shuffle seeds to find races (bazel test
// --test_env=HS_CUDA_EMU_ORDER=shuffle --test_env=HS_CUDA_EMU_SEED=7 ...).
// The variables are read at the first launch; an unknown value aborts.
// Device memory is host memory from posix_memalign of the exact size, so ASan
// sees out-of-bounds kernel accesses. Copies check that device ranges lie
// inside a live allocation (cudaErrorInvalidValue otherwise).
//
// Asynchrony (emu/stream_queues.h). As on a GPU, launches, cudaMemcpyAsync
// and cudaMemsetAsync return at once; unlike a GPU, which runs them soon
// anyway, the emulator runs nothing until something orders it, so memory
// keeps its old bytes until then: the host (or another stream) that reads
// without synchronising sees them. What runs a stream's work, and when:
//   - cudaStreamSynchronize: the stream's work; cudaDeviceSynchronize,
//     cudaFree, cudaFreeHost, cudaIpcCloseMemHandle: every stream's;
//     cudaStreamDestroy: the stream's;
//   - cudaEventSynchronize: the work before the event's latest record;
//   - cudaStreamQuery / cudaEventQuery: the first question while work is
//     pending answers cudaErrorNotReady and runs nothing; the next one runs
//     it and answers cudaSuccess. A result read after one unchecked query
//     is stale, and a polling loop still ends (answering NotReady forever
//     would hang correct code; running at once would hide the unchecked
//     read);
//   - cudaStreamWaitEvent: the waiting stream's later work runs after the
//     event's stream's work up to the record;
//   - the legacy default stream (a null stream): its work runs after the
//     work submitted before it to every blocking stream (cudaStreamCreate,
//     cudaStreamDefault), whose later work runs after it; cudaMemcpy and
//     cudaMemset are such work and wait for it before returning. Streams
//     made cudaStreamNonBlocking are not ordered by any of this;
//   - cudaGraphLaunch queues the graph's operations on its stream.
// One stream's work runs in submission order. When several streams' work
// is forced at once, the stream submitted to last goes first
// (HS_CUDA_EMU_STREAM_ORDER: reverse, the default; submission; shuffle,
// seeded by HS_CUDA_EMU_SEED; see stream_queues.h), so that a missing
// dependency between streams gives a wrong result. A cudaMemcpyAsync from
// pageable host memory reads its source at the call (CUDA stages it before
// returning, so the caller may reuse it); from pinned memory (cudaMallocHost,
// cudaHostAlloc) when it runs, as a DMA would. A copy to pageable host memory
// is deferred too, though CUDA documents it as complete on return: code that
// reads it without a synchronisation is one change (a pinned buffer) away
// from a race. An error of deferred work is returned by the synchronisation
// that ran it.
//
// Everything lives in namespace hybridserve::kernels::cuda_emu, the namespace
// the emulated build of the .cu sources is compiled in, so unqualified CUDA
// names there resolve here and never collide with the real libcudart.
//
// Thread safety: any host thread may call the runtime functions; the work
// they queue runs under one process-wide lock, on whichever host thread
// forces it.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)
// Static shared memory: one copy per function, shared by the fibers of the
// running block (blocks never overlap). Every such variable lives in the ELF
// section hs_cuda_emu_shared, which the block scheduler fills with 0xFF bytes
// before each block (a GPU's shared memory starts undefined, never zeroed).
// A section named like a C identifier is not given ASan redzones, so the
// section is one contiguous run of the variables.
#define __shared__ static __attribute__((section("hs_cuda_emu_shared")))

namespace hybridserve::kernels::cuda_emu {

// ---- Types ----

struct uint3 {
  unsigned int x = 0, y = 0, z = 0;
};
struct dim3 {
  unsigned int x = 1, y = 1, z = 1;
  constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1) : x(vx), y(vy), z(vz) {}
};

// CUDA's vector types: plain aggregates with CUDA's members, size and
// alignment, so a kernel's 8- and 16-byte loads through them read the same
// bytes in both builds.
struct alignas(8) float2 {
  float x, y;
};
struct alignas(16) float4 {
  float x, y, z, w;
};
struct alignas(8) uint2 {
  unsigned int x, y;
};
struct alignas(16) uint4 {
  unsigned int x, y, z, w;
};
struct alignas(8) int2 {
  int x, y;
};
struct alignas(16) int4 {
  int x, y, z, w;
};

enum cudaError_t : int {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevice = 101,
  cudaErrorNoDevice = 100,
  cudaErrorNotReady = 600,
  cudaErrorStreamCaptureUnsupported = 900,
  cudaErrorStreamCaptureInvalidated = 901,
};

enum cudaMemcpyKind : int {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};

enum cudaFuncAttribute : int {
  cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
};

enum cudaDeviceAttr : int {
  cudaDevAttrMaxSharedMemoryPerBlockOptin = 97,
};

enum cudaStreamCaptureMode : int {
  cudaStreamCaptureModeGlobal = 0,
  cudaStreamCaptureModeThreadLocal = 1,
  cudaStreamCaptureModeRelaxed = 2,
};

constexpr unsigned int cudaStreamDefault = 0;
constexpr unsigned int cudaStreamNonBlocking = 1;
constexpr unsigned int cudaHostAllocDefault = 0;

struct EmuStream;
struct EmuEvent;
struct EmuGraph;
struct EmuGraphExec;
using cudaStream_t = EmuStream*;
using cudaEvent_t = EmuEvent*;
using cudaGraph_t = EmuGraph*;
using cudaGraphExec_t = EmuGraphExec*;

struct cudaDeviceProp {
  char name[256] = "hybridserve CUDA emulator";
  size_t totalGlobalMem = size_t{16} << 30;
  size_t sharedMemPerBlock = 48 * 1024;
  size_t sharedMemPerBlockOptin = 227 * 1024;
  int major = 9;
  int minor = 0;
  int multiProcessorCount = 4;
  int warpSize = 32;
  int maxThreadsPerBlock = 1024;
  int memoryBusWidth = 0;
};

// ---- Runtime API (same signatures and meaning as CUDA's) ----

const char* cudaGetErrorString(cudaError_t error);
const char* cudaGetErrorName(cudaError_t error);
// The last error returned by a runtime call (a launch included) on this host
// thread, as CUDA's: cudaGetLastError returns and clears it, Peek only returns it.
cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();
cudaError_t cudaGetDeviceCount(int* count);  // always 1
cudaError_t cudaSetDevice(int device);       // 0 only
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device);
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes);

cudaError_t cudaMalloc(void** ptr, size_t bytes);  // contents unspecified (filled with 0xFF)
cudaError_t cudaFree(void* ptr);                   // null is a no-op
cudaError_t cudaMallocHost(void** ptr, size_t bytes);
cudaError_t cudaHostAlloc(void** ptr, size_t bytes, unsigned int flags);
cudaError_t cudaFreeHost(void* ptr);
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream = nullptr);
cudaError_t cudaMemset(void* dst, int value, size_t bytes);
cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t stream = nullptr);

// Streams and events (the ordering rules: "Asynchrony" above).
cudaError_t cudaStreamCreate(cudaStream_t* stream);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags);
// Runs the stream's pending work first (CUDA finishes it after returning).
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
// cudaErrorNotReady while work is pending, the first time asked; see "Asynchrony".
cudaError_t cudaStreamQuery(cudaStream_t stream);
// The stream's later work runs after the work before the event's latest
// record; a no-op for an event never recorded. Not on a capturing stream
// (cudaErrorStreamCaptureUnsupported: cross-stream capture is not emulated).
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags = 0);

cudaError_t cudaEventCreate(cudaEvent_t* event);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream = nullptr);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
// cudaErrorNotReady while work before the record is pending, the first time asked; see "Asynchrony".
cudaError_t cudaEventQuery(cudaEvent_t event);
// Host wall time between the two cudaEventRecord calls (not between their
// runs, whose times mean nothing here); cudaErrorNotReady while either's
// work is pending.
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end);

// Stream capture: while a stream is capturing, launches, memcpys and memsets
// issued on it are recorded instead of queued (a synchronous cudaMemcpy,
// cudaMemset, cudaStreamSynchronize or cudaDeviceSynchronize while any stream
// captures fails with cudaErrorStreamCaptureUnsupported and invalidates every
// capture, as in CUDA's global capture mode);
// cudaGraphLaunch queues the recorded operations on its stream, in order,
// with the argument values captured; each reads its sources when it runs.
cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long flags = 0);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);

cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value);

// Interprocess memory. A handle names the allocation that starts at the
// pointer given (the start of a cudaMalloc block, as CUDA requires). Unlike
// CUDA, which refuses to open a handle in the process that made it, the
// emulation opens handles of its own process only: the one way to test both
// ends on a machine without a GPU. Opening a handle of another process, a
// freed allocation or garbage is cudaErrorInvalidValue. As in another
// process, each open gives a pointer distinct from the exporter's (its own
// buffer), so the exporter's pointer used as the opened one (or the reverse:
// cudaIpcCloseMemHandle of it, cudaFree of an opened one) fails. The two are
// kept equal at the copy points: a copy or memset reading an opened mapping
// first refreshes the range from the exporter, and one writing it writes the
// range through; kernels must not access an opened mapping (ours copy to it).
struct cudaIpcMemHandle_t {
  char reserved[64];
};
constexpr unsigned int cudaIpcMemLazyEnablePeerAccess = 1;
cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t* handle, void* device_ptr);
cudaError_t cudaIpcOpenMemHandle(void** device_ptr, cudaIpcMemHandle_t handle, unsigned int flags);
cudaError_t cudaIpcCloseMemHandle(void* device_ptr);

// ---- Launch (used by Launch() in kernels/cuda/device_common.cuh) ----

// Queues on `stream` a run of `body` once per thread of every block of
// `grid`, with threadIdx, blockIdx, blockDim and gridDim set (it runs when
// something orders it: "Asynchrony"); or records it when `stream` is
// capturing. `body` runs later, on any host thread: it captures by value. `kernel` identifies the function for
// cudaFuncSetAttribute's shared-memory limit. Returns the launch error (also kept for cudaGetLastError): bad
// configuration is reported, nothing runs.
cudaError_t EmuLaunch(const void* kernel, dim3 grid, dim3 block, size_t dynamic_smem_bytes, cudaStream_t stream,
                      std::function<void()> body);

// ---- Scheduling order (see the header comment) ----

namespace internal {
enum class ScheduleOrder { kAscending, kDescending, kShuffle };
// Replaces the order and seed taken from HS_CUDA_EMU_ORDER / HS_CUDA_EMU_SEED
// for later launches, and restarts the per-launch seed sequence. For tests;
// call while no launch runs (aborts inside a kernel).
void SetScheduleOrderForTesting(ScheduleOrder order, uint64_t seed);
// Back to the order and seed of the environment, as at start-up.
void ResetScheduleOrderForTesting();

// The order in which forced work of several streams runs (HS_CUDA_EMU_STREAM_ORDER, emu/stream_queues.h).
enum class StreamOrder { kReverse, kSubmission, kShuffle };
// Replaces the order and seed of the environment for later drains; Reset
// restores them. For tests.
void SetStreamOrderForTesting(StreamOrder order, uint64_t seed);
void ResetStreamOrderForTesting();
// Operations queued on every stream and not yet run. For tests.
uint64_t PendingOperationsForTesting();

// Emulates a GPU whose opt-in limit of dynamic shared memory per block
// (cudaDevAttrMaxSharedMemoryPerBlockOptin, cudaDeviceProp's
// sharedMemPerBlockOptin, the most cudaFuncSetAttribute accepts) is `bytes`,
// e.g. 99 KiB for sm_86/sm_89, which run our sm_80 build; 0 restores 227 KiB.
// Limits already set by cudaFuncSetAttribute stay. For tests.
void SetMaxSharedMemoryPerBlockOptinForTesting(size_t bytes);
}  // namespace internal

// ---- Device side ----

extern thread_local uint3 threadIdx;
extern thread_local uint3 blockIdx;
extern thread_local dim3 blockDim;
extern thread_local dim3 gridDim;
constexpr int warpSize = 32;

// The running block's dynamic shared memory (see HS_DYNAMIC_SMEM in device_common.cuh).
void* DynamicSharedMemory();

void __syncthreads();
void __syncwarp(unsigned int mask = 0xffffffffu);

namespace detail {
// The lane values of the calling warp after every lane stored `bits` (a warp
// collective: all 32 lanes, full mask).
const uint64_t* WarpExchange(unsigned int mask, uint64_t bits);
}  // namespace detail

template <typename T>
T __shfl_sync(unsigned int mask, T value, int src_lane, int width = warpSize) {
  static_assert(sizeof(T) <= sizeof(uint64_t), "shuffle of a type wider than 64 bits");
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(T));
  const int lane = static_cast<int>(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)) % warpSize;
  const uint64_t* lanes = detail::WarpExchange(mask, bits);
  const int base = lane / width * width;
  T out;
  std::memcpy(&out, &lanes[base + ((src_lane % width) + width) % width], sizeof(T));
  return out;
}

template <typename T>
T __shfl_xor_sync(unsigned int mask, T value, int lane_mask, int width = warpSize) {
  static_assert(sizeof(T) <= sizeof(uint64_t), "shuffle of a type wider than 64 bits");
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(T));
  const int lane = static_cast<int>(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)) % warpSize;
  const uint64_t* lanes = detail::WarpExchange(mask, bits);
  int src = lane ^ lane_mask;
  if (src / width != lane / width) src = lane;  // outside the segment: own value, as on a GPU
  T out;
  std::memcpy(&out, &lanes[src], sizeof(T));
  return out;
}

template <typename T>
T __shfl_down_sync(unsigned int mask, T value, unsigned int delta, int width = warpSize) {
  static_assert(sizeof(T) <= sizeof(uint64_t), "shuffle of a type wider than 64 bits");
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(T));
  const int lane = static_cast<int>(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)) % warpSize;
  const uint64_t* lanes = detail::WarpExchange(mask, bits);
  int src = lane + static_cast<int>(delta);
  if (src / width != lane / width) src = lane;
  T out;
  std::memcpy(&out, &lanes[src], sizeof(T));
  return out;
}

template <typename T>
T __shfl_up_sync(unsigned int mask, T value, unsigned int delta, int width = warpSize) {
  static_assert(sizeof(T) <= sizeof(uint64_t), "shuffle of a type wider than 64 bits");
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(T));
  const int lane = static_cast<int>(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)) % warpSize;
  const uint64_t* lanes = detail::WarpExchange(mask, bits);
  int src = lane - static_cast<int>(delta);
  if (src < 0 || src / width != lane / width) src = lane;
  T out;
  std::memcpy(&out, &lanes[src], sizeof(T));
  return out;
}

// Fibers never run at the same time, so these need no atomics.
inline float atomicAdd(float* address, float value) {
  const float old = *address;
  *address = old + value;
  return old;
}
inline int atomicAdd(int* address, int value) {
  const int old = *address;
  *address = old + value;
  return old;
}
inline unsigned int atomicAdd(unsigned int* address, unsigned int value) {
  const unsigned int old = *address;
  *address = old + value;
  return old;
}
inline int atomicExch(int* address, int value) {
  const int old = *address;
  *address = value;
  return old;
}
inline int atomicCAS(int* address, int compare, int value) {
  const int old = *address;
  if (old == compare) *address = value;
  return old;
}
inline int atomicMax(int* address, int value) {
  const int old = *address;
  if (value > old) *address = value;
  return old;
}

inline float __uint_as_float(unsigned int bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}
inline unsigned int __float_as_uint(float f) {
  unsigned int bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return bits;
}
inline float __int_as_float(int bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}
inline int __float_as_int(float f) {
  int bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return bits;
}
template <typename T>
T __ldg(const T* p) {
  T value;  // by bytes: kernels read float memory through uint4 and the like, as on a GPU
  std::memcpy(&value, p, sizeof(T));
  return value;
}
// __expf, as the GPU's: within 2 + floor(|1.16 * x|) ulp of e^x (CUDA C++
// Programming Guide, intrinsic functions), the emulation always that far off,
// up or down by a hash of x's bits (the same x gives the same result), so
// tests comparing with the CPU see the GPU's worst error. Exact where e^x is 0,
// infinite or NaN.
float __expf(float x);
// The other fast intrinsics are computed exactly; tests comparing the
// emulation with the CPU state tolerances that cover the GPU's error too.
inline float __logf(float x) { return std::log(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fmul_rn(float a, float b) { return a * b; }

}  // namespace hybridserve::kernels::cuda_emu

#endif  // HYBRIDSERVE_KERNELS_CUDA_EMU_CUDA_EMU_H_
