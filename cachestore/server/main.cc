// The cachestore service binary. Flags are read here only and turned into
// ServerOptions.

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <iostream>
#include <string>
#include <tuple>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "cachestore/server/server.h"
#include "common/clock.h"
#include "common/grpc_runtime.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/process.h"
#include "common/tls_flags.h"

ABSL_FLAG(std::string, address, "0.0.0.0:50051", "gRPC listen address (host:port; port 0 picks one)");
ABSL_FLAG(std::string, metrics_address, "0.0.0.0:9091", "Prometheus /metrics address; empty disables");
ABSL_FLAG(int64_t, page_budget_mib, 4096, "Byte budget of KV pages, MiB");
ABSL_FLAG(int64_t, state_budget_mib, 4096, "Byte budget of SSM states, MiB");
ABSL_FLAG(absl::Duration, page_ttl, absl::Hours(1), "Idle time after which a page expires");
ABSL_FLAG(absl::Duration, state_ttl, absl::Hours(1), "Idle time after which an SSM state expires");
ABSL_FLAG(absl::Duration, lease_ttl, absl::Seconds(30), "Lease lifetime, extended by each read");
ABSL_FLAG(absl::Duration, put_timeout, absl::Seconds(30), "Stall time after which an incomplete put is reclaimed");
ABSL_FLAG(std::string, eviction, "lru",
          "Which entry makes room for a put: lru (least recently used) or utility (GreedyDual-Size by prefill "
          "FLOPs saved per byte, blended with recency; docs/ARCHITECTURE.md section 4)");
ABSL_FLAG(double, utility_flops_per_token, 1,
          "--eviction=utility: prefill FLOPs of a token, the part independent of its position, for namespaces "
          "whose workers registered no model cost (CacheNamespace.model_cost): the fallback");
ABSL_FLAG(double, utility_flops_per_token_context, 0,
          "--eviction=utility: prefill FLOPs a token costs per token up to it (attention); a token at position t "
          "costs utility_flops_per_token + utility_flops_per_token_context * (t + 1); the fallback, as above");
ABSL_FLAG(double, utility_recency_blend, 0,
          "--eviction=utility: in [0, 1]; an entry's priority increment is utility^(1 - blend), so 1 is LRU order");
ABSL_FLAG(int64_t, max_tokens, 1 << 20, "Longest token list accepted");
ABSL_FLAG(int64_t, blob_pool_mib, 256, "Freed entry buffers kept for reuse (outside the budgets), MiB");
ABSL_FLAG(int64_t, max_chunk_kib, 4096, "Largest put/get chunk, KiB");
ABSL_FLAG(absl::Duration, max_session_ttl, absl::Hours(24),
          "Longest TTL a put may ask for a state (session retention; also the TTL of a pin without one)");
ABSL_FLAG(int64_t, pin_quota_mib, 64, "Pinned state bytes one tenant may hold (across its salts and models), MiB");
ABSL_FLAG(int64_t, pin_budget_mib, -1, "Pinned state bytes of all namespaces together, MiB; -1: half the state budget");
ABSL_FLAG(int64_t, max_namespaces, 1 << 16,
          "Namespaces (model, adapter, cache salt, page size) held at once; a put into one more is RESOURCE_EXHAUSTED");
ABSL_FLAG(int64_t, max_leases, 1 << 16, "Leases open at once; a leasing lookup beyond it is RESOURCE_EXHAUSTED");
ABSL_FLAG(int64_t, max_streams, 1024,
          "CacheStore calls (streams and unary calls) in flight over all clients; a call beyond it ends at once "
          "with RESOURCE_EXHAUSTED");
ABSL_FLAG(int64_t, max_streams_per_peer, 256,
          "CacheStore calls in flight from one client connection; a call beyond it ends at once with "
          "RESOURCE_EXHAUSTED");
ABSL_FLAG(int64_t, max_threads, 64,
          "Threads gRPC may start for the synchronous services (reflection); beyond it their new calls end with "
          "RESOURCE_EXHAUSTED. The CacheStore and health services hold no thread per call");
