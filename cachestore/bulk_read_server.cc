#include "cachestore/bulk_read_server.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"

namespace hybridserve::cachestore {

absl::StatusOr<std::unique_ptr<BulkReadServer>> BulkReadServer::Start(
    const BulkReadServerOptions& options, CacheStore& store, std::function<void(const BulkReadEvent&)> observe) {
  if (options.max_connections < 1) return absl::InvalidArgumentError("bulk max_connections must be >= 1");
  if (options.io_timeout <= absl::ZeroDuration()) return absl::InvalidArgumentError("bulk io_timeout must be > 0");
  int bound = 0;
  ASSIGN_OR_RETURN(common::Socket listener, common::Listen(options.address, &bound));
  std::unique_ptr<BulkReadServer> server(new BulkReadServer(options, store, bound, std::move(observe)));
  BulkReadServer* s = server.get();
  server->connections_ = std::make_unique<common::ConnectionServer>(std::move(listener), options.max_connections,
                                                                    [s](common::Socket& c) { s->Serve(c); });
  return server;
}

BulkReadServer::BulkReadServer(const BulkReadServerOptions& options, CacheStore& store, int port,
                               std::function<void(const BulkReadEvent&)> observe)
    : options_(options), store_(store), port_(port), observe_(std::move(observe)) {}

BulkReadServer::~BulkReadServer() {
  stopping_ = true;
  connections_.reset();
}

void BulkReadServer::Serve(common::Socket& socket) {
  while (!stopping_) {
    // Idle between requests for at most io_timeout (a closed or shut-down
    // socket is readable: the read below then fails).
    pollfd p{socket.fd(), POLLIN, 0};
    const int ready = poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(options_.io_timeout)));
    if (ready <= 0 || stopping_) return;
    absl::StatusOr<BulkRequest> request = ReadBulkRequest(socket, absl::Now() + options_.io_timeout);
    if (!request.ok()) {
      if (absl::IsInvalidArgument(request.status())) {
        // Best effort: the peer learns why before the connection ends.
        BulkResponseHead refusal;
        refusal.status = request.status();
        (void)socket.WriteFull(EncodeBulkResponseHead(refusal), absl::Now() + options_.io_timeout);
        Observe(refusal.status.code(), 0);
        // The rest of what the peer sent is read (a little, briefly) before
        // the close: a socket closed with unread bytes resets the peer's,
        // which may lose the refusal before it is read.
        shutdown(socket.fd(), SHUT_WR);
        char sink[16 << 10];
        for (int i = 0; i < 64 && !stopping_; ++i) {
          pollfd d{socket.fd(), POLLIN, 0};
          if (poll(&d, 1, 100) <= 0 || recv(socket.fd(), sink, sizeof(sink), 0) <= 0) break;
        }
      }
      return;  // closed, timed out or malformed: the connection ends
    }
    if (!Answer(socket, *request)) return;
  }
}

bool BulkReadServer::Answer(common::Socket& socket, const BulkRequest& request) {
  BulkResponseHead head;
  std::vector<ReadHandle> entries;
  entries.reserve(request.keys.size());
  head.entries.reserve(request.keys.size());
  for (size_t i = 0; i < request.keys.size(); ++i) {
    absl::StatusOr<ReadHandle> h = store_.Open(request.lease_id, request.keys[i]);
    if (!h.ok()) {
      head.status = absl::Status(h.status().code(), absl::StrCat("keys[", i, "]: ", h.status().message()));
      head.entries.clear();
      entries.clear();
      break;
    }
    head.entries.push_back(BulkEntry{h->blob->size, h->info.checksum});
    entries.push_back(*std::move(h));
  }
  const std::string encoded = EncodeBulkResponseHead(head);
  // The head and the entries in writes of at most kBulkWriteBytes, each with
  // its own deadline: a large response progresses as long as the reader
  // reads, and a stalled reader is dropped after io_timeout.
  std::vector<absl::string_view> parts = {encoded};
  int64_t pending = static_cast<int64_t>(encoded.size());
  int64_t sent = 0;
  absl::Status status;
  auto flush = [&] {
    if (status.ok() && !parts.empty()) status = socket.WriteAll(parts, absl::Now() + options_.io_timeout);
    parts.clear();
    pending = 0;
  };
  for (const ReadHandle& e : entries) {
    const char* bytes = reinterpret_cast<const char*>(e.blob->data.get());
    for (size_t off = 0; off < e.blob->size && status.ok();) {
      const size_t take = std::min<size_t>(e.blob->size - off, static_cast<size_t>(kBulkWriteBytes - pending));
      parts.emplace_back(bytes + off, take);
      pending += static_cast<int64_t>(take);
      off += take;
      sent += static_cast<int64_t>(take);
      if (pending >= kBulkWriteBytes) flush();
    }
  }
  flush();
  // The entries were held until their last byte was handed to the kernel.
  entries.clear();
  Observe(status.ok() ? head.status.code() : absl::StatusCode::kUnavailable,
          status.ok() && head.status.ok() ? sent : 0);
  return status.ok();
}

void BulkReadServer::Observe(absl::StatusCode code, int64_t bytes) const {
  if (observe_) observe_(BulkReadEvent{code, bytes});
}

}  // namespace hybridserve::cachestore
