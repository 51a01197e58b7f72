#include "kernels/cuda/emu/cuda_emu.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <utility>
#include <vector>

#include "kernels/cuda/emu/block_scheduler.h"
#include "kernels/cuda/emu/stream_queues.h"

namespace hybridserve::kernels::cuda_emu {

namespace {

constexpr size_t kDefaultDynamicSmemLimit = 48 * 1024;
constexpr size_t kMaxDynamicSmemLimit = 227 * 1024;
// The opt-in limit the emulated GPU reports and enforces (at most kMaxDynamicSmemLimit).
std::atomic<size_t> g_smem_optin_limit{kMaxDynamicSmemLimit};
constexpr size_t kTotalGlobalMem = size_t{16} << 30;

// ---- Last error (per host thread, as CUDA's) ----

thread_local cudaError_t t_last_error = cudaSuccess;

cudaError_t Fail(cudaError_t error) {
  if (error != cudaSuccess) t_last_error = error;
  return error;
}

// ---- Process-wide state ----

// A handle opened by cudaIpcOpenMemHandle: its own buffer of `bytes`, a
// distinct address from the exported allocation at `exporter` (0 once that is
// freed), kept equal to it at the copy points (see cudaIpcOpenMemHandle).
struct IpcMapping {
  uintptr_t exporter = 0;
  size_t bytes = 0;
};

// Live device allocations (base -> bytes), opened IPC mappings (base ->
// mapping), pinned host allocations (base -> bytes) and per-kernel
// shared-memory limits.
struct DeviceState {
  std::mutex mutex;
  std::map<uintptr_t, size_t> allocations;
  std::map<uintptr_t, IpcMapping> ipc_mappings;
  size_t allocated_bytes = 0;
  std::map<uintptr_t, size_t> host_allocations;
  std::map<const void*, size_t> smem_limits;
};

DeviceState& Device() {
  static DeviceState* state = new DeviceState;
  return *state;
}

size_t Bytes(size_t bytes) { return bytes; }
size_t Bytes(const IpcMapping& mapping) { return mapping.bytes; }

// The entry of `ranges` (base -> size) whose [base, base + size] holds `p`, or end().
template <typename Map>
typename Map::const_iterator RangeHolding(const Map& ranges, uintptr_t p) {
  auto it = ranges.upper_bound(p);
  if (it == ranges.begin()) return ranges.end();
  --it;
  return p <= it->first + Bytes(it->second) ? it : ranges.end();
}

// True if [ptr, ptr + bytes) lies inside one live device allocation or opened IPC mapping.
bool InsideAllocation(const void* ptr, size_t bytes) {
  DeviceState& device = Device();
  std::lock_guard<std::mutex> lock(device.mutex);
  const uintptr_t begin = reinterpret_cast<uintptr_t>(ptr);
  const auto a = RangeHolding(device.allocations, begin);
  if (a != device.allocations.end() && begin < a->first + a->second) return bytes <= a->first + a->second - begin;
  const auto m = RangeHolding(device.ipc_mappings, begin);
  if (m != device.ipc_mappings.end() && begin < m->first + m->second.bytes) {
    return bytes <= m->first + m->second.bytes - begin;
  }
  return false;
}

// True if [ptr, ptr + bytes) lies inside one pinned host allocation.
bool InsidePinnedHost(const void* ptr, size_t bytes) {
  DeviceState& device = Device();
  std::lock_guard<std::mutex> lock(device.mutex);
  const uintptr_t begin = reinterpret_cast<uintptr_t>(ptr);
  const auto h = RangeHolding(device.host_allocations, begin);
  return h != device.host_allocations.end() && begin < h->first + h->second && bytes <= h->first + h->second - begin;
}

// True if `ptr` points into (or at the end of) a live device allocation or opened IPC mapping.
bool IsDevicePointer(const void* ptr) {
  DeviceState& device = Device();
  std::lock_guard<std::mutex> lock(device.mutex);
  const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  return RangeHolding(device.allocations, p) != device.allocations.end() ||
         RangeHolding(device.ipc_mappings, p) != device.ipc_mappings.end();
}

// The copy points of the IPC mappings: before a device operation reads
// [ptr, ptr + bytes), the part inside an opened mapping is refreshed from its
// exporter; after one writes it, that part is written through to the exporter.
enum class IpcSync { kRefreshMapping, kWriteThrough };
void SyncIpcMapping(const void* ptr, size_t bytes, IpcSync direction) {
  if (bytes == 0) return;
  DeviceState& device = Device();
  std::lock_guard<std::mutex> lock(device.mutex);
  if (device.ipc_mappings.empty()) return;
  const uintptr_t begin = reinterpret_cast<uintptr_t>(ptr);
  const auto m = RangeHolding(device.ipc_mappings, begin);
  if (m == device.ipc_mappings.end() || m->second.exporter == 0 || begin >= m->first + m->second.bytes) return;
  const size_t offset = begin - m->first;
  const size_t n = std::min(bytes, m->second.bytes - offset);
  auto* mapped = reinterpret_cast<unsigned char*>(begin);
  auto* exported = reinterpret_cast<unsigned char*>(m->second.exporter + offset);
  if (direction == IpcSync::kRefreshMapping) {
    std::memmove(mapped, exported, n);
  } else {
    std::memmove(exported, mapped, n);
  }
}

cudaError_t CheckCopy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  bool check_dst = false;
  bool check_src = false;
  switch (kind) {
    case cudaMemcpyHostToHost:
      break;
    case cudaMemcpyHostToDevice:
      check_dst = true;
      break;
    case cudaMemcpyDeviceToHost:
      check_src = true;
      break;
    case cudaMemcpyDeviceToDevice:
      check_dst = check_src = true;
      break;
    case cudaMemcpyDefault:
      check_dst = IsDevicePointer(dst);
      check_src = IsDevicePointer(src);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  if (bytes == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr) return cudaErrorInvalidValue;
  if (check_dst && !InsideAllocation(dst, bytes)) return cudaErrorInvalidValue;
  if (check_src && !InsideAllocation(src, bytes)) return cudaErrorInvalidValue;
  return cudaSuccess;
}

cudaError_t DoCopy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  const cudaError_t error = CheckCopy(dst, src, bytes, kind);
  if (error != cudaSuccess) return error;
  if (bytes == 0) return cudaSuccess;
  SyncIpcMapping(src, bytes, IpcSync::kRefreshMapping);
  std::memmove(dst, src, bytes);
  SyncIpcMapping(dst, bytes, IpcSync::kWriteThrough);
  return cudaSuccess;
}

cudaError_t DoSet(void* dst, int value, size_t bytes) {
  if (bytes == 0) return cudaSuccess;
  if (!InsideAllocation(dst, bytes)) return cudaErrorInvalidValue;
  std::memset(dst, value, bytes);
  SyncIpcMapping(dst, bytes, IpcSync::kWriteThrough);
  return cudaSuccess;
}

cudaError_t ValidateLaunch(const void* kernel, dim3 grid, dim3 block, size_t smem_bytes) {
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
  if (block.x == 0 || block.y == 0 || block.z == 0 || block.x > 1024 || block.y > 1024 || block.z > 64 ||
      threads > 1024 || threads % warpSize != 0) {
    return cudaErrorInvalidConfiguration;
  }
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 0x7fffffffu || grid.y > 65535 || grid.z > 65535) {
    return cudaErrorInvalidConfiguration;
  }
  size_t limit = kDefaultDynamicSmemLimit;
  {
    DeviceState& device = Device();
    std::lock_guard<std::mutex> lock(device.mutex);
    auto it = device.smem_limits.find(kernel);
    if (it != device.smem_limits.end()) limit = it->second;
  }
  if (smem_bytes > limit) return cudaErrorInvalidValue;
  return cudaSuccess;
}

}  // namespace