ABSL_FLAG(std::string, shm_socket, "",
          "Unix socket path for reads by shared memory from workers on this host: entries live in memfd slabs and "
          "readers get read-only slab descriptors over SCM_RIGHTS; empty: off. Its directory must not be writable "
          "by other users");
ABSL_FLAG(std::vector<std::string>, shm_allowed_uids, {},
          "uids allowed on --shm_socket (SO_PEERCRED), comma-separated; empty: the cachestore's own uid");
ABSL_FLAG(int64_t, shm_max_connections, 8, "shm socket connections served at once (one thread each)");
ABSL_FLAG(std::string, bulk_address, "",
          "host:port for reads over plain TCP from workers on other hosts (their --cachestore_bulk_address): "
          "entries stream from where the store keeps them, off the gRPC stream; port 0: any free port; empty: "
          "off. Not with --tls_cert (the bytes travel unencrypted)");
ABSL_FLAG(int64_t, bulk_max_connections, 32, "bulk port connections served at once (one thread each)");
ABSL_FLAG(absl::Duration, bulk_io_timeout, absl::Seconds(10),
          "a bulk port request's read and each write of its answer: a reader that stalls longer is dropped; also "
          "the idle time after which a bulk connection is closed");
ABSL_FLAG(std::string, disk_dir, "",
          "Directory of the disk tier: entries evicted from memory are written there (one checksummed file each) "
          "and lookups read them back; on start the cachestore serves what it holds (warm restart), and SIGTERM "
          "writes the memory's entries there. Local to this cachestore (locked); empty: no disk tier");
ABSL_FLAG(int64_t, disk_budget_mib, 65536, "--disk_dir: byte budget of the disk tier (whole files), MiB");
ABSL_FLAG(int64_t, disk_write_queue_mib, 256,
          "--disk_dir: evicted entries waiting to be written, MiB (their memory stays held meanwhile); an eviction "
          "beyond it is not written (counted in hybridserve_cache_disk_writes_total{outcome=\"dropped\"})");
ABSL_FLAG(absl::Duration, shutdown_spill_timeout, absl::Seconds(20),
          "--disk_dir: on SIGTERM, after the calls drained, the time to write the memory's entries not yet on disk "
          "(most recently used first, within --disk_budget_mib); 0: none");
ABSL_FLAG(std::string, shard_name, "",
          "the name workers place this shard by (Stats' shard_name, asked of each address a "
          "--cachestore=dns:///NAME:PORT resolves to); empty: the host name (a StatefulSet pod's name, which it "
          "keeps across restarts while its IP changes)");
ABSL_FLAG(absl::Duration, shutdown_grace, absl::Seconds(10), "Time in-flight calls get on SIGTERM");
ABSL_FLAG(absl::Duration, max_connection_age, absl::ZeroDuration(),
          "A client connection to --address is told to go away (GOAWAY) at this age, so clients behind a "
          "connection-balancing Service reconnect; 0 (one cachestore: nothing to rebalance): never");
ABSL_FLAG(absl::Duration, max_connection_age_grace, absl::Minutes(1),
          "How long the calls on a connection told to go away may still run before they are cut; 0: as long as they "
          "take");

