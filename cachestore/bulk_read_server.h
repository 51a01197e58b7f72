#ifndef HYBRIDSERVE_CACHESTORE_BULK_READ_SERVER_H_
#define HYBRIDSERVE_CACHESTORE_BULK_READ_SERVER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cachestore/bulk_protocol.h"
#include "cachestore/cache_store.h"
#include "common/connection_server.h"
#include "common/socket_io.h"

namespace hybridserve::cachestore {

struct BulkReadServerOptions {
  // "host:port" to listen on; port 0: any free port.
  std::string address;
  // Connections served at once, one thread each; one more is closed at once.
  int max_connections = 32;
  // Each request's read, each piece of a response's write (at most
  // kBulkWriteBytes), and the idle time after which a connection is closed.
  absl::Duration io_timeout = absl::Seconds(10);
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
// The bytes travel unencrypted: the cachestore refuses a bulk address beside
// TLS (docs/ARCHITECTURE.md section 4). Thread-safe; destruction stops
// accepting, wakes and joins every connection.
class BulkReadServer {
 public:
  // `store` must outlive the server; `observe` (may be empty) is called on
  // the serving threads. UNAVAILABLE when the address cannot be bound;
  // INVALID_ARGUMENT for a malformed address or option.
  static absl::StatusOr<std::unique_ptr<BulkReadServer>> Start(const BulkReadServerOptions& options, CacheStore& store,
                                                               std::function<void(const BulkReadEvent&)> observe = {});
  ~BulkReadServer();
  BulkReadServer(const BulkReadServer&) = delete;
  BulkReadServer& operator=(const BulkReadServer&) = delete;

  int port() const { return port_; }
  // Connections being served now.
  int64_t connections() const { return connections_->connections(); }

 private:
  BulkReadServer(const BulkReadServerOptions& options, CacheStore& store, int port,
                 std::function<void(const BulkReadEvent&)> observe);
  void Serve(common::Socket& socket);
  // Answers one request: its head, then its entries' bytes. False when the
  // connection is to end (the write failed).
  bool Answer(common::Socket& socket, const BulkRequest& request);
  void Observe(absl::StatusCode code, int64_t bytes) const;

  const BulkReadServerOptions options_;
  CacheStore& store_;
  const int port_;
  const std::function<void(const BulkReadEvent&)> observe_;
  std::atomic<bool> stopping_{false};  // set before connections_ goes
  // Last: its connections use everything above until it is gone.
  std::unique_ptr<common::ConnectionServer> connections_;
};

}  // namespace hybridserve::cachestore

#endif  // HYBRIDSERVE_CACHESTORE_BULK_READ_SERVER_H_
