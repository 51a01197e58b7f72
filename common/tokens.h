#ifndef HYBRIDSERVE_COMMON_TOKENS_H_
#define HYBRIDSERVE_COMMON_TOKENS_H_

// Vocabulary shared by every layer that handles token ids and KV pages: the
// token id type of the wire (proto int32) and the engine, and the page-size
// rules that the engine, the cachestore and the services must agree on.

#include <cstdint>
#include <string>

namespace hybridserve {

// A token id as it travels on the wire (proto int32) and through the engine.
using TokenId = int32_t;

// Largest KV page, in tokens: the cachestore's limit on a namespace's page size
// (proto/cachestore.proto) and so the largest page the engine may use.
inline constexpr int64_t kMaxPageSize = int64_t{1} << 16;

inline constexpr bool IsPowerOfTwo(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

// A valid page size: a power of two in [1, kMaxPageSize].
inline constexpr bool IsValidPageSize(int64_t page_size) {
  return IsPowerOfTwo(page_size) && page_size <= kMaxPageSize;
}

// The rule `page_size` breaks, stated with the actual limits ("page_size
// 131072 is larger than the maximum, 65536"); empty when it is valid.
inline std::string PageSizeProblem(int64_t page_size) {
  if (page_size <= 0) return "page_size " + std::to_string(page_size) + " must be positive";
  if (page_size > kMaxPageSize) {
    return "page_size " + std::to_string(page_size) + " is larger than the maximum, " + std::to_string(kMaxPageSize);
  }
  if (!IsPowerOfTwo(page_size)) return "page_size " + std::to_string(page_size) + " is not a power of two";
  return "";
}

}  // namespace hybridserve

#endif  // HYBRIDSERVE_COMMON_TOKENS_H_
