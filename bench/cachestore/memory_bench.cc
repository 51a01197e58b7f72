// Resident memory of the cachestore binary against its byte budgets. Starts
// the real binary as a child process on loopback (by default 48 + 48 MiB
// budgets, page and state TTLs of 3 s), runs a mixed workload of puts of
// entry sizes from 1 KiB to 8 MiB (log-uniform, pages and states, several
// times the budgets so eviction runs), Gets and lookups with and without
// leases from 4 clients; the child's peak resident memory over the workload
// is the kernel's VmHWM (/proc/<pid>/status), reset to VmRSS when the
// workload starts (/proc/<pid>/clear_refs), so no spike is missed between
// samples. Then stops writing, waits until every entry has expired or been
// evicted, and reads VmRSS.
// Goal (issue 10, item 9): RSS <= 1.25 x (page budget + state budget) + 64 MiB
// during the workload, and back under it after eviction; one verdict, MET only
// when both hold. A reading of /proc that fails ends the run with an error,
// never a verdict.
//   bazel run -c opt //bench/cachestore:memory_bench [-- --page_budget_mib=48
//       --state_budget_mib=48 --ttl_s=3 --fill=10 --clients=4]

#include <sys/types.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/cachestore/bench_timing.h"
#include "cachestore/client/grpc_cache_client.h"
#include "common/proc_status.h"
#include "tests/e2e/stack.h"

namespace hybridserve::bench {
namespace {

using cachestore::ClientNamespace;
using cachestore::ClientPut;
using cachestore::EntryClass;
using cachestore::GrpcCacheClient;
using cachestore::IndexStats;
using cachestore::LookupMode;
using cachestore::LookupResult;
using cachestore::TokenId;

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kMinEntryBytes = 1024;
constexpr int64_t kMaxEntryBytes = 8 * kMiB;
constexpr int32_t kPageSize = 16;

struct Config {
  int64_t page_budget_mib = 48;
  int64_t state_budget_mib = 48;
  int64_t ttl_s = 3;  // --page_ttl and --state_ttl of the child
  int64_t fill = 10;  // bytes put = fill x (page budget + state budget)
  int clients = 4;
};

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "memory_bench: %s\n", what.c_str());
  std::exit(1);
}

Config ParseFlags(int argc, char** argv) {
  Config c;
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    const size_t eq = arg.find('=');
    int64_t value = 0;
    if (eq == absl::string_view::npos || !absl::SimpleAtoi(arg.substr(eq + 1), &value) || value <= 0) {
      Fail(absl::StrCat("bad flag ", arg,
                        "; usage: memory_bench [--page_budget_mib=N] [--state_budget_mib=N] [--ttl_s=N] [--fill=N] "
                        "[--clients=N], every N > 0"));
    }
    const absl::string_view name = arg.substr(0, eq);
    if (name == "--page_budget_mib") {
      c.page_budget_mib = value;
    } else if (name == "--state_budget_mib") {
      c.state_budget_mib = value;
    } else if (name == "--ttl_s") {
      c.ttl_s = value;
    } else if (name == "--fill") {
      c.fill = value;
    } else if (name == "--clients") {
      c.clients = static_cast<int>(value);
    } else {
      Fail(absl::StrCat("unknown flag ", arg));
    }
  }
  return c;
}

double Mib(int64_t bytes) { return static_cast<double>(bytes) / static_cast<double>(kMiB); }

// A reading of the child's /proc/<pid>/status; exits on failure (or a
// reading of 0), so a verdict never rests on a reading that did not happen.
int64_t Reading(const char* what, const absl::StatusOr<int64_t>& bytes) {
  if (!bytes.ok()) Fail(absl::StrCat("cannot read the child's ", what, ": ", bytes.status().ToString()));
  if (*bytes <= 0) Fail(absl::StrCat("the child's ", what, " reads ", *bytes, " bytes"));
  return *bytes;
}

std::unique_ptr<GrpcCacheClient> NewClient(const std::string& target) {
  cachestore::GrpcCacheClientOptions options;
  options.timeout = absl::Seconds(60);
  absl::StatusOr<std::unique_ptr<GrpcCacheClient>> c = GrpcCacheClient::Create(target, options);
  if (!c.ok()) Fail(c.status().ToString());
  return *std::move(c);
}

struct WorkerCounts {
  int64_t puts_ok = 0, puts_refused = 0, put_bytes = 0, gets_ok = 0, gets_failed = 0, lookups = 0, hits = 0;
};

