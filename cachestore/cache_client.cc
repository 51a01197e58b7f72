#include "cachestore/cache_client.h"

namespace hybridserve::cachestore {

absl::StatusOr<std::string> CacheClient::Get(uint64_t lease_id, const Hash128& key) {
  std::string out;
  absl::Status s = GetInto(lease_id, key, &out);
  if (!s.ok()) return s;
  return out;
}

}  // namespace hybridserve::cachestore
