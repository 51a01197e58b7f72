#include "cachestore/bulk_protocol.h"

#include "absl/strings/str_cat.h"
#include "cachestore/wire_ints.h"

namespace hybridserve::cachestore {

using wire::GetU32;
using wire::GetU64;
using wire::PutU32;
using wire::PutU64;

std::string EncodeBulkRequest(const BulkRequest& request) {
  std::string out;
  out.reserve(kBulkRequestHeaderBytes + 16 * request.keys.size());
  PutU32(&out, kBulkMagic);
  PutU32(&out, static_cast<uint32_t>(request.keys.size()));
  PutU64(&out, request.lease_id);
  for (const Hash128& k : request.keys) out += k.ToBytes();
  return out;
}

absl::StatusOr<BulkRequest> ReadBulkRequest(common::Socket& socket, absl::Time deadline) {
  char header[kBulkRequestHeaderBytes];
  if (absl::Status s = socket.ReadFull(header, sizeof(header), deadline); !s.ok()) return s;
  if (GetU32(header) != kBulkMagic) return absl::InvalidArgumentError("bulk request: bad magic");
  const uint32_t count = GetU32(header + 4);
  if (count == 0 || count > kBulkMaxKeys) {
    return absl::InvalidArgumentError(
        absl::StrCat("bulk request: ", count, " keys, must be in [1, ", kBulkMaxKeys, "]"));
  }
  BulkRequest request;
  request.lease_id = GetU64(header + 8);
  std::string keys(16 * static_cast<size_t>(count), '\0');
  if (absl::Status s = socket.ReadFull(keys.data(), keys.size(), deadline); !s.ok()) return s;
  request.keys.resize(count);
  for (uint32_t i = 0; i < count; ++i) {
    Hash128::FromBytes(absl::string_view(keys.data() + 16 * i, 16), &request.keys[i]);
  }
  return request;
}

std::string EncodeBulkResponseHead(const BulkResponseHead& head) {
  const std::string message(head.status.message().substr(0, kBulkMaxMessageBytes));
  const bool ok = head.status.ok();
  std::string out;
  out.reserve(kBulkResponseHeaderBytes + message.size() + (ok ? kBulkEntryBytes * head.entries.size() : 0));
  PutU32(&out, kBulkMagic);
  PutU32(&out, static_cast<uint32_t>(head.status.code()));
  PutU32(&out, ok ? static_cast<uint32_t>(head.entries.size()) : 0);
  PutU32(&out, static_cast<uint32_t>(message.size()));
  out += message;
  if (ok) {
    for (const BulkEntry& e : head.entries) {
      PutU64(&out, e.size);
      PutU64(&out, e.checksum);
    }
  }
  return out;
}

absl::StatusOr<BulkResponseHead> ReadBulkResponseHead(common::Socket& socket, size_t key_count, absl::Time deadline) {
  char header[kBulkResponseHeaderBytes];
  if (absl::Status s = socket.ReadFull(header, sizeof(header), deadline); !s.ok()) return s;
  const uint32_t code = GetU32(header + 4);
  const uint32_t count = GetU32(header + 8);
  const uint32_t message_bytes = GetU32(header + 12);
  if (GetU32(header) != kBulkMagic || code > static_cast<uint32_t>(absl::StatusCode::kUnauthenticated) ||
      message_bytes > kBulkMaxMessageBytes || (code == 0 ? count != key_count : count != 0)) {
    return absl::InvalidArgumentError("bulk response: malformed head");
  }
  std::string body(message_bytes + kBulkEntryBytes * static_cast<size_t>(count), '\0');
  if (absl::Status s = socket.ReadFull(body.data(), body.size(), deadline); !s.ok()) return s;
  BulkResponseHead head;
  head.status = absl::Status(static_cast<absl::StatusCode>(code), body.substr(0, message_bytes));
  head.entries.resize(count);
  for (uint32_t i = 0; i < count; ++i) {
    const char* p = body.data() + message_bytes + kBulkEntryBytes * i;
    head.entries[i] = BulkEntry{GetU64(p), GetU64(p + 8)};
    if (head.entries[i].size > kBulkMaxEntryBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("bulk response: entry ", i, " of an implausible ", head.entries[i].size, " bytes"));
    }
  }
  return head;
}

}  // namespace hybridserve::cachestore
