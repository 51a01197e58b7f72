#ifndef HYBRIDSERVE_WORKER_CACHE_SHARDS_H_
#define HYBRIDSERVE_WORKER_CACHE_SHARDS_H_

// A worker's cache over several cachestore shards (issue 49): one CacheStack
// per shard (its own gRPC, direct-read and direct-put clients) under one
// cachestore::ShardedCacheClient, and the shard set:
//
//   --cachestore=a:1,b:2          a static list: each target one shard, named
//                                 by the target itself (no call made)
//   --cachestore=dns:///NAME:PORT a headless Service: NAME resolved now and
//                                 every --cachestore_resolve_interval, each
//                                 address one shard, named by the name it
//                                 reports (Stats' shard_name, the
//                                 cachestore's --shard_name: its pod name),
//                                 so a pod back with a new IP keeps its
//                                 chains. A resolution that finds nothing
//                                 keeps the set; an address that does not
//                                 answer its name (asked with --cache_timeout)
//                                 is not a shard yet: resolved again after
//                                 min(--cachestore_resolve_interval, 1 s)
//                                 while one does not answer; two addresses
//                                 of one name: the first.
//
// Direct paths per shard: --cachestore_bulk_address is ":PORT" (each shard's
// bulk port on its own host), --cachestore_shm_socket is
// "SHARD_NAME=PATH[,SHARD_NAME=PATH]" (the shards on this node; a shard not
// named there is read over gRPC, or its bulk port).

#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cachestore/client/direct_put_cache_client.h"
#include "cachestore/client/direct_read_cache_client.h"
#include "cachestore/client/grpc_cache_client.h"
#include "cachestore/client/sharded_cache_client.h"

namespace hybridserve::worker {

struct CacheStackOptions;
class CacheStack;

// Thread-safe once built.
class CacheShards {
 public:
  // Whether --cachestore names shards (a comma-separated list, or dns:///)
  // rather than one cachestore.
  static bool NamesShards(absl::string_view address);

  // The shards `options` name (NamesShards(options.address)); for dns:///,
  // resolved once before it returns, then by a thread of its own. A shard
  // that is not up yet is no error (it is probed; requests miss meanwhile).
  // INVALID_ARGUMENT naming the flag: --cachestore (a target that is not
  // host:port, one listed twice, dns:/// without NAME:PORT),
  // --cachestore_bulk_address (not ":PORT"), --cachestore_shm_socket (not
  // NAME=PATH pairs, a name twice), --cachestore_resolve_interval (not > 0).
  static absl::StatusOr<std::unique_ptr<CacheShards>> Connect(const CacheStackOptions& options);
  ~CacheShards();

  cachestore::ShardedCacheClient& client() const { return *client_; }

  // For the start-up log: ", cachestore shards SOURCE: NAME[ at TARGET][
  // (direct path)], ...".
  std::string Describe(absl::string_view note) const ABSL_LOCKS_EXCLUDED(mu_);

  // The direct layers' counts summed over the shards, by path ("shm",
  // "bulk"), those of shards that left the set included.
  std::map<std::string, cachestore::DirectReadCounts> ReadCounts() const ABSL_LOCKS_EXCLUDED(mu_);
  std::map<std::string, cachestore::DirectPutCounts> PutCounts() const ABSL_LOCKS_EXCLUDED(mu_);

  // Resolves dns:/// now and applies the result (the thread's step); nothing
  // for a static list.
  void Resolve() ABSL_LOCKS_EXCLUDED(mu_, resolve_mu_);

 private:
  struct Source;
  struct Member {
    std::string name;
    std::shared_ptr<CacheStack> stack;
    std::shared_ptr<cachestore::GrpcCacheClient> probe;  // Stats with a short deadline
  };

  CacheShards(const CacheStackOptions& options, std::unique_ptr<Source> source);
  // The stack and probe client of the shard `name` at `target`.
  absl::StatusOr<Member> ConnectShard(const std::string& target, const std::string& name) const;
  // Publishes `members` (by target) to the sharded client; the members no
  // longer there retire (their counts kept in the sums).
  absl::Status Apply(std::map<std::string, Member> members) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ResolveLoop() ABSL_LOCKS_EXCLUDED(mu_);
  // The wait before the next resolution: the resolve interval, or at most
  // kUnansweredRetry while `unanswered` resolved addresses did not answer.
  absl::Duration RetryInterval(int unanswered) const;

  static constexpr absl::Duration kUnansweredRetry = absl::Seconds(1);

  const std::unique_ptr<const CacheStackOptions> options_;
  const std::unique_ptr<const Source> source_;
  std::unique_ptr<cachestore::ShardedCacheClient> client_;
  mutable absl::Mutex mu_;
  std::map<std::string, Member> members_ ABSL_GUARDED_BY(mu_);  // by target
  std::map<std::string, cachestore::DirectReadCounts> retired_reads_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, cachestore::DirectPutCounts> retired_puts_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // The addresses of the last resolution that did not answer.
  std::set<std::string> unanswered_ ABSL_GUARDED_BY(mu_);
  absl::Mutex resolve_mu_;  // one Resolve at a time
  std::thread resolver_;
};

}  // namespace hybridserve::worker

#endif  // HYBRIDSERVE_WORKER_CACHE_SHARDS_H_
