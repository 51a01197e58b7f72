#ifndef HYBRIDSERVE_CACHESTORE_WIRE_ENTRY_MESSAGES_H_
#define HYBRIDSERVE_CACHESTORE_WIRE_ENTRY_MESSAGES_H_

// The messages that carry an entry's bytes (GetResponse, GetManyResponse, and
// PutRequest's chunk), encoded from and decoded into gRPC slices directly, in
// protobuf's encoding of proto/cachestore.proto: what goes over the wire is
// what the generated code sends and parses, but the bytes are never copied
// into or out of a protobuf string. A sender hands gRPC a slice that points at
// the entry (no copy); a receiver copies from gRPC's slices straight to where
// the bytes belong (one copy).

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "google/protobuf/message_lite.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"

namespace hybridserve::cachestore::entry_messages {

// Field numbers (proto/cachestore.proto).
inline constexpr int kGetSizeBytes = 1, kGetChecksum = 2, kGetOffset = 3, kGetData = 4;
inline constexpr int kManyIndex = 1, kManySizeBytes = 2, kManyChecksum = 3, kManyOffset = 4, kManyData = 5;
inline constexpr int kPutChunk = 2, kChunkOffset = 1, kChunkData = 2;

// The largest field number the decoder records (the others are skipped).
inline constexpr int kMaxField = 7;

struct VarintField {
  int number;
  uint64_t value;
};

// A message of `varints` (a zero value is left out, as protobuf does) and the
// bytes field `data_field` holding `data` (referenced, not copied); with
// `wrap_field` > 0 that message is itself field `wrap_field` of the message
// sent (PutRequest.chunk).
grpc::ByteBuffer EncodeChunk(absl::Span<const VarintField> varints, int data_field, const grpc::Slice& data,
                             int wrap_field = 0);

// A slice that points at `size` bytes at `data` without copying them and
// keeps `owner` alive until gRPC is done with it.
template <typename T>
grpc::Slice BorrowedSlice(const void* data, size_t size, std::shared_ptr<T> owner) {
  auto* held = new std::shared_ptr<T>(std::move(owner));
  return grpc::Slice(
      const_cast<void*>(data), size, [](void* p) { delete static_cast<std::shared_ptr<T>*>(p); }, held);
}

// A small message (a header, a request, an answer) as a raw buffer, and back;
// false when `message` does not parse as `out`.
grpc::ByteBuffer SerializeMessage(const google::protobuf::MessageLite& message);
bool ParseMessage(const grpc::ByteBuffer& message, google::protobuf::MessageLite* out);

// A decoded chunk message: its varint fields by number (0 when absent) and
// where its data field's bytes lie in the message.
class DecodedChunk {
 public:
  uint64_t field(int number) const { return fields_[number]; }
  size_t data_size() const { return data_size_; }
  // Copies the data field's bytes to `dst` (data_size() bytes).
  void CopyData(uint8_t* dst) const;
  // Appends the data field's bytes to `out`.
  void AppendData(std::string* out) const;
  // Calls sink(bytes, size) for each piece of the data field, in order.
  void ForEachDataPiece(absl::FunctionRef<void(const char* bytes, size_t size)> sink) const;

 private:
  friend absl::Status DecodeChunk(const grpc::ByteBuffer&, int, int, DecodedChunk*);
  // Calls sink(pointer, size) for each piece of the data field, in order.
  template <typename Sink>
  void VisitData(Sink sink) const;
  std::vector<grpc::Slice> slices_;
  uint64_t fields_[kMaxField + 1] = {};
  size_t data_begin_ = 0;  // offset in the concatenated slices
  size_t data_size_ = 0;
};

// Decodes a message of varint fields and the bytes field `data_field`; with
// `wrap_field` > 0, the message is field `wrap_field` of the one received and
// any other field of the latter is FAILED_PRECONDITION (not a chunk: decode it
// with protobuf). Protobuf's rules hold: fields in any order, the last of a
// repeated scalar wins, an embedded message given twice is merged, unknown
// fields are skipped. INVALID_ARGUMENT: malformed encoding.
absl::Status DecodeChunk(const grpc::ByteBuffer& message, int data_field, int wrap_field, DecodedChunk* out);

}  // namespace hybridserve::cachestore::entry_messages

#endif  // HYBRIDSERVE_CACHESTORE_WIRE_ENTRY_MESSAGES_H_
