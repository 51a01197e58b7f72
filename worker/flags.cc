#include "worker/flags.h"

#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "common/grpc_runtime.h"
#include "common/logging.h"
#include "common/process.h"
#include "common/status_macros.h"

ABSL_FLAG(std::string, model_dir, "models/default", "Hugging Face model directory (config.json + safetensors)");
ABSL_FLAG(std::string, metrics_address, "", "Prometheus /metrics address (host:port); empty disables");
ABSL_FLAG(std::string, cachestore, "",
          "cachestore gRPC address (host:port); shards: a list (host:port,host:port,...: each target one shard, "
          "named by the target) or a headless Service (dns:///NAME:PORT: each address one shard, named by its "
          "--shard_name, resolved again every --cachestore_resolve_interval); empty: no cache");
ABSL_FLAG(absl::Duration, cachestore_resolve_interval, absl::Seconds(10),
          "how often --cachestore=dns:///NAME:PORT is resolved again (a resolution that finds nothing keeps the "
          "shards known)");
ABSL_FLAG(std::string, device, "cpu", "cpu or cuda");
ABSL_FLAG(int32_t, device_index, 0, "the CUDA device of the engine and of NCCL channels");
ABSL_FLAG(int32_t, threads, 2, "kernel threads (CPU backend)");
ABSL_FLAG(int64_t, page_size, 0,
          "KV page size in tokens (a power of two); 0: min(16, chunk_size); prefill and decode workers must agree");
ABSL_FLAG(int64_t, max_pages, 4096, "KV pages of the engine");
ABSL_FLAG(std::string, cachestore_shm_socket, "",
          "the cachestore's --shm_socket on this host: cache reads by shared memory (read-only slab descriptors), "
          "falling back to gRPC for any read that fails there; with shards, SHARD_NAME=PATH[,SHARD_NAME=PATH] for "
          "the shards on this node; empty: gRPC only");
ABSL_FLAG(bool, cachestore_direct_puts, true,
          "put cache entries by the direct path too: by shared memory with --cachestore_shm_socket (the cachestore "
          "copies each once from a memfd of this worker), else over --cachestore_bulk_address; any put that fails "
          "there goes to gRPC; false: puts over gRPC");
ABSL_FLAG(std::string, cachestore_bulk_address, "",
          "the cachestore's --bulk_address (host:port): cache reads over plain TCP, off the gRPC stream, "
          "falling back to gRPC for any read that fails there (not with TLS; --cachestore_shm_socket wins); "
          "with shards, :PORT (each shard's host at that port); empty: gRPC only");
ABSL_FLAG(absl::Duration, cache_timeout, absl::Seconds(2), "per-call deadline of cachestore calls");
ABSL_FLAG(absl::Duration, cache_failure_backoff, absl::Seconds(1),
          "after a cache call times out (a hung cachestore), lookups and publications skip it for this long");
ABSL_FLAG(absl::Duration, shutdown_grace, absl::Seconds(10), "time in-flight requests get on SIGTERM");
ABSL_FLAG(absl::Duration, max_connection_age, absl::Minutes(5),
          "a client connection to --address is told to go away (GOAWAY; gRPC adds +-10% jitter) at this age, so "
          "clients behind a connection-balancing Service reconnect and reach pods added since; 0: never");
ABSL_FLAG(absl::Duration, max_connection_age_grace, absl::Minutes(30),
          "how long the calls on a connection told to go away may still run before they are cut (a full-context "
          "stream, 65,536 tokens with the default --max_pages, at 36 tokens/s); 0: as long as they take");

namespace hybridserve::worker {

absl::Status CheckNotNegative(std::initializer_list<std::pair<const char*, absl::Duration>> flags) {
  for (const auto& [name, value] : flags) {
    if (value < absl::ZeroDuration()) {
      return absl::InvalidArgumentError(absl::StrCat("--", name, " must be >= 0, got ", absl::FormatDuration(value)));
    }
  }
  return absl::OkStatus();
}

int WorkerMain(int argc, char** argv, const char* usage, absl::FunctionRef<absl::Status()> run) {
  absl::SetProgramUsageMessage(usage);
  absl::ParseCommandLine(argc, argv);
  common::InitLogging(argv[0]);
  common::TuneProcessForServing();
  common::InstallTerminationHandler();
  absl::Status status;
  {
    // Every gRPC object of the worker lives inside run().
    common::GrpcRuntime grpc;
    status = run();
  }
  if (!status.ok()) {
    LOG(ERROR) << status.message();
    return 1;
  }
  LOG(INFO) << "stopped";
  return 0;
}

absl::StatusOr<WorkerOptions> WorkerOptionsFromFlags() {
  WorkerOptions o;
  o.model_dir = absl::GetFlag(FLAGS_model_dir);
  absl::StatusOr<engine::Device> device = engine::ParseDevice(absl::GetFlag(FLAGS_device));
  if (!device.ok()) return absl::InvalidArgumentError(absl::StrCat("--device: ", device.status().message()));
  o.device = *device;
  o.device_index = absl::GetFlag(FLAGS_device_index);
  o.threads = absl::GetFlag(FLAGS_threads);
  o.page_size = absl::GetFlag(FLAGS_page_size);
  o.max_pages = absl::GetFlag(FLAGS_max_pages);
  o.cache.address = absl::GetFlag(FLAGS_cachestore);
  o.cache.shm_socket = absl::GetFlag(FLAGS_cachestore_shm_socket);
  o.cache.direct_puts = absl::GetFlag(FLAGS_cachestore_direct_puts);
  o.cache.bulk_address = absl::GetFlag(FLAGS_cachestore_bulk_address);
  o.cache.timeout = absl::GetFlag(FLAGS_cache_timeout);
  o.cache.resolve_interval = absl::GetFlag(FLAGS_cachestore_resolve_interval);
  o.cache_failure_backoff = absl::GetFlag(FLAGS_cache_failure_backoff);
  o.metrics_address = absl::GetFlag(FLAGS_metrics_address);
  o.shutdown_grace = absl::GetFlag(FLAGS_shutdown_grace);
  o.connection_age.max_age = absl::GetFlag(FLAGS_max_connection_age);
  o.connection_age.grace = absl::GetFlag(FLAGS_max_connection_age_grace);
  RETURN_IF_ERROR(CheckNotNegative({{"cache_failure_backoff", o.cache_failure_backoff},
                                    {"max_connection_age", o.connection_age.max_age},
                                    {"max_connection_age_grace", o.connection_age.grace}}));
  ASSIGN_OR_RETURN(o.tls, common::TlsFlagsFromFlags());
  o.cache.tls = o.tls.channel;
  return o;
}

}  // namespace hybridserve::worker
