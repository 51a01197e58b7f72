#ifndef HYBRIDSERVE_ENGINE_SNAPSHOT_CODEC_H_
#define HYBRIDSERVE_ENGINE_SNAPSHOT_CODEC_H_

// The snapshot codec: one versioned binary format for the state of one
// sequence at position p (DESIGN.md sections 2 and 3), the bytes that the
// cachestore keeps and the data plane moves.
//
// Wire format, version 1. Every integer is little-endian, every float an
// IEEE-754 binary32 stored bit for bit (little-endian); the codec builds only
// on little-endian hosts (static_assert), where both are plain copies.
//
//   offset size  field
//   0      8     magic "HSSNAP\x1a\n"
//   8      4     u32 format version (1)
//   12     4     u32 header bytes (128: where the payload starts)
//   16     4     u32 dtype of the payload (1 = fp32; 2 = bf16 is reserved)
//   20     4     u32 flags: bit 0 = last logits present; other bits zero
//   24     16    model fingerprint (Hash128: lo u64, hi u64)
//   40     16    token-prefix hash (Hash128 of namespace + tokens[0, p))
//   56     8     i64 position p (>= 0)
//   64     44    layout: 11 x i32 in SnapshotLayout's field order (vocab
//                is the model's even without logits: flag bit 0 says
//                whether they are kept)
//   108    4     u32 tail tokens = p mod page_size (redundant, checked)
//   112    8     u64 payload bytes (redundant, checked)
//   120    8     reserved, zero
//   128    ...   payload, fp32 arrays back to back, row-major:
//                  ssm_states[l]  [ssm_heads, ssm_head_dim, ssm_state]  l < mamba_layers
//                  conv_states[l] [conv_dim, conv_kernel - 1]           l < mamba_layers
//                  tail_k[l], tail_v[l] (K then V per layer)            l < attention_layers
//                                 [tail_tokens, kv_heads, kv_head_dim] each
//                  last_logits    [vocab]                               if flag bit 0
//   end-8  8     u64 XXH3-64 (seed 0) of bytes [0, end - 8)
//
// Decoding never trusts its input: the sizes are computed from the header with
// overflow-checked arithmetic and must equal the input's length exactly, every
// header field is range-checked, layer counts are bounded so that a header
// alone cannot make the decoder allocate, and nothing is read outside the
// input. Error codes:
//   DATA_LOSS            checksum mismatch, or input too short for a header;
//                        corrupted bytes anywhere, header included, give this
//                        code (the checksum is verified before a header
//                        problem is reported);
//   INVALID_ARGUMENT     checksum-valid bytes that are not a valid version-1
//                        snapshot (bad magic, version, field out of range,
//                        length not matching the header);
//   UNIMPLEMENTED        a bf16 payload;
//   FAILED_PRECONDITION  a valid snapshot that does not match the
//                        SnapshotExpectation (another model, layout, position
//                        or prefix).
//
// Cost: encode and decode each make a single pass that copies the payload and
// hashes every 64-byte stripe of it as it goes through registers (XXH3
// computed stripe by stripe), so each byte is loaded from memory once, as in
// a memcpy; ParseSnapshot reads the bytes once for the checksum and copies
// nothing. bench/engine/snapshot_bench.cc measures the ratios to memcpy.
//
// All functions are thread-safe (no shared state).

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/hash.h"

namespace hybridserve::engine {

inline constexpr uint32_t kSnapshotFormatVersion = 1;
inline constexpr size_t kSnapshotHeaderBytes = 128;
inline constexpr size_t kSnapshotTrailerBytes = 8;
// Bound on mamba_layers and attention_layers: far above any real model, low
// enough that a forged header cannot make the decoder allocate much for
// empty per-layer arrays.
inline constexpr int32_t kSnapshotMaxLayers = 16384;

// Element type of the payload arrays on the wire.
enum class SnapshotDType : uint32_t {
  kF32 = 1,
  kBF16 = 2,  // reserved: neither encoded nor decoded yet
};

// Shapes of the state of one sequence. Value type.
struct SnapshotLayout {
  int32_t mamba_layers = 0;
  int32_t ssm_heads = 0;     // Mamba2 n_heads
  int32_t ssm_head_dim = 0;  // Mamba2 head_dim
  int32_t ssm_state = 0;     // Mamba2 d_state
  int32_t conv_dim = 0;      // channels of the causal conv
  int32_t conv_kernel = 0;   // d_conv; the conv state keeps d_conv - 1 columns
  int32_t attention_layers = 0;
  int32_t kv_heads = 0;
  int32_t kv_head_dim = 0;
  int32_t page_size = 0;  // tokens per KV page, >= 1
  int32_t vocab = 0;      // the model's vocabulary; required (>= 1) only with last logits

  // Floats of one array of each kind, for a layout that passes
  // ValidateSnapshotLayout (which bounds them) and a position >= 0.
  int64_t ssm_state_floats() const;                // ssm_heads * ssm_head_dim * ssm_state
  int64_t conv_state_floats() const;               // conv_dim * (conv_kernel - 1)
  int64_t tail_tokens(int64_t position) const;     // position mod page_size
  int64_t tail_kv_floats(int64_t position) const;  // tail_tokens(position) * kv_heads * kv_head_dim

