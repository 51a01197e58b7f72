#include "common/connection_server.h"

#include <poll.h>
#include <sys/socket.h>

#include <utility>

namespace hybridserve::common {

ConnectionServer::ConnectionServer(Socket listener, int max_connections, Handler handler,
                                   std::function<void()> on_refused, std::function<void(int fd)> configure)
    : listener_(std::move(listener)),
      max_connections_(max_connections),
      handler_(std::move(handler)),
      on_refused_(std::move(on_refused)),
      configure_(std::move(configure)),
      accept_thread_([this] { AcceptLoop(); }) {}

ConnectionServer::~ConnectionServer() {
  stop_ = true;
  if (accept_thread_.joinable()) accept_thread_.join();
  absl::flat_hash_map<int64_t, std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, socket] : sockets_) socket->Shutdown();
    threads.swap(threads_);
  }
  for (auto& [id, t] : threads) t.join();
}

int64_t ConnectionServer::connections() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(sockets_.size());
}

void ConnectionServer::JoinFinished() {
  std::vector<std::thread> done;
  {
    absl::MutexLock lock(&mu_);
    for (int64_t id : finished_) {
      auto it = threads_.find(id);
      if (it == threads_.end()) continue;
      done.push_back(std::move(it->second));
      threads_.erase(it);
    }
    finished_.clear();
  }
  for (std::thread& t : done) t.join();
}

void ConnectionServer::AcceptLoop() {
  while (!stop_) {
    JoinFinished();
    // Wakes at least every 200 ms to see stop_.
    pollfd p{listener_.fd(), POLLIN, 0};
    if (poll(&p, 1, 200) <= 0) continue;
    const int fd = accept4(listener_.fd(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) continue;
    if (configure_) configure_(fd);
    auto socket = std::make_unique<Socket>(fd);
    absl::MutexLock lock(&mu_);
    if (static_cast<int64_t>(sockets_.size()) >= max_connections_) {
      if (on_refused_) on_refused_();
      continue;  // closed by the unique_ptr: the peer sees the connection drop
    }
    const int64_t id = next_connection_++;
    sockets_[id] = socket.get();
    threads_[id] = std::thread([this, id, s = socket.release()] {
      std::unique_ptr<Socket> owned(s);
      handler_(*owned);
      absl::MutexLock done(&mu_);
      sockets_.erase(id);
      finished_.push_back(id);
    });
  }
}

}  // namespace hybridserve::common
