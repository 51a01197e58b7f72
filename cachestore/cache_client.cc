#include "cachestore/cache_client.h"

#include "absl/strings/str_cat.h"

namespace hybridserve::cachestore {

absl::StatusOr<std::string> CacheClient::Get(uint64_t lease_id, const Hash128& key) {
  std::string out;
  absl::Status s = GetInto(lease_id, key, &out);
  if (!s.ok()) return s;
  return out;
}

absl::Status CacheClient::GetManyInto(uint64_t lease_id, absl::Span<const Hash128> keys, absl::Span<std::string> out) {
  if (keys.empty() || keys.size() != out.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("GetManyInto: ", keys.size(), " keys into ", out.size(), " outputs (at least one, as many)"));
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    absl::Status s = GetInto(lease_id, keys[i], &out[i]);
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat("keys[", i, "]: ", s.message()));
  }
  return absl::OkStatus();
}

}  // namespace hybridserve::cachestore
