#include "cachestore/server/call_admission.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace hybridserve::cachestore {

CallAdmission::Slot::Slot(Slot&& other) noexcept
    : admission_(std::exchange(other.admission_, nullptr)), peer_(std::move(other.peer_)) {}

CallAdmission::Slot& CallAdmission::Slot::operator=(Slot&& other) noexcept {
  if (this != &other) {
    if (admission_ != nullptr) admission_->Release(peer_);
    admission_ = std::exchange(other.admission_, nullptr);
    peer_ = std::move(other.peer_);
  }
  return *this;
}

CallAdmission::Slot::~Slot() {
  if (admission_ != nullptr) admission_->Release(peer_);
}

CallAdmission::CallAdmission(int64_t max_calls, int64_t max_calls_per_peer)
    : max_calls_(max_calls), max_calls_per_peer_(max_calls_per_peer) {}

absl::StatusOr<CallAdmission::Slot> CallAdmission::Admit(absl::string_view peer) {
  absl::MutexLock lock(&mu_);
  if (closed_) return absl::UnavailableError("the cachestore is draining");
  if (in_flight_ >= max_calls_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("too many calls: --max_streams=", max_calls_, " calls in flight over all clients"));
  }
  auto it = per_peer_.find(peer);
  if (it != per_peer_.end() && it->second >= max_calls_per_peer_) {
    return absl::ResourceExhaustedError(absl::StrCat("too many calls: --max_streams_per_peer=", max_calls_per_peer_,
                                                     " calls in flight from this client"));
  }
  if (it == per_peer_.end()) it = per_peer_.emplace(std::string(peer), 0).first;
  ++it->second;
  ++in_flight_;
  return Slot(this, std::string(peer));
}

int64_t CallAdmission::in_flight() const {
  absl::MutexLock lock(&mu_);
  return in_flight_;
}

void CallAdmission::Close() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
}

bool CallAdmission::AwaitIdle(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return in_flight_ == 0; };
  return mu_.AwaitWithDeadline(absl::Condition(&idle), deadline);
}

void CallAdmission::Release(const std::string& peer) {
  absl::MutexLock lock(&mu_);
  --in_flight_;
  auto it = per_peer_.find(peer);
  if (it != per_peer_.end() && --it->second == 0) per_peer_.erase(it);
}

}  // namespace hybridserve::cachestore
