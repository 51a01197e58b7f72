#ifndef HYBRIDSERVE_CACHESTORE_SERVICE_H_
#define HYBRIDSERVE_CACHESTORE_SERVICE_H_

// The cachestore's gRPC edge: converts proto to domain types, calls
// CacheStore, converts the status once. Thread-safe.

#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "cachestore/cache_store.h"
#include "cachestore/service_metrics.h"
#include "grpcpp/grpcpp.h"
#include "proto/cachestore.grpc.pb.h"

namespace hybridserve::cachestore {

struct ServiceOptions {
  // Largest Put chunk accepted and largest Get chunk served.
  int64_t max_chunk_bytes = int64_t{4} << 20;
  // Get chunk size when the request names none.
  int64_t default_chunk_bytes = int64_t{1} << 20;
};

class CacheStoreService final : public hybridserve::v1::CacheStore::Service {
 public:
  // `store` and `metrics` must outlive the service.
  CacheStoreService(CacheStore& store, ServiceMetrics& metrics, const ServiceOptions& options);

  grpc::Status Lookup(grpc::ServerContext* context, const v1::LookupRequest* request,
                      v1::LookupResponse* response) override;
  grpc::Status Put(grpc::ServerContext* context, grpc::ServerReader<v1::PutRequest>* reader,
                   v1::PutResponse* response) override;
  grpc::Status Get(grpc::ServerContext* context, const v1::GetRequest* request,
                   grpc::ServerWriter<v1::GetResponse>* writer) override;
  grpc::Status Release(grpc::ServerContext* context, const v1::ReleaseRequest* request,
                       v1::ReleaseResponse* response) override;
  grpc::Status Stats(grpc::ServerContext* context, const v1::StatsRequest* request,
                     v1::StatsResponse* response) override;

  // Cancels the streams of puts the store reclaimed (stalled writers), so their
  // handler threads return instead of waiting on a dead client.
  void CancelReclaimedPuts(const std::vector<uint64_t>& reservation_ids) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  grpc::Status DoPut(grpc::ServerContext* context, grpc::ServerReader<v1::PutRequest>* reader,
                     v1::PutResponse* response, int64_t* bytes);

  CacheStore& store_;
  ServiceMetrics& metrics_;
  const ServiceOptions options_;
  absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, grpc::ServerContext*> active_puts_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hybridserve::cachestore

#endif  // HYBRIDSERVE_CACHESTORE_SERVICE_H_
