// Lookups per second against a loopback CacheStoreServer holding a realistic
// store (~100K entries, page_size 16), prompts of 4K tokens that are full hits,
// with 1 and 8 concurrent clients; reports the 8-client / 1-client ratio.
// Each of the 8 client threads has its own GrpcCacheClient (and TCP
// connection: see kDistinctConnections); a shared-client row is printed too.
// Lookups are probe-only (no lease), and lease + Release pairs. Beside them,
// Put and Get throughput of 1 MiB states with 1 and 8 concurrent clients, so
// the three 8-client / 1-client ratios can be read side by side. On a 2-core
// machine 8 clients cannot run 8x: the ratios show contention, not scaling.
//   bazel run -c opt //bench/cachestore:lookup_qps_bench

#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "bench/cachestore/bench_timing.h"
#include "bench/cachestore/synthetic_store.h"
#include "cachestore/client/grpc_cache_client.h"
#include "cachestore/server/server.h"
#include "common/clock.h"
#include "common/process.h"
#include "prometheus/registry.h"
#include "proto/cachestore.pb.h"

namespace hybridserve::bench {
namespace {

using cachestore::ClientNamespace;
using cachestore::GrpcCacheClient;
using cachestore::GrpcCacheClientOptions;
using cachestore::LookupMode;
using cachestore::LookupResult;

constexpr int32_t kPageSize = 16;
constexpr int64_t kStoreEntries = 100'000;
constexpr int64_t kPromptTokens = 4096;
constexpr int kPrompts = 64;
constexpr int64_t kSnapshotFromEnd = 3;
constexpr int kRounds = 6;
constexpr double kWindowSeconds = 0.5;
constexpr int64_t kTransferBytes = int64_t{1} << 20;  // one Put or Get in the byte loads

void Check(const absl::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, s.ToString().c_str());
    std::exit(1);
  }
}

// Established TCP connections to `port` from this host (client ends), read
// from /proc/net/tcp and tcp6 (gRPC's sockets are dual-stack). -1 if unreadable.
int ConnectionsTo(int port) {
  int n = 0;
  bool any = false;
  for (const char* path : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream f(path);
    if (!f) continue;
    any = true;
    std::string line;
    std::getline(f, line);  // header
    while (std::getline(f, line)) {
      std::istringstream in(line);
      std::string slot, local, remote, state;
      in >> slot >> local >> remote >> state;
      const size_t colon = remote.rfind(':');
      if (colon == std::string::npos || state != "01") continue;
      if (std::stoi(remote.substr(colon + 1), nullptr, 16) == port) ++n;
    }
  }
  return any ? n : -1;
}

struct Load {
  int threads = 1;
  bool shared_client = false;
  bool lease = false;
};

struct Outcome {
  double lookups_per_second = 0;
  double cpu_us_per_lookup = 0;  // user + system time of the whole process (both ends)
  int64_t errors = 0;
  int connections = -1;
};

double ProcessCpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  auto secs = [](const timeval& t) { return static_cast<double>(t.tv_sec) + 1e-6 * static_cast<double>(t.tv_usec); };
  return secs(u.ru_utime) + secs(u.ru_stime);
}

// gRPC channels with identical arguments share one connection (the global
// subchannel pool); a per-client chunk size makes each client's channel
// arguments, and so its connection, distinct. Lookups do not use chunks.
constexpr bool kDistinctConnections = true;

std::unique_ptr<GrpcCacheClient> NewClient(const std::string& target, int index) {
  GrpcCacheClientOptions options;
  if (kDistinctConnections) options.chunk_bytes = (int64_t{4} << 20) - int64_t{4096} * index;
  absl::StatusOr<std::unique_ptr<GrpcCacheClient>> c = GrpcCacheClient::Create(target, options);
  Check(c.status(), "GrpcCacheClient::Create");
  return *std::move(c);
}

