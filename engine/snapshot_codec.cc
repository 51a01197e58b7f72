#include "engine/snapshot_codec.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/hash.h"
#include "common/status_macros.h"

// The checksum is computed stripe by stripe inside the copy loops, with
// xxhash's own accumulate and scramble steps (see StripedXxh3).
#define XXH_INLINE_ALL
#include "xxhash.h"

namespace hybridserve::engine {
namespace {

// The wire is little-endian and fields are copied with memcpy; a big-endian
// port would byte-swap in Put/Get and in the array copies.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the snapshot codec assumes a little-endian host");
static_assert(sizeof(float) == 4, "fp32 arrays are 4 bytes per element");

constexpr char kMagic[8] = {'H', 'S', 'S', 'N', 'A', 'P', '\x1a', '\n'};
constexpr uint32_t kFlagLastLogits = 1u << 0;

// Header field offsets; see the table in snapshot_codec.h.
constexpr size_t kOffMagic = 0;
constexpr size_t kOffVersion = 8;
constexpr size_t kOffHeaderBytes = 12;
constexpr size_t kOffDType = 16;
constexpr size_t kOffFlags = 20;
constexpr size_t kOffFingerprint = 24;
constexpr size_t kOffPrefixHash = 40;
constexpr size_t kOffPosition = 56;
constexpr size_t kOffLayout = 64;
constexpr size_t kOffTailTokens = 108;
constexpr size_t kOffPayloadBytes = 112;
constexpr size_t kOffReserved = 120;

constexpr int kLayoutFieldCount = kStateLayoutFieldCount;
static_assert(kOffLayout + 4 * kLayoutFieldCount == kOffTailTokens, "layout fills [64, 108)");
static_assert(kOffReserved + 8 == kSnapshotHeaderBytes, "header is 128 bytes");

// XXH3's output is frozen since 0.8.0; its internal step functions, which
// StripedXxh3 calls, belong to the 0.8 headers.
static_assert(XXH_VERSION_MAJOR == 0 && XXH_VERSION_MINOR == 8, "StripedXxh3 follows xxhash 0.8");

template <typename T>
void Put(char* buf, size_t offset, T value) {
  std::memcpy(buf + offset, &value, sizeof(T));
}

template <typename T>
T Get(const char* buf, size_t offset) {
  T value;
  std::memcpy(&value, buf + offset, sizeof(T));
  return value;
}

void PutHash(char* buf, size_t offset, const common::Hash128& h) {
  Put<uint64_t>(buf, offset, h.lo);
  Put<uint64_t>(buf, offset + 8, h.hi);
}

common::Hash128 GetHash(const char* buf, size_t offset) {
  return common::Hash128{Get<uint64_t>(buf, offset), Get<uint64_t>(buf, offset + 8)};
}

// Sizes of every part of one encoding, from a validated layout.
struct PayloadShape {
  int64_t ssm_floats = 0;     // per Mamba layer
  int64_t conv_floats = 0;    // per Mamba layer
  int64_t tail_floats = 0;    // per attention layer, K and V each
  int64_t logits_floats = 0;  // 0 without logits
  uint64_t payload_bytes = 0;
  uint64_t total_bytes = 0;
};

// *total += count * floats * sizeof(float); false on overflow.
bool CheckedMulAdd(uint64_t count, uint64_t floats, uint64_t* total) {
  uint64_t array_bytes, bytes;
  return !__builtin_mul_overflow(floats, uint64_t{sizeof(float)}, &array_bytes) &&
         !__builtin_mul_overflow(count, array_bytes, &bytes) && !__builtin_add_overflow(*total, bytes, total);
}

absl::StatusOr<PayloadShape> ComputeShape(const StateLayout& layout, int64_t position, bool with_logits) {
  RETURN_IF_ERROR(layout.Validate());
  if (position < 0) return absl::InvalidArgumentError(absl::StrCat("position must be >= 0, got ", position));
  if (with_logits && layout.vocab < 1) {
    return absl::InvalidArgumentError(absl::StrCat("last logits need vocab >= 1, got ", layout.vocab));
  }
  PayloadShape shape;
  shape.ssm_floats = layout.ssm_state_floats();
  shape.conv_floats = layout.conv_state_floats();
  shape.tail_floats = layout.tail_kv_floats(position);
  shape.logits_floats = with_logits ? layout.vocab : 0;
  // The layout's bounds keep these far from overflow; check anyway, since a
  // size error here would become an out-of-bounds access.
  uint64_t payload = 0;
  const bool ok = CheckedMulAdd(layout.mamba_layers, shape.ssm_floats, &payload) &&
                  CheckedMulAdd(layout.mamba_layers, shape.conv_floats, &payload) &&
                  CheckedMulAdd(2 * static_cast<uint64_t>(layout.attention_layers), shape.tail_floats, &payload) &&
                  CheckedMulAdd(1, shape.logits_floats, &payload) &&
                  payload <= UINT64_MAX - kSnapshotHeaderBytes - kSnapshotTrailerBytes;
  if (!ok) return absl::InvalidArgumentError(absl::StrCat("snapshot size overflows: ", layout.ToString()));
  shape.payload_bytes = payload;
  shape.total_bytes = kSnapshotHeaderBytes + payload + kSnapshotTrailerBytes;
  return shape;
}

// Views over a Snapshot's own arrays.
SnapshotSource SourceOf(const Snapshot& s) {
  SnapshotSource source;
  source.model_fingerprint = s.model_fingerprint;
  source.prefix_hash = s.prefix_hash;
  source.layout = s.layout;
  source.arrays = StateArrays::Of(s);
  return source;
}

// Validates `s` against its own layout and position.
absl::StatusOr<PayloadShape> ShapeOf(const SnapshotSource& s) {
  ASSIGN_OR_RETURN(PayloadShape shape, ComputeShape(s.layout, s.arrays.position, !s.arrays.last_logits.empty()));
  RETURN_IF_ERROR(s.layout.CheckState(s.arrays));
  return shape;
}

void WriteHeader(const SnapshotSource& s, const PayloadShape& shape, char* header) {
  std::memset(header, 0, kSnapshotHeaderBytes);
  std::memcpy(header + kOffMagic, kMagic, sizeof(kMagic));
  Put<uint32_t>(header, kOffVersion, kSnapshotFormatVersion);
  Put<uint32_t>(header, kOffHeaderBytes, kSnapshotHeaderBytes);
  Put<uint32_t>(header, kOffDType, static_cast<uint32_t>(SnapshotDType::kF32));
  Put<uint32_t>(header, kOffFlags, s.arrays.last_logits.empty() ? 0u : kFlagLastLogits);
  PutHash(header, kOffFingerprint, s.model_fingerprint);
  PutHash(header, kOffPrefixHash, s.prefix_hash);
  Put<int64_t>(header, kOffPosition, s.arrays.position);
  for (int i = 0; i < kLayoutFieldCount; ++i) Put<int32_t>(header, kOffLayout + 4 * i, s.layout.*kStateLayoutFields[i]);
  Put<uint32_t>(header, kOffTailTokens, static_cast<uint32_t>(s.layout.tail_tokens(s.arrays.position)));
  Put<uint64_t>(header, kOffPayloadBytes, shape.payload_bytes);
  // [kOffReserved, 128) stays zero.
}

// XXH3-64 (seed 0) of a buffer of known length, computed by the copy loops
// that fill or drain the buffer: each 64-byte stripe is hashed while it is in
// registers or L1, instead of in a second pass over the bytes (in cache, two
// passes cost about twice a memcpy; the fused loop about 1.2x). It reproduces
// XXH3_hashLong_64b_internal of xxhash 0.8 (blocks of 16 stripes with a
// scramble after each full block, then the last 64 bytes with their own secret
// offset) with the library's SIMD accumulate and scramble steps; inputs of at
// most 240 bytes, which XXH3 hashes another way, are hashed in one call by
// Finish. Tests compare the result with common::Checksum64 across lengths.
class StripedXxh3 {
 public:
  explicit StripedXxh3(size_t length) : length_(length) {
    if (length_ > XXH3_MIDSIZE_MAX) {
      // Full blocks, then the stripes of the last partial block (at most 15,
      // so a scramble only ever follows a full block), not the last stripe.
      const size_t blocks = (length_ - 1) / kBlock;
      loop_stripes_ = blocks * kStripesPerBlock + ((length_ - 1) - blocks * kBlock) / kStripe;
    }
  }

