#include "cachestore/server/bulk_server.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "cachestore/server/put_header.h"
#include "cachestore/wire/wire_ints.h"
#include "common/status_macros.h"

namespace hybridserve::cachestore {
namespace {

// A put's bytes are received this much at a time, each piece with its own
// deadline, and hashed as stored while still in cache.
constexpr int64_t kReceivePieceBytes = int64_t{1} << 20;

}  // namespace

absl::StatusOr<std::unique_ptr<BulkServer>> BulkServer::Start(const BulkServerOptions& options, CacheStore& store,
                                                              std::function<void(const BulkReadEvent&)> observe,
                                                              std::function<void(const BulkPutEvent&)> observe_put) {
  if (options.max_connections < 1) return absl::InvalidArgumentError("bulk max_connections must be >= 1");
  if (options.io_timeout <= absl::ZeroDuration()) return absl::InvalidArgumentError("bulk io_timeout must be > 0");
  int bound = 0;
  ASSIGN_OR_RETURN(common::Socket listener, common::Listen(options.address, &bound));
  std::unique_ptr<BulkServer> server(new BulkServer(options, store, bound, std::move(observe), std::move(observe_put)));
  BulkServer* s = server.get();
  server->connections_ = std::make_unique<common::ConnectionServer>(std::move(listener), options.max_connections,
                                                                    [s](common::Socket& c) { s->Serve(c); });
  return server;
}

BulkServer::BulkServer(const BulkServerOptions& options, CacheStore& store, int port,
                       std::function<void(const BulkReadEvent&)> observe,
                       std::function<void(const BulkPutEvent&)> observe_put)
    : options_(options),
      store_(store),
      port_(port),
      max_put_bytes_(options.max_put_bytes != 0 ? options.max_put_bytes
                                                : static_cast<uint64_t>(store.options().page_budget_bytes +
                                                                        store.options().state_budget_bytes)),
      observe_(std::move(observe)),
      observe_put_(std::move(observe_put)) {}

BulkServer::~BulkServer() {
  stopping_ = true;
  connections_.reset();
}

void BulkServer::Serve(common::Socket& socket) {
  while (!stopping_) {
    // Idle between requests for at most io_timeout (a closed or shut-down
    // socket is readable: the read below then fails).
    pollfd p{socket.fd(), POLLIN, 0};
    const int ready = poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(options_.io_timeout)));
    if (ready <= 0 || stopping_) return;
    uint32_t magic = 0;
    absl::StatusOr<BulkMessage> request =
        ReadBulkMessage(socket, absl::Now() + options_.io_timeout, max_put_bytes_, &magic);
    if (!request.ok()) {
      if (absl::IsInvalidArgument(request.status())) {
        // Best effort: the peer learns why, in its request's format, before
        // the connection ends.
        if (magic == kBulkPutMagic) {
          BulkPutResponse refusal;
          refusal.status = request.status();
          (void)socket.WriteFull(EncodeBulkPutResponse(refusal), absl::Now() + options_.io_timeout);
        } else {
          BulkResponseHead refusal;
          refusal.status = request.status();
          (void)socket.WriteFull(EncodeBulkResponseHead(refusal), absl::Now() + options_.io_timeout);
          Observe(refusal.status.code(), 0);
        }
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
    if (request->put.has_value() ? !Put(socket, *request->put) : !Answer(socket, *request->read)) return;
  }
}

bool BulkServer::Put(common::Socket& socket, const BulkPutRequest& request) {
  BulkPutResponse response;
  response.answers.reserve(request.entries.size());
  for (size_t i = 0; i < request.entries.size(); ++i) {
    const absl::Time start = absl::Now();
    absl::Status status;
    std::unique_ptr<PutSession> session;
    int64_t committed = 0;
    if (!PutEntry(socket, request.entries[i], &status, &session, &committed)) return false;
    response.answers.push_back(DirectPutAnswer(static_cast<uint32_t>(i), status, session.get(), kBulkMaxMessageBytes));
    // A refused put gives its reservation back before the answer.
    session.reset();
    if (observe_put_) observe_put_(BulkPutEvent{status.code(), committed, absl::ToDoubleSeconds(absl::Now() - start)});
  }
  return socket.WriteFull(EncodeBulkPutResponse(response), absl::Now() + options_.io_timeout).ok();
}

bool BulkServer::PutEntry(common::Socket& socket, const BulkPutEntry& entry, absl::Status* status,
                          std::unique_ptr<PutSession>* session, int64_t* committed) {
  absl::StatusOr<std::unique_ptr<PutSession>> begun = BeginDirectPut(store_, entry.header, entry.size);
  if (begun.ok()) {
    *session = *std::move(begun);
  } else {
    *status = begun.status();
  }
  const bool take = status->ok() && !(*session)->already_present();
  // The bytes, each piece with its own deadline: into the reservation, or
  // (refused, already present) dropped.
  absl::Status io;
  std::vector<char> sink;
  for (uint64_t at = 0; at < entry.size && io.ok();) {
    const int64_t piece = static_cast<int64_t>(std::min<uint64_t>(entry.size - at, kReceivePieceBytes));
    const absl::Time deadline = absl::Now() + options_.io_timeout;
    if (take && status->ok()) {
      absl::Status wrote = (*session)->Append(static_cast<int64_t>(at), piece, [&](uint8_t* dst) {
        io = socket.ReadFull(reinterpret_cast<char*>(dst), static_cast<size_t>(piece), deadline);
        return io;
      });
      // A reclaimed put (ABORTED): its remaining bytes are dropped.
      if (io.ok() && !wrote.ok()) *status = wrote;
      if (io.ok() && wrote.ok()) {
        at += static_cast<uint64_t>(piece);
        continue;
      }
      if (!io.ok()) break;
    }
    sink.resize(static_cast<size_t>(std::min<int64_t>(piece, int64_t{1} << 20)));
    for (int64_t left = piece; left > 0 && io.ok();) {
      const size_t n = static_cast<size_t>(std::min<int64_t>(left, static_cast<int64_t>(sink.size())));
      io = socket.ReadFull(sink.data(), n, deadline);
      left -= static_cast<int64_t>(n);
    }
    at += static_cast<uint64_t>(piece);
  }
  char sum[8];
  if (io.ok()) io = socket.ReadFull(sum, sizeof(sum), absl::Now() + options_.io_timeout);
  if (!io.ok()) return false;  // the session, unfinished, aborts its put
  if (take && status->ok()) {
    *status = (*session)->Commit(wire::GetU64(sum));
    if (status->ok()) *committed = (*session)->size_bytes();
  }
  return true;
}

bool BulkServer::Answer(common::Socket& socket, const BulkRequest& request) {
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

void BulkServer::Observe(absl::StatusCode code, int64_t bytes) const {
  if (observe_) observe_(BulkReadEvent{code, bytes});
}

}  // namespace hybridserve::cachestore
