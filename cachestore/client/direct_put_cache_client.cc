#include "cachestore/client/direct_put_cache_client.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "cachestore/client/client_messages.h"
#include "common/logging.h"

namespace hybridserve::cachestore {

std::vector<std::pair<size_t, size_t>> SplitPutRequests(absl::Span<const PutManyEntry> entries, size_t max_entries,
                                                        int64_t max_bytes, size_t max_header_bytes) {
  std::vector<std::pair<size_t, size_t>> requests;
  for (size_t begin = 0; begin < entries.size();) {
    size_t end = begin;
    int64_t bytes = 0;
    size_t header_bytes = 0;
    while (end < entries.size() && end - begin < max_entries) {
      const int64_t next = static_cast<int64_t>(entries[end].bytes.size());
      const size_t next_header = 64 + 8 * entries[end].put->tokens.size();
      if (end > begin && (bytes + next > max_bytes || header_bytes + next_header > max_header_bytes)) break;
      bytes += next;
      header_bytes += next_header;
      ++end;
    }
    requests.emplace_back(begin, end);
    begin = end;
  }
  return requests;
}

absl::Status AppendPutAnswers(absl::Span<const std::string> answers, size_t entries,
                              std::vector<absl::StatusOr<PutResult>>* results) {
  if (answers.size() != entries) {
    return absl::InvalidArgumentError(absl::StrCat("put: ", answers.size(), " answers for ", entries, " entries"));
  }
  for (size_t i = 0; i < answers.size(); ++i) {
    v1::PutManyResponse answer;
    if (!answer.ParseFromString(answers[i]) || answer.index() != i || answer.code() < 0 ||
        answer.code() > static_cast<int32_t>(absl::StatusCode::kUnauthenticated)) {
      return absl::InvalidArgumentError(absl::StrCat("put: malformed answer for entry ", i));
    }
    if (answer.code() != 0) {
      results->push_back(absl::Status(static_cast<absl::StatusCode>(answer.code()), answer.message()));
      continue;
    }
    absl::StatusOr<PutResult> result = PutResultOf(answer.result());
    if (!result.ok()) return result.status();
    results->push_back(*std::move(result));
  }
  return absl::OkStatus();
}

DirectPutCacheClient::DirectPutCacheClient(CacheClient& base, std::unique_ptr<DirectWriter> writer)
    : base_(base), writer_(std::move(writer)) {
  counts_.path = writer_->name();
}

absl::StatusOr<PutResult> DirectPutCacheClient::Put(const ClientNamespace& ns, const ClientPut& put,
                                                    absl::string_view bytes) {
  const PutManyEntry entry{&put, bytes, std::nullopt};
  return std::move(PutMany(ns, absl::MakeConstSpan(&entry, 1))[0]);
}

std::vector<absl::StatusOr<PutResult>> DirectPutCacheClient::PutMany(const ClientNamespace& ns,
                                                                     absl::Span<const PutManyEntry> entries) {
  std::vector<absl::StatusOr<PutResult>> results;
  if (entries.empty()) return results;
  results.reserve(entries.size());
  const absl::Status path = writer_->Put(ns, entries, &results);
  {
    absl::MutexLock lock(&mu_);
    counts_.entries += static_cast<int64_t>(results.size());
    for (size_t i = 0; i < results.size(); ++i) counts_.bytes += static_cast<int64_t>(entries[i].bytes.size());
    if (path.ok()) {
      ++counts_.calls;
    } else {
      ++counts_.fallbacks[common::FailureReason(path)];
    }
  }
  if (!path.ok()) {
    int64_t held_back = 0;
    if (log_limiter_.Allow(common::FailureReason(path), &held_back)) {
      LOG(WARNING) << "cache puts by " << writer_->name() << " failed (" << path << "); "
                   << entries.size() - results.size() << " entries go to gRPC" << common::HeldBack(held_back);
    }
    std::vector<absl::StatusOr<PutResult>> rest = base_.PutMany(ns, entries.subspan(results.size()));
    for (absl::StatusOr<PutResult>& r : rest) results.push_back(std::move(r));
  }
  return results;
}

DirectPutCounts DirectPutCacheClient::counts() const {
  absl::MutexLock lock(&mu_);
  return counts_;
}

}  // namespace hybridserve::cachestore
