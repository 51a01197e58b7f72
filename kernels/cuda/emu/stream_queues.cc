#include "kernels/cuda/emu/stream_queues.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "kernels/cuda/emu/block_scheduler.h"

namespace hybridserve::kernels::cuda_emu::internal {
namespace {

struct OrderConfig {
  StreamOrder order = StreamOrder::kReverse;
  uint64_t seed = kDefaultSeed;
};

OrderConfig ConfigFromEnvironment() {
  OrderConfig config;
  const char* order = std::getenv("HS_CUDA_EMU_STREAM_ORDER");
  if (order != nullptr && order[0] != '\0') {
    if (std::strcmp(order, "reverse") == 0) {
      config.order = StreamOrder::kReverse;
    } else if (std::strcmp(order, "submission") == 0) {
      config.order = StreamOrder::kSubmission;
    } else if (std::strcmp(order, "shuffle") == 0) {
      config.order = StreamOrder::kShuffle;
    } else {
      Fatal("HS_CUDA_EMU_STREAM_ORDER=%s: expected reverse, submission or shuffle", order);
    }
  }
  config.seed = SeedFromEnvironment();
  return config;
}

// An operation waiting in its stream's queue.
struct Pending {
  StreamOperation run;
  std::vector<StreamPoint> after;  // points of other streams it waits for
  uint64_t submission = 0;         // its number among all submissions of the process
};

struct Queue {
  bool blocking = true;
  uint64_t submitted = 0;        // operations ever submitted
  uint64_t done = 0;             // operations run: the first `done` of them
  uint64_t last_submission = 0;  // the submission number of the latest one
  uint64_t asked = 0;            // the latest point Query answered cudaErrorNotReady
  std::deque<Pending> pending;   // operations done + 1 .. submitted
};

// Every stream's queue, and the order of forced drains. Guarded by mutex, which
// is held while operations run.
struct Queues {
  std::mutex mutex;
  std::map<StreamId, Queue> streams;
  StreamId next_id = kLegacyStream + 1;
  uint64_t submissions = 0;
  bool configured = false;
  OrderConfig config;
  SplitMix64 random{kDefaultSeed};