// ---- Streams, events, graphs ----

// An event's latest record: where in which stream's work, and the host time
// of the cudaEventRecord call. Guarded by mutex (any host thread may record,
// wait for or query an event).
struct EmuEvent {
  std::mutex mutex;
  bool recorded = false;
  internal::StreamPoint point;
  std::chrono::steady_clock::time_point time;
};

namespace {

struct LaunchOp {
  const void* kernel = nullptr;
  dim3 grid;
  dim3 block;
  size_t smem_bytes = 0;
  std::function<void()> body;
};
struct CopyOp {
  void* dst = nullptr;
  const void* src = nullptr;
  size_t bytes = 0;
  cudaMemcpyKind kind = cudaMemcpyDefault;
};
struct SetOp {
  void* dst = nullptr;
  int value = 0;
  size_t bytes = 0;
};
struct EventOp {
  EmuEvent* event = nullptr;
};

// One recorded operation: exactly one member is used, by `type`.
struct GraphOp {
  enum class Type { kLaunch, kCopy, kSet, kEvent } type = Type::kLaunch;
  LaunchOp launch;
  CopyOp copy;
  SetOp set;
  EventOp event;
};

}  // namespace

// `id` names the stream's queue (emu/stream_queues.h); the rest is capture
// state, guarded by StreamState's mutex.
struct EmuStream {
  internal::StreamId id = internal::kLegacyStream;
  bool capturing = false;
  bool invalidated = false;
  std::vector<GraphOp> captured;
};
struct EmuGraph {
  std::vector<GraphOp> ops;
};
struct EmuGraphExec {
  std::vector<GraphOp> ops;
};

