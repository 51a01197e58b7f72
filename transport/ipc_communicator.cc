#include "transport/ipc_communicator.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "kernels/kernel_status.h"
#include "transport/transfer_secret.h"

namespace hybridserve::transport {

struct IpcTrafficCounters {
  std::atomic<int64_t> sent_by_device_copy{0};
  std::atomic<int64_t> sent_by_socket{0};
  std::atomic<int64_t> received_by_device_copy{0};
  std::atomic<int64_t> received_by_socket{0};
};

namespace {

constexpr size_t kTokenBytes = 32;       // hex digits of 128 random bits
constexpr uint32_t kReady = 0x31445452;  // "RTD1": the receiver's buffer is posted
constexpr uint32_t kData = 0x31544144;   // "DAT1": the bytes follow on the connection
constexpr uint32_t kDone = 0x314e4f44;   // "DON1": the bytes are in the receiver's device memory
constexpr size_t kMaxHandleBytes = 256;

// The fixed part of each control message (little-endian host layout: both
// ends run on the same machine).
struct ControlHeader {
  uint32_t kind = 0;
  uint32_t handle_bytes = 0;  // kReady: bytes of the IPC handle that follow (0: send over the connection)
  uint64_t bytes = 0;         // the message's size
  int64_t offset = 0;         // kReady: where the buffer starts in the handle's allocation
};

absl::string_view AsBytes(const void* p, size_t n) { return absl::string_view(static_cast<const char*>(p), n); }

// Connections read side by side while rank 0 waits for its peer; beyond
// this many, new ones are closed at once.
constexpr size_t kMaxJoining = 64;

// 128 random bits (getrandom: transfer_secret.h) as 32 hex digits.
absl::StatusOr<std::string> RandomToken() {
  absl::StatusOr<std::string> bits = RandomSecret(kTokenBytes / 2);
  if (!bits.ok()) return bits.status();
  return absl::BytesToHexString(*bits);
}

// "host:port/token" -> (endpoint, token).
absl::Status SplitId(absl::string_view id, std::string* endpoint, std::string* token) {
  const size_t slash = id.rfind('/');
  if (slash == absl::string_view::npos || id.size() - slash - 1 != kTokenBytes) {
    return absl::InvalidArgumentError("malformed CUDA IPC channel id (expected host:port/<32 hex digits>)");
  }
  *endpoint = std::string(id.substr(0, slash));
  *token = std::string(id.substr(slash + 1));
  std::string host, port;
  return common::SplitHostPort(*endpoint, &host, &port);
}

int PollMs(absl::Time deadline) {
  if (deadline == absl::InfiniteFuture()) return 1000;
  const int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
  return static_cast<int>(std::clamp<int64_t>(ms, 0, 1000));
}

class IpcChannel final : public Communicator {
 public:
  // `peer_memory` (null: the backend shares no memory) outlives the channel.
  // `traffic`: the factory's counters, which this channel adds to.
  IpcChannel(kernels::PeerMemory* peer_memory, std::shared_ptr<IpcTrafficCounters> traffic, int rank,
             common::Socket listener, std::string endpoint, std::string token, absl::Duration token_timeout)
      : peer_memory_(peer_memory),
        traffic_(std::move(traffic)),
        rank_(rank),
        listener_(std::move(listener)),
        endpoint_(std::move(endpoint)),
        token_(std::move(token)),
        token_timeout_(token_timeout) {}

  ~IpcChannel() override {
    for (const auto& [handle, peer] : opened_) peer_memory_->ClosePeerMemory(peer.base);
  }

  int rank() const override { return rank_; }

  absl::Status WaitReady(absl::Time deadline) override { return Joined(deadline); }

  absl::Status Send(const void* data, size_t bytes, absl::Time deadline) override {
    RETURN_IF_ERROR(Joined(deadline));
    absl::Status s = SendMessage(data, bytes, deadline);
    if (!s.ok()) Fail();
    return s;
  }

  absl::Status Recv(void* data, size_t bytes, absl::Time deadline) override {
    RETURN_IF_ERROR(Joined(deadline));
    absl::Status s = RecvMessage(data, bytes, deadline);
    if (!s.ok()) Fail();
    return s;
  }

  void Abort() override {
    aborted_.store(true);
    absl::MutexLock lock(&sockets_mu_);
    conn_.Shutdown();
    listener_.Shutdown();
  }

  IpcChannelStats stats() const { return stats_; }

 private:
  struct Peer {
    void* base = nullptr;
    int64_t bytes = 0;
  };

