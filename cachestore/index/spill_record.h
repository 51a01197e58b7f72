#ifndef HYBRIDSERVE_CACHESTORE_INDEX_SPILL_RECORD_H_
#define HYBRIDSERVE_CACHESTORE_INDEX_SPILL_RECORD_H_

// What the disk tier keeps beside an entry's bytes: everything a lookup needs
// to put the entry back into memory through the normal put path (a PutSpec),
// and the entry's own checksum, which that put's commit verifies the bytes
// against. Stored as a DiskTier entry's metadata (disk_tier.h).
//
// Record format, version 1, every integer little-endian:
//
//   offset  size  field
//        0     4  record version (kSpillRecordVersion)
//        4     1  entry class: 0 page, 1 state
//        5     1  state kind: 0 grid checkpoint, 1 exact prefix (pages: 0)
//        6     1  1 when the entry hangs from a page (parent below), 0 from the root
//        7     1  1 when a model cost follows (offset 80), else 0
//        8    16  namespace key N: lo then hi
//       24    16  parent page key K_{n-1}: lo then hi (zero when from the root)
//       40     4  page size
//       44     4  tail tokens T (states; pages: 0)
//       48     8  position (pages: tokens through the page)
//       56     8  the entry's XXH3-64 (the memory tier's checksum)
//       64     8  the entry's size in bytes
//       72     8  the state's own idle TTL in nanoseconds (0: the class's)
//       80     8  model cost: flops_per_token (IEEE-754 binary64)
//       88     8  model cost: flops_per_token_context
//       96     4  tenant length U
//      100     U  tenant bytes
//    100+U   4*T  tail tokens (int32)
//
// The record ends exactly there. A record of another version, length or
// field value is refused (DATA_LOSS): the entry is then a miss.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "cachestore/keys.h"
#include "cachestore/types.h"
#include "common/prefill_cost.h"

namespace hybridserve::cachestore {

inline constexpr uint32_t kSpillRecordVersion = 1;

// Value type.
struct SpillRecord {
  EntryClass entry_class = EntryClass::kPage;
  Hash128 key;  // not encoded: the DiskTier entry's own key
  Hash128 ns;
  std::string tenant;
  int32_t page_size = 0;
  std::optional<Hash128> parent;  // nullopt: hangs from the namespace root
  std::vector<TokenId> tail;      // states only
  StateKind state_kind = StateKind::kExactPrefix;
  int64_t position = 0;
  uint64_t checksum = 0;
  int64_t size_bytes = 0;
  absl::Duration ttl = absl::ZeroDuration();  // states: their own idle TTL, 0 for none
  std::optional<PrefillCost> model_cost;      // the namespace's, when it registered one

  // The key of the page or root the entry hangs from (N for the root).
  const Hash128& parent_or_root() const { return parent.has_value() ? *parent : ns; }
};

// An entry the index evicted to make room (CacheIndexOptions::spill_evictions),
// or a committed entry the store writes at shutdown: its record and its bytes,
// kept alive by the shared pointer until written.
struct SpilledEntry {
  SpillRecord record;
  std::shared_ptr<const Blob> blob;
};

std::string EncodeSpillRecord(const SpillRecord& record);
// `key` is the DiskTier entry's key, copied into the result.
absl::StatusOr<SpillRecord> DecodeSpillRecord(const Hash128& key, absl::string_view bytes);

}  // namespace hybridserve::cachestore

#endif  // HYBRIDSERVE_CACHESTORE_INDEX_SPILL_RECORD_H_
