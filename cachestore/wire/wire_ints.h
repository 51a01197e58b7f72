#ifndef HYBRIDSERVE_CACHESTORE_WIRE_WIRE_INTS_H_
#define HYBRIDSERVE_CACHESTORE_WIRE_WIRE_INTS_H_

// Little-endian integers of the cachestore's socket formats (shm_protocol.h,
// bulk_protocol.h), whatever the host's byte order.

#include <cstdint>
#include <string>

namespace hybridserve::cachestore::wire {

inline void PutU32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
inline void PutU64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
inline uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}
inline uint64_t GetU64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

}  // namespace hybridserve::cachestore::wire

#endif  // HYBRIDSERVE_CACHESTORE_WIRE_WIRE_INTS_H_
