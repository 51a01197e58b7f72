#ifndef HYBRIDSERVE_CACHESTORE_SERVER_SERVER_H_
#define HYBRIDSERVE_CACHESTORE_SERVER_SERVER_H_

#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "cachestore/index/cache_store.h"
#include "cachestore/server/bulk_server.h"
#include "cachestore/server/service.h"
#include "cachestore/server/service_metrics.h"
#include "cachestore/server/shm_server.h"
#include "common/clock.h"
#include "common/connection_age.h"
#include "common/health_server.h"
#include "common/tls.h"
#include "grpcpp/grpcpp.h"
#include "prometheus/registry.h"

namespace hybridserve::cachestore {

struct ServerOptions {
  // "host:port"; port 0 picks a free one (see port()).
  std::string address = "127.0.0.1:0";
  CacheIndexOptions index;
  ServiceOptions service;
  // How often leases, stalled puts and idle entries are expired.
  absl::Duration reap_interval = absl::Milliseconds(500);
  // Threads gRPC may start for the synchronous services (reflection; gRPC
  // 1.51) through the server's grpc::ResourceQuota (--max_threads, >= 2): one
  // polls, each open call holds another. When they are spent, a new
  // reflection call ends at once with RESOURCE_EXHAUSTED "Server Threadpool
  // Exhausted" (gRPC's message). The CacheStore and health services are
  // callback services and take none from it.
  int max_threads = 64;
  // TLS on `address` (common/tls.h): with mutual TLS and allowed peers, only
  // the workers' identities may call; off when tls.cert_file is empty.
  common::ServerTlsOptions tls;
  // A plaintext port with the health service alone (kubelet probes); empty:
  // none.
  std::string health_address;
  // Each client connection to `address` is told to go away at this age
  // (common/connection_age.h); zero (the default): never.
  common::ConnectionAge connection_age;
  // Reads by shared memory for workers on this host (shm_server.h): on
  // when shm.socket_path is not empty, and then the store keeps its entries
  // in shared memory (index.blob_storage is set to kSharedMemory).
  ShmServerOptions shm;
  // Reads over plain TCP for workers on other hosts (bulk_server.h): on
  // when bulk.address is not empty. Refused beside TLS (INVALID_ARGUMENT):
  // its bytes travel unencrypted.
  BulkServerOptions bulk;
  // The disk tier (cachestore/index/disk_tier_cache.h): on when
  // disk.directory is not empty. Shutdown writes the memory's entries to it
  // (CacheStore::SpillToDisk) after the last call ended.
  DiskTierCacheOptions disk;
};

// A running cachestore: gRPC server with the CacheStore service, the standard
// health service and reflection, plus a reaper thread, and the shared-memory
// read socket and the bulk port when configured. Thread-safe. Its
// threads are bounded whatever clients do: the CacheStore service holds no
// thread per call and bounds its calls (ServiceOptions::max_streams), the
// synchronous services draw threads from a quota (max_threads).
class CacheStoreServer {
 public:
  // `clock` must outlive the server; `registry` receives the metrics.
  static absl::StatusOr<std::unique_ptr<CacheStoreServer>> Start(const ServerOptions& options,
                                                                 const common::Clock& clock,
                                                                 prometheus::Registry& registry);
  ~CacheStoreServer();  // Shutdown(absl::ZeroDuration()) if still running

  int port() const { return port_; }
  int health_port() const { return health_ != nullptr ? health_->port() : 0; }
  // The bulk port; 0 without one.
  int bulk_port() const { return bulk_ != nullptr ? bulk_->port() : 0; }
  // Connections the bulk port serves now.
  int64_t bulk_connections() const { return bulk_ != nullptr ? bulk_->connections() : 0; }
  CacheStore& store() { return *store_; }

  // Runs one reaper pass now (tests drive it with a fake clock).
  void ReapOnce();

  // Stops accepting work, marks health NOT_SERVING, gives in-flight calls
  // `grace` to finish, then cancels the rest; then, with a disk tier, writes
  // the memory's entries to disk (up to options.disk.shutdown_spill_timeout
  // more). Idempotent.
  void Shutdown(absl::Duration grace);

  // Blocks until Shutdown has completed.
  void Wait();

 private:
  CacheStoreServer() = default;

  std::unique_ptr<CacheStore> store_;
  std::unique_ptr<ServiceMetrics> metrics_;
  std::unique_ptr<CacheStoreService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<common::HealthServer> health_;  // null without a health address
  std::unique_ptr<ShmServer> shm_;                // null without a shm socket
  std::unique_ptr<BulkServer> bulk_;              // null without a bulk address
  int port_ = 0;
  absl::Duration reap_interval_;
  absl::Notification stop_;
  absl::Notification stopped_;
  std::thread reaper_;
  absl::Mutex shutdown_mu_;
  bool shut_down_ ABSL_GUARDED_BY(shutdown_mu_) = false;
};

}  // namespace hybridserve::cachestore

#endif  // HYBRIDSERVE_CACHESTORE_SERVER_SERVER_H_
