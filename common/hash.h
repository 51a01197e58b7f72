#ifndef HYBRIDSERVE_COMMON_HASH_H_
#define HYBRIDSERVE_COMMON_HASH_H_

// Hashing built on XXH3 (libxxhash): 128-bit keys for cache addressing, where a
// collision would silently serve the wrong state, and 64-bit checksums for
// integrity of stored bytes.

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace hybridserve::common {

// A 128-bit hash used as a cache key. Value type; ordered and hashable.
struct Hash128 {
  uint64_t lo = 0;
  uint64_t hi = 0;

  friend bool operator==(const Hash128& a, const Hash128& b) { return a.lo == b.lo && a.hi == b.hi; }
  friend bool operator!=(const Hash128& a, const Hash128& b) { return !(a == b); }
  friend bool operator<(const Hash128& a, const Hash128& b) { return a.hi != b.hi ? a.hi < b.hi : a.lo < b.lo; }
  template <typename H>
  friend H AbslHashValue(H h, const Hash128& k) {
    // The key is already uniformly distributed; mixing one word is enough.
    return H::combine(std::move(h), k.lo);
  }

  // 32 lowercase hex digits, hi then lo.
  std::string ToHex() const;
  // 16 bytes, lo then hi, little-endian (the wire form).
  std::string ToBytes() const;
  // Parses ToBytes(); false if `bytes` is not 16 bytes long.
  static bool FromBytes(absl::string_view bytes, Hash128* out);
};

// XXH3-128 of `data`.
Hash128 HashBytes(const void* data, size_t size);
inline Hash128 HashBytes(absl::string_view s) { return HashBytes(s.data(), s.size()); }

// XXH3-128 of `prev` (16 bytes) followed by `data`: one link of a hash chain.
Hash128 HashChain(const Hash128& prev, const void* data, size_t size);

// HashChain(prev, bytes) over bytes that arrive in pieces, with the hash of
// every prefix on the way: Digest() after Update(a) then Update(b) equals
// HashChain(prev, a || b), and Update may continue after a Digest. Not
// thread-safe.
class ChainHasher {
 public:
  explicit ChainHasher(const Hash128& prev);
  ~ChainHasher();
  ChainHasher(const ChainHasher&) = delete;
  ChainHasher& operator=(const ChainHasher&) = delete;

  void Update(const void* data, size_t size);
  Hash128 Digest() const;

 private:
  void* state_;  // XXH3_state_t*, owned.
};

// XXH3-64 checksum of `data`, for integrity of stored entries.
uint64_t Checksum64(const void* data, size_t size);

// Incremental XXH3-64 checksum over bytes that arrive in pieces. Not thread-safe.
class StreamingChecksum {
 public:
  StreamingChecksum();
  ~StreamingChecksum();
  StreamingChecksum(const StreamingChecksum&) = delete;
  StreamingChecksum& operator=(const StreamingChecksum&) = delete;

  void Update(const void* data, size_t size);
  uint64_t Digest() const;

 private:
  void* state_;  // XXH3_state_t*, owned.
};

}  // namespace hybridserve::common

#endif  // HYBRIDSERVE_COMMON_HASH_H_
