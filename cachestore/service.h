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
  // Most keys in one GetMany.
  int64_t max_get_many_keys = 4096;
};

class PutReactor;

// Lookup, Get, Release and Stats are synchronous handlers; Put is a callback
// (reactor) handler, so that a put the store reclaims can be finished with
// ABORTED from the reaper while its handler waits for the stalled writer's
// next message (a synchronous handler could only be cancelled, which the
// writer sees as CANCELLED).
class CacheStoreService final
    : public hybridserve::v1::CacheStore::WithCallbackMethod_Put<hybridserve::v1::CacheStore::Service> {
 public:
  // `store` and `metrics` must outlive the service.
  CacheStoreService(CacheStore& store, ServiceMetrics& metrics, const ServiceOptions& options);

  grpc::Status Lookup(grpc::ServerContext* context, const v1::LookupRequest* request,
                      v1::LookupResponse* response) override;
  grpc::ServerReadReactor<v1::PutRequest>* Put(grpc::CallbackServerContext* context,
                                               v1::PutResponse* response) override;
  grpc::Status Get(grpc::ServerContext* context, const v1::GetRequest* request,
                   grpc::ServerWriter<v1::GetResponse>* writer) override;
  grpc::Status GetMany(grpc::ServerContext* context, const v1::GetManyRequest* request,
                       grpc::ServerWriter<v1::GetManyResponse>* writer) override;
  grpc::Status Release(grpc::ServerContext* context, const v1::ReleaseRequest* request,
                       v1::ReleaseResponse* response) override;
  grpc::Status Stats(grpc::ServerContext* context, const v1::StatsRequest* request,
                     v1::StatsResponse* response) override;

  // Ends the streams of puts the store reclaimed (stalled writers) with
  // ABORTED, instead of waiting on a writer that may be gone.
  void CancelReclaimedPuts(const std::vector<uint64_t>& reservation_ids) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  friend class PutReactor;

  CacheStore& store_;
  ServiceMetrics& metrics_;
  // A Get's chunk size: the request's (0: the default), within [4 KiB, max].
  int64_t ChunkBytes(uint32_t requested) const;

  const ServiceOptions options_;
  absl::Mutex mu_;
  // Puts past their header, by reservation id; a reactor removes itself in
  // OnDone, before it is deleted.
  absl::flat_hash_map<uint64_t, PutReactor*> active_puts_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hybridserve::cachestore

#endif  // HYBRIDSERVE_CACHESTORE_SERVICE_H_