namespace {

// Live streams and which of them capture.
struct StreamState {
  std::mutex mutex;
  std::set<EmuStream*> streams;
  int capturing = 0;
};

StreamState& Streams() {
  static StreamState* state = new StreamState;
  return *state;
}

bool ValidStream(cudaStream_t stream) {
  if (stream == nullptr) return true;
  StreamState& streams = Streams();
  std::lock_guard<std::mutex> lock(streams.mutex);
  return streams.streams.count(stream) != 0;
}

// The queue of a valid stream (null: the legacy default stream's).
internal::StreamId QueueOf(cudaStream_t stream) { return stream == nullptr ? internal::kLegacyStream : stream->id; }

// Appends `op` to the stream's capture and returns true if it is capturing.
bool RecordIfCapturing(cudaStream_t stream, GraphOp&& op) {
  if (stream == nullptr) return false;
  StreamState& streams = Streams();
  std::lock_guard<std::mutex> lock(streams.mutex);
  if (!stream->capturing) return false;
  stream->captured.push_back(std::move(op));
  return true;
}

bool IsCapturing(cudaStream_t stream) {
  if (stream == nullptr) return false;
  StreamState& streams = Streams();
  std::lock_guard<std::mutex> lock(streams.mutex);
  return stream->capturing;
}

// A synchronous operation during capture: invalidates every capture. Returns
// true (the operation must fail) if any stream was capturing.
bool InvalidateCaptures() {
  StreamState& streams = Streams();
  std::lock_guard<std::mutex> lock(streams.mutex);
  if (streams.capturing == 0) return false;
  for (EmuStream* stream : streams.streams) {
    if (stream->capturing) stream->invalidated = true;
  }
  return true;
}

// Queues a record of `event` on `queue`: an empty operation (so it is
// ordered as any, the legacy stream's rule included) whose point becomes the
// event's.
void RecordEvent(EmuEvent* event, internal::StreamId queue) {
  const internal::StreamPoint point = internal::Submit(queue, [] { return cudaSuccess; });
  std::lock_guard<std::mutex> lock(event->mutex);
  event->recorded = true;
  event->point = point;
  event->time = std::chrono::steady_clock::now();
}

// Queues `op` (a graph's operation) on `queue`, to read its sources and run when ordered.
void SubmitGraphOp(const GraphOp& op, internal::StreamId queue) {
  switch (op.type) {
    case GraphOp::Type::kLaunch:
      internal::Submit(queue, [launch = op.launch] {
        const cudaError_t error = ValidateLaunch(launch.kernel, launch.grid, launch.block, launch.smem_bytes);
        if (error != cudaSuccess) return error;
        internal::RunGrid(launch.kernel, launch.grid, launch.block, launch.smem_bytes, launch.body);
        return cudaSuccess;
      });
      return;
    case GraphOp::Type::kCopy:
      internal::Submit(queue, [copy = op.copy] { return DoCopy(copy.dst, copy.src, copy.bytes, copy.kind); });
      return;
    case GraphOp::Type::kSet:
      internal::Submit(queue, [set = op.set] { return DoSet(set.dst, set.value, set.bytes); });
      return;
    case GraphOp::Type::kEvent:
      RecordEvent(op.event.event, queue);
      return;
  }
}

// The point of the event's latest record, or false if it has none.
bool EventPoint(cudaEvent_t event, internal::StreamPoint* point) {
  std::lock_guard<std::mutex> lock(event->mutex);
  *point = event->point;
  return event->recorded;
}

}  // namespace

