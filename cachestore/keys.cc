#include "cachestore/keys.h"

#include <cstring>

namespace hybridserve::cachestore {
namespace {

void AppendPart(std::string* out, absl::string_view part) {
  uint64_t n = part.size();
  out->append(reinterpret_cast<const char*>(&n), sizeof(n));
  out->append(part.data(), part.size());
}

// States and pages are hashed with a different leading tag so a state key can
// never equal a page key built from the same bytes.
constexpr uint32_t kStateTag = 0x53544154;  // "STAT"

}  // namespace

Hash128 NamespaceKey(absl::string_view model_fingerprint, absl::string_view adapter, absl::string_view cache_salt,
                     int32_t page_size) {
  std::string buf;
  AppendPart(&buf, "hybridserve/ns/v1");
  AppendPart(&buf, model_fingerprint);
  AppendPart(&buf, adapter);
  AppendPart(&buf, cache_salt);
  buf.append(reinterpret_cast<const char*>(&page_size), sizeof(page_size));
  return common::HashBytes(buf);
}

Hash128 PageKey(const Hash128& parent, absl::Span<const TokenId> page_tokens) {
  return common::HashChain(parent, page_tokens.data(), page_tokens.size() * sizeof(TokenId));
}

std::vector<Hash128> PageKeys(const Hash128& ns, absl::Span<const TokenId> tokens, int32_t page_size) {
  std::vector<Hash128> keys;
  if (page_size <= 0) return keys;
  const size_t n = tokens.size() / page_size;
  keys.reserve(n);
  Hash128 prev = ns;
  for (size_t i = 0; i < n; ++i) {
    prev = PageKey(prev, tokens.subspan(i * page_size, page_size));
    keys.push_back(prev);
  }
  return keys;
}

Hash128 StateKey(const Hash128& parent, absl::Span<const TokenId> tail_tokens) {
  std::vector<TokenId> buf(tail_tokens.size() + 1);
  std::memcpy(buf.data(), &kStateTag, sizeof(kStateTag));
  if (!tail_tokens.empty()) {
    std::memcpy(buf.data() + 1, tail_tokens.data(), tail_tokens.size() * sizeof(TokenId));
  }
  return common::HashChain(parent, buf.data(), buf.size() * sizeof(TokenId));
}

}  // namespace hybridserve::cachestore
