#ifndef HYBRIDSERVE_CACHESTORE_CLIENT_BULK_READER_H_
#define HYBRIDSERVE_CACHESTORE_CLIENT_BULK_READER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "cachestore/client/bulk_connections.h"
#include "cachestore/client/direct_reader.h"
#include "cachestore/keys.h"
#include "cachestore/types.h"
#include "cachestore/wire/bulk_protocol.h"
#include "common/socket_io.h"

namespace hybridserve::cachestore {

struct BulkReaderOptions {
  // The cachestore's bulk port, "host:port".
  std::string address;
  // The connect, and each step of a read (the request, the head, each piece
  // of an entry's bytes): a read makes progress or fails.
  absl::Duration timeout = absl::Seconds(10);
};

// Reads leased entries over the cachestore's bulk port (bulk_protocol.h,
// version 1), each entry's bytes received straight into the caller's memory
// (one kernel copy) and hashed piece by piece as they arrive, while in cache.
// A connection serves one read at a time and is kept for the next after a
// read that ended cleanly (at most kBulkMaxIdleConnections idle): a resume
// pays no connect, and a busy worker leaves no trail of closed sockets in
// TIME_WAIT. A kept connection the server has closed is replaced on the spot.
// Thread-safe.
class BulkReader final : public DirectReader {
 public:
  explicit BulkReader(BulkReaderOptions options)
      : options_(std::move(options)), connections_(options_.address, options_.timeout) {}

  const char* name() const override { return "bulk"; }
  size_t max_keys() const override { return kBulkMaxKeys; }

  absl::Status ReadInto(uint64_t lease_id, absl::Span<const Hash128> keys, absl::Span<std::string> out,
                        bool* verdict = nullptr) const override;
  absl::Status ReadScattered(uint64_t lease_id, absl::Span<const Hash128> keys, absl::Span<const EntrySegments> out,
                             bool* verdict = nullptr) const override;

  // Connections kept for the next read.
  int64_t idle_connections() const { return connections_.idle(); }

 private:
  // Where the entries' bytes go: Begin once per entry (its index and size;
  // an error is a verdict), then the memory for its next bytes, at most `max`
  // of them contiguous, until the entry is whole.
  class Sink {
   public:
    virtual ~Sink() = default;
    virtual absl::Status Begin(size_t index, uint64_t size) = 0;
    virtual absl::Span<char> Next(size_t max) = 0;
  };
  class StringSink;
  class SegmentsSink;

  absl::Status Read(uint64_t lease_id, absl::Span<const Hash128> keys, Sink& sink, bool* verdict) const;
  const BulkReaderOptions options_;
  mutable BulkConnections connections_;
};

}  // namespace hybridserve::cachestore

#endif  // HYBRIDSERVE_CACHESTORE_CLIENT_BULK_READER_H_