// ---- Errors and device ----

const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration:
      return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    case cudaErrorNoDevice:
      return "cudaErrorNoDevice";
    case cudaErrorNotReady:
      return "cudaErrorNotReady";
    case cudaErrorStreamCaptureUnsupported:
      return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated:
      return "cudaErrorStreamCaptureInvalidated";
  }
  return "cudaErrorUnknown";
}

const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal";
    case cudaErrorNoDevice:
      return "no CUDA-capable device is detected";
    case cudaErrorNotReady:
      return "device not ready";
    case cudaErrorStreamCaptureUnsupported:
      return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated:
      return "operation failed due to a previous error during capture";
  }
  return "unrecognized error code";
}

cudaError_t cudaGetLastError() {
  const cudaError_t error = t_last_error;
  t_last_error = cudaSuccess;
  return error;
}

cudaError_t cudaPeekAtLastError() { return t_last_error; }

cudaError_t cudaGetDeviceCount(int* count) {
  if (count == nullptr) return Fail(cudaErrorInvalidValue);
  *count = 1;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) { return device == 0 ? cudaSuccess : Fail(cudaErrorInvalidDevice); }

cudaError_t cudaGetDevice(int* device) {
  if (device == nullptr) return Fail(cudaErrorInvalidValue);
  *device = 0;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (prop == nullptr) return Fail(cudaErrorInvalidValue);
  if (device != 0) return Fail(cudaErrorInvalidDevice);
  *prop = cudaDeviceProp{};
  prop->sharedMemPerBlockOptin = g_smem_optin_limit.load();
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (value == nullptr || attr != cudaDevAttrMaxSharedMemoryPerBlockOptin) return Fail(cudaErrorInvalidValue);
  if (device != 0) return Fail(cudaErrorInvalidDevice);
  *value = static_cast<int>(g_smem_optin_limit.load());
  return cudaSuccess;
}

namespace internal {
void SetMaxSharedMemoryPerBlockOptinForTesting(size_t bytes) {
  g_smem_optin_limit.store(bytes == 0 ? kMaxDynamicSmemLimit : std::min(bytes, kMaxDynamicSmemLimit));
}
}  // namespace internal

cudaError_t cudaDeviceSynchronize() {
  if (InvalidateCaptures()) return Fail(cudaErrorStreamCaptureUnsupported);
  return Fail(internal::RunAll());
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  if (free_bytes == nullptr || total_bytes == nullptr) return Fail(cudaErrorInvalidValue);
  DeviceState& device = Device();
  std::lock_guard<std::mutex> lock(device.mutex);
  *total_bytes = kTotalGlobalMem;
  *free_bytes = device.allocated_bytes < kTotalGlobalMem ? kTotalGlobalMem - device.allocated_bytes : 0;
  return cudaSuccess;
}

// ---- Memory ----

cudaError_t cudaMalloc(void** ptr, size_t bytes) {
  if (ptr == nullptr) return Fail(cudaErrorInvalidValue);
  *ptr = nullptr;
  if (bytes == 0) return cudaSuccess;
  DeviceState& device = Device();
  {
    std::lock_guard<std::mutex> lock(device.mutex);
    if (bytes > kTotalGlobalMem - std::min(device.allocated_bytes, kTotalGlobalMem)) {
      return Fail(cudaErrorMemoryAllocation);
    }
  }
  void* memory = nullptr;
  if (posix_memalign(&memory, 256, bytes) != 0) return Fail(cudaErrorMemoryAllocation);
  std::memset(memory, 0xFF, bytes);
  std::lock_guard<std::mutex> lock(device.mutex);
  device.allocations[reinterpret_cast<uintptr_t>(memory)] = bytes;
  device.allocated_bytes += bytes;
  *ptr = memory;
  return cudaSuccess;
}

