// The prefill worker binary: one engine behind the Prefill gRPC service, a
// cachestore client, and the data planes' senders. Flags are read here (and
// in worker/flags.cc, the flags both workers share) only.

#include <iostream>
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "prefill/metrics.h"
#include "prefill/prefill_worker.h"
#include "prefill/service.h"
#include "worker/bootstrap.h"
#include "worker/cache_shard_metrics.h"
#include "worker/cache_stack.h"
#include "worker/data_plane_metrics.h"
#include "worker/direct_put_metrics.h"
#include "worker/direct_read_metrics.h"
#include "worker/flags.h"

ABSL_FLAG(std::string, address, "0.0.0.0:50061", "gRPC listen address (host:port; port 0 picks one)");
ABSL_FLAG(std::string, data_planes, "tcp",
          "data planes served, comma-separated: tcp, nccl (NCCL send/recv to decode workers on other GPUs), "
          "cuda_ipc (decode workers on this GPU; needs --device=cuda); each ticket names its own");
ABSL_FLAG(int64_t, max_queue, 16, "requests waiting for the engine; beyond: RESOURCE_EXHAUSTED");
ABSL_FLAG(int64_t, cache_fetch_parallelism, 3,
          "cachestore calls in flight while resuming a prompt: the state's Get and N-1 GetMany streams of its pages "
          "(>= 1)");

ABSL_FLAG(int64_t, checkpoint_publish_interval, 0,
          "admission of grid checkpoints: publish the engine's checkpoint at q when q is a multiple of this, a "
          "multiple of the engine's checkpoint interval (0: every one; -1: none: states only at prompt ends, turn "
          "ends and branch points, where a prompt leaves the cached pages)");

constexpr char kUsage[] =
    "hybridserve prefill worker: resumes prompts from the cache, prefills the rest, "
    "pushes the state to a decode worker";

namespace hybridserve {
namespace {

absl::Status Run() {
  ASSIGN_OR_RETURN(const worker::WorkerOptions options, worker::WorkerOptionsFromFlags());
  if (absl::GetFlag(FLAGS_cache_fetch_parallelism) < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--cache_fetch_parallelism must be at least 1, got ",
                                                   absl::GetFlag(FLAGS_cache_fetch_parallelism)));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<engine::ModelWeights> weights, worker::LoadModel(options));
  // One request in the engine at a time.
  ASSIGN_OR_RETURN(std::unique_ptr<engine::Model> model, worker::NewEngine(*weights, options, /*max_sequences=*/1));
  ASSIGN_OR_RETURN(const std::unique_ptr<worker::CacheStack> cache, worker::CacheStack::Connect(options.cache));
  ASSIGN_OR_RETURN(const std::vector<transport::TransportKind> planes,
                   worker::ParseDataPlanes(absl::GetFlag(FLAGS_data_planes)));
  ASSIGN_OR_RETURN(std::unique_ptr<worker::SenderPlanes> senders, worker::SenderPlanes::Open(planes, *model, options));

  const int64_t publish_interval = absl::GetFlag(FLAGS_checkpoint_publish_interval);
  if (const int64_t grid = model->options().checkpoint_interval;
      publish_interval < -1 || (publish_interval > 0 && publish_interval % grid != 0)) {
    return absl::InvalidArgumentError(absl::StrCat("--checkpoint_publish_interval=", publish_interval,
                                                   ": must be -1, 0 or a multiple of the engine's checkpoint "
                                                   "interval, ",
                                                   grid));
  }

  prefill::PrefillWorkerOptions wo;
  wo.checkpoint_publish_interval = publish_interval;
  wo.async_publication = true;  // answer decode right after the push; publish behind it
  wo.fetch_parallelism = absl::GetFlag(FLAGS_cache_fetch_parallelism);
  wo.cache_failure_backoff = options.cache_failure_backoff;
  prefill::PrefillWorker prefill_worker(*model, weights->fingerprint(), cache->client(), senders->sender(), wo);

  auto registry = std::make_shared<prometheus::Registry>();
  prefill::PrefillMetrics metrics(*registry);
  worker::DataPlaneMetrics plane_metrics(*registry);
  worker::DirectReadMetrics direct_read_metrics(*registry, "hybridserve_prefill_cache");
  worker::DirectPutMetrics direct_put_metrics(*registry);
  worker::CacheShardMetrics shard_metrics(*registry);
  metrics.SetFree(prefill_worker.free_pages(), prefill_worker.free_slots());
  // The worker's cache counters move behind the answers too (publications
  // run on its publisher's thread), and the planes count their own bytes:
  // each scrape brings them up to date.
  ASSIGN_OR_RETURN(std::unique_ptr<common::MetricsExposer> exposer, worker::StartMetrics(options, registry, [&] {
                     metrics.SyncCounters(prefill_worker.counters());
                     plane_metrics.Sync(senders->ipc_traffic());
                     cache->SyncMetrics(direct_read_metrics, direct_put_metrics, &shard_metrics);
                   }));
  prefill::PrefillService service(prefill_worker, absl::GetFlag(FLAGS_max_queue), &metrics);
  ASSIGN_OR_RETURN(
      std::unique_ptr<worker::GrpcServer> server,
      worker::GrpcServer::Start(absl::GetFlag(FLAGS_address), {&service}, options.tls, options.connection_age));

  LOG(INFO) << "prefill serving " << weights->config().LayerPattern() << " on port " << server->port()
            << (options.tls.server.enabled()
                    ? absl::StrCat(" (mutual TLS, client certificates ",
                                   common::ClientAuthName(options.tls.server.client_auth), ", ",
                                   options.tls.server.allowed_peers.size(), " allowed peers)")
                    : " (plaintext)")
            << cache->Describe() << (exposer ? absl::StrCat(", metrics on port ", exposer->port()) : std::string());
  std::cout << "PREFILL_READY port=" << server->port()
            << (exposer ? absl::StrCat(" metrics_port=", exposer->port()) : "")
            << (server->health_port() != 0 ? absl::StrCat(" health_port=", server->health_port()) : "") << std::endl;

  server->ServeUntilSignal(options.shutdown_grace, {.refuse = [&] { service.Drain(); }});
  if (!prefill_worker.WaitForPublications(options.shutdown_grace)) {
    LOG(WARNING) << "grace period over with cache publications still queued";
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace hybridserve

int main(int argc, char** argv) { return hybridserve::worker::WorkerMain(argc, argv, kUsage, hybridserve::Run); }
