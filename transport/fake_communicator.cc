#include "transport/fake_communicator.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace hybridserve::transport {
namespace {

absl::Status Gone(int rank) {
  return absl::UnavailableError(absl::StrCat("fake channel broken (rank ", rank, "'s peer is gone or aborted)"));
}

class FakeCommunicator final : public Communicator {
 public:
  FakeCommunicator(std::shared_ptr<FakeCommunicatorFactory::Link> link, int rank)
      : link_(std::move(link)), rank_(rank) {}
  ~FakeCommunicator() override { link_->Break(); }  // a process that leaves: its peer sees it gone

  int rank() const override { return rank_; }
  absl::Status WaitReady(absl::Time deadline) override { return link_->WaitReady(deadline); }
  absl::Status Send(const void* data, size_t bytes, absl::Time deadline) override {
    return link_->Send(rank_, data, bytes, deadline);
  }
  absl::Status Recv(void* data, size_t bytes, absl::Time deadline) override {
    return link_->Recv(rank_, data, bytes, deadline);
  }
  void Abort() override { link_->Break(); }

 private:
  const std::shared_ptr<FakeCommunicatorFactory::Link> link_;
  const int rank_;
};

}  // namespace

// ---- Link ----

absl::Status FakeCommunicatorFactory::Link::JoinRank(int rank) {
  absl::MutexLock lock(&mu_);
  if (joined_[rank]) return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " already joined this channel"));
  joined_[rank] = true;
  return absl::OkStatus();
}

void FakeCommunicatorFactory::Link::AddFault(const FakeFault& fault) {
  absl::MutexLock lock(&mu_);
  faults_.push_back(fault);
}

absl::Status FakeCommunicatorFactory::Link::WaitReady(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return broken_ || (joined_[0] && joined_[1]); };
  if (!mu_.AwaitWithDeadline(absl::Condition(&ready), deadline)) {
    return absl::DeadlineExceededError("fake channel: the peer did not join by the deadline");
  }
  return broken_ ? Gone(-1) : absl::OkStatus();
}

absl::Status FakeCommunicatorFactory::Link::Send(int from, const void* data, size_t bytes, absl::Time deadline) {
  const int to = 1 - from;
  absl::MutexLock lock(&mu_);
  auto can_send = [this, to]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return broken_ || (joined_[0] && joined_[1] && static_cast<int>(to_[to].size()) < queue_capacity_);
  };
  if (!mu_.AwaitWithDeadline(absl::Condition(&can_send), deadline)) {
    return absl::DeadlineExceededError(absl::StrCat("fake channel: rank ", to, " took no message by the deadline"));
  }
  if (broken_) return Gone(from);
  const int64_t index = sent_[from]++;
  std::string message(static_cast<const char*>(data), bytes);
  for (const FakeFault& f : faults_) {
    if (f.from_rank != from) continue;
    switch (f.kind) {
      case FakeFault::Kind::kCorruptByte:
        if (f.message == index && f.byte < message.size()) message[f.byte] ^= 0x20;
        break;
      case FakeFault::Kind::kResize:
        if (f.message == index) message.resize(f.size, '\0');
        break;
      case FakeFault::Kind::kBreak:
        if (index >= f.message) {
          broken_ = true;
          return Gone(from);
        }
        break;
      case FakeFault::Kind::kStall:
        if (index >= f.message) return absl::OkStatus();  // swallowed
        break;
    }
  }
  to_[to].push_back(std::move(message));
  return absl::OkStatus();
}

