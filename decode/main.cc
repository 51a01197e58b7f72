// The decode worker binary: the client-facing Generation service over one
// engine, the data plane's receiver (TCP, NCCL or CUDA IPC), a pool of
// prefill workers (or, with --prefill=in_process, a prefill worker in this
// process: aggregated mode), a cachestore client, Prometheus metrics. Flags
// are read here (and in worker/flags.cc, the flags both workers share) only.

#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "cachestore/client/cache_backoff.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "decode/decode_loop.h"
#include "decode/metrics.h"
#include "decode/service.h"
#include "decode/tenant.h"
#include "engine/model_metadata.h"
#include "prefill/grpc_prefill_client.h"
#include "prefill/in_process_prefill_client.h"
#include "prefill/prefill_worker.h"
#include "transport/in_process_transport.h"
#include "worker/bootstrap.h"
#include "worker/cache_shard_metrics.h"
#include "worker/cache_stack.h"
#include "worker/data_plane_metrics.h"
#include "worker/direct_put_metrics.h"
#include "worker/direct_read_metrics.h"
#include "worker/flags.h"

ABSL_FLAG(std::string, address, "0.0.0.0:50050", "gRPC listen address of the Generation service (port 0 picks one)");
ABSL_FLAG(std::string, prefill, "",
          "prefill workers: comma-separated host:port (a name is re-resolved to all its addresses), or in_process "
          "for aggregated mode (a prefill engine in this process, no data plane sockets)");
ABSL_FLAG(std::string, data_planes, "tcp",
          "the one data plane prefill workers send state over: tcp, nccl (GPUs: one NCCL channel to the one "
          "--prefill worker), or cuda_ipc (the --prefill worker on this GPU: device-to-device copies; needs "
          "--device=cuda). Named as the prefill worker's flag, which may list several");
ABSL_FLAG(std::string, data_address, "127.0.0.1:0", "TCP data plane listen address (port 0 picks one)");
ABSL_FLAG(std::string, advertise_host, "",
          "host that prefill workers connect to for the data plane; empty: the data_address host (127.0.0.1 for "
          "0.0.0.0)");
ABSL_FLAG(int64_t, max_batch, 8, "requests running at once (prefilling or decoding)");
ABSL_FLAG(int64_t, max_waiting, 32, "requests waiting for room; beyond: RESOURCE_EXHAUSTED");
ABSL_FLAG(absl::Duration, transfer_timeout, absl::Seconds(60), "longest prefill call + state transfer");
ABSL_FLAG(absl::Duration, prefill_resolve_interval, absl::Seconds(10), "how often prefill names are re-resolved");
ABSL_FLAG(absl::Duration, prefill_failure_backoff, absl::Seconds(5), "how long a failed prefill worker is skipped");
ABSL_FLAG(absl::Duration, prefill_unavailable_wait, absl::Seconds(3),
          "how long a prefill call keeps trying while every prefill worker is unreachable (a restart)");
ABSL_FLAG(std::string, tenant_from, "",
          "where a call's tenant (its cache namespace) comes from: none (one tenant), certificate (the client "
          "certificate's SPIFFE ID, else its first DNS name; a --trusted_proxies call's x-hybridserve-tenant "
          "header when it sends one) or proxy_header (x-hybridserve-tenant, from --trusted_proxies only); "
          "empty: certificate with --tls_cert, none without");
ABSL_FLAG(std::string, trusted_proxies, "",
          "comma-separated SPIFFE IDs or DNS names of front proxies (the OpenAI gateway) trusted to name the "
          "tenant in x-hybridserve-tenant (--tenant_from=proxy_header, or certificate beside direct clients)");
ABSL_FLAG(std::string, served_model_name, "",
          "the model's name in GetModelInfo; empty: config.json's _name_or_path, else the --model_dir's last "
          "component");
ABSL_FLAG(bool, publish, true, "publish turn-end states and generated pages to the cachestore");
ABSL_FLAG(bool, read_history_pages, true,
          "with --cachestore_shm_socket: read each prompt's cached KV pages from the cachestore by shared memory "
          "into the reserved slots, and have prefill send only the pages after them (TCP and in-process planes, "
          "CPU pools)");
ABSL_FLAG(int64_t, history_read_min_kib, 4096,
          "--read_history_pages only for prompts whose full KV pages hold at least this many KiB (below, the "
          "lookup costs more than the push it saves)");
ABSL_FLAG(int64_t, local_prefill_max_tokens, 256,
          "with a cachestore: prefill here, in this worker's engine, a request whose prompt the cache holds a state "
          "of, all but at most this many tokens (a conversation's next turn), instead of calling a prefill worker: "
          "the history is read once, into the sequence that decodes, and nothing is pushed; 0: never");
