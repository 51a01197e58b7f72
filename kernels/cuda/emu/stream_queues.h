#ifndef HYBRIDSERVE_KERNELS_CUDA_EMU_STREAM_QUEUES_H_
#define HYBRIDSERVE_KERNELS_CUDA_EMU_STREAM_QUEUES_H_

// The CUDA emulator's streams, internal to kernels/cuda/emu (the runtime of
// cuda_emu.cc is its only caller). Work submitted to a stream (a launch, an
// async copy or memset, an event record, a wait) is held in the stream's
// queue and runs only when something orders it: a synchronisation that needs
// it (RunTo, RunAll), or an operation that must run after it. Until then the
// memory it would write keeps its old bytes, so a missing synchronisation
// shows as a wrong result instead of passing by luck.
//
// Order. One stream's operations run in submission order. An operation also
// runs after the points it was submitted with (cudaStreamWaitEvent) and, by
// the legacy default stream's rule, after the work submitted before it to the
// legacy stream (an operation of a blocking stream) or to every blocking
// stream (an operation of the legacy stream); non-blocking streams
// (cudaStreamNonBlocking) are ordered by neither. Nothing else orders two
// streams. When a synchronisation forces the work of several streams, or an
// operation waits for several, which stream goes first is chosen by
// HS_CUDA_EMU_STREAM_ORDER:
//   reverse     (the default) the stream submitted to last first, until its
//               forced work is done; then the next latest. Submission order
//               is what a GPU usually does, so the reverse is the order
//               most likely to expose a missing dependency between streams.
//   submission  operations in the order the host submitted them (across
//               streams): the friendly order, to tell a missing dependency
//               from another bug.
//   shuffle     a pseudo-random stream for each operation, seeded from
//               HS_CUDA_EMU_SEED (as the thread order; cuda_emu.h).
// The variable is read at the first submission; an unknown value aborts.
// Tests replace it with SetStreamOrderForTesting (cuda_emu.h).
//
// Thread safety: every function may be called from any host thread. One
// process-wide lock guards the queues and is held while operations run: it is
// also the launch lock RunGrid needs (block_scheduler.h). Operations must not
// call these functions (a CUDA runtime call inside a kernel aborts).

#include <cstdint>
#include <functional>
#include <vector>

#include "kernels/cuda/emu/cuda_emu.h"

namespace hybridserve::kernels::cuda_emu::internal {

using StreamId = uint64_t;
// The legacy default stream (a null cudaStream_t): blocking, never destroyed.
inline constexpr StreamId kLegacyStream = 0;

// A point in one stream's work: reached once the stream's first `count`
// operations have run. Points of a destroyed stream are reached.
struct StreamPoint {
  StreamId stream = kLegacyStream;
  uint64_t count = 0;
};

// An operation's work; its error is returned by the synchronisation that ran it.
using StreamOperation = std::function<cudaError_t()>;

// A new stream, empty; `blocking`: ordered with the legacy stream.
StreamId CreateStream(bool blocking);
// Runs the stream's pending work (CUDA would finish it after the call
// returns), then forgets the stream. The first error of that work.
cudaError_t DestroyStream(StreamId stream);

// Queues `operation` on `stream` (which exists), to run after the stream's
// earlier operations and every point of `after`. Returns the point at which
// it has run.
StreamPoint Submit(StreamId stream, StreamOperation operation, std::vector<StreamPoint> after = {});

// The point after everything submitted to `stream` so far.
StreamPoint Tail(StreamId stream);
bool Reached(StreamPoint point);

// Runs the work `point` needs (its stream's operations up to it, and theirs
// across streams). The first error of the operations run, cudaSuccess if none.
cudaError_t RunTo(StreamPoint point);
// Runs every stream's pending work (cudaDeviceSynchronize).
cudaError_t RunAll();

// cudaStreamQuery's and cudaEventQuery's answer for `point`: cudaSuccess when
// it is reached. Otherwise the first question runs nothing and answers
// cudaErrorNotReady; a later question about it (or about an earlier point of
// its stream) runs the work, as RunTo, and answers cudaSuccess (or the
// work's error). So code that reads results after one unchecked query sees
// the old bytes, and a loop that polls until ready still ends.
cudaError_t Query(StreamPoint point);

}  // namespace hybridserve::kernels::cuda_emu::internal

#endif  // HYBRIDSERVE_KERNELS_CUDA_EMU_STREAM_QUEUES_H_
