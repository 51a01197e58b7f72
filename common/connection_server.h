#ifndef HYBRIDSERVE_COMMON_CONNECTION_SERVER_H_
#define HYBRIDSERVE_COMMON_CONNECTION_SERVER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "common/socket_io.h"

namespace hybridserve::common {

// Serves the connections of a listening TCP socket, each on a thread of its
// own, at most `max_connections` at once: one more is closed at once and
// `on_refused` (may be empty) is called. `configure` (may be empty) sees each
// accepted descriptor before it is served (socket options). The TCP data
// plane's receiver and the cachestore's bulk port run on it.
//
// Thread-safe. Destruction stops accepting, shuts every connection down (a
// handler blocked in a read or write wakes with an error) and joins them;
// stopping() is true from then on, so a handler can tell a connection the
// server ended from one its peer broke.
class ConnectionServer {
 public:
  using Handler = std::function<void(Socket& connection)>;

  ConnectionServer(Socket listener, int max_connections, Handler handler, std::function<void()> on_refused = {},
                   std::function<void(int fd)> configure = {});
  ~ConnectionServer();
  ConnectionServer(const ConnectionServer&) = delete;
  ConnectionServer& operator=(const ConnectionServer&) = delete;

  // Connections being served now.
  int64_t connections() const ABSL_LOCKS_EXCLUDED(mu_);
  bool stopping() const { return stop_.load(); }

 private:
  void AcceptLoop();
  // Joins the threads of finished connections.
  void JoinFinished() ABSL_LOCKS_EXCLUDED(mu_);

  Socket listener_;
  const int max_connections_;
  const Handler handler_;
  const std::function<void()> on_refused_;
  const std::function<void(int)> configure_;
  std::atomic<bool> stop_{false};

  mutable absl::Mutex mu_;
  int64_t next_connection_ ABSL_GUARDED_BY(mu_) = 0;
  // Live connections (so the destructor can wake them), their threads, and
  // the connections whose thread has finished (joined by the accept loop).
  absl::flat_hash_map<int64_t, Socket*> sockets_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<int64_t, std::thread> threads_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> finished_ ABSL_GUARDED_BY(mu_);
  // Last: started once everything above exists.
  std::thread accept_thread_;
};

}  // namespace hybridserve::common

#endif  // HYBRIDSERVE_COMMON_CONNECTION_SERVER_H_