// One load shape with its clients, connected once and kept across windows.
class LoadRunner {
 public:
  // Clients are numbered from `first_client` so that no two runners share a connection.
  LoadRunner(const std::string& target, int port, const Load& load, int first_client, const ClientNamespace& ns,
             const std::vector<std::vector<TokenId>>& prompts, int64_t expect_resume)
      : port_(port), load_(load), ns_(ns), prompts_(prompts), expect_resume_(expect_resume) {
    for (int i = 0; i < clients(); ++i) clients_.push_back(NewClient(target, first_client + i));
    for (auto& c : clients_) Check(c->Lookup(ns, prompts[0], LookupMode::kProbeOnly).status(), "warm-up Lookup");
  }

  int clients() const { return load_.shared_client ? 1 : load_.threads; }

  // Runs the load for `seconds` of wall time.
  Outcome Window(double seconds) {
    std::atomic<bool> stop{false};
    absl::Notification go;
    std::vector<int64_t> counts(load_.threads, 0), errors(load_.threads, 0);
    std::vector<std::thread> threads;
    for (int t = 0; t < load_.threads; ++t) {
      threads.emplace_back([&, t] {
        GrpcCacheClient& client = *clients_[load_.shared_client ? 0 : t];
        go.WaitForNotification();
        for (int64_t i = next_++; !stop.load(std::memory_order_relaxed); i = next_++) {
          const std::vector<TokenId>& prompt = prompts_[(i * 7) % prompts_.size()];
          absl::StatusOr<LookupResult> r =
              client.Lookup(ns_, prompt, load_.lease ? LookupMode::kLease : LookupMode::kProbeOnly);
          if (!r.ok() || r->resume_position != expect_resume_) {
            ++errors[t];
            continue;
          }
          if (load_.lease && !client.Release(r->lease_id).ok()) ++errors[t];
          ++counts[t];
        }
      });
    }
    const double cpu_start = ProcessCpuSeconds();
    const auto start = std::chrono::steady_clock::now();
    go.Notify();
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
    Outcome out;
    stop = true;
    for (auto& th : threads) th.join();
    const double wall = SecondsSince(start);
    const double cpu = ProcessCpuSeconds() - cpu_start;
    int64_t total = 0;
    for (int t = 0; t < load_.threads; ++t) {
      total += counts[t];
      out.errors += errors[t];
    }
    out.lookups_per_second = static_cast<double>(total) / wall;
    out.cpu_us_per_lookup = total > 0 ? cpu * 1e6 / static_cast<double>(total) : 0;
    out.connections = ConnectionsTo(port_);  // all runners' clients stay connected
    return out;
  }

 private:
  const int port_;
  const Load load_;
  const ClientNamespace ns_;
  const std::vector<std::vector<TokenId>>& prompts_;
  const int64_t expect_resume_;
  std::vector<std::unique_ptr<GrpcCacheClient>> clients_;
  std::atomic<int64_t> next_{0};  // prompt cursor shared by the threads
};

// Put or Get of kTransferBytes states by `threads` clients, each on its own
// connection. Put: every op a new state (a fresh token, so never already
// present; the full state budget evicts the oldest). Get: each client reads
// one state it put, under a lease it holds (each Get extends it).
class ByteLoadRunner {
 public:
  ByteLoadRunner(const std::string& target, int threads, bool put, int first_client, const ClientNamespace& ns,
                 const std::string& bytes, std::atomic<TokenId>* next_token)
      : put_(put), ns_(ns), bytes_(bytes), next_token_(next_token) {
    for (int i = 0; i < threads; ++i) {
      Client c;
      c.client = NewClient(target, first_client + i);
      if (!put_) {
        const TokenId t = (*next_token_)++;
        Check(c.client->Put(ns_, StatePut(t), bytes_).status(), "Put (Get load)");
        absl::StatusOr<LookupResult> l = c.client->Lookup(ns_, {t}, LookupMode::kLease);
        Check(l.status(), "Lookup (Get load)");
        if (!l->state.has_value()) {
          std::fprintf(stderr, "the state just put is not found\n");
          std::exit(1);
        }
        c.lease_id = l->lease_id;
        c.key = l->state->key;
      }
      clients_.push_back(std::move(c));
    }
  }
  ~ByteLoadRunner() {
    for (Client& c : clients_) {
      if (c.lease_id != 0) c.client->Release(c.lease_id).IgnoreError();
    }
  }

