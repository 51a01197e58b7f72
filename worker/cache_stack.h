#ifndef HYBRIDSERVE_WORKER_CACHE_STACK_H_
#define HYBRIDSERVE_WORKER_CACHE_STACK_H_

// A worker's cache clients, built once for both worker binaries (prefill,
// decode), each in front of the one below it:
//
//   direct puts   cachestore/client/direct_put_cache_client.h   (shm socket, else bulk port)
//   direct reads  cachestore/client/direct_read_cache_client.h  (shm socket, else bulk port)
//   gRPC          cachestore/client/grpc_cache_client.h         the control plane and every fallback
//
// Either direct layer may be absent; without a cachestore address there is
// no stack at all (client() is null: requests run as cache misses). When
// --cachestore names several shards (a list, or dns:///), each shard gets
// such a stack and a cachestore::ShardedCacheClient over them is the client
// (worker/cache_shards.h); one plain target keeps the one stack.

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "cachestore/cache_client.h"
#include "cachestore/client/direct_put_cache_client.h"
#include "cachestore/client/direct_read_cache_client.h"
#include "cachestore/client/grpc_cache_client.h"
#include "common/tls.h"
#include "worker/cache_shard_metrics.h"
#include "worker/cache_shards.h"
#include "worker/direct_put_metrics.h"
#include "worker/direct_read_metrics.h"

namespace hybridserve::worker {

// worker/flags.cc builds these from the flags named on each field.
struct CacheStackOptions {
  // --cachestore: host:port; shards: host:port,host:port,... or
  // dns:///NAME:PORT (cache_shards.h). Empty: no cache.
  std::string address;
  // --cachestore_shm_socket: the cachestore's --shm_socket on this host;
  // reads (and puts) by shared memory. Empty: not by shared memory. With
  // shards: SHARD_NAME=PATH[,SHARD_NAME=PATH] (the shards on this node).
  std::string shm_socket;
  // --cachestore_bulk_address: the cachestore's --bulk_address; reads (and
  // puts) over plain TCP, not beside TLS. Empty: not over the bulk port. The
  // shm socket wins when both are given. With shards: :PORT (each shard's
  // host at that port).
  std::string bulk_address;
  // --cachestore_resolve_interval: how often dns:/// is resolved again.
  absl::Duration resolve_interval = absl::Seconds(10);
  // How often a shard that failed is probed, and the probe's deadline (or
  // `timeout`, when shorter).
  absl::Duration probe_interval = absl::Milliseconds(500);
  absl::Duration probe_timeout = absl::Milliseconds(500);
  bool direct_puts = true;                    // --cachestore_direct_puts
  absl::Duration timeout = absl::Seconds(2);  // --cache_timeout: per call, every layer
  common::ChannelTlsOptions tls;              // the --tls_* flags of this process's calls
};

// Not thread-safe to build; once built, the clients are (cache_client.h).
class CacheStack {
 public:
  // The stack `options` ask for. A cachestore that is not up yet is no error
  // (logged: requests miss the cache until it is). INVALID_ARGUMENT naming
  // the flag: a bulk address beside TLS to the cachestore (its bytes would
  // travel unencrypted) or one that does not parse; --cachestore's errors;
  // with shards, CacheShards::Connect's.
  static absl::StatusOr<std::unique_ptr<CacheStack>> Connect(const CacheStackOptions& options);

  // The outermost client, what the workers call; null without a cache.
  // Valid while the stack lives.
  cachestore::CacheClient* client() const { return client_; }
  // The shards; null without several.
  CacheShards* shards() const { return shards_.get(); }
  // Each layer of the one stack; null where absent (and with shards).
  cachestore::GrpcCacheClient* grpc() const { return grpc_.get(); }
  cachestore::DirectReadCacheClient* direct_reads() const { return direct_reads_.get(); }
  cachestore::DirectPutCacheClient* direct_puts() const { return direct_puts_.get(); }
  // Direct reads go by shared memory (not over the bulk port); false with
  // shards (some of them are on other nodes).
  bool reads_by_shared_memory() const { return direct_reads_ != nullptr && !options_.shm_socket.empty(); }

  // For the start-up log: with shards CacheShards::Describe's; otherwise
  // ", no cache", ", cachestore ADDRESS", or with
  // direct reads ", cachestore ADDRESS (reads and puts by shared memory on
  // PATH[, note])" (or "reads over the bulk port ADDRESS", ...).
  std::string Describe(absl::string_view note = "") const;

  // Advances `reads` and `puts` to the direct layers' cumulative counts
  // (summed over the shards, by path), and `shard_metrics` (when given) to
  // the shards' (before each scrape); nothing for an absent layer.
  // Thread-safe.
  void SyncMetrics(DirectReadMetrics& reads, DirectPutMetrics& puts, CacheShardMetrics* shard_metrics = nullptr) const;

 private:
  explicit CacheStack(const CacheStackOptions& options) : options_(options) {}

  const CacheStackOptions options_;
  // In this order, so that each is destroyed before the one below it.
  std::unique_ptr<cachestore::GrpcCacheClient> grpc_;
  std::unique_ptr<cachestore::DirectReadCacheClient> direct_reads_;
  std::unique_ptr<cachestore::DirectPutCacheClient> direct_puts_;
  std::unique_ptr<CacheShards> shards_;
  cachestore::CacheClient* client_ = nullptr;
};

}  // namespace hybridserve::worker

#endif  // HYBRIDSERVE_WORKER_CACHE_STACK_H_
