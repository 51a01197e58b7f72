#include "cachestore/client/bulk_writer.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "cachestore/client/client_messages.h"
#include "cachestore/wire/bulk_protocol.h"
#include "cachestore/wire/wire_ints.h"
#include "common/hash.h"
#include "common/status_macros.h"

namespace hybridserve::cachestore {
namespace {

// Bytes hashed then handed to the kernel at a time: the kernel's copy reads
// them while the hash left them in cache.
constexpr size_t kSendPieceBytes = size_t{256} << 10;
// Bytes handed to the kernel in one call (one deadline) at most.
constexpr size_t kSendCallBytes = size_t{4} << 20;

}  // namespace

absl::Status BulkWriter::Put(const ClientNamespace& ns, absl::Span<const PutManyEntry> entries,
                             std::vector<absl::StatusOr<PutResult>>* results) {
  // A quarter of the headers' limit: SplitPutRequests estimates their sizes.
  for (const auto& [begin, end] :
       SplitPutRequests(entries, kBulkMaxPutEntries, options_.request_bytes, kBulkMaxPutHeadersBytes / 4)) {
    const absl::Span<const PutManyEntry> request = entries.subspan(begin, end - begin);
    while (true) {
      bool reused = false;
      ASSIGN_OR_RETURN(common::Socket socket, connections_.Take(&reused));
      const size_t answered = results->size();
      absl::Status s = PutRequest(socket, ns, request, results);
      // A kept connection the server had closed fails before any answer:
      // the request goes again on a new one (an entry stored meanwhile is
      // already_present then).
      if (!s.ok() && reused && absl::IsUnavailable(s) && results->size() == answered) continue;
      RETURN_IF_ERROR(s);
      connections_.Keep(std::move(socket));
      break;
    }
  }
  return absl::OkStatus();
}

absl::Status BulkWriter::PutRequest(common::Socket& socket, const ClientNamespace& ns,
                                    absl::Span<const PutManyEntry> entries,
                                    std::vector<absl::StatusOr<PutResult>>* results) {
  auto deadline = [this] { return absl::Now() + options_.timeout; };
  const v1::CacheNamespace ns_message = NamespaceMessage(ns);
  BulkPutRequest request;
  request.entries.reserve(entries.size());
  for (const PutManyEntry& e : entries) {
    request.entries.push_back(
        BulkPutEntry{e.bytes.size(), PutHeaderMessage(ns_message, *e.put, e.bytes.size()).SerializeAsString()});
  }
  const std::string head = EncodeBulkPutRequest(request);
  // Pieces go out in calls of up to kSendCallBytes; the checksums they need
  // live until their call is made.
  std::vector<absl::string_view> parts = {head};
  std::vector<std::string> sums;
  sums.reserve(entries.size());
  size_t pending = head.size();
  auto flush = [&]() -> absl::Status {
    if (parts.empty()) return absl::OkStatus();
    absl::Status s = socket.WriteAll(parts, deadline());
    parts.clear();
    pending = 0;
    return s;
  };
  for (const PutManyEntry& e : entries) {
    common::StreamingChecksum sum;
    for (size_t at = 0; at < e.bytes.size(); at += kSendPieceBytes) {
      const absl::string_view piece = e.bytes.substr(at, kSendPieceBytes);
      if (!e.checksum.has_value()) sum.Update(piece.data(), piece.size());
      parts.push_back(piece);
      pending += piece.size();
      if (pending >= kSendCallBytes) RETURN_IF_ERROR(flush());
    }
    std::string trailer;
    wire::PutU64(&trailer, e.checksum.value_or(sum.Digest()));
    sums.push_back(std::move(trailer));
    parts.push_back(sums.back());
    pending += 8;
  }
  RETURN_IF_ERROR(flush());
  ASSIGN_OR_RETURN(const BulkPutResponse response, ReadBulkPutResponse(socket, entries.size(), deadline()));
  RETURN_IF_ERROR(response.status);
  return AppendPutAnswers(response.answers, entries.size(), results);
}

}  // namespace hybridserve::cachestore