  // Runs the load for `seconds` of wall time; ops/s in lookups_per_second.
  Outcome Window(double seconds) {
    std::atomic<bool> stop{false};
    absl::Notification go;
    std::vector<int64_t> counts(clients_.size(), 0), errors(clients_.size(), 0);
    std::vector<std::thread> threads;
    for (size_t t = 0; t < clients_.size(); ++t) {
      threads.emplace_back([&, t] {
        Client& c = clients_[t];
        std::string got;
        go.WaitForNotification();
        while (!stop.load(std::memory_order_relaxed)) {
          const bool ok = put_ ? c.client->Put(ns_, StatePut((*next_token_)++), bytes_).ok()
                               : c.client->GetInto(c.lease_id, c.key, &got).ok() && got.size() == bytes_.size();
          ++(ok ? counts[t] : errors[t]);
        }
      });
    }
    const double cpu_start = ProcessCpuSeconds();
    const auto start = std::chrono::steady_clock::now();
    go.Notify();
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
    stop = true;
    for (auto& th : threads) th.join();
    const double wall = SecondsSince(start);
    const double cpu = ProcessCpuSeconds() - cpu_start;
    Outcome out;
    int64_t total = 0;
    for (size_t t = 0; t < clients_.size(); ++t) {
      total += counts[t];
      out.errors += errors[t];
    }
    out.lookups_per_second = static_cast<double>(total) / wall;
    out.cpu_us_per_lookup = total > 0 ? cpu * 1e6 / static_cast<double>(total) : 0;
    return out;
  }

 private:
  struct Client {
    std::unique_ptr<GrpcCacheClient> client;
    uint64_t lease_id = 0;
    cachestore::Hash128 key;
  };
  static cachestore::ClientPut StatePut(TokenId token) {
    cachestore::ClientPut put;
    put.entry_class = cachestore::EntryClass::kState;
    put.tokens = {token};
    put.position = 1;
    return put;
  }
  const bool put_;
  const ClientNamespace ns_;
  const std::string& bytes_;
  std::atomic<TokenId>* const next_token_;
  std::vector<Client> clients_;
};

// The protobuf work of one Lookup RPC done in process, as the client and the
// service edge do it (request built, serialized, parsed; response built from
// a real result, serialized, parsed, converted), without any transport.
struct ProtoCosts {
  double request_ns = 0;
  double response_ns = 0;
  size_t request_bytes = 0;
  size_t response_bytes = 0;
};

void FillEntryRef(const cachestore::EntryInfo& e, v1::EntryRef* out) {
  out->set_key(e.key.ToBytes());
  out->set_entry_class(e.entry_class == cachestore::EntryClass::kPage ? v1::ENTRY_CLASS_PAGE : v1::ENTRY_CLASS_STATE);
  out->set_size_bytes(static_cast<uint64_t>(e.size_bytes));
  out->set_checksum(e.checksum);
  out->set_location(v1::ENTRY_LOCATION_CACHESTORE_HOST);
  out->set_position(static_cast<uint64_t>(e.position));
}

ProtoCosts MeasureProto(const ClientNamespace& ns, const std::vector<TokenId>& prompt, const LookupResult& result) {
  ProtoCosts costs;
  costs.request_ns = MedianNanosPerCall([&] {
    v1::LookupRequest req;
    req.mutable_namespace_()->set_model_fingerprint(ns.model_fingerprint);
    req.mutable_namespace_()->set_cache_salt(ns.cache_salt);
    req.mutable_namespace_()->set_page_size(static_cast<uint32_t>(ns.page_size));
    req.mutable_token_ids()->Add(prompt.begin(), prompt.end());
    const std::string wire = req.SerializeAsString();
    v1::LookupRequest parsed;
    KeepAlive(parsed.ParseFromString(wire));
    costs.request_bytes = wire.size();
  });
  costs.response_ns = MedianNanosPerCall([&] {
    v1::LookupResponse resp;
    resp.set_resume_position(static_cast<uint64_t>(result.resume_position));
    resp.set_kv_match_tokens(static_cast<uint64_t>(result.kv_match_tokens));
    for (const cachestore::EntryInfo& e : result.pages) FillEntryRef(e, resp.add_pages());
    if (result.state.has_value()) FillEntryRef(*result.state, resp.mutable_state());
    const std::string wire = resp.SerializeAsString();
    v1::LookupResponse parsed;
    KeepAlive(parsed.ParseFromString(wire));
    LookupResult out;
    for (const v1::EntryRef& p : parsed.pages()) {
      cachestore::EntryInfo info;
      cachestore::Hash128::FromBytes(p.key(), &info.key);
      info.size_bytes = static_cast<int64_t>(p.size_bytes());
      info.checksum = p.checksum();
      info.position = static_cast<int64_t>(p.position());
      out.pages.push_back(info);
    }
    KeepAlive(out.pages.data());
    costs.response_bytes = wire.size();
  });
  return costs;
}