  // Copies src[0, size) to buffer[offset, offset + size), hashing each stripe
  // of the buffer as it becomes complete: those wholly inside this piece
  // straight from `src` as they are copied, one that straddles pieces from the
  // buffer once its last byte is there. Pieces must arrive in buffer order.
  void CopyIn(const char* src, size_t size, char* buffer, size_t offset) {
    Loop loop(*this);
    size_t pos = offset;
    const size_t end = offset + size;
    while (pos < end && !loop.done()) {
      const size_t stripe = loop.next_offset();  // in (pos - 64, pos]
      if (stripe == pos && end - pos >= kStripe) {
        const size_t stripes = std::min((end - pos) / kStripe, loop.stripes_left());
        loop.FeedAndCopy(src + (pos - offset), buffer + pos, stripes);
        pos += stripes * kStripe;
        continue;
      }
      const size_t stop = std::min(end, stripe + kStripe);
      std::memcpy(buffer + pos, src + (pos - offset), stop - pos);
      pos = stop;
      if (pos == stripe + kStripe) loop.Feed(buffer + stripe);
    }
    if (pos < end) std::memcpy(buffer + pos, src + (pos - offset), end - pos);  // read only by the last stripe
    loop.Store(*this);
  }

  // Copies buffer[offset, offset + size) to dst, hashing the buffer's stripes
  // as they are copied (a stripe that straddles the start of this piece just
  // before).
  void CopyOut(const char* buffer, size_t offset, size_t size, char* dst) {
    Loop loop(*this);
    size_t pos = offset;
    const size_t end = offset + size;
    while (pos < end && !loop.done()) {
      if (pos == loop.next_offset() && end - pos >= kStripe) {
        const size_t stripes = std::min((end - pos) / kStripe, loop.stripes_left());
        loop.FeedAndCopy(buffer + pos, dst + (pos - offset), stripes);
        pos += stripes * kStripe;
        continue;
      }
      // Up to the next stripe boundary, after hashing every stripe that ends
      // by there (the header's too, on the first call).
      const size_t stop = std::min(end, (pos / kStripe + 1) * kStripe);
      while (!loop.done() && loop.next_offset() + kStripe <= stop) loop.Feed(buffer + loop.next_offset());
      std::memcpy(dst + (pos - offset), buffer + pos, stop - pos);
      pos = stop;
    }
    if (pos < end) std::memcpy(dst + (pos - offset), buffer + pos, end - pos);  // read only by the last stripe
    loop.Store(*this);
  }

