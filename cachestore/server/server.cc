#include "cachestore/server/server.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/health.h"
#include "common/status_macros.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/resource_quota.h"

namespace hybridserve::cachestore {
namespace {

// After the last call of a drain ended: the time readers get for the bytes
// still in flight before the connections close.
constexpr absl::Duration kCloseLinger = absl::Milliseconds(500);

// gRPC's synchronous server keeps one polling thread from the quota and runs
// each open call on another: with fewer than 2, every reflection call would be
// refused (measured in streams_test).
constexpr int kMinThreads = 2;

}  // namespace

absl::StatusOr<std::unique_ptr<CacheStoreServer>> CacheStoreServer::Start(const ServerOptions& options,
                                                                          const common::Clock& clock,
                                                                          prometheus::Registry& registry) {
  if (options.service.max_chunk_bytes <= 0 || options.service.max_chunk_bytes > (int64_t{64} << 20)) {
    return absl::InvalidArgumentError("max_chunk_bytes must be in (0, 64 MiB]");
  }
  if (options.service.max_streams < 1 || options.service.max_streams_per_peer < 1) {
    return absl::InvalidArgumentError("max_streams and max_streams_per_peer must be >= 1");
  }
  if (options.max_threads < kMinThreads) {
    return absl::InvalidArgumentError(absl::StrCat("max_threads must be >= ", kMinThreads));
  }
  if (!options.bulk.address.empty() && options.tls.enabled()) {
    return absl::InvalidArgumentError(
        "a bulk address serves cache bytes over plain TCP; it cannot be combined with TLS (drop it: reads then "
        "stay on the encrypted gRPC stream)");
  }
  auto server = std::unique_ptr<CacheStoreServer>(new CacheStoreServer());
  CacheIndexOptions index = options.index;
  // The shm read path sends entries where they live: in shared memory.
  if (!options.shm.socket_path.empty()) index.blob_storage = BlobStorage::kSharedMemory;
  ASSIGN_OR_RETURN(server->store_, CacheStore::Create(index, clock, options.disk));
  server->metrics_ = std::make_unique<ServiceMetrics>(registry, options.index.eviction);
  server->service_ = std::make_unique<CacheStoreService>(*server->store_, *server->metrics_, options.service);
  server->reap_interval_ = options.reap_interval;

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  // gRPC sets SO_REUSEPORT by default: a second server on a taken port would
  // share it silently instead of failing with "port in use".
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials, common::NewServerCredentials(options.tls));
  builder.AddListeningPort(options.address, credentials, &server->port_);
  builder.RegisterService(server->service_.get());
  grpc::ResourceQuota quota("cachestore");
  quota.SetMaxThreads(options.max_threads);
  builder.SetResourceQuota(quota);
  // Room for a full chunk plus the message framing.
  const int max_message = static_cast<int>(options.service.max_chunk_bytes + (1 << 20));
  builder.SetMaxReceiveMessageSize(max_message);
  builder.SetMaxSendMessageSize(max_message);
  // Detect dead peers so a vanished writer's stream ends.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 20000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  common::ApplyConnectionAge(options.connection_age, builder);
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options.address));
  }
  server->server_->GetHealthCheckService()->SetServingStatus(true);
  server->server_->GetHealthCheckService()->SetServingStatus(common::kLivenessHealthService, true);
  if (!options.health_address.empty()) {
    ASSIGN_OR_RETURN(server->health_, common::HealthServer::Start(options.health_address));
  }
  if (!options.shm.socket_path.empty()) {
    ServiceMetrics* metrics = server->metrics_.get();
    ASSIGN_OR_RETURN(server->shm_, ShmServer::Start(
                                       options.shm, *server->store_,
                                       [metrics](const ShmReadEvent& e) {
                                         metrics->RecordShmRead(e.code == absl::StatusCode::kOk, e.refused_peer,
                                                                e.bytes);
                                       },
                                       [metrics](const ShmPutEvent& e) {
                                         metrics->RecordShmPut(e.code == absl::StatusCode::kOk, e.bytes, e.seconds);
                                       }));
  }
  if (!options.bulk.address.empty()) {
    ServiceMetrics* metrics = server->metrics_.get();
    ASSIGN_OR_RETURN(server->bulk_, BulkServer::Start(
                                        options.bulk, *server->store_,
                                        [metrics](const BulkReadEvent& e) {
                                          metrics->RecordBulkRead(e.code == absl::StatusCode::kOk, e.bytes);
                                        },
                                        [metrics](const BulkPutEvent& e) {
                                          metrics->RecordBulkPut(e.code == absl::StatusCode::kOk, e.bytes, e.seconds);
                                        }));
  }
  CacheStoreServer* self = server.get();
  server->reaper_ = std::thread([self] {
    while (!self->stop_.WaitForNotificationWithTimeout(self->reap_interval_)) self->ReapOnce();
  });
  return server;
}

void CacheStoreServer::ReapOnce() {
  std::vector<uint64_t> reclaimed = store_->Expire();
  if (!reclaimed.empty()) service_->CancelReclaimedPuts(reclaimed);
  metrics_->SyncFromStats(store_->Stats());
}

void CacheStoreServer::Shutdown(absl::Duration grace) {
  {
    absl::MutexLock lock(&shutdown_mu_);
    if (shut_down_) return;
    shut_down_ = true;
  }
  // server_ is null and the reaper not running when Start failed part way.
  const absl::Time deadline = absl::Now() + grace;
  // Not ready any more; still alive until it exits (common/health.h).
  if (server_ != nullptr) server_->GetHealthCheckService()->SetServingStatus("", false);
  if (health_ != nullptr) health_->SetServing("", false);
  stop_.Notify();
  if (reaper_.joinable()) reaper_.join();
  // A shm read is short (descriptors, no bytes); the socket closes before the drain.
  if (shm_ != nullptr) shm_->Stop();
  // A bulk read in flight ends with the connection: its reader falls back to gRPC.
  bulk_.reset();
  if (server_ != nullptr) {
    // New calls are refused (UNAVAILABLE) while the calls in flight end on
    // their own, within the grace. Only then does gRPC close the
    // connections: its own shutdown ends calls by their final status handed
    // to the transport, not received, and a connection closed with the
    // client's frames unread is reset, losing the tail of a Get the client
    // was still reading (cachestore_process_test lost ~600 KB of 48 MiB in
    // about 1 run in 10 under ASan). The linger gives readers the bytes in
    // flight (at most a flow-control window a stream) before the close.
    service_->Drain();
    if (service_->AwaitCallsDone(deadline)) absl::SleepFor(std::min(kCloseLinger, deadline - absl::Now()));
    server_->Shutdown(absl::ToChronoTime(deadline));
    server_->Wait();
  }
  // No call is left to change the memory: what it holds goes to disk.
  if (store_ != nullptr && store_->has_disk_tier()) {
    store_->SpillToDisk();
    if (metrics_ != nullptr) metrics_->SyncFromStats(store_->Stats());
  }
  health_.reset();
  stopped_.Notify();
}

void CacheStoreServer::Wait() { stopped_.WaitForNotification(); }

CacheStoreServer::~CacheStoreServer() { Shutdown(absl::ZeroDuration()); }

}  // namespace hybridserve::cachestore
