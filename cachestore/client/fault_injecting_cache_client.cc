#include "cachestore/client/fault_injecting_cache_client.h"

#include <utility>

#include "absl/time/clock.h"

namespace hybridserve::cachestore {
namespace {

size_t Index(CacheClientMethod method) { return static_cast<size_t>(method); }

}  // namespace

FaultInjectingCacheClient::FaultInjectingCacheClient(CacheClient& inner, SleepFn sleep)
    : inner_(inner), sleep_(std::move(sleep)) {}

void FaultInjectingCacheClient::FailNext(CacheClientMethod method, int count, absl::Status status) {
  absl::MutexLock lock(&mu_);
  MethodFaults& f = faults_[Index(method)];
  f.fail_remaining = count > 0 && !status.ok() ? count : 0;
  f.failure = std::move(status);
}

void FaultInjectingCacheClient::SetDelay(CacheClientMethod method, absl::Duration delay) {
  absl::MutexLock lock(&mu_);
  faults_[Index(method)].delay = delay;
}

void FaultInjectingCacheClient::CorruptNextGets(int count) {
  absl::MutexLock lock(&mu_);
  corrupt_gets_remaining_ = count > 0 ? count : 0;
}

void FaultInjectingCacheClient::Clear() {
  absl::MutexLock lock(&mu_);
  for (MethodFaults& f : faults_) {
    f.fail_remaining = 0;
    f.failure = absl::OkStatus();
    f.delay = absl::ZeroDuration();
  }
  corrupt_gets_remaining_ = 0;
}

int64_t FaultInjectingCacheClient::calls(CacheClientMethod method) const {
  absl::MutexLock lock(&mu_);
  return faults_[Index(method)].calls;
}

absl::Status FaultInjectingCacheClient::Enter(CacheClientMethod method) {
  absl::Duration delay;
  absl::Status failure;
  {
    absl::MutexLock lock(&mu_);
    MethodFaults& f = faults_[Index(method)];
    ++f.calls;
    delay = f.delay;
    if (f.fail_remaining > 0) {
      --f.fail_remaining;
      failure = f.failure;
    }
  }
  if (delay > absl::ZeroDuration()) sleep_(delay);
  return failure;
}

absl::StatusOr<LookupResult> FaultInjectingCacheClient::Lookup(const ClientNamespace& ns,
                                                               absl::Span<const TokenId> tokens, LookupMode mode) {
  absl::Status s = Enter(CacheClientMethod::kLookup);
  if (!s.ok()) return s;
  return inner_.Lookup(ns, tokens, mode);
}

absl::StatusOr<PutResult> FaultInjectingCacheClient::Put(const ClientNamespace& ns, const ClientPut& put,
                                                         absl::string_view bytes) {
  absl::Status s = Enter(CacheClientMethod::kPut);
  if (!s.ok()) return s;
  return inner_.Put(ns, put, bytes);
}

absl::Status FaultInjectingCacheClient::GetInto(uint64_t lease_id, const Hash128& key, std::string* out) {
  absl::Status s = Enter(CacheClientMethod::kGetInto);
  if (!s.ok()) {
    out->clear();
    return s;
  }
  s = inner_.GetInto(lease_id, key, out);
  if (!s.ok()) return s;
  bool corrupt = false;
  {
    absl::MutexLock lock(&mu_);
    if (corrupt_gets_remaining_ > 0) {
      --corrupt_gets_remaining_;
      corrupt = true;
    }
  }
  if (corrupt && !out->empty()) (*out)[0] = static_cast<char>(~(*out)[0]);
  return absl::OkStatus();
}

absl::Status FaultInjectingCacheClient::GetManyInto(uint64_t lease_id, absl::Span<const Hash128> keys,
                                                    absl::Span<std::string> out) {
  absl::Status s = Enter(CacheClientMethod::kGetManyInto);
  if (!s.ok()) {
    for (std::string& o : out) o.clear();
    return s;
  }
  return inner_.GetManyInto(lease_id, keys, out);
}

std::vector<absl::StatusOr<PutResult>> FaultInjectingCacheClient::PutMany(const ClientNamespace& ns,
                                                                          absl::Span<const PutManyEntry> entries) {
  absl::Status s = Enter(CacheClientMethod::kPutMany);
  if (!s.ok()) return std::vector<absl::StatusOr<PutResult>>(entries.size(), s);
  return CacheClient::PutMany(ns, entries);
}

absl::Status FaultInjectingCacheClient::Release(uint64_t lease_id) {
  absl::Status s = Enter(CacheClientMethod::kRelease);
  if (!s.ok()) return s;
  return inner_.Release(lease_id);
}

absl::StatusOr<IndexStats> FaultInjectingCacheClient::Stats() {
  absl::Status s = Enter(CacheClientMethod::kStats);
  if (!s.ok()) return s;
  return inner_.Stats();
}

}  // namespace hybridserve::cachestore
