#ifndef HYBRIDSERVE_CACHESTORE_SERVER_BULK_SERVER_H_
#define HYBRIDSERVE_CACHESTORE_SERVER_BULK_SERVER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cachestore/index/cache_store.h"
#include "cachestore/wire/bulk_protocol.h"
#include "common/connection_server.h"
#include "common/socket_io.h"

namespace hybridserve::cachestore {

struct BulkServerOptions {
  // "host:port" to listen on; port 0: any free port.
  std::string address;
  // Connections served at once, one thread each; one more is closed at once.
  int max_connections = 32;
  // Each request's read, each piece of a response's write (at most
  // kBulkWriteBytes), and the idle time after which a connection is closed.
  absl::Duration io_timeout = absl::Seconds(10);
  // The most entry bytes one put request may declare (the store could hold
  // no more: its budgets together); 0: the store's page and state budgets.
  uint64_t max_put_bytes = 0;
};

// Bytes a response hands the kernel in one write (deadline) at most.
inline constexpr int64_t kBulkWriteBytes = int64_t{4} << 20;

// What a read came to, for the server's metrics: `code` is OK or the
// refusal's (UNAVAILABLE: the reader went away or stalled mid-response),
// `bytes` the entry bytes sent.
struct BulkReadEvent {
  absl::StatusCode code = absl::StatusCode::kOk;
  int64_t bytes = 0;
};

// What one entry of a put on the port came to, for the server's metrics:
// `code` is its answer's, `bytes` what it committed (0 when already present
// or refused), `seconds` from its header to its answer.
struct BulkPutEvent {
  absl::StatusCode code = absl::StatusCode::kOk;
  int64_t bytes = 0;
  double seconds = 0;
};

// Serves reads of leased entries over plain TCP (the format is in
// bulk_protocol.h): for each request every key is opened through the lease
// with CacheStore::Open (NOT_FOUND outside the lease or without one; each
// read extends the lease) and the entries are written from where the store
// keeps them, straight to the socket. The stored checksum is not verified
// here: the reader verifies every entry and takes a mismatch to gRPC, whose
// Get verifies, removes the entry and answers DATA_LOSS. A request's entries
// are held (ReadHandle) until its response is written, so a reader that
// stalls or leaves mid-response frees nothing another reader holds; a
// stalled one is dropped after io_timeout.
//
// It also takes puts (bulk_protocol.h, "HBP1"): each entry's bytes are
// received straight into its reservation (PutSession: hashed as stored), in
// pieces of 1 MiB each with its own deadline, and the entry is
// committed against the checksum that follows them; a refused entry's bytes
// are read and dropped. A writer that stalls or leaves mid-entry ends the
// connection, and the entry's reservation goes with it.
//
// The bytes travel unencrypted: the cachestore refuses a bulk address beside
// TLS (docs/ARCHITECTURE.md section 4). Thread-safe; destruction stops
// accepting, wakes and joins every connection.
class BulkServer {
 public:
  // `store` must outlive the server; `observe` (may be empty) is called on
  // the serving threads. UNAVAILABLE when the address cannot be bound;
  // INVALID_ARGUMENT for a malformed address or option.
  static absl::StatusOr<std::unique_ptr<BulkServer>> Start(const BulkServerOptions& options, CacheStore& store,
                                                           std::function<void(const BulkReadEvent&)> observe = {},
                                                           std::function<void(const BulkPutEvent&)> observe_put = {});
  ~BulkServer();
  BulkServer(const BulkServer&) = delete;
  BulkServer& operator=(const BulkServer&) = delete;

  int port() const { return port_; }
  // Connections being served now.
  int64_t connections() const { return connections_->connections(); }

 private:
  BulkServer(const BulkServerOptions& options, CacheStore& store, int port,
             std::function<void(const BulkReadEvent&)> observe, std::function<void(const BulkPutEvent&)> observe_put);
  void Serve(common::Socket& socket);
  // Answers one request: its head, then its entries' bytes. False when the
  // connection is to end (the write failed).
  bool Answer(common::Socket& socket, const BulkRequest& request);
  void Observe(absl::StatusCode code, int64_t bytes) const;
  // Takes a put's entries from the connection and answers them. False when
  // the connection is to end (a read or the answer's write failed).
  bool Put(common::Socket& socket, const BulkPutRequest& request);
  // One entry: its bytes (into its reservation, or dropped when it is
  // refused) and its checksum. Its answer's status in *status (OK when
  // stored or already present), its committed bytes in *committed; false when
  // the connection failed.
  bool PutEntry(common::Socket& socket, const BulkPutEntry& entry, absl::Status* status,
                std::unique_ptr<PutSession>* session, int64_t* committed);

  const BulkServerOptions options_;
  CacheStore& store_;
  const int port_;
  const uint64_t max_put_bytes_;  // options_.max_put_bytes, or the store's budgets
  const std::function<void(const BulkReadEvent&)> observe_;
  const std::function<void(const BulkPutEvent&)> observe_put_;
  std::atomic<bool> stopping_{false};  // set before connections_ goes
  // Last: its connections use everything above until it is gone.
  std::unique_ptr<common::ConnectionServer> connections_;
};

}  // namespace hybridserve::cachestore

#endif  // HYBRIDSERVE_CACHESTORE_SERVER_BULK_SERVER_H_