  // The checksum of `buffer`, the whole input, once CopyIn or CopyOut has
  // covered every byte.
  uint64_t Finish(const char* buffer) {
    if (length_ <= XXH3_MIDSIZE_MAX) return XXH3_64bits(buffer, length_);
    Loop loop(*this);
    while (!loop.done()) loop.Feed(buffer + loop.next_offset());  // normally none left
    XXH3_accumulate_512(loop.acc, buffer + length_ - kStripe,
                        XXH3_kSecret + sizeof(XXH3_kSecret) - kStripe - XXH_SECRET_LASTACC_START);
    return XXH3_mergeAccs(loop.acc, XXH3_kSecret + XXH_SECRET_MERGEACCS_START, uint64_t{length_} * XXH_PRIME64_1);
  }

 private:
  static constexpr size_t kStripe = XXH_STRIPE_LEN;                                                       // 64
  static constexpr size_t kStripesPerBlock = (sizeof(XXH3_kSecret) - kStripe) / XXH_SECRET_CONSUME_RATE;  // 16
  static constexpr size_t kBlock = kStripe * kStripesPerBlock;

  // The running state copied into locals for the duration of a copy loop, so
  // that the accumulators stay in registers: as members they would be stored
  // and reloaded around every memcpy that might alias them.
  struct Loop {
    explicit Loop(const StripedXxh3& h) : next(h.next_), loop_stripes(h.loop_stripes_) {
      std::memcpy(acc, h.acc_, sizeof(acc));
    }
    void Store(StripedXxh3& h) const {
      std::memcpy(h.acc_, acc, sizeof(acc));
      h.next_ = next;
    }
    bool done() const { return next >= loop_stripes; }
    size_t stripes_left() const { return loop_stripes - next; }
    size_t next_offset() const { return next * kStripe; }
    // Hashes the next `count` stripes from `from` while copying them to `to`:
    // the hot loop, one load of each byte from memory.
    void FeedAndCopy(const char* from, char* to, size_t count) {
      for (size_t i = 0; i < count; ++i) {
        Feed(from + i * kStripe);
        std::memcpy(to + i * kStripe, from + i * kStripe, kStripe);
      }
    }
    // `stripe`: the 64 bytes of the buffer at next_offset().
    void Feed(const void* stripe) {
      XXH3_accumulate_512(acc, stripe, XXH3_kSecret + (next % kStripesPerBlock) * XXH_SECRET_CONSUME_RATE);
      if (next % kStripesPerBlock == kStripesPerBlock - 1) {
        XXH3_scrambleAcc(acc, XXH3_kSecret + sizeof(XXH3_kSecret) - kStripe);
      }
      ++next;
    }