namespace {

// The flags' rules, checked before anything starts: the first violation, as
// "--flag=value: rule", or "" when all hold.
std::string FlagError() {
  constexpr int64_t kMaxMib = int64_t{1} << 23;  // 8 TiB: MiB << 20 stays far from overflow
  auto in_range = [](absl::string_view flag, int64_t value, int64_t lo, int64_t hi) -> std::string {
    if (value >= lo && value <= hi) return "";
    return absl::StrCat("--", flag, "=", value, ": must be in [", lo, ", ", hi, "]");
  };
  auto positive = [](absl::string_view flag, absl::Duration value) -> std::string {
    if (value > absl::ZeroDuration() && value != absl::InfiniteDuration()) return "";
    return absl::StrCat("--", flag, "=", absl::FormatDuration(value), ": must be a finite duration > 0");
  };
  for (const std::string& e : {
           in_range("page_budget_mib", absl::GetFlag(FLAGS_page_budget_mib), 1, kMaxMib),
           in_range("state_budget_mib", absl::GetFlag(FLAGS_state_budget_mib), 1, kMaxMib),
           in_range("blob_pool_mib", absl::GetFlag(FLAGS_blob_pool_mib), 0, kMaxMib),
           in_range("pin_quota_mib", absl::GetFlag(FLAGS_pin_quota_mib), 0, kMaxMib),
           in_range("pin_budget_mib", absl::GetFlag(FLAGS_pin_budget_mib), -1, kMaxMib),
           in_range("max_chunk_kib", absl::GetFlag(FLAGS_max_chunk_kib), 1, 64 << 10),
           in_range("max_tokens", absl::GetFlag(FLAGS_max_tokens), 1, int64_t{1} << 40),
           in_range("max_namespaces", absl::GetFlag(FLAGS_max_namespaces), 1, int64_t{1} << 30),
           in_range("max_leases", absl::GetFlag(FLAGS_max_leases), 1, int64_t{1} << 30),
           in_range("max_streams", absl::GetFlag(FLAGS_max_streams), 1, int64_t{1} << 20),
           in_range("max_streams_per_peer", absl::GetFlag(FLAGS_max_streams_per_peer), 1, int64_t{1} << 20),
           in_range("max_threads", absl::GetFlag(FLAGS_max_threads), 2, 1 << 16),
           in_range("shm_max_connections", absl::GetFlag(FLAGS_shm_max_connections), 1, 1024),
           in_range("bulk_max_connections", absl::GetFlag(FLAGS_bulk_max_connections), 1, 1024),
           in_range("disk_budget_mib", absl::GetFlag(FLAGS_disk_budget_mib), 1, kMaxMib),
           in_range("disk_write_queue_mib", absl::GetFlag(FLAGS_disk_write_queue_mib), 0, kMaxMib),
           positive("page_ttl", absl::GetFlag(FLAGS_page_ttl)),
           positive("state_ttl", absl::GetFlag(FLAGS_state_ttl)),
           positive("lease_ttl", absl::GetFlag(FLAGS_lease_ttl)),
           positive("put_timeout", absl::GetFlag(FLAGS_put_timeout)),
           positive("max_session_ttl", absl::GetFlag(FLAGS_max_session_ttl)),
           positive("bulk_io_timeout", absl::GetFlag(FLAGS_bulk_io_timeout)),
       }) {
    if (!e.empty()) return e;
  }
  if (const std::string eviction = absl::GetFlag(FLAGS_eviction); eviction != "lru" && eviction != "utility") {
    return absl::StrCat("--eviction=", eviction, ": must be lru or utility");
  }
  for (const auto& [flag, value, hi] : {
           std::make_tuple("utility_flops_per_token", absl::GetFlag(FLAGS_utility_flops_per_token), 1e30),
           std::make_tuple("utility_flops_per_token_context", absl::GetFlag(FLAGS_utility_flops_per_token_context),
                           1e30),
           std::make_tuple("utility_recency_blend", absl::GetFlag(FLAGS_utility_recency_blend), 1.0),
       }) {
    if (!(value >= 0 && value <= hi)) return absl::StrCat("--", flag, "=", value, ": must be in [0, ", hi, "]");
  }
  for (const std::string& uid : absl::GetFlag(FLAGS_shm_allowed_uids)) {
    uint32_t parsed = 0;
    if (!absl::SimpleAtoi(uid, &parsed)) return absl::StrCat("--shm_allowed_uids: ", uid, " is not a uid");
  }
  for (const auto& [flag, value] : {
           std::make_pair("shutdown_grace", absl::GetFlag(FLAGS_shutdown_grace)),
           std::make_pair("shutdown_spill_timeout", absl::GetFlag(FLAGS_shutdown_spill_timeout)),
           std::make_pair("max_connection_age", absl::GetFlag(FLAGS_max_connection_age)),
           std::make_pair("max_connection_age_grace", absl::GetFlag(FLAGS_max_connection_age_grace)),
       }) {
    if (value < absl::ZeroDuration())
      return absl::StrCat("--", flag, "=", absl::FormatDuration(value), ": must be >= 0");
  }
  if (absl::GetFlag(FLAGS_shutdown_spill_timeout) == absl::InfiniteDuration()) {
    return "--shutdown_spill_timeout=inf: must be finite (a rollout waits for it)";
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("hybridserve cachestore: shared cache of KV pages and SSM states");
  absl::ParseCommandLine(argc, argv);
  if (const std::string e = FlagError(); !e.empty()) {
    std::cerr << "cachestore: bad flag " << e << std::endl;
    return 2;
  }
  hybridserve::common::InitLogging(argv[0]);
  // Two heap arenas: resident memory follows the budgets (common/process.h).
  hybridserve::common::TuneProcessForServing(/*max_heap_arenas=*/2);
  using hybridserve::cachestore::CacheStoreServer;
  using hybridserve::cachestore::ServerOptions;

  ServerOptions options;
  options.address = absl::GetFlag(FLAGS_address);
  options.index.page_budget_bytes = absl::GetFlag(FLAGS_page_budget_mib) << 20;
  options.index.state_budget_bytes = absl::GetFlag(FLAGS_state_budget_mib) << 20;
  options.index.page_ttl = absl::GetFlag(FLAGS_page_ttl);
  options.index.state_ttl = absl::GetFlag(FLAGS_state_ttl);
  options.index.lease_ttl = absl::GetFlag(FLAGS_lease_ttl);
  options.index.put_timeout = absl::GetFlag(FLAGS_put_timeout);
  options.index.max_tokens = absl::GetFlag(FLAGS_max_tokens);
  if (absl::GetFlag(FLAGS_eviction) == "utility") {
    options.index.eviction = hybridserve::cachestore::EvictionPolicy::kUtility;
    options.index.utility = hybridserve::cachestore::UtilityCost{absl::GetFlag(FLAGS_utility_flops_per_token),
                                                                 absl::GetFlag(FLAGS_utility_flops_per_token_context),
                                                                 absl::GetFlag(FLAGS_utility_recency_blend)};
  }
  options.index.blob_pool_bytes = absl::GetFlag(FLAGS_blob_pool_mib) << 20;
  options.index.max_session_ttl = absl::GetFlag(FLAGS_max_session_ttl);
  options.index.pin_quota_bytes = absl::GetFlag(FLAGS_pin_quota_mib) << 20;
  options.index.pin_budget_bytes =
      absl::GetFlag(FLAGS_pin_budget_mib) < 0 ? -1 : absl::GetFlag(FLAGS_pin_budget_mib) << 20;
  options.index.max_namespaces = absl::GetFlag(FLAGS_max_namespaces);
  options.index.max_leases = absl::GetFlag(FLAGS_max_leases);
  options.service.max_chunk_bytes = absl::GetFlag(FLAGS_max_chunk_kib) << 10;
  options.service.max_streams = absl::GetFlag(FLAGS_max_streams);
  options.service.max_streams_per_peer = absl::GetFlag(FLAGS_max_streams_per_peer);
  options.service.shard_name = absl::GetFlag(FLAGS_shard_name);
  if (options.service.shard_name.empty()) {
    char host[256] = {};
    if (gethostname(host, sizeof(host) - 1) == 0) options.service.shard_name = host;
  }
  options.max_threads = static_cast<int>(absl::GetFlag(FLAGS_max_threads));
  options.shm.socket_path = absl::GetFlag(FLAGS_shm_socket);
  for (const std::string& uid : absl::GetFlag(FLAGS_shm_allowed_uids)) {
    uint32_t parsed = 0;
    (void)absl::SimpleAtoi(uid, &parsed);
    options.shm.allowed_uids.push_back(static_cast<uid_t>(parsed));
  }
  options.shm.max_connections = static_cast<int>(absl::GetFlag(FLAGS_shm_max_connections));
  options.bulk.address = absl::GetFlag(FLAGS_bulk_address);
  options.bulk.max_connections = static_cast<int>(absl::GetFlag(FLAGS_bulk_max_connections));
  options.bulk.io_timeout = absl::GetFlag(FLAGS_bulk_io_timeout);
  options.disk.directory = absl::GetFlag(FLAGS_disk_dir);
  options.disk.budget_bytes = absl::GetFlag(FLAGS_disk_budget_mib) << 20;
  options.disk.write_queue_bytes = absl::GetFlag(FLAGS_disk_write_queue_mib) << 20;
  options.disk.shutdown_spill_timeout = absl::GetFlag(FLAGS_shutdown_spill_timeout);
  absl::StatusOr<hybridserve::common::TlsFlags> tls = hybridserve::common::TlsFlagsFromFlags();
  if (!tls.ok()) {
    std::cerr << "cachestore: bad flag " << tls.status().message() << std::endl;
    return 2;
  }
  if (tls->channel.enabled()) {
    LOG(INFO) << "--tls_ca: the cachestore makes no calls; it verifies its clients with --tls_client_ca or it";
  }
  options.tls = tls->server;
  options.health_address = tls->health_address;
  options.connection_age.max_age = absl::GetFlag(FLAGS_max_connection_age);
  options.connection_age.grace = absl::GetFlag(FLAGS_max_connection_age_grace);
  if (!options.tls.enabled()) {
    LOG(WARNING) << "no TLS (--tls_cert): any process that reaches --address=" << options.address
                 << " can read and write this cache";
  }

  hybridserve::common::InstallTerminationHandler();
  // Before the server: gRPC is down, all its threads joined, when main returns.
  hybridserve::common::GrpcRuntime grpc;

  auto registry = std::make_shared<prometheus::Registry>();
  std::unique_ptr<hybridserve::common::MetricsExposer> exposer;
  if (!absl::GetFlag(FLAGS_metrics_address).empty()) {
    auto e = hybridserve::common::MetricsExposer::Create(absl::GetFlag(FLAGS_metrics_address), registry);
    if (!e.ok()) {
      LOG(ERROR) << e.status();
      return 1;
    }
    exposer = *std::move(e);
  }
  auto server = CacheStoreServer::Start(options, hybridserve::common::Clock::Real(), *registry);
  if (!server.ok()) {
    LOG(ERROR) << "cachestore failed to start: " << server.status();
    return 1;
  }
  LOG(INFO) << "cachestore \"" << options.service.shard_name << "\" serving on port " << (*server)->port()
            << (exposer ? absl::StrCat(", metrics on port ", exposer->port()) : std::string());
  // Machine-readable line for launchers and tests.
  std::cout << "CACHESTORE_READY port=" << (*server)->port()
            << (exposer ? absl::StrCat(" metrics_port=", exposer->port()) : std::string())
            << (options.shm.socket_path.empty() ? "" : absl::StrCat(" shm_socket=", options.shm.socket_path))
            << ((*server)->health_port() != 0 ? absl::StrCat(" health_port=", (*server)->health_port()) : "")
            << ((*server)->bulk_port() != 0 ? absl::StrCat(" bulk_port=", (*server)->bulk_port()) : "") << std::endl;

  const int sig = hybridserve::common::WaitForTerminationSignal();
  LOG(INFO) << "signal " << sig << ": draining (grace " << absl::GetFlag(FLAGS_shutdown_grace) << ")";
  // With --disk_dir, Shutdown then writes the memory's entries to disk.
  (*server)->Shutdown(absl::GetFlag(FLAGS_shutdown_grace));
  LOG(INFO) << "cachestore stopped";
  return 0;
}