  void Fail() {
    failed_ = true;
    conn_.Shutdown();
  }

  absl::Status Usable() const {
    if (aborted_.load()) return absl::UnavailableError("CUDA IPC channel aborted");
    if (failed_) return absl::UnavailableError("CUDA IPC channel failed earlier");
    return absl::OkStatus();
  }

  // Makes the control connection on first use: rank 0 accepts the peer that
  // presents the token, rank 1 connects and presents it.
  absl::Status Joined(absl::Time deadline) {
    RETURN_IF_ERROR(Usable());
    if (conn_.valid()) return absl::OkStatus();
    if (rank_ == 0) return AcceptPeer(deadline);
    absl::StatusOr<common::Socket> s = common::Connect(endpoint_, deadline);
    if (!s.ok()) return s.status();
    {
      absl::MutexLock lock(&sockets_mu_);
      conn_ = *std::move(s);
      if (aborted_.load()) conn_.Shutdown();
    }
    absl::Status sent = conn_.WriteFull(token_, deadline);
    if (!sent.ok()) Fail();
    return sent;
  }

  // Rank 0: accepts connections until one presents the token, the first
  // kTokenBytes it sends, compared in constant time (SecretsEqual) before
  // anything else is read. A connection that presents anything else, closes,
  // or has not presented the token within token_timeout is closed; nothing
  // else is read from it. Connections are read side by side, so strangers
  // that connect and stay silent delay no one (at most kMaxJoining at once;
  // beyond, new ones are closed at once). The listener closes once the peer
  // has joined: one peer per channel.
  absl::Status AcceptPeer(absl::Time deadline) {
    struct Joining {
      common::Socket socket;
      std::string token;  // what it has presented so far
      absl::Time until;
    };
    std::vector<Joining> joining;
    while (true) {
      RETURN_IF_ERROR(Usable());
      const absl::Time now = absl::Now();
      if (now >= deadline) return absl::DeadlineExceededError("CUDA IPC channel: the peer did not join");
      joining.erase(std::remove_if(joining.begin(), joining.end(), [now](const Joining& j) { return j.until <= now; }),
                    joining.end());
      std::vector<pollfd> fds{pollfd{listener_.fd(), POLLIN, 0}};
      absl::Time wake = deadline;
      for (const Joining& j : joining) {
        fds.push_back(pollfd{j.socket.fd(), POLLIN, 0});
        wake = std::min(wake, j.until);
      }
      if (poll(fds.data(), fds.size(), PollMs(wake)) <= 0) continue;
      // Backwards: erasing joining[i] leaves fds[k + 1] <-> joining[k] for k < i.
      for (size_t i = joining.size(); i-- > 0;) {
        if (fds[i + 1].revents == 0) continue;
        Joining& j = joining[i];
        char buf[kTokenBytes];
        const ssize_t n = recv(j.socket.fd(), buf, kTokenBytes - j.token.size(), 0);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
        if (n <= 0) {
          joining.erase(joining.begin() + static_cast<std::ptrdiff_t>(i));  // closed or broken
          continue;
        }
        j.token.append(buf, static_cast<size_t>(n));
        if (j.token.size() < kTokenBytes) continue;
        if (!SecretsEqual(j.token, token_)) {
          joining.erase(joining.begin() + static_cast<std::ptrdiff_t>(i));  // a stranger: dropped unanswered
          continue;
        }
        const int one = 1;
        setsockopt(j.socket.fd(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        absl::MutexLock lock(&sockets_mu_);
        conn_ = std::move(j.socket);
        listener_ = common::Socket();  // one peer per channel
        if (aborted_.load()) conn_.Shutdown();
        return Usable();
      }
      if ((fds[0].revents & POLLIN) == 0) continue;
      common::Socket s(accept4(listener_.fd(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
      if (!s.valid()) {
        if (errno == EAGAIN || errno == EINTR || errno == ECONNABORTED) continue;
        RETURN_IF_ERROR(Usable());
        return absl::UnavailableError(absl::StrCat("CUDA IPC channel: accept: ", std::strerror(errno)));
      }
      if (joining.size() < kMaxJoining) joining.push_back(Joining{std::move(s), std::string(), now + token_timeout_});
    }
  }

  absl::Status ReadHeader(ControlHeader* h, absl::Time deadline) {
    return conn_.ReadFull(reinterpret_cast<char*>(h), sizeof(*h), deadline);
  }

  absl::Status SendMessage(const void* data, size_t bytes, absl::Time deadline) {
    ControlHeader ready;
    RETURN_IF_ERROR(ReadHeader(&ready, deadline));
    if (ready.kind != kReady || ready.handle_bytes > kMaxHandleBytes) {
      return absl::DataLossError("CUDA IPC channel: control message out of step");
    }
    std::string handle(ready.handle_bytes, '\0');
    if (!handle.empty()) RETURN_IF_ERROR(conn_.ReadFull(handle.data(), handle.size(), deadline));
    if (ready.bytes != bytes) {
      return absl::DataLossError(
          absl::StrCat("CUDA IPC channel: the peer receives ", ready.bytes, " bytes where ", bytes, " are sent"));
    }
    if (!handle.empty()) {
      ASSIGN_OR_RETURN(Peer peer, Open(handle));
      if (ready.offset < 0 || static_cast<uint64_t>(ready.offset) + bytes > static_cast<uint64_t>(peer.bytes)) {
        return absl::DataLossError("CUDA IPC channel: the peer's buffer lies outside its allocation");
      }
      const int copied =
          peer_memory_->CopyToPeer(static_cast<char*>(peer.base) + ready.offset, data, static_cast<int64_t>(bytes));
      if (copied != kernels::kKernelOk) {
        return absl::InternalError(
            absl::StrCat("CUDA IPC channel: copy to the peer failed (", kernels::KernelStatusName(copied), ")"));
      }
      stats_.bytes_by_ipc += static_cast<int64_t>(bytes);
      traffic_->sent_by_device_copy += static_cast<int64_t>(bytes);
      ControlHeader done;
      done.kind = kDone;
      done.bytes = bytes;
      return conn_.WriteFull(AsBytes(&done, sizeof(done)), deadline);
    }
    ControlHeader header;
    header.kind = kData;
    header.bytes = bytes;
    std::string staged;
    const char* host = static_cast<const char*>(data);
    std::string unused;
    int64_t offset = 0;
    // Device memory of this backend goes to the host first (the peer's buffer is host memory).
    if (bytes > 0 && peer_memory_ != nullptr &&
        peer_memory_->ExportMemory(data, static_cast<int64_t>(bytes), &unused, &offset) == kernels::kKernelOk) {
      staged.resize(bytes);
      if (peer_memory_->CopyToHost(staged.data(), data, static_cast<int64_t>(bytes)) != kernels::kKernelOk) {
        return absl::InternalError("CUDA IPC channel: reading the device buffer failed");
      }
      host = staged.data();
    }
    RETURN_IF_ERROR(conn_.WriteAll({AsBytes(&header, sizeof(header)), AsBytes(host, bytes)}, deadline));
    stats_.bytes_by_socket += static_cast<int64_t>(bytes);
    traffic_->sent_by_socket += static_cast<int64_t>(bytes);
    return absl::OkStatus();
  }

  absl::Status RecvMessage(void* data, size_t bytes, absl::Time deadline) {
    ControlHeader ready;
    ready.kind = kReady;
    ready.bytes = bytes;
    std::string handle;
    int64_t offset = 0;
    const bool shared =
        bytes > 0 && peer_memory_ != nullptr &&
        peer_memory_->ExportMemory(data, static_cast<int64_t>(bytes), &handle, &offset) == kernels::kKernelOk;
    if (!shared) handle.clear();
    ready.handle_bytes = static_cast<uint32_t>(handle.size());
    ready.offset = offset;
    RETURN_IF_ERROR(conn_.WriteAll({AsBytes(&ready, sizeof(ready)), handle}, deadline));
    ControlHeader reply;
    RETURN_IF_ERROR(ReadHeader(&reply, deadline));
    if (reply.bytes != bytes || (reply.kind != kDone && reply.kind != kData) || (reply.kind == kDone && !shared)) {
      return absl::DataLossError("CUDA IPC channel: the peer's reply is out of step");
    }
    if (reply.kind == kDone) {
      traffic_->received_by_device_copy += static_cast<int64_t>(bytes);
      return absl::OkStatus();
    }
    if (!shared) {
      RETURN_IF_ERROR(conn_.ReadFull(static_cast<char*>(data), bytes, deadline));
    } else {
      // Device memory the peer chose not to write directly: stage it.
      std::string staged(bytes, '\0');
      RETURN_IF_ERROR(conn_.ReadFull(staged.data(), bytes, deadline));
      if (peer_memory_->CopyToDevice(data, staged.data(), static_cast<int64_t>(bytes)) != kernels::kKernelOk) {
        return absl::InternalError("CUDA IPC channel: writing the device buffer failed");
      }
    }
    traffic_->received_by_socket += static_cast<int64_t>(bytes);
    return absl::OkStatus();
  }

  absl::StatusOr<Peer> Open(const std::string& handle) {
    if (auto it = opened_.find(handle); it != opened_.end()) return it->second;
    Peer peer;
    const int s = peer_memory_ != nullptr ? peer_memory_->OpenPeerMemory(handle, &peer.base, &peer.bytes)
                                          : kernels::kKernelUnsupported;
    if (s != kernels::kKernelOk) {
      return absl::FailedPreconditionError(
          absl::StrCat("CUDA IPC channel: cannot open the peer's memory (", kernels::KernelStatusName(s),
                       "): both processes must run on the same GPU with a backend that shares memory (--device=cuda)"));
    }
    opened_[handle] = peer;
    ++stats_.handles_opened;
    return peer;
  }

  kernels::PeerMemory* const peer_memory_;
  const std::shared_ptr<IpcTrafficCounters> traffic_;
  const int rank_;
  // conn_ and listener_ are replaced only under sockets_mu_ (Abort shuts them
  // down from any thread); the calling thread reads them without it.
  absl::Mutex sockets_mu_;
  common::Socket listener_;  // rank 0 until the peer joined
  const std::string endpoint_;
  const std::string token_;
  const absl::Duration token_timeout_;
  common::Socket conn_;
  std::atomic<bool> aborted_{false};
  bool failed_ = false;
  absl::flat_hash_map<std::string, Peer> opened_;
  IpcChannelStats stats_;
};

}  // namespace

IpcCommunicatorFactory::IpcCommunicatorFactory(kernels::PeerMemory* peer_memory, const IpcCommunicatorOptions& options)
    : peer_memory_(peer_memory), options_(options), traffic_(std::make_shared<IpcTrafficCounters>()) {}

IpcCommunicatorFactory::~IpcCommunicatorFactory() = default;

IpcTraffic IpcCommunicatorFactory::traffic() const {
  IpcTraffic t;
  t.sent_by_device_copy = traffic_->sent_by_device_copy.load();
  t.sent_by_socket = traffic_->sent_by_socket.load();
  t.received_by_device_copy = traffic_->received_by_device_copy.load();
  t.received_by_socket = traffic_->received_by_socket.load();
  return t;
}

absl::StatusOr<std::string> IpcCommunicatorFactory::NewUniqueId() {
  int port = 0;
  absl::StatusOr<common::Socket> listener = common::Listen(absl::StrCat(options_.listen_host, ":0"), &port);
  if (!listener.ok()) return listener.status();
  const std::string host = options_.listen_host.find(':') != std::string::npos
                               ? absl::StrCat("[", options_.listen_host, "]")
                               : options_.listen_host;
  absl::StatusOr<std::string> token = RandomToken();
  if (!token.ok()) return token.status();
  std::string id = absl::StrCat(host, ":", port, "/", *token);
  absl::MutexLock lock(&mu_);
  listeners_[id] = *std::move(listener);
  return id;
}

absl::StatusOr<std::unique_ptr<Communicator>> IpcCommunicatorFactory::Join(absl::string_view unique_id, int rank) {
  if (rank != 0 && rank != 1) return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " is not 0 or 1"));
  std::string endpoint, token;
  RETURN_IF_ERROR(SplitId(unique_id, &endpoint, &token));
  common::Socket listener;
  if (rank == 0) {
    absl::MutexLock lock(&mu_);
    auto it = listeners_.find(unique_id);
    if (it == listeners_.end()) {
      return absl::InvalidArgumentError("rank 0 of a CUDA IPC channel this factory did not make, or joined already");
    }
    listener = std::move(it->second);
    listeners_.erase(it);
  }
  return std::unique_ptr<Communicator>(new IpcChannel(peer_memory_, traffic_, rank, std::move(listener),
                                                      std::move(endpoint), std::move(token), options_.token_timeout));
}

IpcChannelStats StatsOf(const Communicator& channel) {
  const auto* ipc = dynamic_cast<const IpcChannel*>(&channel);
  return ipc != nullptr ? ipc->stats() : IpcChannelStats();
}

IpcTraffic TrafficOf(const CommunicatorFactory& factory) {
  const auto* ipc = dynamic_cast<const IpcCommunicatorFactory*>(&factory);
  return ipc != nullptr ? ipc->traffic() : IpcTraffic();
}

}  // namespace hybridserve::transport