ABSL_FLAG(bool, local_prefill_while_decoding, false,
          "let a local prefill run while other requests decode (they wait for it, one step's time); off: only when "
          "none decodes");
ABSL_FLAG(int64_t, fallback_prefill_max_tokens, 8192,
          "when a request's prefill call fails (no prefill worker answered within --prefill_unavailable_wait, or "
          "the worker failed or died during the call), prefill it here, in this worker's engine, if its prompt has "
          "at most this many tokens (with or without a cachestore; the next request goes to the pool again); "
          "0: never (the request fails)");
ABSL_FLAG(absl::Duration, publish_parent_wait, absl::Seconds(2),
          "how long a turn-end publication waits for prefill to have put the prompt's last page, its parent");

constexpr char kUsage[] =
    "hybridserve decode worker: serves Generate to clients, has prefill workers prefill each prompt (resuming "
    "from the cachestore) and push the state here, decodes in continuous batches, publishes turn-end states";

namespace hybridserve {
namespace {

// Where prefill happens: a pool of prefill workers and the data plane their
// state arrives by, or a prefill worker in this process.
struct PrefillSide {
  std::unique_ptr<worker::ReceiverPlane> plane;  // disaggregated
  // Aggregated: the in-process plane, the prefill engine and its worker.
  std::unique_ptr<transport::InProcessTransport> local;
  std::unique_ptr<engine::Model> model;
  std::unique_ptr<prefill::PrefillWorker> worker;
  std::unique_ptr<prefill::PrefillClient> client;
  prefill::GrpcPrefillClient* pool = nullptr;  // disaggregated: `client`

  // Whether the pool has resolved a prefill worker (always, aggregated).
  bool resolved() const { return pool == nullptr || !pool->workers().empty(); }

  transport::StateReceiver& receiver() { return plane != nullptr ? plane->receiver() : *local; }
  std::string endpoint() const { return plane != nullptr ? plane->endpoint() : "in_process"; }
};

absl::StatusOr<PrefillSide> OpenPrefillSide(const worker::WorkerOptions& options, const engine::ModelWeights& weights,
                                            engine::Model& model, cachestore::CacheClient* cache,
                                            const std::shared_ptr<cachestore::CacheBackoff>& cache_backoff) {
  PrefillSide side;
  const std::string prefill_flag = absl::GetFlag(FLAGS_prefill);
  if (prefill_flag.empty()) {
    return absl::InvalidArgumentError("--prefill is required: host:port of prefill workers, or in_process");
  }
  if (prefill_flag == "in_process") {
    side.local = std::make_unique<transport::InProcessTransport>();
    ASSIGN_OR_RETURN(side.model, worker::NewEngine(weights, options, /*max_sequences=*/1));
    prefill::PrefillWorkerOptions wo;
    wo.async_publication = true;  // as the prefill binary: the answer does not wait for the cache
    wo.cache_backoff = cache_backoff;
    side.worker = std::make_unique<prefill::PrefillWorker>(*side.model, weights.fingerprint(), cache, *side.local, wo);
    side.client = std::make_unique<prefill::InProcessPrefillClient>(*side.worker);
    return side;
  }
  const std::vector<std::string> targets = absl::StrSplit(prefill_flag, ',', absl::SkipWhitespace());
  ASSIGN_OR_RETURN(const std::vector<transport::TransportKind> planes,
                   worker::ParseDataPlanes(absl::GetFlag(FLAGS_data_planes)));
  if (planes.size() != 1) return absl::InvalidArgumentError("--data_planes: a decode worker receives over one plane");
  worker::ReceiverPlaneOptions ro;
  ro.kind = planes[0];
  ro.data_address = absl::GetFlag(FLAGS_data_address);
  ro.advertise_host = absl::GetFlag(FLAGS_advertise_host);
  if (ro.kind != transport::TransportKind::kTcp) {
    if (targets.size() != 1) {
      return absl::InvalidArgumentError(absl::StrCat("--data_planes=", absl::GetFlag(FLAGS_data_planes),
                                                     " pairs this worker with one prefill worker; --prefill names ",
                                                     targets.size()));
    }
    ro.peer = targets[0];
  }
  ASSIGN_OR_RETURN(side.plane, worker::ReceiverPlane::Open(ro, model, options));
  prefill::PrefillPoolOptions po;
  po.targets = targets;
  po.resolve_interval = absl::GetFlag(FLAGS_prefill_resolve_interval);
  po.failure_backoff = absl::GetFlag(FLAGS_prefill_failure_backoff);
  po.unavailable_wait = absl::GetFlag(FLAGS_prefill_unavailable_wait);
  po.tls = options.tls.channel;
  absl::StatusOr<std::unique_ptr<prefill::GrpcPrefillClient>> pool = prefill::GrpcPrefillClient::Create(po);
  if (!pool.ok()) return absl::Status(pool.status().code(), absl::StrCat("--prefill: ", pool.status().message()));
  side.pool = pool->get();
  side.client = *std::move(pool);
  // Prefill workers may start later than this one: requests sent to one that
  // is not up yet wait for it (--prefill_unavailable_wait), then fail.
  for (const std::string& target : targets) {
    ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel, common::NewChannel(target, options.tls.channel));
    if (!channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(2))) {
      LOG(WARNING) << "the prefill worker " << target << " is unreachable: requests sent to it fail until it is up";
    }
  }
  return side;
}