    alignas(64) xxh_u64 acc[XXH_ACC_NB];
    size_t next;
    const size_t loop_stripes;
  };

  alignas(64) xxh_u64 acc_[XXH_ACC_NB] = XXH3_INIT_ACC;
  size_t length_;
  size_t next_ = 0;          // index of the next stripe to hash
  size_t loop_stripes_ = 0;  // stripes hashed before the last one (0 for short inputs)
};

// Writes the encoding of `s` into buffer[0, shape.total_bytes).
void WriteSnapshot(const SnapshotSource& source, const PayloadShape& shape, char* buffer) {
  const StateArrays& s = source.arrays;
  char header[kSnapshotHeaderBytes];
  WriteHeader(source, shape, header);
  const size_t body = shape.total_bytes - kSnapshotTrailerBytes;
  StripedXxh3 checksum(body);
  size_t offset = 0;
  auto write = [&](const void* src, size_t bytes) {
    checksum.CopyIn(static_cast<const char*>(src), bytes, buffer, offset);
    offset += bytes;
  };
  write(header, sizeof(header));
  for (const absl::Span<const float> a : s.ssm_states) write(a.data(), a.size() * sizeof(float));
  for (const absl::Span<const float> a : s.conv_states) write(a.data(), a.size() * sizeof(float));
  for (size_t l = 0; l < s.tail_k.size(); ++l) {
    write(s.tail_k[l].data(), s.tail_k[l].size() * sizeof(float));
    write(s.tail_v[l].data(), s.tail_v[l].size() * sizeof(float));
  }
  write(s.last_logits.data(), s.last_logits.size() * sizeof(float));
  Put<uint64_t>(buffer, body, checksum.Finish(buffer));
}

// A header that passed every structural check.
struct ParsedHeader {
  common::Hash128 model_fingerprint;
  common::Hash128 prefix_hash;
  int64_t position = 0;
  StateLayout layout;
  bool with_logits = false;
  PayloadShape shape;
};

absl::StatusOr<ParsedHeader> ParseHeader(absl::string_view bytes) {
  const char* h = bytes.data();
  if (std::memcmp(h + kOffMagic, kMagic, sizeof(kMagic)) != 0) {
    return absl::InvalidArgumentError("not a snapshot: bad magic");
  }
  const uint32_t version = Get<uint32_t>(h, kOffVersion);
  if (version != kSnapshotFormatVersion) {
    return absl::InvalidArgumentError(absl::StrCat(
        "snapshot format version ", version, " is not supported (this build reads ", kSnapshotFormatVersion, ")"));
  }
  const uint32_t header_bytes = Get<uint32_t>(h, kOffHeaderBytes);
  if (header_bytes != kSnapshotHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("header bytes ", header_bytes, " != ", kSnapshotHeaderBytes, " in version 1"));
  }
  const uint32_t dtype = Get<uint32_t>(h, kOffDType);
  if (dtype == static_cast<uint32_t>(SnapshotDType::kBF16)) {
    return absl::UnimplementedError("bf16 snapshots are not supported yet");
  }
  if (dtype != static_cast<uint32_t>(SnapshotDType::kF32)) {
    return absl::InvalidArgumentError(absl::StrCat("unknown snapshot dtype ", dtype));
  }
  const uint32_t flags = Get<uint32_t>(h, kOffFlags);
  if ((flags & ~kFlagLastLogits) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("unknown snapshot flags 0x", absl::Hex(flags)));
  }
  if (Get<uint64_t>(h, kOffReserved) != 0) return absl::InvalidArgumentError("reserved header bytes are not zero");

