#include "worker/cache_stack.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "cachestore/client/bulk_reader.h"
#include "cachestore/client/bulk_writer.h"
#include "cachestore/client/shm_reader.h"
#include "cachestore/client/shm_writer.h"
#include "common/logging.h"
#include "common/socket_io.h"
#include "common/status_macros.h"

namespace hybridserve::worker {
namespace {

absl::StatusOr<std::unique_ptr<cachestore::GrpcCacheClient>> ConnectGrpc(const CacheStackOptions& options) {
  cachestore::GrpcCacheClientOptions co;
  co.timeout = options.timeout;
  co.tls = options.tls;
  absl::StatusOr<std::unique_ptr<cachestore::GrpcCacheClient>> cache =
      cachestore::GrpcCacheClient::Create(options.address, co);
  if (!cache.ok()) {
    return absl::Status(cache.status().code(), absl::StrCat("--cachestore: ", cache.status().message()));
  }
  // A cachestore that starts later than this worker is no error: requests
  // miss the cache until it is up.
  if (absl::StatusOr<cachestore::IndexStats> stats = (*cache)->Stats(); !stats.ok()) {
    LOG(WARNING) << "the cachestore " << options.address << " is unreachable (" << stats.status()
                 << "): requests run as cache misses until it is up";
  }
  return cache;
}

// Reads by shared memory, else over the bulk port, in front of `grpc`; null
// without either.
absl::StatusOr<std::unique_ptr<cachestore::DirectReadCacheClient>> ConnectDirectReads(
    const CacheStackOptions& options, cachestore::GrpcCacheClient& grpc) {
  if (!options.shm_socket.empty()) {
    return std::make_unique<cachestore::DirectReadCacheClient>(
        grpc,
        std::make_unique<cachestore::ShmReader>(cachestore::ShmReaderOptions{options.shm_socket, options.timeout}));
  }
  if (options.bulk_address.empty()) return nullptr;
  if (!options.tls.ca_file.empty()) {
    return absl::InvalidArgumentError(
        "--cachestore_bulk_address reads cache bytes over plain TCP; it cannot be combined with TLS to the "
        "cachestore (drop it: reads then stay on the encrypted gRPC stream)");
  }
  std::string host, port;
  RETURN_IF_ERROR(common::SplitHostPort(options.bulk_address, &host, &port));
  return std::make_unique<cachestore::DirectReadCacheClient>(
      grpc,
      std::make_unique<cachestore::BulkReader>(cachestore::BulkReaderOptions{options.bulk_address, options.timeout}));
}

// Puts by the same direct path in front of `base`; null without one or with
// direct puts off.
std::unique_ptr<cachestore::DirectPutCacheClient> ConnectDirectPuts(const CacheStackOptions& options,
                                                                    cachestore::CacheClient& base) {
  if (!options.direct_puts) return nullptr;
  if (!options.shm_socket.empty()) {
    cachestore::ShmWriterOptions o;
    o.socket_path = options.shm_socket;
    o.timeout = options.timeout;
    return std::make_unique<cachestore::DirectPutCacheClient>(base, std::make_unique<cachestore::ShmWriter>(o));
  }
  // Beside TLS ConnectDirectReads has refused the bulk address already.
  if (options.bulk_address.empty() || !options.tls.ca_file.empty()) return nullptr;
  cachestore::BulkWriterOptions o;
  o.address = options.bulk_address;
  o.timeout = options.timeout;
  return std::make_unique<cachestore::DirectPutCacheClient>(base, std::make_unique<cachestore::BulkWriter>(o));
}

}  // namespace

absl::StatusOr<std::unique_ptr<CacheStack>> CacheStack::Connect(const CacheStackOptions& options) {
  std::unique_ptr<CacheStack> stack(new CacheStack(options));
  if (options.address.empty()) return stack;
  if (CacheShards::NamesShards(options.address)) {
    ASSIGN_OR_RETURN(stack->shards_, CacheShards::Connect(options));
    stack->client_ = &stack->shards_->client();
    return stack;
  }
  ASSIGN_OR_RETURN(stack->grpc_, ConnectGrpc(options));
  stack->client_ = stack->grpc_.get();
  ASSIGN_OR_RETURN(stack->direct_reads_, ConnectDirectReads(options, *stack->grpc_));
  if (stack->direct_reads_ != nullptr) stack->client_ = stack->direct_reads_.get();
  stack->direct_puts_ = ConnectDirectPuts(options, *stack->client_);
  if (stack->direct_puts_ != nullptr) stack->client_ = stack->direct_puts_.get();
  return stack;
}

std::string CacheStack::Describe(absl::string_view note) const {
  if (shards_ != nullptr) return shards_->Describe(note);
  if (grpc_ == nullptr) return ", no cache";
  if (direct_reads_ == nullptr) return absl::StrCat(", cachestore ", options_.address);
  const char* what = options_.direct_puts ? "reads and puts" : "reads";
  const std::string path = options_.shm_socket.empty()
                               ? absl::StrCat(what, " over the bulk port ", options_.bulk_address)
                               : absl::StrCat(what, " by shared memory on ", options_.shm_socket);
  return absl::StrCat(", cachestore ", options_.address, " (", path, note.empty() ? "" : ", ", note, ")");
}

void CacheStack::SyncMetrics(DirectReadMetrics& reads, DirectPutMetrics& puts, CacheShardMetrics* shard_metrics) const {
  if (shards_ != nullptr) {
    for (const auto& [path, counts] : shards_->ReadCounts()) reads.Sync(counts);
    for (const auto& [path, counts] : shards_->PutCounts()) puts.Sync(counts);
    if (shard_metrics != nullptr) shard_metrics->Sync(shards_->client().counts());
    return;
  }
  if (direct_reads_ != nullptr) reads.Sync(direct_reads_->counts());
  if (direct_puts_ != nullptr) puts.Sync(direct_puts_->counts());
}

}  // namespace hybridserve::worker
