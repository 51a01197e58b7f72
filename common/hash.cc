#include "common/hash.h"

#include <cstring>

#include "absl/strings/str_format.h"

#define XXH_INLINE_ALL
#include "xxhash.h"

namespace hybridserve::common {

std::string Hash128::ToHex() const { return absl::StrFormat("%016x%016x", hi, lo); }

std::string Hash128::ToBytes() const {
  std::string out(16, '\0');
  std::memcpy(out.data(), &lo, 8);
  std::memcpy(out.data() + 8, &hi, 8);
  return out;
}

bool Hash128::FromBytes(absl::string_view bytes, Hash128* out) {
  if (bytes.size() != 16) return false;
  std::memcpy(&out->lo, bytes.data(), 8);
  std::memcpy(&out->hi, bytes.data() + 8, 8);
  return true;
}

Hash128 HashBytes(const void* data, size_t size) {
  XXH128_hash_t h = XXH3_128bits(data, size);
  return Hash128{h.low64, h.high64};
}

Hash128 HashChain(const Hash128& prev, const void* data, size_t size) {
  // Small links (a state's tail, a domain string) are hashed in one shot from
  // a stack buffer: the one-shot path is several times faster than the
  // streaming state for inputs this size.
  constexpr size_t kStackBytes = 1024;
  if (size <= kStackBytes - 16) {
    unsigned char buf[kStackBytes];
    std::memcpy(buf, &prev.lo, 8);
    std::memcpy(buf + 8, &prev.hi, 8);
    if (size > 0) std::memcpy(buf + 16, data, size);
    XXH128_hash_t h = XXH3_128bits(buf, size + 16);
    return Hash128{h.low64, h.high64};
  }
  XXH3_state_t state;
  XXH3_128bits_reset(&state);
  XXH3_128bits_update(&state, &prev.lo, 8);
  XXH3_128bits_update(&state, &prev.hi, 8);
  XXH3_128bits_update(&state, data, size);
  XXH128_hash_t h = XXH3_128bits_digest(&state);
  return Hash128{h.low64, h.high64};
}

ChainHasher::ChainHasher(const Hash128& prev) : state_(XXH3_createState()) {
  auto* state = static_cast<XXH3_state_t*>(state_);
  XXH3_128bits_reset(state);
  XXH3_128bits_update(state, &prev.lo, 8);
  XXH3_128bits_update(state, &prev.hi, 8);
}

ChainHasher::~ChainHasher() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }

void ChainHasher::Update(const void* data, size_t size) {
  XXH3_128bits_update(static_cast<XXH3_state_t*>(state_), data, size);
}

Hash128 ChainHasher::Digest() const {
  XXH128_hash_t h = XXH3_128bits_digest(static_cast<const XXH3_state_t*>(state_));
  return Hash128{h.low64, h.high64};
}

uint64_t Checksum64(const void* data, size_t size) { return XXH3_64bits(data, size); }

StreamingChecksum::StreamingChecksum() : state_(XXH3_createState()) {
  XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_));
}

StreamingChecksum::~StreamingChecksum() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }

void StreamingChecksum::Update(const void* data, size_t size) {
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), data, size);
}

uint64_t StreamingChecksum::Digest() const { return XXH3_64bits_digest(static_cast<const XXH3_state_t*>(state_)); }

}  // namespace hybridserve::common
