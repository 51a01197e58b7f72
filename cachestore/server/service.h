#ifndef HYBRIDSERVE_CACHESTORE_SERVER_SERVICE_H_
#define HYBRIDSERVE_CACHESTORE_SERVER_SERVICE_H_

// The cachestore's gRPC edge: converts proto to domain types, calls
// CacheStore, converts the status once. Thread-safe.

#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "cachestore/index/cache_store.h"
#include "cachestore/server/call_admission.h"
#include "cachestore/server/service_metrics.h"
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
  // Calls of this service in flight over all clients (--max_streams), and
  // from one client connection (--max_streams_per_peer). A call beyond either
  // ends at once with RESOURCE_EXHAUSTED naming the flag.
  int64_t max_streams = 1024;
  int64_t max_streams_per_peer = 256;
  // Stats' shard_name: what workers place this shard by (--shard_name).
  std::string shard_name;
};

class PutReactor;
class PutManyReactor;
template <typename Response>
class EntryStreamReactor;

// A put stream whose entry in flight the store can reclaim (Put's and
// PutMany's reactors): Reclaim ends the stream with ABORTED. Called with the
// service's mu_ held, while the stream is registered in active_puts_.
class ReclaimablePut {
 public:
  virtual void Reclaim() = 0;

 protected:
  ~ReclaimablePut() = default;
};

// Every method is a callback (reactor) handler: an open stream holds a
// reactor and its buffers, never a thread, so the threads stay bounded
// whatever clients do (a synchronous handler holds a thread per open stream:
// 1,000 stalled puts made 1,016 threads). Handlers never block on a client;
// they run on gRPC's callback threads and only take the store's locks.
// Put's reactor also lets the reaper end a reclaimed put with ABORTED while it
// waits for the stalled writer's next message (a synchronous handler could
// only be cancelled, which the writer sees as CANCELLED). Get and GetMany keep
// one write outstanding and the entry's bytes alive until the write is done.
// Put, Get and GetMany are raw methods: their messages stay gRPC byte buffers,
// so an entry's bytes go from the transport's slices into the entry and from
// the entry into slices that point at it (entry_messages.h), never through a protobuf
// string. The wire format is the proto's.
// PutMany is raw too, its entries' chunks decoded in place as Put's are.
using CacheStoreHandlers = v1::CacheStore::WithCallbackMethod_Lookup<v1::CacheStore::WithRawCallbackMethod_Put<
    v1::CacheStore::WithRawCallbackMethod_PutMany<v1::CacheStore::WithRawCallbackMethod_Get<
        v1::CacheStore::WithRawCallbackMethod_GetMany<v1::CacheStore::WithCallbackMethod_Release<
            v1::CacheStore::WithCallbackMethod_Stats<v1::CacheStore::Service>>>>>>>;

class CacheStoreService final : public CacheStoreHandlers {
 public:
  // `store` and `metrics` must outlive the service.
  CacheStoreService(CacheStore& store, ServiceMetrics& metrics, const ServiceOptions& options);

  grpc::ServerUnaryReactor* Lookup(grpc::CallbackServerContext* context, const v1::LookupRequest* request,
                                   v1::LookupResponse* response) override;
  // Raw: PutRequest messages in, a PutResponse out.
  grpc::ServerReadReactor<grpc::ByteBuffer>* Put(grpc::CallbackServerContext* context,
                                                 grpc::ByteBuffer* response) override;
  // Raw: PutRequest messages in (entry after entry), PutManyResponse
  // messages out (put_many_reactor.cc).
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* PutMany(grpc::CallbackServerContext* context) override;
  // Raw: a GetRequest in, GetResponse messages out.
  grpc::ServerWriteReactor<grpc::ByteBuffer>* Get(grpc::CallbackServerContext* context,
                                                  const grpc::ByteBuffer* request) override;
  // Raw: a GetManyRequest in, GetManyResponse messages out.
  grpc::ServerWriteReactor<grpc::ByteBuffer>* GetMany(grpc::CallbackServerContext* context,
                                                      const grpc::ByteBuffer* request) override;
  grpc::ServerUnaryReactor* Release(grpc::CallbackServerContext* context, const v1::ReleaseRequest* request,
                                    v1::ReleaseResponse* response) override;
  grpc::ServerUnaryReactor* Stats(grpc::CallbackServerContext* context, const v1::StatsRequest* request,
                                  v1::StatsResponse* response) override;

  // Ends the streams of puts the store reclaimed (stalled writers) with
  // ABORTED, instead of waiting on a writer that may be gone.
  void CancelReclaimedPuts(const std::vector<uint64_t>& reservation_ids) ABSL_LOCKS_EXCLUDED(mu_);

  // The drain: every new call is refused with UNAVAILABLE; the calls in
  // flight go on. AwaitCallsDone waits until they have all ended (their final
  // status handed to gRPC); false at `deadline`.
  void Drain() { admission_.Close(); }
  bool AwaitCallsDone(absl::Time deadline) { return admission_.AwaitIdle(deadline); }

 private:
  friend class PutReactor;
  friend class PutManyReactor;
  template <typename Response>
  friend class EntryStreamReactor;

  // The unary methods' work, run on the handler's thread.
  grpc::Status AnswerLookup(const v1::LookupRequest& request, v1::LookupResponse* response);
  grpc::Status AnswerRelease(const v1::ReleaseRequest& request);
  grpc::Status AnswerStats(v1::StatsResponse* response);

  // A unary call: admitted, answered by `answer` now, its slot held until
  // the call is done; or refused with RESOURCE_EXHAUSTED.
  template <typename Answer>
  grpc::ServerUnaryReactor* Unary(grpc::CallbackServerContext* context, Answer answer);

  // A slot for a call from `context`'s peer, or RESOURCE_EXHAUSTED (counted).
  absl::StatusOr<CallAdmission::Slot> Admit(grpc::CallbackServerContext* context);
  // Admit, then `raw` parsed into `request`; INVALID_ARGUMENT ("malformed
  // <message>") when it does not parse, the slot given back.
  template <typename Request>
  absl::StatusOr<CallAdmission::Slot> AdmitRaw(grpc::CallbackServerContext* context, const grpc::ByteBuffer& raw,
                                               Request* request);

  // A Get's chunk size: the request's (0: the default), within [4 KiB, max].
  int64_t ChunkBytes(uint32_t requested) const;

  CacheStore& store_;
  ServiceMetrics& metrics_;
  const ServiceOptions options_;
  CallAdmission admission_;
  absl::Mutex mu_;
  // Puts past their header, by reservation id; a reactor removes its entry
  // when the entry ends (PutMany) or in OnDone, before it is deleted.
  absl::flat_hash_map<uint64_t, ReclaimablePut*> active_puts_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hybridserve::cachestore

#endif  // HYBRIDSERVE_CACHESTORE_SERVER_SERVICE_H_