cudaError_t cudaFree(void* ptr) {
  if (ptr == nullptr) return cudaSuccess;
  // As CUDA's, waits for the device: queued work may still use the memory.
  const cudaError_t pending = internal::RunAll();
  DeviceState& device = Device();
  {
    std::lock_guard<std::mutex> lock(device.mutex);
    auto it = device.allocations.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == device.allocations.end()) return Fail(cudaErrorInvalidValue);
    device.allocated_bytes -= it->second;
    device.allocations.erase(it);
    for (auto& [base, mapping] : device.ipc_mappings) {
      if (mapping.exporter == reinterpret_cast<uintptr_t>(ptr)) mapping.exporter = 0;  // orphaned
    }
  }
  std::free(ptr);
  return Fail(pending);
}

cudaError_t cudaMallocHost(void** ptr, size_t bytes) { return cudaHostAlloc(ptr, bytes, cudaHostAllocDefault); }

cudaError_t cudaHostAlloc(void** ptr, size_t bytes, unsigned int flags) {
  if (ptr == nullptr) return Fail(cudaErrorInvalidValue);
  *ptr = nullptr;
  void* memory = nullptr;
  if (posix_memalign(&memory, 256, bytes == 0 ? 1 : bytes) != 0) return Fail(cudaErrorMemoryAllocation);
  DeviceState& device = Device();
  std::lock_guard<std::mutex> lock(device.mutex);
  device.host_allocations[reinterpret_cast<uintptr_t>(memory)] = bytes;
  *ptr = memory;
  return cudaSuccess;
}

cudaError_t cudaFreeHost(void* ptr) {
  if (ptr == nullptr) return cudaSuccess;
  // Queued copies may still read or write the memory.
  const cudaError_t pending = internal::RunAll();
  DeviceState& device = Device();
  {
    std::lock_guard<std::mutex> lock(device.mutex);
    if (device.host_allocations.erase(reinterpret_cast<uintptr_t>(ptr)) == 0) return Fail(cudaErrorInvalidValue);
  }
  std::free(ptr);
  return Fail(pending);
}

// Synchronous copies and memsets are work of the legacy default stream,
// waited for (with what it waits for: every blocking stream's earlier work).
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  if (InvalidateCaptures()) return Fail(cudaErrorStreamCaptureUnsupported);
  const cudaError_t error = CheckCopy(dst, src, bytes, kind);
  if (error != cudaSuccess) return Fail(error);
  return Fail(
      internal::RunTo(internal::Submit(internal::kLegacyStream, [=] { return DoCopy(dst, src, bytes, kind); })));
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream) {
  if (!ValidStream(stream)) return Fail(cudaErrorInvalidValue);
  const cudaError_t error = CheckCopy(dst, src, bytes, kind);
  if (error != cudaSuccess) return Fail(error);
  GraphOp op;
  op.type = GraphOp::Type::kCopy;
  op.copy = CopyOp{dst, src, bytes, kind};
  if (RecordIfCapturing(stream, std::move(op))) return cudaSuccess;
  const bool host_source = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyHostToHost ||
                           (kind == cudaMemcpyDefault && !IsDevicePointer(src));
  if (host_source && bytes > 0 && !InsidePinnedHost(src, bytes)) {
    // Pageable: staged now, as CUDA does before returning.
    auto staged = std::make_shared<std::vector<unsigned char>>(static_cast<const unsigned char*>(src),
                                                               static_cast<const unsigned char*>(src) + bytes);
    internal::Submit(QueueOf(stream), [=] { return DoCopy(dst, staged->data(), bytes, kind); });
    return cudaSuccess;
  }
  internal::Submit(QueueOf(stream), [=] { return DoCopy(dst, src, bytes, kind); });
  return cudaSuccess;
}

