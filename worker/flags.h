#ifndef HYBRIDSERVE_WORKER_FLAGS_H_
#define HYBRIDSERVE_WORKER_FLAGS_H_

// The flags both worker binaries take (defined in flags.cc, linked into each
// main): --model_dir, --device, --device_index, --threads, --page_size,
// --max_pages, --cachestore, --cachestore_resolve_interval, --cache_timeout, --cache_failure_backoff,
// --metrics_address, --shutdown_grace, --max_connection_age,
// --max_connection_age_grace. Each binary defines its own
// --address and --data_planes (their defaults and meaning differ). Only the
// mains include this header.

#include <initializer_list>
#include <utility>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/bootstrap.h"

namespace hybridserve::worker {

// The shared flags as options. INVALID_ARGUMENT, naming the flag, for an
// unknown --device or a negative --cache_failure_backoff, --max_connection_age
// or --max_connection_age_grace.
absl::StatusOr<WorkerOptions> WorkerOptionsFromFlags();

// A worker binary's main: parses the flags (usage: --help's first line),
// sets up logging, the process and SIGTERM handling, then runs `run` inside a
// common::GrpcRuntime (gRPC down when run returns: every gRPC object `run`
// makes must be gone by then); 0 (after logging "stopped"), or 1 after
// logging run's error.
int WorkerMain(int argc, char** argv, const char* usage, absl::FunctionRef<absl::Status()> run);

// INVALID_ARGUMENT naming the first flag (name, value) whose duration is
// negative.
absl::Status CheckNotNegative(std::initializer_list<std::pair<const char*, absl::Duration>> flags);

}  // namespace hybridserve::worker

#endif  // HYBRIDSERVE_WORKER_FLAGS_H_
