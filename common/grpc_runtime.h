#ifndef HYBRIDSERVE_COMMON_GRPC_RUNTIME_H_
#define HYBRIDSERVE_COMMON_GRPC_RUNTIME_H_

// gRPC held up for a scope and shut down, completely, before the scope ends.
//
// Why a process needs this. OpenSSL keeps per-thread state (a thread's error
// queue, its public and private random generators) and frees it when the
// thread exits, through a thread-exit hook. OPENSSL_cleanup, which OpenSSL
// registers with atexit, removes that hook for every thread. gRPC does not
// shut itself down when main returns: its threads that did TLS work (the
// poller and executor threads that run handshakes, each
// FileWatcherCertificateProvider's refresh thread, which builds SSL_CTXs)
// may still run then, and one that exits after OPENSSL_cleanup leaves its
// state unreachable. LeakSanitizer reports it (CRYPTO_zalloc,
// ERR_add_error_vdata, EVP_RAND_CTX_new, a few KB) in the runs where such a
// thread loses that race. A GrpcRuntime that goes out of scope before main
// returns ends those threads while OpenSSL still frees their state.
//
// Use: the first local of main (or of a test main), so that every gRPC object
// (server, channel, credentials, completion queue) is destroyed before it.
// A gRPC object that outlives it keeps gRPC up past it: the destructor then
// waits kShutdownWait and logs that gRPC is still up; the shutdown happens
// whenever the last such object goes, with the race back.
//
// One per process (a second one's destructor would wait for the first).
// Thread-compatible: construct and destroy it on one thread, outside any gRPC
// callback.

#include "absl/time/time.h"

namespace hybridserve::common {

class GrpcRuntime {
 public:
  // How long the destructor waits for gRPC's own last references (its
  // subchannels and transports, torn down on its threads after the last
  // channel or server goes) before it gives up and logs.
  static constexpr absl::Duration kShutdownWait = absl::Seconds(10);

  GrpcRuntime();  // grpc_init
  // Drops this reference (grpc_shutdown_blocking) and waits, up to
  // kShutdownWait, until gRPC is down: its threads joined, its sockets closed.
  ~GrpcRuntime();

  GrpcRuntime(const GrpcRuntime&) = delete;
  GrpcRuntime& operator=(const GrpcRuntime&) = delete;
};

}  // namespace hybridserve::common

#endif  // HYBRIDSERVE_COMMON_GRPC_RUNTIME_H_