// One client: until `byte_target` bytes are put, a page (a root page of the
// client's namespace) or a state (a 1-3 token tail after a page) of a
// log-uniform size; after each state a lookup, every other one leased, and a
// leased hit Gets the state and its page, then releases the lease.
WorkerCounts Worker(const std::string& target, int index, int64_t byte_target) {
  std::unique_ptr<GrpcCacheClient> client = NewClient(target);
  std::mt19937_64 rng(100 + index);
  std::uniform_real_distribution<double> log_size(std::log(static_cast<double>(kMinEntryBytes)),
                                                  std::log(static_cast<double>(kMaxEntryBytes)));
  auto next_size = [&] {
    return std::clamp(static_cast<int64_t>(std::exp(log_size(rng))), kMinEntryBytes, kMaxEntryBytes);
  };
  const ClientNamespace ns{"memory-bench", "", absl::StrCat("client", index), kPageSize};
  std::string bytes(static_cast<size_t>(kMaxEntryBytes), '\0');
  for (size_t i = 0; i < bytes.size(); i += 8) {
    const uint64_t v = rng();
    std::memcpy(&bytes[i], &v, 8);
  }
  WorkerCounts counts;
  std::string got;
  while (counts.put_bytes < byte_target) {
    ClientPut page;
    page.entry_class = EntryClass::kPage;
    for (int i = 0; i < kPageSize; ++i) page.tokens.push_back(static_cast<TokenId>(rng() % 50000));
    const int64_t page_size = next_size();
    absl::StatusOr<cachestore::PutResult> p =
        client->Put(ns, page, absl::string_view(bytes).substr(0, static_cast<size_t>(page_size)));
    counts.put_bytes += page_size;
    if (!p.ok()) {
      ++counts.puts_refused;
      continue;
    }
    ++counts.puts_ok;
    ClientPut state;
    state.entry_class = EntryClass::kState;
    state.parent = p->key;
    const int tail = 1 + static_cast<int>(rng() % 3);
    for (int i = 0; i < tail; ++i) state.tokens.push_back(static_cast<TokenId>(rng() % 50000));
    state.position = kPageSize + tail;
    const int64_t state_size = next_size();
    absl::StatusOr<cachestore::PutResult> s =
        client->Put(ns, state, absl::string_view(bytes).substr(0, static_cast<size_t>(state_size)));
    counts.put_bytes += state_size;
    if (!s.ok()) {
      ++counts.puts_refused;
      continue;
    }
    ++counts.puts_ok;
    std::vector<TokenId> prompt = page.tokens;
    prompt.insert(prompt.end(), state.tokens.begin(), state.tokens.end());
    const bool lease = counts.lookups % 2 == 0;
    absl::StatusOr<LookupResult> l = client->Lookup(ns, prompt, lease ? LookupMode::kLease : LookupMode::kProbeOnly);
    ++counts.lookups;
    if (!l.ok() || !l->state.has_value()) continue;
    ++counts.hits;
    if (l->lease_id == 0) continue;
    for (const cachestore::EntryInfo& e : {*l->state, l->pages.empty() ? *l->state : l->pages[0]}) {
      if (client->GetInto(l->lease_id, e.key, &got).ok()) {
        ++counts.gets_ok;
      } else {
        ++counts.gets_failed;
      }
    }
    client->Release(l->lease_id).IgnoreError();
  }
  return counts;
}