absl::Status FakeCommunicatorFactory::Link::Recv(int rank, void* data, size_t bytes, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto can_recv = [this, rank]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return broken_ || !to_[rank].empty(); };
  receiving_[rank] = true;
  const bool ready = mu_.AwaitWithDeadline(absl::Condition(&can_recv), deadline);
  receiving_[rank] = false;
  if (!ready) {
    return absl::DeadlineExceededError(absl::StrCat("fake channel: no message for rank ", rank, " by the deadline"));
  }
  if (broken_) return Gone(rank);
  std::string message = std::move(to_[rank].front());
  to_[rank].pop_front();
  if (message.size() != bytes) {
    // NCCL would truncate or fail the communicator: the channel is out of step.
    broken_ = true;
    return absl::DataLossError(
        absl::StrCat("fake channel: rank ", rank, " expected a message of ", bytes, " bytes, got ", message.size()));
  }
  std::memcpy(data, message.data(), bytes);
  ++received_[rank];
  return absl::OkStatus();
}

void FakeCommunicatorFactory::Link::Break() {
  absl::MutexLock lock(&mu_);
  broken_ = true;
}

absl::Status FakeCommunicatorFactory::Link::AwaitReceiving(int rank, int64_t messages, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto receiving = [this, rank, messages]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return received_[rank] == messages && receiving_[rank]; };
  if (!mu_.AwaitWithTimeout(absl::Condition(&receiving), timeout)) {
    return absl::DeadlineExceededError(absl::StrCat("fake channel: rank ", rank, " was not waiting for message ",
                                                    messages, " within ", absl::FormatDuration(timeout), " (",
                                                    received_[rank], " received, ",
                                                    receiving_[rank] ? "in a Recv" : "not in a Recv", ")"));
  }
  return absl::OkStatus();
}

bool FakeCommunicatorFactory::Link::Receiving(int rank) {
  absl::MutexLock lock(&mu_);
  return receiving_[rank];
}

// ---- Factory ----

absl::StatusOr<std::string> FakeCommunicatorFactory::NewUniqueId() {
  absl::MutexLock lock(&mu_);
  last_ = absl::StrCat("fake-", links_.size() + 1);
  links_[last_] = std::make_shared<Link>(queue_capacity_);
  return last_;
}

absl::StatusOr<std::shared_ptr<FakeCommunicatorFactory::Link>> FakeCommunicatorFactory::FindLink(
    absl::string_view unique_id, int rank) const {
  if (rank != 0 && rank != 1) return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " of a two-rank channel"));
  absl::MutexLock lock(&mu_);
  auto it = links_.find(unique_id);
  if (it == links_.end()) return absl::InvalidArgumentError(absl::StrCat("no fake channel named \"", unique_id, "\""));
  return it->second;
}

absl::StatusOr<std::unique_ptr<Communicator>> FakeCommunicatorFactory::Join(absl::string_view unique_id, int rank) {
  ASSIGN_OR_RETURN(std::shared_ptr<Link> link, FindLink(unique_id, rank));
  if (absl::Status s = link->JoinRank(rank); !s.ok()) return s;
  return std::unique_ptr<Communicator>(new FakeCommunicator(std::move(link), rank));
}

absl::Status FakeCommunicatorFactory::InjectFault(absl::string_view unique_id, const FakeFault& fault) {
  absl::MutexLock lock(&mu_);
  auto it = links_.find(unique_id);
  if (it == links_.end()) return absl::InvalidArgumentError(absl::StrCat("no fake channel named \"", unique_id, "\""));
  it->second->AddFault(fault);
  return absl::OkStatus();
}

std::string FakeCommunicatorFactory::last_unique_id() const {
  absl::MutexLock lock(&mu_);
  return last_;
}

absl::Status FakeCommunicatorFactory::AwaitReceiving(absl::string_view unique_id, int rank, int64_t messages,
                                                     absl::Duration timeout) {
  ASSIGN_OR_RETURN(std::shared_ptr<Link> link, FindLink(unique_id, rank));
  return link->AwaitReceiving(rank, messages, timeout);
}

bool FakeCommunicatorFactory::Receiving(absl::string_view unique_id, int rank) const {
  absl::StatusOr<std::shared_ptr<Link>> link = FindLink(unique_id, rank);
  return link.ok() && (*link)->Receiving(rank);
}

int64_t FakeCommunicatorFactory::links() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(links_.size());
}

}  // namespace hybridserve::transport
