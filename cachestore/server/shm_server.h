#ifndef HYBRIDSERVE_CACHESTORE_SERVER_SHM_SERVER_H_
#define HYBRIDSERVE_CACHESTORE_SERVER_SHM_SERVER_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cachestore/index/cache_store.h"
#include "cachestore/wire/shm_protocol.h"

namespace hybridserve::cachestore {

struct ShmServerOptions {
  // The Unix socket's path (at most 107 bytes). Its directory must not be
  // writable by others unless sticky; a stale socket there is replaced, any
  // other file is refused. The socket is made 0600 before it listens.
  std::string socket_path;
  // Peers (SO_PEERCRED) allowed to read; empty: this process's uid only.
  std::vector<uid_t> allowed_uids;
  // Connections served at once, one thread each; more wait in the backlog.
  int max_connections = 8;
  // A read's I/O (each request and response), and the idle time after which
  // a connection is closed.
  absl::Duration io_timeout = absl::Seconds(10);
};

// What a read came to, for the server's metrics: `code` is OK or the refusal's,
// `bytes` the entry bytes described to the reader (sent as descriptors);
// `refused_peer` for a connection refused by the credentials check (no
// request read).
struct ShmReadEvent {
  absl::StatusCode code = absl::StatusCode::kOk;
  int64_t bytes = 0;
  bool refused_peer = false;
};

// What one entry of a put on the socket came to, for the server's metrics:
// `code` is its answer's, `bytes` what it committed (0 when already
// present), `seconds` from its header to its answer.
struct ShmPutEvent {
  absl::StatusCode code = absl::StatusCode::kOk;
  int64_t bytes = 0;
  double seconds = 0;
};

// Serves the reads of leased entries by shared memory (the format is in
// shm_protocol.h) without copying them: the store's entries live in memfd
// slabs (CacheIndexOptions::blob_storage = kSharedMemory, required), and for
// each request every key is opened through the lease with CacheStore::Open
// (NOT_FOUND outside the lease or without one; each read extends the lease),
// and the answer carries the read-only descriptor of each distinct slab once,
// and each entry's place in it. The stored checksum is not verified here: the
// reader verifies every entry, and takes a mismatch to gRPC, whose Get
// verifies, removes the entry and answers DATA_LOSS. The server holds the
// entries until the answer is sent (the descriptors are the slabs'); after
// that it is the lease that keeps each entry in its slot while the reader
// reads (a worker reads before it releases). The server uses no memory per
// read beyond the answer.
//
// It also takes puts (shm_protocol.h, "HSP1"): the writer's bytes arrive in a
// memfd of its own, and each entry is copied once from it into its
// reservation (CacheStore::BeginPut, PutSession::WriteWith: hashed as stored)
// and committed against the checksum the writer named, entry after entry
// with PutMany's answers. The descriptor is closed before the answer.
//
// Thread-safe. Stop (or destruction) ends every thread and removes the socket.
class ShmServer {
 public:
  // `store` must outlive the server and keep its entries in shared memory
  // (FAILED_PRECONDITION otherwise); `observe` (may be empty) is called on
  // the serving threads.
  static absl::StatusOr<std::unique_ptr<ShmServer>> Start(const ShmServerOptions& options, CacheStore& store,
                                                          std::function<void(const ShmReadEvent&)> observe = {},
                                                          std::function<void(const ShmPutEvent&)> observe_put = {});
  ~ShmServer();
  ShmServer(const ShmServer&) = delete;
  ShmServer& operator=(const ShmServer&) = delete;

  const std::string& socket_path() const { return options_.socket_path; }

  // Stops accepting, ends open connections at their next request, joins the
  // threads. Idempotent.
  void Stop();

 private:
  ShmServer(const ShmServerOptions& options, CacheStore& store, std::function<void(const ShmReadEvent&)> observe,
            std::function<void(const ShmPutEvent&)> observe_put);

  void Serve();
  void ServeConnection(int fd);
  // The response to `request`; *fds the descriptors to attach, *entries the
  // entries they belong to (held until the response is sent).
  ShmResponse Read(const ShmRequest& request, std::vector<int>* fds, std::vector<ReadHandle>* entries);
  // Answers a request that could not be read, in its format (`magic`).
  void Refuse(int fd, uint32_t magic, const absl::Status& why);
  // The answers to `request`, whose bytes are in `data_fd` (not closed here).
  ShmPutResponse Put(const ShmPutRequest& request, int data_fd);
  // Entry `index` of a put: PutMany's answer for it (a serialized
  // v1::PutManyResponse), its code in *code; *committed its bytes when it was
  // stored.
  std::string PutEntry(const ShmPutEntry& entry, uint32_t index, int data_fd, uint64_t data_size, int64_t* committed,
                       absl::StatusCode* code);
  // Waits until `fd` is readable or Stop; false on Stop or io_timeout.
  bool WaitReadable(int fd);

  const ShmServerOptions options_;
  const std::vector<uid_t> allowed_uids_;
  CacheStore& store_;
  const std::function<void(const ShmReadEvent&)> observe_;
  const std::function<void(const ShmPutEvent&)> observe_put_;
  int listen_fd_ = -1;
  int stop_fd_ = -1;  // an eventfd, readable once Stop began
  std::atomic<bool> stopped_{false};
  std::vector<std::thread> threads_;
};

}  // namespace hybridserve::cachestore

#endif  // HYBRIDSERVE_CACHESTORE_SERVER_SHM_SERVER_H_