cudaError_t cudaMemset(void* dst, int value, size_t bytes) {
  if (InvalidateCaptures()) return Fail(cudaErrorStreamCaptureUnsupported);
  if (bytes != 0 && !InsideAllocation(dst, bytes)) return Fail(cudaErrorInvalidValue);
  return Fail(internal::RunTo(internal::Submit(internal::kLegacyStream, [=] { return DoSet(dst, value, bytes); })));
}

cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t stream) {
  if (!ValidStream(stream)) return Fail(cudaErrorInvalidValue);
  if (bytes != 0 && !InsideAllocation(dst, bytes)) return Fail(cudaErrorInvalidValue);
  GraphOp op;
  op.type = GraphOp::Type::kSet;
  op.set = SetOp{dst, value, bytes};
  if (RecordIfCapturing(stream, std::move(op))) return cudaSuccess;
  internal::Submit(QueueOf(stream), [=] { return DoSet(dst, value, bytes); });
  return cudaSuccess;
}

// ---- Streams and events ----

cudaError_t cudaStreamCreate(cudaStream_t* stream) { return cudaStreamCreateWithFlags(stream, cudaStreamDefault); }

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  if (stream == nullptr || (flags & ~cudaStreamNonBlocking) != 0) return Fail(cudaErrorInvalidValue);
  auto* created = new EmuStream;
  created->id = internal::CreateStream(/*blocking=*/(flags & cudaStreamNonBlocking) == 0);
  StreamState& streams = Streams();
  std::lock_guard<std::mutex> lock(streams.mutex);
  streams.streams.insert(created);
  *stream = created;
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  if (stream == nullptr) return Fail(cudaErrorInvalidValue);
  StreamState& streams = Streams();
  {
    std::lock_guard<std::mutex> lock(streams.mutex);
    if (streams.streams.erase(stream) == 0) return Fail(cudaErrorInvalidValue);
    if (stream->capturing) --streams.capturing;
  }
  const cudaError_t pending = internal::DestroyStream(stream->id);
  delete stream;
  return Fail(pending);
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  if (!ValidStream(stream)) return Fail(cudaErrorInvalidValue);
  if (InvalidateCaptures()) return Fail(cudaErrorStreamCaptureUnsupported);
  // The legacy stream's synchronisation also waits for the blocking streams' work before it.
  return Fail(internal::RunTo(stream == nullptr ? internal::Submit(internal::kLegacyStream, [] { return cudaSuccess; })
                                                : internal::Tail(QueueOf(stream))));
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  if (!ValidStream(stream)) return Fail(cudaErrorInvalidValue);
  const cudaError_t answer = internal::Query(internal::Tail(QueueOf(stream)));
  return answer == cudaErrorNotReady ? answer : Fail(answer);  // not ready is no error
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  if (event == nullptr || flags != 0 || !ValidStream(stream)) return Fail(cudaErrorInvalidValue);
  if (IsCapturing(stream)) return Fail(cudaErrorStreamCaptureUnsupported);
  internal::StreamPoint point;
  if (!EventPoint(event, &point)) return cudaSuccess;
  internal::Submit(QueueOf(stream), [] { return cudaSuccess; }, {point});
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  if (event == nullptr) return Fail(cudaErrorInvalidValue);
  *event = new EmuEvent;
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  if (event == nullptr) return Fail(cudaErrorInvalidValue);
  delete event;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  if (event == nullptr || !ValidStream(stream)) return Fail(cudaErrorInvalidValue);
  GraphOp op;
  op.type = GraphOp::Type::kEvent;
  op.event.event = event;
  if (RecordIfCapturing(stream, std::move(op))) return cudaSuccess;
  RecordEvent(event, QueueOf(stream));
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  if (event == nullptr) return Fail(cudaErrorInvalidValue);
  internal::StreamPoint point;
  if (!EventPoint(event, &point)) return cudaSuccess;
  return Fail(internal::RunTo(point));
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  if (event == nullptr) return Fail(cudaErrorInvalidValue);
  internal::StreamPoint point;
  if (!EventPoint(event, &point)) return cudaSuccess;
  const cudaError_t answer = internal::Query(point);
  return answer == cudaErrorNotReady ? answer : Fail(answer);
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (ms == nullptr || start == nullptr || end == nullptr) return Fail(cudaErrorInvalidValue);
  internal::StreamPoint start_point, end_point;
  if (!EventPoint(start, &start_point) || !EventPoint(end, &end_point)) return Fail(cudaErrorInvalidValue);
  if (!internal::Reached(start_point) || !internal::Reached(end_point)) return Fail(cudaErrorNotReady);
  std::chrono::steady_clock::time_point from, to;
  {
    std::lock_guard<std::mutex> lock(start->mutex);
    from = start->time;
  }
  {
    std::lock_guard<std::mutex> lock(end->mutex);
    to = end->time;
  }
  *ms = std::chrono::duration<float, std::milli>(to - from).count();
  return cudaSuccess;
}