// --tenant_from and --trusted_proxies as a resolver; the default and its
// reason are logged.
absl::StatusOr<decode::TenantResolver> TenantsFromFlags(const worker::WorkerOptions& options) {
  std::string from = absl::GetFlag(FLAGS_tenant_from);
  if (from.empty()) {
    from = options.tls.server.enabled() ? "certificate" : "none";
    LOG(INFO) << "--tenant_from=" << from
              << (options.tls.server.enabled() ? " (the default with TLS: tenants by client certificate)"
                                               : " (the default without TLS: one tenant; any client that reaches "
                                                 "this port shares its cache by salt)");
  }
  ASSIGN_OR_RETURN(const decode::TenantSource source, decode::ParseTenantSource(from, "tenant_from"));
  if (source != decode::TenantSource::kNone && !options.tls.server.enabled()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tenant_from=", from, " needs TLS (--tls_cert): without it nothing is verified"));
  }
  if (source != decode::TenantSource::kNone && options.tls.server.client_auth == common::ClientAuth::kNone) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tenant_from=", from, " needs client certificates: --tls_client_auth=none"));
  }
  std::vector<std::string> proxies = absl::StrSplit(absl::GetFlag(FLAGS_trusted_proxies), ',', absl::SkipWhitespace());
  absl::StatusOr<decode::TenantResolver> resolver = decode::TenantResolver::Create(source, std::move(proxies));
  if (!resolver.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--tenant_from / --trusted_proxies: ", resolver.status().message()));
  }
  return resolver;
}

