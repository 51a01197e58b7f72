#include "transport/transfer_registry.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace hybridserve::transport {

absl::Status TransferRegistry::Expect(const Ticket& t) {
  if (t.n_tokens < 1 || t.num_pages < 0 || t.num_pages > limits_.max_pages || t.page_bytes < 0 ||
      t.page_bytes > limits_.max_page_bytes || (t.num_pages > 0 && t.page_bytes == 0) || t.max_state_bytes < 1 ||
      t.max_state_bytes > limits_.max_state_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("transfer ", t.transfer_id, ": ticket sizes out of range (",
                                                   t.n_tokens, " tokens, ", t.num_pages, " pages of ", t.page_bytes,
                                                   " bytes, state up to ", t.max_state_bytes, " bytes)"));
  }
  if (t.secret.size() != kTransferSecretBytes) {
    return absl::InvalidArgumentError(absl::StrCat("transfer ", t.transfer_id, ": a ticket secret of ", t.secret.size(),
                                                   " bytes, ", kTransferSecretBytes,
                                                   " expected (StateReceiver::ExpectTicket draws one)"));
  }
  absl::MutexLock lock(&mu_);
  if (!entries_.try_emplace(t.transfer_id, Entry{t}).second) {
    return absl::InvalidArgumentError(absl::StrCat("transfer ", t.transfer_id, " is already expected"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Ticket> TransferRegistry::Begin(uint64_t transfer_id, absl::string_view secret) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(transfer_id);
  if (it == entries_.end()) {
    ++unauthenticated_;
    return absl::UnauthenticatedError(absl::StrCat("transfer ", transfer_id, " is not expected here"));
  }
  if (!SecretsEqual(secret, it->second.ticket.secret)) {
    ++unauthenticated_;
    return absl::UnauthenticatedError(
        absl::StrCat("transfer ", transfer_id, ": the sender does not present its ticket's secret"));
  }
  if (it->second.done) {
    ++refused_;
    return absl::NotFoundError(absl::StrCat("transfer ", transfer_id, " has finished: it is not expected any more"));
  }
  if (it->second.begun) {
    ++refused_;
    return absl::AlreadyExistsError(absl::StrCat("transfer ", transfer_id, " is already being received"));
  }
  it->second.begun = true;
  return it->second.ticket;
}

absl::Status TransferRegistry::Complete(uint64_t transfer_id, ReceivedState state) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(transfer_id);
  if (it == entries_.end() || it->second.done) {
    ++refused_;
    return absl::NotFoundError(absl::StrCat("transfer ", transfer_id, " was cancelled or timed out"));
  }
  it->second.done = true;
  it->second.status = absl::OkStatus();
  it->second.state = std::move(state);
  return absl::OkStatus();
}

void TransferRegistry::Fail(uint64_t transfer_id, const absl::Status& error) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(transfer_id);
  if (it == entries_.end() || it->second.done) return;
  it->second.done = true;
  it->second.status = error;
}

absl::StatusOr<ReceivedState> TransferRegistry::Await(uint64_t transfer_id) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(transfer_id);
  if (it == entries_.end()) {
    return absl::NotFoundError(absl::StrCat("transfer ", transfer_id, " is not expected"));
  }
  const absl::Time deadline = it->second.ticket.deadline;
  auto finished = [this, transfer_id]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto e = entries_.find(transfer_id);
    return e == entries_.end() || e->second.done;
  };
  ++awaiting_;
  mu_.AwaitWithDeadline(absl::Condition(&finished), deadline);
  --awaiting_;
  it = entries_.find(transfer_id);
  if (it == entries_.end()) return absl::CancelledError(absl::StrCat("transfer ", transfer_id, " was cancelled"));
  if (!it->second.done) {
    entries_.erase(it);
    return absl::DeadlineExceededError(absl::StrCat("transfer ", transfer_id, " did not arrive by its deadline"));
  }
  Entry entry = std::move(it->second);
  entries_.erase(it);
  if (!entry.status.ok()) return entry.status;
  return std::move(entry.state);
}

int64_t TransferRegistry::awaiting() const {
  absl::MutexLock lock(&mu_);
  return awaiting_;
}

void TransferRegistry::Cancel(uint64_t transfer_id) {
  absl::MutexLock lock(&mu_);
  entries_.erase(transfer_id);
}

void TransferRegistry::CountRefused() {
  absl::MutexLock lock(&mu_);
  ++refused_;
}

void TransferRegistry::CountUnauthenticated() {
  absl::MutexLock lock(&mu_);
  ++unauthenticated_;
}

int64_t TransferRegistry::pending() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(entries_.size());
}

int64_t TransferRegistry::refused() const {
  absl::MutexLock lock(&mu_);
  return refused_;
}

int64_t TransferRegistry::unauthenticated() const {
  absl::MutexLock lock(&mu_);
  return unauthenticated_;
}

}  // namespace hybridserve::transport