// ---- Capture and graphs ----

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode) {
  if (stream == nullptr) return Fail(cudaErrorStreamCaptureUnsupported);
  StreamState& streams = Streams();
  std::lock_guard<std::mutex> lock(streams.mutex);
  if (streams.streams.count(stream) == 0 || stream->capturing) return Fail(cudaErrorInvalidValue);
  stream->capturing = true;
  stream->invalidated = false;
  stream->captured.clear();
  ++streams.capturing;
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  if (stream == nullptr || graph == nullptr) return Fail(cudaErrorInvalidValue);
  *graph = nullptr;
  std::vector<GraphOp> ops;
  bool invalidated = false;
  {
    StreamState& streams = Streams();
    std::lock_guard<std::mutex> lock(streams.mutex);
    if (streams.streams.count(stream) == 0 || !stream->capturing) return Fail(cudaErrorInvalidValue);
    stream->capturing = false;
    --streams.capturing;
    invalidated = stream->invalidated;
    stream->invalidated = false;
    ops.swap(stream->captured);
  }
  if (invalidated) return Fail(cudaErrorStreamCaptureInvalidated);
  *graph = new EmuGraph{std::move(ops)};
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long flags) {
  if (exec == nullptr || graph == nullptr) return Fail(cudaErrorInvalidValue);
  *exec = new EmuGraphExec{graph->ops};
  return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  if (exec == nullptr || !ValidStream(stream)) return Fail(cudaErrorInvalidValue);
  if (stream != nullptr) {
    StreamState& streams = Streams();
    std::lock_guard<std::mutex> lock(streams.mutex);
    if (stream->capturing) {
      stream->captured.insert(stream->captured.end(), exec->ops.begin(), exec->ops.end());
      return cudaSuccess;
    }
  }
  if (internal::InKernel()) internal::Fatal("cudaGraphLaunch called inside a kernel");
  for (const GraphOp& op : exec->ops) SubmitGraphOp(op, QueueOf(stream));
  return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  if (exec == nullptr) return Fail(cudaErrorInvalidValue);
  delete exec;
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  if (graph == nullptr) return Fail(cudaErrorInvalidValue);
  delete graph;
  return cudaSuccess;
}

namespace {

// What an emulated IPC handle holds.
struct IpcPayload {
  uint64_t magic;
  int64_t pid;
  uint64_t base;
  uint64_t bytes;
};
constexpr uint64_t kIpcMagic = 0x68735f6970635f31ull;  // "hs_ipc_1"

}  // namespace

cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t* handle, void* device_ptr) {
  if (handle == nullptr) return Fail(cudaErrorInvalidValue);
  DeviceState& device = Device();
  std::lock_guard<std::mutex> lock(device.mutex);
  const auto it = device.allocations.find(reinterpret_cast<uintptr_t>(device_ptr));
  if (it == device.allocations.end()) return Fail(cudaErrorInvalidValue);  // not the start of an allocation
  const IpcPayload payload{kIpcMagic, static_cast<int64_t>(getpid()), it->first, it->second};
  std::memset(handle->reserved, 0, sizeof(handle->reserved));
  std::memcpy(handle->reserved, &payload, sizeof(payload));
  return cudaSuccess;
}