void Run() {
  std::printf("lookup_qps_bench: %lld-token full-hit prompts, page_size %d, %.1f s per load, %u hardware threads\n",
              static_cast<long long>(kPromptTokens), kPageSize, kRounds * kWindowSeconds,
              std::thread::hardware_concurrency());
  std::ifstream loadavg("/proc/loadavg");
  std::string load1;
  if (loadavg >> load1) std::printf("1-minute load average at start: %s\n", load1.c_str());
  prometheus::Registry registry;
  cachestore::ServerOptions options;
  options.address = "127.0.0.1:0";
  options.index.page_budget_bytes = int64_t{1} << 30;
  // Room for the byte loads' 1 MiB states (the oldest are evicted).
  options.index.state_budget_bytes = int64_t{256} << 20;
  absl::StatusOr<std::unique_ptr<cachestore::CacheStoreServer>> server =
      cachestore::CacheStoreServer::Start(options, common::Clock::Real(), registry);
  Check(server.status(), "CacheStoreServer::Start");
  const int port = (*server)->port();
  const std::string target = "127.0.0.1:" + std::to_string(port);
  cachestore::CacheStore& store = (*server)->store();

  // Fill in process (the contents are what matter, not how they arrived).
  SyntheticStoreOptions synth;
  synth.page_size = kPageSize;
  synth.entry_bytes = 64;
  const PutEntryFn put = StorePutter(store);
  std::mt19937 rng(42);
  std::vector<std::vector<TokenId>> prompts;
  int64_t added = 0;
  for (int i = 0; i < kPrompts; ++i) {
    prompts.push_back(TenantPrompt(synth, 0, kPromptTokens, rng));
    Conversation c;
    c.ns = TenantNamespace(0, kPageSize);
    c.page_size = kPageSize;
    c.tokens = prompts.back();
    c.checkpoint_every_pages = synth.checkpoint_every_pages;
    c.snapshot_position = kPromptTokens - kSnapshotFromEnd;
    c.entry_bytes = synth.entry_bytes;
    absl::StatusOr<int64_t> n = PutConversation(c, put);
    Check(n.status(), "put prompt");
    added += *n;
  }
  Check(FillConversations(synth, kStoreEntries - added, put).status(), "fill");
  const cachestore::IndexStats stats = store.Stats();
  std::printf("store: %lld pages + %lld states in %lld namespaces; %d distinct prompts cycled\n",
              static_cast<long long>(stats.pages.entries), static_cast<long long>(stats.states.entries),
              static_cast<long long>(stats.namespaces), kPrompts);

  const ClientNamespace ns{kBenchModelFingerprint, "", TenantSalt(0), kPageSize};
  // 4096 is a grid-checkpoint position (every 4 pages), deeper than the snapshot.
  const int64_t expect_resume = kPromptTokens;

  // In-process reference: the same lookups without RPC, one thread.
  int64_t next_prompt = 0;
  const double in_process_ns = MedianNanosPerCall([&] {
    absl::StatusOr<LookupResult> r =
        store.Lookup(ns.Key(), kPageSize, prompts[(next_prompt++ * 7) % prompts.size()], /*lease=*/false);
    KeepAlive(r->resume_position);
  });

  absl::StatusOr<LookupResult> sample = store.Lookup(ns.Key(), kPageSize, prompts[0], /*lease=*/false);
  Check(sample.status(), "Lookup");
  const ProtoCosts proto = MeasureProto(ns, prompts[0], *sample);

  struct Config {
    const char* name;
    Load load;
    int baseline;  // index of the 1-client config it is compared with
    std::unique_ptr<LoadRunner> runner;
    std::vector<Outcome> windows;
  };
  std::vector<Config> configs;
  configs.push_back({"probe, 1 client", {1, false, false}, 0});
  configs.push_back({"probe, 8 clients (own client each)", {8, false, false}, 0});
  configs.push_back({"probe, 8 threads sharing 1 client", {8, true, false}, 0});
  configs.push_back({"lease+release, 1 client", {1, false, true}, 3});
  configs.push_back({"lease+release, 8 clients (own each)", {8, false, true}, 3});
  int clients = 0;
  for (Config& c : configs) {
    c.runner = std::make_unique<LoadRunner>(target, port, c.load, clients, ns, prompts, expect_resume);
    clients += c.runner->clients();
  }
  // Interleaved windows: load from other processes drifts slowly, so each
  // 8-client window is compared with the 1-client window of the same round.
  for (int round = 0; round < kRounds; ++round) {
    for (Config& c : configs) c.windows.push_back(c.runner->Window(kWindowSeconds));
  }

  // Put and Get of 1 MiB states, 1 and 8 clients, interleaved windows.
  std::string bytes(static_cast<size_t>(kTransferBytes), '\0');
  {
    std::mt19937_64 brng(9);
    for (size_t i = 0; i < bytes.size(); i += 8) {
      const uint64_t v = brng();
      std::memcpy(&bytes[i], &v, 8);
    }
  }
  const ClientNamespace byte_ns{kBenchModelFingerprint, "", "byte-loads", kPageSize};
  std::atomic<TokenId> next_token{1};
  struct ByteConfig {
    const char* name;
    int threads;
    bool put;
    int baseline;
    std::unique_ptr<ByteLoadRunner> runner;
    std::vector<Outcome> windows;
  };
  std::vector<ByteConfig> byte_configs;
  byte_configs.push_back({"Put 1 MiB, 1 client", 1, true, 0});
  byte_configs.push_back({"Put 1 MiB, 8 clients (own each)", 8, true, 0});
  byte_configs.push_back({"Get 1 MiB, 1 client", 1, false, 2});
  byte_configs.push_back({"Get 1 MiB, 8 clients (own each)", 8, false, 2});
  int next_client = clients;  // own connections, distinct from the lookup loads' (counted above)
  for (ByteConfig& c : byte_configs) {
    c.runner = std::make_unique<ByteLoadRunner>(target, c.threads, c.put, next_client, byte_ns, bytes, &next_token);
    next_client += c.threads;
  }
  for (int round = 0; round < kRounds; ++round) {
    for (ByteConfig& c : byte_configs) c.windows.push_back(c.runner->Window(kWindowSeconds));
  }
  struct ByteResult {
    std::string name;
    int baseline;
    int clients;
    std::vector<Outcome> windows;
  };
  std::vector<ByteResult> byte_results;
  for (ByteConfig& c : byte_configs) byte_results.push_back({c.name, c.baseline, c.threads, std::move(c.windows)});
  byte_configs.clear();

  Check(store.CheckInvariants(), "store invariants");
  const cachestore::IndexStats after = store.Stats();
  struct Result {
    std::string name;
    int baseline;
    int clients;
    std::vector<Outcome> windows;
  };
  std::vector<Result> results;
  for (Config& c : configs) results.push_back({c.name, c.baseline, c.runner->clients(), std::move(c.windows)});
  configs.clear();  // disconnect before the server stops
  (*server)->Shutdown(absl::Seconds(1));

  std::printf("\nin-process CacheStore::Lookup (probe, 1 thread, no RPC): %.1f us = %.0f lookups/s\n",
              in_process_ns / 1e3, 1e9 / in_process_ns);
  std::printf(
      "protobuf work per Lookup RPC, in process (no transport): request %.1f us (%zu bytes), response "
      "%.1f us (%zu bytes, %zu pages)\n",
      proto.request_ns / 1e3, proto.request_bytes, proto.response_ns / 1e3, proto.response_bytes, sample->pages.size());
  std::printf("\n%-38s %10s %10s %10s %12s %7s %6s\n", "load (median of windows)", "lookups/s", "vs 1 client",
              "CPU us/op", "min..max/s", "errors", "clients");
  std::vector<double> ratio(results.size());
  int connections = -1;
  for (size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    std::vector<double> qps, cpu, ratios;
    int64_t errors = 0;
    for (size_t w = 0; w < r.windows.size(); ++w) {
      qps.push_back(r.windows[w].lookups_per_second);
      cpu.push_back(r.windows[w].cpu_us_per_lookup);
      ratios.push_back(r.windows[w].lookups_per_second / results[r.baseline].windows[w].lookups_per_second);
      errors += r.windows[w].errors;
      connections = std::max(connections, r.windows[w].connections);
    }
    ratio[i] = Median(ratios);
    std::printf("%-38s %10.0f %9.2fx %10.1f %5.0f..%-6.0f %7lld %6d\n", r.name.c_str(), Median(qps), ratio[i],
                Median(cpu), *std::min_element(qps.begin(), qps.end()), *std::max_element(qps.begin(), qps.end()),
                static_cast<long long>(errors), r.clients);
  }
  std::printf(
      "(%d rounds of %.1f s windows, one window per load per round; \"vs 1 client\": median over rounds\n"
      " of the ratio within a round. lease+release: a Lookup with a lease and a Release RPC per op.\n"
      " CPU us/op: user + system time of the whole process (clients and server) per op.\n"
      " clients: GrpcCacheClient objects, each on its own channel and TCP connection.)\n",
      kRounds, kWindowSeconds);
  std::printf("established TCP connections to the server: %d (expected %d, one per client)\n", connections, clients);

  std::printf("\n%-38s %10s %10s %10s %12s %7s %6s\n", "byte load (median of windows)", "MiB/s", "vs 1 client",
              "CPU us/op", "min..max/s", "errors", "clients");
  std::vector<double> byte_ratio(byte_results.size());
  for (size_t i = 0; i < byte_results.size(); ++i) {
    const ByteResult& r = byte_results[i];
    std::vector<double> mibps, cpu, ratios;
    int64_t errors = 0;
    for (size_t w = 0; w < r.windows.size(); ++w) {
      mibps.push_back(r.windows[w].lookups_per_second * static_cast<double>(kTransferBytes) / (1 << 20));
      cpu.push_back(r.windows[w].cpu_us_per_lookup);
      ratios.push_back(r.windows[w].lookups_per_second / byte_results[r.baseline].windows[w].lookups_per_second);
      errors += r.windows[w].errors;
    }
    byte_ratio[i] = Median(ratios);
    std::printf("%-38s %10.0f %9.2fx %10.1f %5.0f..%-6.0f %7lld %6d\n", r.name.c_str(), Median(mibps), byte_ratio[i],
                Median(cpu), *std::min_element(mibps.begin(), mibps.end()),
                *std::max_element(mibps.begin(), mibps.end()), static_cast<long long>(errors), r.clients);
  }
  std::printf("(the same rounds and windows; MiB/s of entry bytes; CPU us/op: the whole process per Put or Get)\n");

  std::printf(
      "\n8 concurrent clients / 1 client, side by side, on %u hardware threads (shared by the clients and the\n"
      "server, so 8 clients cannot do 8x the work of 1: the ratio shows how much CPU one client left idle\n"
      "for the others, less what they lose contending; near 1: the extra clients added nothing):\n",
      std::thread::hardware_concurrency());
  std::printf("  lookups/s  probe %.2fx   lease+release %.2fx\n", ratio[1], ratio[4]);
  std::printf("  Put MiB/s  %.2fx   Get MiB/s %.2fx   (1 MiB states)\n", byte_ratio[1], byte_ratio[3]);
  std::printf("server-side lookups counted: %lld, active leases at the end: %lld\n",
              static_cast<long long>(after.lookups), static_cast<long long>(after.active_leases));
}

}  // namespace
}  // namespace hybridserve::bench

int main() {
  // The same process settings as the cachestore binary it stands in for.
  hybridserve::common::TuneProcessForServing();
  hybridserve::bench::Run();
  return 0;
}
