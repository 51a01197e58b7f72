#include "cachestore/client/bulk_reader.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cachestore/cache_client.h"
#include "common/hash.h"
#include "common/socket_io.h"
#include "common/status_macros.h"

namespace hybridserve::cachestore {
namespace {

// Bytes received and hashed at a time: the hash reads them while in cache.
constexpr size_t kReceivePieceBytes = size_t{1} << 20;

// A string read reserves at most this much before the bytes arrive: a broken
// or hostile server cannot make it allocate what it merely announces.
constexpr uint64_t kStringReserveBytes = uint64_t{64} << 20;

}  // namespace

// Each entry into a string of its own, grown as its bytes arrive (bytes a
// reused string already holds are overwritten, not cleared and refilled).
class BulkReader::StringSink final : public BulkReader::Sink {
 public:
  explicit StringSink(absl::Span<std::string> out) : out_(out) {}
  absl::Status Begin(size_t index, uint64_t size) override {
    dst_ = &out_[index];
    at_ = 0;
    if (dst_->size() > size) dst_->resize(static_cast<size_t>(size));
    dst_->reserve(static_cast<size_t>(std::min<uint64_t>(size, kStringReserveBytes)));
    return absl::OkStatus();
  }
  absl::Span<char> Next(size_t max) override {
    if (dst_->size() < at_ + max) dst_->resize(at_ + max);
    at_ += max;
    return absl::MakeSpan(dst_->data() + at_ - max, max);
  }

 private:
  const absl::Span<std::string> out_;
  std::string* dst_ = nullptr;
  size_t at_ = 0;  // bytes of the entry placed so far
};

// Each entry into its caller-owned segments, which must hold it exactly.
class BulkReader::SegmentsSink final : public BulkReader::Sink {
 public:
  explicit SegmentsSink(absl::Span<const EntrySegments> out) : out_(out) {}
  absl::Status Begin(size_t index, uint64_t size) override {
    RETURN_IF_ERROR(CheckEntryFits(index, size, out_[index]));
    segments_ = &out_[index].segments;
    segment_ = 0;
    within_ = 0;
    return absl::OkStatus();
  }
  absl::Span<char> Next(size_t max) override {
    while ((*segments_)[segment_].size() == within_) ++segment_, within_ = 0;  // Begin checked the total
    const absl::Span<char> s = (*segments_)[segment_];
    const size_t take = std::min(max, s.size() - within_);
    within_ += take;
    return s.subspan(within_ - take, take);
  }

 private:
  const absl::Span<const EntrySegments> out_;
  const std::vector<absl::Span<char>>* segments_ = nullptr;
  size_t segment_ = 0, within_ = 0;
};

absl::Status BulkReader::ReadInto(uint64_t lease_id, absl::Span<const Hash128> keys, absl::Span<std::string> out,
                                  bool* verdict) const {
  if (verdict != nullptr) *verdict = false;
  if (out.size() != keys.size()) return absl::InvalidArgumentError("ReadInto: as many outputs as keys");
  StringSink sink(out);
  return Read(lease_id, keys, sink, verdict);
}

absl::Status BulkReader::ReadScattered(uint64_t lease_id, absl::Span<const Hash128> keys,
                                       absl::Span<const EntrySegments> out, bool* verdict) const {
  if (verdict != nullptr) *verdict = false;
  if (out.size() != keys.size()) return absl::InvalidArgumentError("ReadScattered: as many destinations as keys");
  SegmentsSink sink(out);
  return Read(lease_id, keys, sink, verdict);
}

absl::Status BulkReader::Read(uint64_t lease_id, absl::Span<const Hash128> keys, Sink& sink, bool* verdict) const {
  if (keys.empty() || keys.size() > kBulkMaxKeys) {
    return absl::InvalidArgumentError(absl::StrCat(keys.size(), " keys: a bulk read takes 1 to ", kBulkMaxKeys));
  }
  auto deadline = [this] { return absl::Now() + options_.timeout; };
  BulkRequest request;
  request.lease_id = lease_id;
  request.keys.assign(keys.begin(), keys.end());
  const std::string frame = EncodeBulkRequest(request);
  common::Socket socket;
  absl::StatusOr<BulkResponseHead> head;
  while (true) {
    bool reused = false;
    ASSIGN_OR_RETURN(socket, connections_.Take(&reused));
    absl::Status sent = socket.WriteFull(frame, deadline());
    head = sent.ok() ? ReadBulkResponseHead(socket, keys.size(), deadline()) : sent;
    // A kept connection the server has closed meanwhile (idle past its
    // --bulk_io_timeout, or restarted) fails before any answer: the read
    // goes again on a new one. Reads change nothing, so a retry is safe.
    if (!head.ok() && reused && absl::IsUnavailable(head.status())) continue;
    if (!head.ok()) return head.status();
    break;
  }
  if (!head->status.ok()) {
    if (verdict != nullptr) *verdict = head->status.code() == absl::StatusCode::kNotFound;
    connections_.Keep(std::move(socket));  // nothing follows a refusal
    return head->status;
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    const BulkEntry& e = head->entries[i];
    if (absl::Status s = sink.Begin(i, e.size); !s.ok()) {
      // The entry's size is the cachestore's answer; a gRPC read gets it too.
      // (The connection, with bytes unread, is closed.)
      if (verdict != nullptr) *verdict = true;
      return s;
    }
    common::StreamingChecksum sum;
    for (uint64_t got = 0; got < e.size;) {
      const absl::Span<char> piece =
          sink.Next(static_cast<size_t>(std::min<uint64_t>(kReceivePieceBytes, e.size - got)));
      RETURN_IF_ERROR(socket.ReadFull(piece.data(), piece.size(), deadline()));
      sum.Update(piece.data(), piece.size());
      got += piece.size();
    }
    if (sum.Digest() != e.checksum) {
      return absl::DataLossError(absl::StrCat("bulk entry ", i, " (key ", keys[i].ToHex(), ") failed its checksum"));
    }
  }
  connections_.Keep(std::move(socket));
  return absl::OkStatus();
}

}  // namespace hybridserve::cachestore
