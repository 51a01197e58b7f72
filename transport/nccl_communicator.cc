#include "transport/nccl_communicator.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "transport/nccl_ops.h"

namespace hybridserve::transport {
namespace {

absl::Status ToStatus(const nccl_ops::OpResult& r) {
  switch (r.outcome) {
    case nccl_ops::Outcome::kOk:
      return absl::OkStatus();
    case nccl_ops::Outcome::kTimedOut:
      return absl::DeadlineExceededError(r.message);
    case nccl_ops::Outcome::kAborted:
    case nccl_ops::Outcome::kPeerFailed:
      return absl::UnavailableError(r.message);
    case nccl_ops::Outcome::kInvalid:
      return absl::InvalidArgumentError(r.message);
    case nccl_ops::Outcome::kFailed:
      break;
  }
  return absl::InternalError(r.message);
}

// `deadline` on the steady clock the polling loops read.
std::chrono::steady_clock::time_point SteadyDeadline(absl::Time deadline) {
  const absl::Duration left = deadline - absl::Now();
  if (left > absl::Hours(24 * 365)) return std::chrono::steady_clock::time_point::max();
  return std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(std::max(left, absl::ZeroDuration()));
}

// Owns its nccl_ops channel. Send/Recv/WaitReady one thread at a time; Abort
// from any thread (it raises the flag the polling loops read).
class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(nccl_ops::Channel* channel, int rank) : channel_(channel), rank_(rank) {}
  ~NcclCommunicator() override { nccl_ops::Destroy(channel_); }

  int rank() const override { return rank_; }
  absl::Status WaitReady(absl::Time deadline) override {
    return ToStatus(nccl_ops::WaitReady(channel_, Wait(deadline)));
  }
  absl::Status Send(const void* data, size_t bytes, absl::Time deadline) override {
    return ToStatus(nccl_ops::Send(channel_, data, bytes, Wait(deadline)));
  }
  absl::Status Recv(void* data, size_t bytes, absl::Time deadline) override {
    return ToStatus(nccl_ops::Recv(channel_, data, bytes, Wait(deadline)));
  }
  void Abort() override { abort_ = true; }

 private:
  nccl_ops::WaitParams Wait(absl::Time deadline) const {
    nccl_ops::WaitParams w;
    w.deadline = SteadyDeadline(deadline);
    w.abort = &abort_;
    return w;
  }

  nccl_ops::Channel* const channel_;
  const int rank_;
  std::atomic<bool> abort_{false};
};

}  // namespace

absl::StatusOr<std::unique_ptr<NcclCommunicatorFactory>> NcclCommunicatorFactory::Create(
    const NcclCommunicatorOptions& options) {
  if (std::getenv("NCCL_COMM_ID") != nullptr) {
    return absl::FailedPreconditionError(
        "NCCL_COMM_ID is set: NCCL would give every channel one fixed bootstrap address and its constant magic "
        "instead of a random one, so a channel's unique id would no longer prove who joins it; unset it");
  }
  const int devices = nccl_ops::DeviceCount();
  if (devices == 0) {
    return absl::UnavailableError(
        "no CUDA device on this machine: the NCCL data plane needs a GPU (the TCP data plane runs on CPUs)");
  }
  if (devices < 0) {
    return absl::InternalError(
        absl::StrCat("CUDA error ", -devices, " while counting devices: this machine's CUDA setup is broken"));
  }
  if (options.device < 0 || options.device >= devices) {
    return absl::InvalidArgumentError(absl::StrCat("CUDA device ", options.device, " of ", devices));
  }
  return std::unique_ptr<NcclCommunicatorFactory>(new NcclCommunicatorFactory(options));
}

absl::StatusOr<std::string> NcclCommunicatorFactory::NewUniqueId() {
  std::string id;
  if (absl::Status s = ToStatus(nccl_ops::NewUniqueId(&id)); !s.ok()) return s;
  return id;
}

absl::StatusOr<std::unique_ptr<Communicator>> NcclCommunicatorFactory::Join(absl::string_view unique_id, int rank) {
  if (unique_id.size() != nccl_ops::kUniqueIdBytes || (rank != 0 && rank != 1)) {
    return absl::InvalidArgumentError(absl::StrCat("NCCL channel: a unique id of ", unique_id.size(),
                                                   " bytes (expected ", nccl_ops::kUniqueIdBytes, ") and rank ", rank));
  }
  nccl_ops::Channel* channel = nullptr;
  if (absl::Status s = ToStatus(nccl_ops::Join(std::string(unique_id), rank, options_.device, &channel)); !s.ok()) {
    return s;
  }
  return std::unique_ptr<Communicator>(new NcclCommunicator(channel, rank));
}

}  // namespace hybridserve::transport