  std::string ToString() const;

  friend bool operator==(const SnapshotLayout& a, const SnapshotLayout& b);
  friend bool operator!=(const SnapshotLayout& a, const SnapshotLayout& b) { return !(a == b); }
};

// Bound on the floats of any one array (4 TiB): keeps every size computation
// of a valid layout far from overflow.
inline constexpr int64_t kSnapshotMaxArrayFloats = int64_t{1} << 40;

// OK, or INVALID_ARGUMENT naming the first field out of range: layer counts in
// [0, kSnapshotMaxLayers], page_size >= 1, the shapes of every layer kind
// present >= 1 (conv_kernel >= 1), everything else >= 0, and no array (a full
// page of tail KV included) above kSnapshotMaxArrayFloats.
absl::Status ValidateSnapshotLayout(const SnapshotLayout& layout);

// The state of one sequence after its first `position` tokens.
struct Snapshot {
  common::Hash128 model_fingerprint;
  int64_t position = 0;
  common::Hash128 prefix_hash;  // Hash128 of namespace + tokens[0, position), from the caller
  SnapshotLayout layout;
  std::vector<std::vector<float>> ssm_states;   // [mamba_layers][ssm_state_floats()]
  std::vector<std::vector<float>> conv_states;  // [mamba_layers][conv_state_floats()]
  std::vector<std::vector<float>> tail_k;       // [attention_layers][tail_kv_floats(position)]
  std::vector<std::vector<float>> tail_v;       // [attention_layers][tail_kv_floats(position)]
  std::vector<float> last_logits;               // [vocab], or empty when not kept
};

// What the reader requires of a snapshot; an unset field is not checked.
struct SnapshotExpectation {
  std::optional<common::Hash128> model_fingerprint;
  std::optional<SnapshotLayout> layout;
  std::optional<int64_t> position;
  std::optional<common::Hash128> prefix_hash;
};

// A verified snapshot whose arrays point into the encoded bytes, for a reader
// that copies the state straight into its own slot (a state-pool row, a device
// buffer) and so needs no intermediate vectors. Valid while the bytes it was
// parsed from live unchanged. Each array is the raw little-endian fp32 bytes
// of the shape given in Snapshot, possibly unaligned: copy it out with memcpy.
struct SnapshotView {
  common::Hash128 model_fingerprint;
  int64_t position = 0;
  common::Hash128 prefix_hash;
  SnapshotLayout layout;
  std::vector<absl::Span<const uint8_t>> ssm_states;   // [mamba_layers]
  std::vector<absl::Span<const uint8_t>> conv_states;  // [mamba_layers]
  std::vector<absl::Span<const uint8_t>> tail_k;       // [attention_layers]
  std::vector<absl::Span<const uint8_t>> tail_v;       // [attention_layers]
  absl::Span<const uint8_t> last_logits;               // empty when not kept
};

// Bytes of the encoding of a snapshot with this layout at `position`, header
// and checksum included. INVALID_ARGUMENT for an invalid layout, a negative
// position, logits without a vocabulary, or a size that overflows.
absl::StatusOr<size_t> EncodedSnapshotSize(const SnapshotLayout& layout, int64_t position, bool with_logits);

// Encodes `snapshot`. INVALID_ARGUMENT, naming the array, if a vector's size
// does not match the layout and position.
absl::StatusOr<std::string> EncodeSnapshot(const Snapshot& snapshot);
// Same, into `*out`, replacing its contents and reusing its buffer: no
// allocation when its capacity suffices, and no zero-fill of what it already
// holds (a reused buffer of the same size is only overwritten). On error
// `*out` is unspecified.
absl::Status EncodeSnapshotInto(const Snapshot& snapshot, std::string* out);
// Same, into a caller-owned buffer (e.g. a reserved cache or transfer slot)
// whose size must be exactly EncodedSnapshotSize(...).
absl::Status EncodeSnapshotToBuffer(const Snapshot& snapshot, absl::Span<char> out);

// Verifies `bytes` (one checksum pass, no copy) and returns views into them;
// the same checks and error codes as DecodeSnapshot.
absl::StatusOr<SnapshotView> ParseSnapshot(absl::string_view bytes, const SnapshotExpectation& expect = {});

// Decodes and verifies `bytes`; see the file comment for the error codes.
absl::StatusOr<Snapshot> DecodeSnapshot(absl::string_view bytes, const SnapshotExpectation& expect = {});
// Same, into `*out`, reusing its vectors: no allocation or zero-fill when a
// snapshot of the same shape was decoded into it before (fresh vectors are
// zero-filled by resize, then overwritten). On error `*out` is unspecified.
absl::Status DecodeSnapshotInto(absl::string_view bytes, const SnapshotExpectation& expect, Snapshot* out);

}  // namespace hybridserve::engine

#endif  // HYBRIDSERVE_ENGINE_SNAPSHOT_CODEC_H_