void Run(const Config& config) {
  const int64_t budget = (config.page_budget_mib + config.state_budget_mib) * kMiB;
  const int64_t bound = budget * 5 / 4 + 64 * kMiB;
  const std::string ttl = absl::StrCat(config.ttl_s, "s");
  std::vector<std::string> args = {"--address=127.0.0.1:0",
                                   "--metrics_address=",
                                   absl::StrCat("--page_budget_mib=", config.page_budget_mib),
                                   absl::StrCat("--state_budget_mib=", config.state_budget_mib),
                                   "--page_ttl=" + ttl,
                                   "--state_ttl=" + ttl};
  absl::StatusOr<std::unique_ptr<e2e::Process>> server =
      e2e::Process::Start("cachestore", "cachestore/server/cachestore", args, "CACHESTORE_READY");
  if (!server.ok()) Fail(server.status().ToString());
  const pid_t pid = (*server)->pid();
  const std::string target = absl::StrCat("127.0.0.1:", (*server)->port());
  std::printf("memory_bench: cachestore child (pid %d)", static_cast<int>(pid));
  for (const std::string& a : args) std::printf(" %s", a.c_str());
  std::printf(
      "\n%d clients put %lld x the budgets (%lld MiB) in entries of 1 KiB..8 MiB (log-uniform; a page, then\n"
      "a state after it), each state followed by a lookup (every other one leased: Get state and page,\n"
      "Release); %u hardware threads (the machine is shared: figures are indicative)\n",
      config.clients, static_cast<long long>(config.fill), static_cast<long long>(config.fill * budget / kMiB),
      std::thread::hardware_concurrency());
  const int64_t rss_start = Reading("VmRSS", common::ResidentBytes(pid));
  // From here VmHWM is the workload's peak; where the kernel cannot reset
  // it, the peak since the child started (no less strict).
  const absl::Status reset = common::ResetPeakResident(pid);
  if (!reset.ok())
    std::printf("(VmHWM not reset: %s; the peak counts from the child's start)\n", reset.ToString().c_str());
  const auto start = std::chrono::steady_clock::now();
  std::vector<WorkerCounts> counts(config.clients);
  {
    std::vector<std::thread> threads;
    for (int c = 0; c < config.clients; ++c) {
      threads.emplace_back([&, c] { counts[c] = Worker(target, c, config.fill * budget / config.clients); });
    }
    for (std::thread& t : threads) t.join();
  }
  const double workload_s = SecondsSince(start);
  const int64_t peak_workload = Reading("VmHWM", common::PeakResidentBytes(pid));
  std::unique_ptr<GrpcCacheClient> client = NewClient(target);
  absl::StatusOr<IndexStats> after_workload = client->Stats();
  if (!after_workload.ok()) Fail(after_workload.status().ToString());

  // Stop writing: wait until every entry expired (TTL) or was evicted, then
  // let the process settle for a second.
  const auto idle_start = std::chrono::steady_clock::now();
  absl::StatusOr<IndexStats> idle;
  for (;;) {
    idle = client->Stats();
    if (!idle.ok()) Fail(idle.status().ToString());
    if (idle->pages.resident_bytes == 0 && idle->states.resident_bytes == 0) break;
    if (SecondsSince(idle_start) > 10.0 * static_cast<double>(config.ttl_s) + 30) {
      std::printf("(entries still resident %.0f s after the workload stopped)\n", SecondsSince(idle_start));
      break;
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  absl::SleepFor(absl::Seconds(1));
  const double idle_s = SecondsSince(idle_start);
  const int64_t rss_idle = Reading("VmRSS", common::ResidentBytes(pid));

  WorkerCounts total;
  for (const WorkerCounts& c : counts) {
    total.puts_ok += c.puts_ok;
    total.puts_refused += c.puts_refused;
    total.put_bytes += c.put_bytes;
    total.gets_ok += c.gets_ok;
    total.gets_failed += c.gets_failed;
    total.lookups += c.lookups;
    total.hits += c.hits;
  }
  std::printf(
      "\nworkload: %.1f s; %lld puts ok, %lld refused, %.0f MiB put; %lld lookups, %lld hits; %lld gets ok, "
      "%lld failed\n",
      workload_s, static_cast<long long>(total.puts_ok), static_cast<long long>(total.puts_refused),
      Mib(total.put_bytes), static_cast<long long>(total.lookups), static_cast<long long>(total.hits),
      static_cast<long long>(total.gets_ok), static_cast<long long>(total.gets_failed));
  std::printf("store after the workload: pages %.1f MiB, states %.1f MiB resident; evicted lru %lld, ttl %lld\n",
              Mib(after_workload->pages.resident_bytes), Mib(after_workload->states.resident_bytes),
              static_cast<long long>(after_workload->pages.evicted_lru + after_workload->states.evicted_lru),
              static_cast<long long>(after_workload->pages.evicted_ttl + after_workload->states.evicted_ttl));
  std::printf("store after %.1f s idle: pages %.1f MiB, states %.1f MiB resident\n", idle_s,
              Mib(idle->pages.resident_bytes), Mib(idle->states.resident_bytes));

  const double budget_mib = Mib(budget);
  std::printf("\n%-40s %10s %14s\n", "child process", "MiB", "/ budgets");
  auto row = [&](const char* name, int64_t bytes) {
    std::printf("%-40s %10.1f %13.2fx\n", name, Mib(bytes), static_cast<double>(bytes) / static_cast<double>(budget));
  };
  row("VmRSS at start", rss_start);
  row(reset.ok() ? "VmHWM over the workload" : "VmHWM since the child started", peak_workload);
  row("VmRSS after expiry/eviction", rss_idle);
  std::printf("(budgets: pages %lld + states %lld = %.0f MiB)\n", static_cast<long long>(config.page_budget_mib),
              static_cast<long long>(config.state_budget_mib), budget_mib);

  const bool during = peak_workload <= bound;
  const bool after = rss_idle <= bound;
  std::printf(
      "\ngoal: RSS <= 1.25 x (page budget + state budget) + 64 MiB = %.1f MiB during the workload and back under\n"
      "      it after expiry/eviction. Rule: MET only when BOTH the peak resident memory during the workload\n"
      "      (the kernel's VmHWM, reset when it began) and VmRSS once every entry is gone are <= %.1f MiB.\n"
      "      peak %.1f MiB (%.2fx the bound, %s), after %.1f MiB (%.2fx the bound, %s): %s\n",
      Mib(bound), Mib(bound), Mib(peak_workload), static_cast<double>(peak_workload) / static_cast<double>(bound),
      during ? "holds" : "fails", Mib(rss_idle), static_cast<double>(rss_idle) / static_cast<double>(bound),
      after ? "holds" : "fails", during && after ? "MET" : "MISSED");
  client.reset();
  (*server)->Terminate(absl::Seconds(10));
}

}  // namespace
}  // namespace hybridserve::bench

int main(int argc, char** argv) {
  hybridserve::bench::Run(hybridserve::bench::ParseFlags(argc, argv));
  return 0;
}
