#include "cachestore/wire/entry_messages.h"

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"

namespace hybridserve::cachestore::entry_messages {
namespace {

constexpr int kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5;

void PutVarint(uint64_t v, std::string* out) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

// Forward-only reading of the concatenation of a message's slices.
class Reader {
 public:
  explicit Reader(const std::vector<grpc::Slice>& slices) : slices_(slices) {}

  size_t pos() const { return pos_; }

  bool ReadByte(uint8_t* b) {
    while (slice_ < slices_.size() && offset_ == slices_[slice_].size()) {
      ++slice_;
      offset_ = 0;
    }
    if (slice_ == slices_.size()) return false;
    *b = slices_[slice_].begin()[offset_++];
    ++pos_;
    return true;
  }

  // False past `limit` or after 10 bytes.
  bool ReadVarint(size_t limit, uint64_t* v) {
    *v = 0;
    for (int shift = 0; shift < 70; shift += 7) {
      uint8_t b;
      if (pos_ >= limit || !ReadByte(&b)) return false;
      if (shift == 63 && b > 1) return false;  // past 64 bits
      *v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) return true;
    }
    return false;
  }

  void Skip(size_t n) {
    pos_ += n;
    while (n > 0 && slice_ < slices_.size()) {
      const size_t step = std::min(n, slices_[slice_].size() - offset_);
      offset_ += step;
      n -= step;
      if (offset_ == slices_[slice_].size()) {
        ++slice_;
        offset_ = 0;
      }
    }
  }

 private:
  const std::vector<grpc::Slice>& slices_;
  size_t slice_ = 0;
  size_t offset_ = 0;
  size_t pos_ = 0;
};

absl::Status Malformed(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("malformed message: ", what));
}

}  // namespace

grpc::ByteBuffer SerializeMessage(const google::protobuf::MessageLite& message) {
  grpc::Slice slice(message.SerializeAsString());
  return grpc::ByteBuffer(&slice, 1);
}

bool ParseMessage(const grpc::ByteBuffer& message, google::protobuf::MessageLite* out) {
  grpc::Slice flat;
  if (!message.DumpToSingleSlice(&flat).ok()) return false;
  return out->ParseFromArray(flat.begin(), static_cast<int>(flat.size()));
}

grpc::ByteBuffer EncodeChunk(absl::Span<const VarintField> varints, int data_field, const grpc::Slice& data,
                             int wrap_field) {
  std::string inner;
  for (const VarintField& f : varints) {
    if (f.value == 0) continue;  // proto3 leaves zero scalars out
    PutVarint((static_cast<uint64_t>(f.number) << 3) | kVarint, &inner);
    PutVarint(f.value, &inner);
  }
  if (data.size() > 0) {
    PutVarint((static_cast<uint64_t>(data_field) << 3) | kLengthDelimited, &inner);
    PutVarint(data.size(), &inner);
  }
  std::string head;
  if (wrap_field > 0) {
    PutVarint((static_cast<uint64_t>(wrap_field) << 3) | kLengthDelimited, &head);
    PutVarint(inner.size() + data.size(), &head);
  }
  head += inner;
  if (data.size() == 0) {
    grpc::Slice only(head);
    return grpc::ByteBuffer(&only, 1);
  }
  const grpc::Slice slices[2] = {grpc::Slice(head), data};
  return grpc::ByteBuffer(slices, 2);
}

template <typename Sink>
void DecodedChunk::VisitData(Sink sink) const {
  size_t skip = data_begin_, left = data_size_;
  for (const grpc::Slice& s : slices_) {
    if (left == 0) break;
    if (skip >= s.size()) {
      skip -= s.size();
      continue;
    }
    const size_t n = std::min(left, s.size() - skip);
    sink(s.begin() + skip, n);
    left -= n;
    skip = 0;
  }
}

void DecodedChunk::CopyData(uint8_t* dst) const {
  VisitData([&dst](const uint8_t* p, size_t n) {
    std::memcpy(dst, p, n);
    dst += n;
  });
}

void DecodedChunk::AppendData(std::string* out) const {
  VisitData([out](const uint8_t* p, size_t n) { out->append(reinterpret_cast<const char*>(p), n); });
}

void DecodedChunk::ForEachDataPiece(absl::FunctionRef<void(const char* bytes, size_t size)> sink) const {
  VisitData([sink](const uint8_t* p, size_t n) { sink(reinterpret_cast<const char*>(p), n); });
}

absl::Status DecodeChunk(const grpc::ByteBuffer& message, int data_field, int wrap_field, DecodedChunk* out) {
  *out = DecodedChunk();
  grpc::Status dumped = message.Dump(&out->slices_);
  if (!dumped.ok()) return Malformed("unreadable buffer");
  Reader r(out->slices_);
  const size_t length = message.Length();
  // Parses fields up to `limit`; `outer` is the received message when the
  // chunk is wrapped in it.
  auto parse = [&](size_t limit, bool outer, auto& self) -> absl::Status {
    while (r.pos() < limit) {
      uint64_t tag;
      if (!r.ReadVarint(limit, &tag)) return Malformed("truncated tag");
      const uint64_t number = tag >> 3;
      const int type = static_cast<int>(tag & 7);
      // Protobuf's limits: a 32-bit tag, field numbers from 1 to 2^29 - 1.
      if (number == 0 || tag > 0xffffffffu) return Malformed("field number out of range");
      if (outer && !(number == static_cast<uint64_t>(wrap_field) && type == kLengthDelimited)) {
        return absl::FailedPreconditionError("not a chunk message");
      }
      switch (type) {
        case kVarint: {
          uint64_t v;
          if (!r.ReadVarint(limit, &v)) return Malformed("truncated varint");
          if (number <= static_cast<uint64_t>(kMaxField)) out->fields_[number] = v;
          break;
        }
        case kFixed64:
        case kFixed32: {
          const size_t n = type == kFixed64 ? 8 : 4;
          if (limit - r.pos() < n) return Malformed("truncated fixed field");
          r.Skip(n);
          break;
        }
        case kLengthDelimited: {
          uint64_t n;
          if (!r.ReadVarint(limit, &n)) return Malformed("truncated length");
          if (n > limit - r.pos()) return Malformed("length past the end");
          if (outer) {
            // The wrapped message; given twice, protobuf merges the two.
            const absl::Status inner = self(r.pos() + n, false, self);
            if (!inner.ok()) return inner;
          } else {
            if (number == static_cast<uint64_t>(data_field)) {
              out->data_begin_ = r.pos();
              out->data_size_ = n;
            }
            r.Skip(n);
          }
          break;
        }
        default:
          // Groups (3, 4) are not in the proto; anything else is invalid.
          return absl::FailedPreconditionError(absl::StrCat("wire type ", type, " not handled"));
      }
    }
    if (r.pos() != limit) return Malformed("field past the end");
    return absl::OkStatus();
  };
  absl::Status parsed = parse(length, wrap_field > 0, parse);
  if (parsed.ok() && wrap_field > 0 && length == 0) {
    return absl::FailedPreconditionError("not a chunk message");  // an empty message sets no field
  }
  return parsed;
}

}  // namespace hybridserve::cachestore::entry_messages