absl::Status Run() {
  ASSIGN_OR_RETURN(const worker::WorkerOptions options, worker::WorkerOptionsFromFlags());
  ASSIGN_OR_RETURN(decode::TenantResolver tenants, TenantsFromFlags(options));
  RETURN_IF_ERROR(worker::CheckNotNegative({{"prefill_unavailable_wait", absl::GetFlag(FLAGS_prefill_unavailable_wait)},
                                            {"publish_parent_wait", absl::GetFlag(FLAGS_publish_parent_wait)}}));
  ASSIGN_OR_RETURN(std::unique_ptr<engine::ModelWeights> weights, worker::LoadModel(options));
  ASSIGN_OR_RETURN(std::unique_ptr<engine::Model> model,
                   worker::NewEngine(*weights, options, absl::GetFlag(FLAGS_max_batch)));
  ASSIGN_OR_RETURN(const std::unique_ptr<worker::CacheStack> cache, worker::CacheStack::Connect(options.cache));
  cachestore::CacheClient* const cache_client = cache->client();
  // The process's one memory of a hung cache: the loop's publisher, history
  // reads and local prefill, and the prefill workers in this process.
  const auto cache_backoff = std::make_shared<cachestore::CacheBackoff>(options.cache_failure_backoff);
  ASSIGN_OR_RETURN(PrefillSide prefill_side, OpenPrefillSide(options, *weights, *model, cache_client, cache_backoff));

  decode::DecodeLoopOptions lo;
  lo.max_batch = absl::GetFlag(FLAGS_max_batch);
  lo.max_waiting = absl::GetFlag(FLAGS_max_waiting);
  lo.endpoint = prefill_side.endpoint();
  lo.transfer_timeout = absl::GetFlag(FLAGS_transfer_timeout);
  lo.eos_token_ids.assign(weights->config().eos_token_ids.begin(), weights->config().eos_token_ids.end());
  lo.publish = absl::GetFlag(FLAGS_publish);
  lo.publish_parent_wait = absl::GetFlag(FLAGS_publish_parent_wait);
  lo.cache_backoff = cache_backoff;
  // Only by shared memory: over gRPC or the bulk port, reading the pages
  // here moves them over a socket as the push from prefill does, and costs
  // a lookup besides.
  lo.read_history_pages = cache->reads_by_shared_memory() && absl::GetFlag(FLAGS_read_history_pages);
  const int64_t history_read_min_kib = absl::GetFlag(FLAGS_history_read_min_kib);
  if (history_read_min_kib < 0 || history_read_min_kib > (int64_t{1} << 40)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--history_read_min_kib must be in [0, 2^40], got ", history_read_min_kib));
  }
  lo.history_read_min_bytes = history_read_min_kib << 10;
  // Local prefill: a prefill worker on this engine, without a data plane,
  // run by the loop on its own thread.
  lo.local_prefill_max_tokens = absl::GetFlag(FLAGS_local_prefill_max_tokens);
  lo.local_prefill_while_decoding = absl::GetFlag(FLAGS_local_prefill_while_decoding);
  if (lo.local_prefill_max_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--local_prefill_max_tokens must be at least 0, got ", lo.local_prefill_max_tokens));
  }
  lo.fallback_prefill_max_tokens = absl::GetFlag(FLAGS_fallback_prefill_max_tokens);
  if (lo.fallback_prefill_max_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--fallback_prefill_max_tokens must be at least 0, got ", lo.fallback_prefill_max_tokens));
  }
  // The same worker prefills the requests whose prefill call failed
  // (--fallback_prefill_max_tokens), with or without a cache.
  std::unique_ptr<prefill::PrefillWorker> local_worker;
  decode::KeepingPrefill local_prefill;
  if ((cache_client != nullptr && lo.local_prefill_max_tokens > 0) || lo.fallback_prefill_max_tokens > 0) {
    prefill::PrefillWorkerOptions wo;
    wo.async_publication = true;  // as the prefill binary: the first token does not wait for the cache
    wo.cache_backoff = cache_backoff;
    local_worker = std::make_unique<prefill::PrefillWorker>(*model, weights->fingerprint(), cache_client, wo);
    local_prefill = [worker = local_worker.get()](const prefill::PrefillRequest& request, int64_t positions) {
      return worker->PrefillAndKeep(request, positions);
    };
  }
  ASSIGN_OR_RETURN(std::unique_ptr<decode::DecodeLoop> loop,
                   decode::DecodeLoop::Create(*model, weights->fingerprint(), *prefill_side.client,
                                              prefill_side.receiver(), cache_client, lo, std::move(local_prefill)));

  auto registry = std::make_shared<prometheus::Registry>();
  decode::DecodeMetrics metrics(*registry);
  metrics.SetPageTotal(model->sequences().num_pages());
  worker::DataPlaneMetrics plane_metrics(*registry);
  worker::DirectReadMetrics direct_read_metrics(*registry, "hybridserve_decode_cache");
  worker::DirectPutMetrics direct_put_metrics(*registry);
  worker::CacheShardMetrics shard_metrics(*registry);
  // Queue gauges, the data plane's refusals and byte counters, brought up to
  // date by each scrape.
  transport::StateReceiver& receiver = prefill_side.receiver();
  ASSIGN_OR_RETURN(std::unique_ptr<common::MetricsExposer> exposer, worker::StartMetrics(options, registry, [&] {
                     const decode::DecodeLoop::Counts c = loop->counts();
                     metrics.SetQueue(c.waiting, c.prefilling + c.decoding);
                     metrics.SetFree(c.free_pages, c.free_slots);
                     metrics.SetBatchPeak(c.batch_peak);
                     metrics.SetOrphanedCalls(c.orphaned_calls);
                     metrics.SyncDataPlane(receiver.refused(), receiver.unauthenticated());
                     metrics.SyncHistoryReads(c.history_reads, c.history_pages, c.history_failures);
                     metrics.SyncLocalPrefills(c.local_prefills, c.local_prefill_failures, c.local_prefill_tokens,
                                               c.local_prefill_resume, c.local_prefill_compute);
                     metrics.SyncFallbackPrefills(c.fallback_prefills_unavailable, c.fallback_prefills_failed,
                                                  c.fallback_prefill_failures);
                     if (prefill_side.plane != nullptr) plane_metrics.Sync(prefill_side.plane->ipc_traffic());
                     cache->SyncMetrics(direct_read_metrics, direct_put_metrics, &shard_metrics);
                   }));

  ASSIGN_OR_RETURN(engine::ModelMetadata metadata, engine::LoadModelMetadata(options.model_dir, weights->config(),
                                                                             absl::GetFlag(FLAGS_served_model_name)));
  decode::ModelDescription description;
  description.name = metadata.name;
  description.end_of_turn_tokens = metadata.end_of_turn_tokens;
  description.fingerprint_hex = weights->fingerprint().ToHex();
  description.vocab_size = weights->config().vocab_size;
  description.max_context = loop->max_context();
  description.eos_token_ids = lo.eos_token_ids;
  description.chunk_size = weights->config().chunk_size();
  description.page_size = model->page_size();
  description.checkpoint_interval = model->options().checkpoint_interval;
  decode::GenerationService service(*loop, description, std::move(tenants), &metrics);
  // One server thread per open stream: bound them (beyond the batch and the
  // wait queue, calls are refused anyway).
  ASSIGN_OR_RETURN(
      std::unique_ptr<worker::GrpcServer> server,
      worker::GrpcServer::Start(absl::GetFlag(FLAGS_address), {&service}, options.tls, options.connection_age,
                                static_cast<int>(2 * (lo.max_batch + lo.max_waiting) + 16)));

  // Readiness: this worker can serve while a prefill worker is resolved
  // (one that is unreachable is waited for, --prefill_unavailable_wait) or
  // while it prefills itself when none answers (--fallback_prefill_max_tokens);
  // checked every second.
  const bool fallback = lo.fallback_prefill_max_tokens > 0;
  auto can_serve = [&] { return fallback || prefill_side.resolved(); };
  server->SetReady(can_serve());
  absl::Notification stop_readiness;
  std::thread readiness;
  if (!fallback) {
    readiness = std::thread([&] {
      bool ready = can_serve();
      while (!stop_readiness.WaitForNotificationWithTimeout(absl::Seconds(1))) {
        const bool now = can_serve();
        if (now == ready) continue;
        ready = now;
        LOG(WARNING) << (ready ? "a prefill worker is resolved: ready"
                               : "no prefill worker is resolved and "
                                 "--fallback_prefill_max_tokens=0: not ready");
        server->SetReady(ready);
      }
    });
  }
  if (!can_serve()) LOG(WARNING) << "no prefill worker is resolved and --fallback_prefill_max_tokens=0: not ready";

  const bool aggregated = prefill_side.plane == nullptr;
  LOG(INFO) << "decode serving " << weights->config().LayerPattern() << " on port " << server->port() << ", "
            << (aggregated ? std::string("aggregated (prefill in process)")
                           : absl::StrCat("data plane ", lo.endpoint, ", prefill ", absl::GetFlag(FLAGS_prefill)))
            << cache->Describe(lo.read_history_pages ? "prompts' cached pages read here" : "")
            << (local_worker != nullptr && cache_client != nullptr && lo.local_prefill_max_tokens > 0
                    ? absl::StrCat(", continuations of up to ", lo.local_prefill_max_tokens,
                                   " new tokens prefilled here")
                    : std::string())
            << (lo.fallback_prefill_max_tokens > 0
                    ? absl::StrCat(", prompts of up to ", lo.fallback_prefill_max_tokens,
                                   " tokens prefilled here when their prefill call fails")
                    : std::string(", no fallback prefill"))
            << (exposer ? absl::StrCat(", metrics on port ", exposer->port()) : std::string());
  const std::string data_port = aggregated ? std::string() : prefill_side.plane->listening();
  std::cout << "DECODE_READY port=" << server->port() << (data_port.empty() ? "" : " data_port=" + data_port)
            << (exposer ? absl::StrCat(" metrics_port=", exposer->port()) : "")
            << (server->health_port() != 0 ? absl::StrCat(" health_port=", server->health_port()) : "") << std::endl;

  worker::DrainSteps drain;
  drain.refuse = [&] { loop->Drain(); };
  drain.settle = [&](absl::Time grace_end) {
    while (!loop->Idle() && absl::Now() < grace_end) absl::SleepFor(absl::Milliseconds(20));
    if (!loop->Idle()) LOG(WARNING) << "grace period over: aborting the requests still running";
  };
  drain.before_wait = [&] {
    exposer.reset();  // its scrapes read the loop
    loop.reset();     // aborts what still runs; every stream gets its final message
  };
  server->ServeUntilSignal(options.shutdown_grace, drain);
  stop_readiness.Notify();
  if (readiness.joinable()) readiness.join();
  return absl::OkStatus();
}

}  // namespace
}  // namespace hybridserve

int main(int argc, char** argv) { return hybridserve::worker::WorkerMain(argc, argv, kUsage, hybridserve::Run); }