cudaError_t cudaIpcOpenMemHandle(void** device_ptr, cudaIpcMemHandle_t handle, unsigned int) {
  if (device_ptr == nullptr) return Fail(cudaErrorInvalidValue);
  IpcPayload payload;
  std::memcpy(&payload, handle.reserved, sizeof(payload));
  if (payload.magic != kIpcMagic || payload.pid != static_cast<int64_t>(getpid())) return Fail(cudaErrorInvalidValue);
  DeviceState& device = Device();
  std::lock_guard<std::mutex> lock(device.mutex);
  const auto it = device.allocations.find(payload.base);
  if (it == device.allocations.end() || it->second != payload.bytes) return Fail(cudaErrorInvalidValue);
  void* mapping = nullptr;
  if (posix_memalign(&mapping, 256, payload.bytes) != 0) return Fail(cudaErrorMemoryAllocation);
  std::memcpy(mapping, reinterpret_cast<const void*>(payload.base), payload.bytes);
  device.ipc_mappings[reinterpret_cast<uintptr_t>(mapping)] = IpcMapping{payload.base, payload.bytes};
  *device_ptr = mapping;
  return cudaSuccess;
}

cudaError_t cudaIpcCloseMemHandle(void* device_ptr) {
  // Queued copies may still write the mapping.
  const cudaError_t pending = internal::RunAll();
  DeviceState& device = Device();
  {
    std::lock_guard<std::mutex> lock(device.mutex);
    if (device.ipc_mappings.erase(reinterpret_cast<uintptr_t>(device_ptr)) == 0) return Fail(cudaErrorInvalidValue);
  }
  std::free(device_ptr);
  return Fail(pending);
}

cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  if (func == nullptr || attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 ||
      static_cast<size_t>(value) > g_smem_optin_limit.load()) {
    return Fail(cudaErrorInvalidValue);
  }
  DeviceState& device = Device();
  std::lock_guard<std::mutex> lock(device.mutex);
  device.smem_limits[func] = static_cast<size_t>(value);
  return cudaSuccess;
}

// ---- Launch ----

cudaError_t EmuLaunch(const void* kernel, dim3 grid, dim3 block, size_t dynamic_smem_bytes, cudaStream_t stream,
                      std::function<void()> body) {
  if (internal::InKernel()) internal::Fatal("a kernel launched a kernel (dynamic parallelism is not emulated)");
  if (!body || !ValidStream(stream)) return Fail(cudaErrorInvalidValue);
  const cudaError_t error = ValidateLaunch(kernel, grid, block, dynamic_smem_bytes);
  if (error != cudaSuccess) return Fail(error);
  GraphOp op;
  op.type = GraphOp::Type::kLaunch;
  op.launch = LaunchOp{kernel, grid, block, dynamic_smem_bytes, std::move(body)};
  if (RecordIfCapturing(stream, std::move(op))) return cudaSuccess;
  internal::Submit(QueueOf(stream), [kernel, grid, block, dynamic_smem_bytes, body = std::move(op.launch.body)] {
    internal::RunGrid(kernel, grid, block, dynamic_smem_bytes, body);
    return cudaSuccess;
  });
  return cudaSuccess;
}

// ---- Device functions ----

float __expf(float x) {
  const float exact = std::exp(x);
  if (!std::isfinite(exact) || exact == 0.0f) return exact;
  const float bound = 2.0f + std::floor(std::fabs(1.16f * x));  // <= 2 + 1.16 * 104: e^x is finite
  const uint32_t ulps = static_cast<uint32_t>(bound);
  uint32_t hash = __float_as_uint(x) * 0x9e3779b1u;
  hash ^= hash >> 16;
  uint32_t bits = __float_as_uint(exact);
  if ((hash & 1u) != 0) {
    bits = std::min(bits + ulps, 0x7f7fffffu);  // at most FLT_MAX
  } else {
    bits = bits > ulps ? bits - ulps : 0u;
  }
  return __uint_as_float(bits);
}

}  // namespace hybridserve::kernels::cuda_emu