  ParsedHeader parsed;
  parsed.model_fingerprint = GetHash(h, kOffFingerprint);
  parsed.prefix_hash = GetHash(h, kOffPrefixHash);
  parsed.position = Get<int64_t>(h, kOffPosition);
  for (int i = 0; i < kLayoutFieldCount; ++i)
    parsed.layout.*kStateLayoutFields[i] = Get<int32_t>(h, kOffLayout + 4 * i);
  parsed.with_logits = (flags & kFlagLastLogits) != 0;
  ASSIGN_OR_RETURN(parsed.shape, ComputeShape(parsed.layout, parsed.position, parsed.with_logits));

  const uint32_t tail_tokens = Get<uint32_t>(h, kOffTailTokens);
  if (tail_tokens != static_cast<uint64_t>(parsed.layout.tail_tokens(parsed.position))) {
    return absl::InvalidArgumentError(absl::StrCat("tail tokens ", tail_tokens, " != position ", parsed.position,
                                                   " mod page size ", parsed.layout.page_size));
  }
  const uint64_t payload_bytes = Get<uint64_t>(h, kOffPayloadBytes);
  if (payload_bytes != parsed.shape.payload_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("header says ", payload_bytes, " payload bytes, the layout needs ", parsed.shape.payload_bytes));
  }
  if (bytes.size() != parsed.shape.total_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("snapshot is ", bytes.size(), " bytes, its header describes ", parsed.shape.total_bytes));
  }
  return parsed;
}

absl::Status CheckExpectation(const ParsedHeader& header, const SnapshotExpectation& expect) {
  if (expect.model_fingerprint && *expect.model_fingerprint != header.model_fingerprint) {
    return absl::FailedPreconditionError(absl::StrCat("snapshot of model ", header.model_fingerprint.ToHex(),
                                                      ", expected model ", expect.model_fingerprint->ToHex()));
  }
  if (expect.layout && *expect.layout != header.layout) {
    return absl::FailedPreconditionError(
        absl::StrCat("snapshot layout ", header.layout.ToString(), ", expected ", expect.layout->ToString()));
  }
  if (expect.position && *expect.position != header.position) {
    return absl::FailedPreconditionError(
        absl::StrCat("snapshot at position ", header.position, ", expected position ", *expect.position));
  }
  if (expect.prefix_hash && *expect.prefix_hash != header.prefix_hash) {
    return absl::FailedPreconditionError(absl::StrCat("snapshot of token prefix ", header.prefix_hash.ToHex(),
                                                      ", expected prefix ", expect.prefix_hash->ToHex()));
  }
  return absl::OkStatus();
}

