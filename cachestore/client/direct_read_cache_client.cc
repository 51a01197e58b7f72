#include "cachestore/client/direct_read_cache_client.h"

#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "common/log_rate_limiter.h"

namespace hybridserve::cachestore {

absl::Status DirectReadCacheClient::GetInto(uint64_t lease_id, const Hash128& key, std::string* out) {
  std::optional<absl::Status> direct = TryDirect(lease_id, absl::MakeConstSpan(&key, 1), absl::MakeSpan(out, 1));
  if (!direct.has_value()) return base_.GetInto(lease_id, key, out);
  // One key: the server's "keys[0]: " says nothing.
  absl::string_view message = direct->message();
  absl::ConsumePrefix(&message, "keys[0]: ");
  return direct->ok() ? *direct : absl::Status(direct->code(), message);
}

absl::Status DirectReadCacheClient::GetManyInto(uint64_t lease_id, absl::Span<const Hash128> keys,
                                                absl::Span<std::string> out) {
  // Argument errors are the base's to report, in its words.
  if (keys.empty() || keys.size() != out.size() || keys.size() > reader_->max_keys()) {
    return base_.GetManyInto(lease_id, keys, out);
  }
  std::optional<absl::Status> direct = TryDirect(lease_id, keys, out);
  if (direct.has_value()) return *direct;
  return base_.GetManyInto(lease_id, keys, out);
}

absl::Status DirectReadCacheClient::GetManyScattered(uint64_t lease_id, absl::Span<const Hash128> keys,
                                                     absl::Span<const EntrySegments> out) {
  if (keys.empty() || keys.size() != out.size() || keys.size() > reader_->max_keys()) {
    return base_.GetManyScattered(lease_id, keys, out);
  }
  bool verdict = false;
  const absl::Status read = reader_->ReadScattered(lease_id, keys, out, &verdict);
  int64_t bytes = 0;
  for (const EntrySegments& o : out) bytes += static_cast<int64_t>(o.bytes());
  std::optional<absl::Status> direct = Counted(read, verdict, bytes);
  if (direct.has_value()) return *direct;
  return base_.GetManyScattered(lease_id, keys, out);
}

std::optional<absl::Status> DirectReadCacheClient::TryDirect(uint64_t lease_id, absl::Span<const Hash128> keys,
                                                             absl::Span<std::string> out) {
  bool verdict = false;
  const absl::Status read = reader_->ReadInto(lease_id, keys, out, &verdict);
  int64_t bytes = 0;
  for (const std::string& o : out) bytes += static_cast<int64_t>(o.size());
  return Counted(read, verdict, bytes);
}

std::optional<absl::Status> DirectReadCacheClient::Counted(const absl::Status& read, bool verdict, int64_t bytes) {
  absl::MutexLock lock(&mu_);
  if (!read.ok()) {
    if (verdict) {
      ++counts_.verdicts;
      return read;
    }
    ++counts_.fallbacks[common::FailureReason(read)];
    return std::nullopt;
  }
  ++counts_.reads;
  counts_.bytes += bytes;
  return absl::OkStatus();
}

DirectReadCounts DirectReadCacheClient::counts() const {
  absl::MutexLock lock(&mu_);
  return counts_;
}

}  // namespace hybridserve::cachestore
