#ifndef HYBRIDSERVE_ENGINE_SNAPSHOT_CODEC_H_
#define HYBRIDSERVE_ENGINE_SNAPSHOT_CODEC_H_

// The snapshot codec: one versioned binary format for the state of one
// sequence at position p (docs/ARCHITECTURE.md sections 3 and 4), the bytes that the
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
//   64     44    layout: 11 x i32 in StateLayout's wire order (vocab
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
// input (layer counts are bounded by kStateMaxLayers). Error codes:
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
#include "engine/sequence_state.h"
#include "engine/state_layout.h"

namespace hybridserve::engine {

inline constexpr uint32_t kSnapshotFormatVersion = 1;
inline constexpr size_t kSnapshotHeaderBytes = 128;
inline constexpr size_t kSnapshotTrailerBytes = 8;

// Element type of the payload arrays on the wire.
enum class SnapshotDType : uint32_t {
  kF32 = 1,
  kBF16 = 2,  // reserved: neither encoded nor decoded yet
};

// The state of one sequence after its first `position` tokens (the arrays of
// SequenceState, in the shapes `layout` gives), stamped with what identifies
// it: the model and the token prefix.
struct Snapshot : SequenceState {
  common::Hash128 model_fingerprint;
  common::Hash128 prefix_hash;  // Hash128 of namespace + tokens[0, position), from the caller
  StateLayout layout;
};

// A state to encode given as host views (for instance straight over a state
// pool the host can address), with what identifies it.
struct SnapshotSource {
  common::Hash128 model_fingerprint;
  common::Hash128 prefix_hash;
  StateLayout layout;
  StateArrays arrays;  // the position is arrays.position
};

// What the reader requires of a snapshot; an unset field is not checked.
struct SnapshotExpectation {
  std::optional<common::Hash128> model_fingerprint;
  std::optional<StateLayout> layout;
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
  StateLayout layout;
  std::vector<absl::Span<const uint8_t>> ssm_states;   // [mamba_layers]
  std::vector<absl::Span<const uint8_t>> conv_states;  // [mamba_layers]
  std::vector<absl::Span<const uint8_t>> tail_k;       // [attention_layers]
  std::vector<absl::Span<const uint8_t>> tail_v;       // [attention_layers]
  absl::Span<const uint8_t> last_logits;               // empty when not kept
};

// Bytes of the encoding of a snapshot with this layout at `position`, header
// and checksum included. INVALID_ARGUMENT for an invalid layout, a negative
// position, logits without a vocabulary, or a size that overflows.
absl::StatusOr<size_t> EncodedSnapshotSize(const StateLayout& layout, int64_t position, bool with_logits);

// Encodes `snapshot`. INVALID_ARGUMENT, naming the array, if a vector's size
// does not match the layout and position (StateLayout::CheckState).
absl::StatusOr<std::string> EncodeSnapshot(const Snapshot& snapshot);
// Same, into `*out`, replacing its contents and reusing its buffer: no
// allocation when its capacity suffices, and no zero-fill of what it already
// holds (a reused buffer of the same size is only overwritten). On error
// `*out` is unspecified.
absl::Status EncodeSnapshotInto(const Snapshot& snapshot, std::string* out);
// Same, from views: one pass from wherever the arrays are into `*out`.
absl::Status EncodeSnapshotInto(const SnapshotSource& source, std::string* out);
// Same, into a caller-owned buffer (e.g. a reserved cache or transfer slot)
// whose size must be exactly EncodedSnapshotSize(...).
absl::Status EncodeSnapshotToBuffer(const Snapshot& snapshot, absl::Span<char> out);
absl::Status EncodeSnapshotToBuffer(const SnapshotSource& source, absl::Span<char> out);

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