uint64_t StoredChecksum(absl::string_view bytes) { return Get<uint64_t>(bytes.data(), bytes.size() - 8); }

// `error` if the bytes are intact, DATA_LOSS if they are not: a corrupted
// header is reported as corruption, not as whatever field it happened to hit.
absl::Status ChecksumFirst(absl::string_view bytes, absl::Status error) {
  const uint64_t actual = common::Checksum64(bytes.data(), bytes.size() - kSnapshotTrailerBytes);
  if (actual != StoredChecksum(bytes)) {
    return absl::DataLossError(absl::StrCat("snapshot checksum mismatch (", error.message(), ")"));
  }
  return error;
}

// The header of `bytes`, checked for consistency with their length and
// against `expect`. Errors are reported after a checksum check, so that
// corruption reads as DATA_LOSS; the success path does not verify the checksum.
absl::StatusOr<ParsedHeader> CheckedHeader(absl::string_view bytes, const SnapshotExpectation& expect) {
  if (bytes.size() < kSnapshotHeaderBytes + kSnapshotTrailerBytes) {
    return absl::DataLossError(absl::StrCat("truncated snapshot: ", bytes.size(), " bytes, less than the ",
                                            kSnapshotHeaderBytes + kSnapshotTrailerBytes, " of header and checksum"));
  }
  absl::StatusOr<ParsedHeader> header = ParseHeader(bytes);
  if (!header.ok()) return ChecksumFirst(bytes, header.status());
  if (absl::Status match = CheckExpectation(*header, expect); !match.ok()) return ChecksumFirst(bytes, match);
  return header;
}

// Reads `floats` floats at buffer[*offset] into `*out` (resized, so without
// allocating or zero-filling when it already has that size).
void ReadArray(const char* buffer, size_t* offset, int64_t floats, std::vector<float>* out, StripedXxh3& checksum) {
  out->resize(floats);
  const size_t bytes = static_cast<size_t>(floats) * sizeof(float);
  checksum.CopyOut(buffer, *offset, bytes, reinterpret_cast<char*>(out->data()));
  *offset += bytes;
}

}  // namespace

absl::StatusOr<size_t> EncodedSnapshotSize(const StateLayout& layout, int64_t position, bool with_logits) {
  ASSIGN_OR_RETURN(PayloadShape shape, ComputeShape(layout, position, with_logits));
  if (shape.total_bytes > SIZE_MAX) return absl::InvalidArgumentError("snapshot size exceeds size_t");
  return static_cast<size_t>(shape.total_bytes);
}

absl::StatusOr<std::string> EncodeSnapshot(const Snapshot& snapshot) {
  std::string out;
  RETURN_IF_ERROR(EncodeSnapshotInto(snapshot, &out));
  return out;
}

absl::Status EncodeSnapshotInto(const Snapshot& snapshot, std::string* out) {
  return EncodeSnapshotInto(SourceOf(snapshot), out);
}

absl::Status EncodeSnapshotInto(const SnapshotSource& source, std::string* out) {
  ASSIGN_OR_RETURN(PayloadShape shape, ShapeOf(source));
  out->resize(shape.total_bytes);  // fills only what it grows by
  WriteSnapshot(source, shape, out->data());
  return absl::OkStatus();
}

absl::Status EncodeSnapshotToBuffer(const Snapshot& snapshot, absl::Span<char> out) {
  return EncodeSnapshotToBuffer(SourceOf(snapshot), out);
}

absl::Status EncodeSnapshotToBuffer(const SnapshotSource& source, absl::Span<char> out) {
  ASSIGN_OR_RETURN(PayloadShape shape, ShapeOf(source));
  if (out.size() != shape.total_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("output buffer is ", out.size(), " bytes, the snapshot encodes to ", shape.total_bytes));
  }
  WriteSnapshot(source, shape, out.data());
  return absl::OkStatus();
}

