#ifndef HYBRIDSERVE_CACHESTORE_CLIENT_BULK_WRITER_H_
#define HYBRIDSERVE_CACHESTORE_CLIENT_BULK_WRITER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "cachestore/client/bulk_connections.h"
#include "cachestore/client/direct_writer.h"
#include "common/socket_io.h"

namespace hybridserve::cachestore {

struct BulkWriterOptions {
  // The cachestore's bulk port, "host:port".
  std::string address;
  // The connect, and each step of a put (the request's head, each piece of
  // the bytes, the answer): a put makes progress or fails.
  absl::Duration timeout = absl::Seconds(10);
  // Entry bytes one request carries (an entry larger than this goes alone):
  // the cachestore answers a request after its last entry.
  int64_t request_bytes = int64_t{64} << 20;
};

// Puts entries over the cachestore's bulk port (bulk_protocol.h, "HBP1"),
// their bytes off the gRPC stream: each entry's bytes leave in pieces straight
// from the caller's memory (one kernel copy), each piece hashed just before
// it is sent, while in cache, and the checksum follows the entry. Connections
// are kept between calls (BulkConnections). Thread-safe.
class BulkWriter final : public DirectWriter {
 public:
  explicit BulkWriter(BulkWriterOptions options)
      : options_(std::move(options)), connections_(options_.address, options_.timeout) {}

  const char* name() const override { return "bulk"; }
  absl::Status Put(const ClientNamespace& ns, absl::Span<const PutManyEntry> entries,
                   std::vector<absl::StatusOr<PutResult>>* results) override;

  // Connections kept for the next put.
  int64_t idle_connections() const { return connections_.idle(); }

 private:
  // One request of `entries` on `socket`: its head, each entry's bytes and
  // checksum, then its answers.
  absl::Status PutRequest(common::Socket& socket, const ClientNamespace& ns, absl::Span<const PutManyEntry> entries,
                          std::vector<absl::StatusOr<PutResult>>* results);

  const BulkWriterOptions options_;
  BulkConnections connections_;
};

}  // namespace hybridserve::cachestore

#endif  // HYBRIDSERVE_CACHESTORE_CLIENT_BULK_WRITER_H_