  Queues() { streams[kLegacyStream].blocking = true; }
};

Queues& State() {
  static Queues* queues = new Queues;
  return *queues;
}

// Locks the queues; aborts when called from a kernel (whose launch holds them).
std::unique_lock<std::mutex> Lock() {
  if (InKernel()) Fatal("a CUDA runtime call inside a kernel");
  return std::unique_lock<std::mutex>(State().mutex);
}

void Configure(Queues& q) {
  if (q.configured) return;
  q.config = ConfigFromEnvironment();
  q.random = SplitMix64(q.config.seed);
  q.configured = true;
}

bool ReachedLocked(const Queues& q, StreamPoint point) {
  const auto it = q.streams.find(point.stream);
  return it == q.streams.end() || it->second.done >= point.count;
}

// Which of `targets` (unreached points) advances next, by the drain order.
StreamId Pick(Queues& q, const std::vector<StreamPoint>& targets) {
  Configure(q);
  size_t best = 0;
  switch (q.config.order) {
    case StreamOrder::kReverse:
      for (size_t i = 1; i < targets.size(); ++i) {
        if (q.streams[targets[i].stream].last_submission > q.streams[targets[best].stream].last_submission) best = i;
      }
      break;
    case StreamOrder::kSubmission:
      for (size_t i = 1; i < targets.size(); ++i) {
        if (q.streams[targets[i].stream].pending.front().submission <
            q.streams[targets[best].stream].pending.front().submission) {
          best = i;
        }
      }
      break;
    case StreamOrder::kShuffle:
      best = q.random.Below(static_cast<uint32_t>(targets.size()));
      break;
  }
  return targets[best].stream;
}

// Runs operations until every point of `targets` is reached: one operation at
// a time, of the stream Pick chooses, each after the points it waits for.
// Points always name work submitted before the operation that waits, so the
// waits form no cycle. An explicit stack rather than recursion: chains of
// waits between streams may be long.
cudaError_t DriveLocked(Queues& q, std::vector<StreamPoint> targets) {
  cudaError_t first_error = cudaSuccess;
  std::vector<std::vector<StreamPoint>> stack;
  stack.push_back(std::move(targets));
  while (!stack.empty()) {
    std::vector<StreamPoint>& frame = stack.back();
    frame.erase(std::remove_if(frame.begin(), frame.end(), [&](StreamPoint p) { return ReachedLocked(q, p); }),
                frame.end());
    if (frame.empty()) {
      stack.pop_back();
      continue;
    }
    Queue& stream = q.streams[Pick(q, frame)];
    std::vector<StreamPoint> unmet;
    for (const StreamPoint& p : stream.pending.front().after) {
      if (!ReachedLocked(q, p)) unmet.push_back(p);
    }
    if (!unmet.empty()) {
      stack.push_back(std::move(unmet));  // invalidates `frame`; it is found again at the next turn
      continue;
    }
    StreamOperation run = std::move(stream.pending.front().run);
    stream.pending.pop_front();
    const cudaError_t error = run();
    ++stream.done;
    if (first_error == cudaSuccess) first_error = error;
  }
  return first_error;
}

}  // namespace

StreamId CreateStream(bool blocking) {
  auto lock = Lock();
  Queues& q = State();
  const StreamId id = q.next_id++;
  q.streams[id].blocking = blocking;
  return id;
}

cudaError_t DestroyStream(StreamId stream) {
  auto lock = Lock();
  Queues& q = State();
  const auto it = q.streams.find(stream);
  if (it == q.streams.end() || stream == kLegacyStream) return cudaErrorInvalidValue;
  const cudaError_t error = DriveLocked(q, {StreamPoint{stream, it->second.submitted}});
  q.streams.erase(stream);
  return error;
}

StreamPoint Submit(StreamId stream, StreamOperation operation, std::vector<StreamPoint> after) {
  auto lock = Lock();
  Queues& q = State();
  Configure(q);
  Queue& queue = q.streams.at(stream);
  // The legacy default stream's rule.
  if (stream == kLegacyStream) {
    for (const auto& [id, other] : q.streams) {
      if (id != kLegacyStream && other.blocking) after.push_back(StreamPoint{id, other.submitted});
    }
  } else if (queue.blocking) {
    after.push_back(StreamPoint{kLegacyStream, q.streams[kLegacyStream].submitted});
  }
  after.erase(std::remove_if(after.begin(), after.end(),
                             [&](StreamPoint p) { return p.stream == stream || ReachedLocked(q, p); }),
              after.end());
  queue.last_submission = ++q.submissions;
  queue.pending.push_back(Pending{std::move(operation), std::move(after), queue.last_submission});
  return StreamPoint{stream, ++queue.submitted};
}

StreamPoint Tail(StreamId stream) {
  auto lock = Lock();
  Queues& q = State();
  const auto it = q.streams.find(stream);
  return StreamPoint{stream, it == q.streams.end() ? 0 : it->second.submitted};
}

bool Reached(StreamPoint point) {
  auto lock = Lock();
  return ReachedLocked(State(), point);
}

cudaError_t RunTo(StreamPoint point) {
  auto lock = Lock();
  return DriveLocked(State(), {point});
}

cudaError_t RunAll() {
  auto lock = Lock();
  Queues& q = State();
  std::vector<StreamPoint> every;
  for (const auto& [id, queue] : q.streams) every.push_back(StreamPoint{id, queue.submitted});
  return DriveLocked(q, std::move(every));
}

cudaError_t Query(StreamPoint point) {
  auto lock = Lock();
  Queues& q = State();
  if (ReachedLocked(q, point)) return cudaSuccess;
  Queue& queue = q.streams[point.stream];
  if (queue.asked >= point.count) return DriveLocked(q, {point});
  queue.asked = point.count;
  return cudaErrorNotReady;
}

uint64_t PendingOperationsForTesting() {
  auto lock = Lock();
  uint64_t pending = 0;
  for (const auto& [id, queue] : State().streams) pending += queue.pending.size();
  return pending;
}

void SetStreamOrderForTesting(StreamOrder order, uint64_t seed) {
  auto lock = Lock();
  Queues& q = State();
  q.config = OrderConfig{order, seed};
  q.random = SplitMix64(seed);
  q.configured = true;
}

void ResetStreamOrderForTesting() {
  auto lock = Lock();
  State().configured = false;
}

}  // namespace hybridserve::kernels::cuda_emu::internal