absl::StatusOr<SnapshotView> ParseSnapshot(absl::string_view bytes, const SnapshotExpectation& expect) {
  ASSIGN_OR_RETURN(const ParsedHeader header, CheckedHeader(bytes, expect));
  if (common::Checksum64(bytes.data(), bytes.size() - kSnapshotTrailerBytes) != StoredChecksum(bytes)) {
    return absl::DataLossError("snapshot checksum mismatch");
  }
  SnapshotView view;
  view.model_fingerprint = header.model_fingerprint;
  view.prefix_hash = header.prefix_hash;
  view.position = header.position;
  view.layout = header.layout;
  const uint8_t* cursor = reinterpret_cast<const uint8_t*>(bytes.data()) + kSnapshotHeaderBytes;
  auto next = [&cursor](int64_t floats) {
    const absl::Span<const uint8_t> array(cursor, static_cast<size_t>(floats) * sizeof(float));
    cursor += array.size();
    return array;
  };
  for (int32_t l = 0; l < header.layout.mamba_layers; ++l) view.ssm_states.push_back(next(header.shape.ssm_floats));
  for (int32_t l = 0; l < header.layout.mamba_layers; ++l) view.conv_states.push_back(next(header.shape.conv_floats));
  for (int32_t l = 0; l < header.layout.attention_layers; ++l) {
    view.tail_k.push_back(next(header.shape.tail_floats));
    view.tail_v.push_back(next(header.shape.tail_floats));
  }
  view.last_logits = next(header.shape.logits_floats);
  return view;
}

absl::StatusOr<Snapshot> DecodeSnapshot(absl::string_view bytes, const SnapshotExpectation& expect) {
  Snapshot snapshot;
  RETURN_IF_ERROR(DecodeSnapshotInto(bytes, expect, &snapshot));
  return snapshot;
}

absl::Status DecodeSnapshotInto(absl::string_view bytes, const SnapshotExpectation& expect, Snapshot* out) {
  absl::StatusOr<ParsedHeader> header = CheckedHeader(bytes, expect);
  if (!header.ok()) return header.status();

  // The header is consistent with the input's length, so every read below is
  // in bounds; the checksum is verified once all bytes have been copied.
  const char* buffer = bytes.data();
  const PayloadShape& shape = header->shape;
  const int32_t mamba_layers = header->layout.mamba_layers;
  const int32_t attention_layers = header->layout.attention_layers;
  StripedXxh3 checksum(bytes.size() - kSnapshotTrailerBytes);
  size_t offset = kSnapshotHeaderBytes;
  out->model_fingerprint = header->model_fingerprint;
  out->prefix_hash = header->prefix_hash;
  out->position = header->position;
  out->layout = header->layout;
  out->ssm_states.resize(mamba_layers);
  out->conv_states.resize(mamba_layers);
  out->tail_k.resize(attention_layers);
  out->tail_v.resize(attention_layers);
  for (std::vector<float>& a : out->ssm_states) ReadArray(buffer, &offset, shape.ssm_floats, &a, checksum);
  for (std::vector<float>& a : out->conv_states) ReadArray(buffer, &offset, shape.conv_floats, &a, checksum);
  for (int32_t l = 0; l < attention_layers; ++l) {
    ReadArray(buffer, &offset, shape.tail_floats, &out->tail_k[l], checksum);
    ReadArray(buffer, &offset, shape.tail_floats, &out->tail_v[l], checksum);
  }
  ReadArray(buffer, &offset, shape.logits_floats, &out->last_logits, checksum);
  if (checksum.Finish(buffer) != StoredChecksum(bytes)) return absl::DataLossError("snapshot checksum mismatch");
  return absl::OkStatus();
}

}  // namespace hybridserve::engine
