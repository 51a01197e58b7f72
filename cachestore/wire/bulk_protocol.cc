#include "cachestore/wire/bulk_protocol.h"

#include "absl/strings/str_cat.h"
#include "cachestore/wire/wire_ints.h"

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

namespace {

// A read request after its first kBulkRequestHeaderBytes.
absl::StatusOr<BulkRequest> ReadRestOfRead(common::Socket& socket, const char* header, absl::Time deadline) {
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

// A put request after its first kBulkRequestHeaderBytes, up to its entries' bytes.
absl::StatusOr<BulkPutRequest> ReadRestOfPut(common::Socket& socket, const char* header, absl::Time deadline,
                                             uint64_t max_put_bytes) {
  const uint32_t count = GetU32(header + 4);
  const uint32_t headers_bytes = GetU32(header + 8);
  if (count == 0 || count > kBulkMaxPutEntries) {
    return absl::InvalidArgumentError(
        absl::StrCat("bulk put: ", count, " entries, must be in [1, ", kBulkMaxPutEntries, "]"));
  }
  if (headers_bytes > kBulkMaxPutHeadersBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("bulk put: ", headers_bytes, " bytes of headers > ", kBulkMaxPutHeadersBytes));
  }
  std::string table(kBulkPutEntryBytes * count, '\0');
  if (absl::Status s = socket.ReadFull(table.data(), table.size(), deadline); !s.ok()) return s;
  BulkPutRequest request;
  request.entries.resize(count);
  std::vector<uint32_t> lengths(count);
  uint64_t declared_headers = 0;
  uint64_t declared_bytes = 0;
  for (uint32_t i = 0; i < count; ++i) {
    const char* p = table.data() + kBulkPutEntryBytes * i;
    request.entries[i].size = GetU64(p);
    lengths[i] = GetU32(p + 8);
    declared_headers += lengths[i];
    // Each size is checked before it is added: the sum cannot wrap.
    if (request.entries[i].size > max_put_bytes || declared_bytes + request.entries[i].size > max_put_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "bulk put: the entries add up to more than this cachestore could store (", max_put_bytes, " bytes)"));
    }
    declared_bytes += request.entries[i].size;
  }
  if (declared_headers != headers_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("bulk put: the entries' headers add up to ", declared_headers,
                                                   " bytes, the request says ", headers_bytes));
  }
  std::string headers(headers_bytes, '\0');
  if (absl::Status s = socket.ReadFull(headers.data(), headers.size(), deadline); !s.ok()) return s;
  size_t at = 0;
  for (uint32_t i = 0; i < count; ++i) {
    request.entries[i].header = headers.substr(at, lengths[i]);
    at += lengths[i];
  }
  return request;
}

}  // namespace

absl::StatusOr<BulkMessage> ReadBulkMessage(common::Socket& socket, absl::Time deadline, uint64_t max_put_bytes,
                                            uint32_t* magic) {
  char header[kBulkRequestHeaderBytes];
  if (absl::Status s = socket.ReadFull(header, sizeof(header), deadline); !s.ok()) return s;
  if (magic != nullptr) *magic = GetU32(header);
  BulkMessage message;
  switch (GetU32(header)) {
    case kBulkMagic: {
      absl::StatusOr<BulkRequest> read = ReadRestOfRead(socket, header, deadline);
      if (!read.ok()) return read.status();
      message.read = *std::move(read);
      return message;
    }
    case kBulkPutMagic: {
      absl::StatusOr<BulkPutRequest> put = ReadRestOfPut(socket, header, deadline, max_put_bytes);
      if (!put.ok()) return put.status();
      message.put = *std::move(put);
      return message;
    }
    default:
      return absl::InvalidArgumentError("bulk request: bad magic");
  }
}

std::string EncodeBulkPutRequest(const BulkPutRequest& request) {
  size_t headers_bytes = 0;
  for (const BulkPutEntry& e : request.entries) headers_bytes += e.header.size();
  std::string out;
  out.reserve(kBulkRequestHeaderBytes + kBulkPutEntryBytes * request.entries.size() + headers_bytes);
  PutU32(&out, kBulkPutMagic);
  PutU32(&out, static_cast<uint32_t>(request.entries.size()));
  PutU32(&out, static_cast<uint32_t>(headers_bytes));
  PutU32(&out, 0);
  for (const BulkPutEntry& e : request.entries) {
    PutU64(&out, e.size);
    PutU32(&out, static_cast<uint32_t>(e.header.size()));
  }
  for (const BulkPutEntry& e : request.entries) out += e.header;
  return out;
}

std::string EncodeBulkPutResponse(const BulkPutResponse& response) {
  return EncodePutAnswers(kBulkPutMagic, response, kBulkMaxMessageBytes);
}

absl::StatusOr<BulkPutResponse> ReadBulkPutResponse(common::Socket& socket, size_t entry_count, absl::Time deadline) {
  absl::StatusOr<BulkPutResponse> response = DecodePutAnswers(
      kBulkPutMagic, entry_count, kBulkMaxMessageBytes,
      [&](char* data, size_t size) { return socket.ReadFull(data, size, deadline); }, "bulk put response");
  if (response.ok() && response->status.ok() && response->answers.size() != entry_count) {
    return absl::InvalidArgumentError(
        absl::StrCat("bulk put response: ", response->answers.size(), " answers for ", entry_count, " entries"));
  }
  return response;
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
