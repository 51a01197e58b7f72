// A bounded soak of the cachestore binary as deployed (a child process on
// loopback, 48 + 48 MiB budgets, put_timeout and lease_ttl of 2 s): phases
// that mix puts of every size from 1 KiB to 8 MiB (log-uniform, pages and
// states, several times the budgets so eviction runs), Gets checked byte for
// byte, lookups with and without leases, and stalled clients (a put that sends
// its header and then nothing, one that stops after a chunk, a lease never
// released, a Get whose reader stops reading). A monitor samples Stats and
// the child's threads throughout. After each phase: no class ever held more
// than its budget (resident + reserved), every call ended with a status its
// method documents, the process stayed under the thread bound, and its peak
// resident memory (the kernel's VmHWM, reset at each phase's start, so a
// spike between samples counts) under the RSS bound.
// At the end, once the stalled clients are gone and put_timeout / lease_ttl
// have passed: no put and no lease is left.

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "cachestore/client/grpc_cache_client.h"
#include "common/proc_status.h"
#include "common/sanitizers.h"
#include "common/wait_for.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/cachestore.grpc.pb.h"
#include "tests/e2e/stack.h"

namespace hybridserve::e2e {
namespace {

using cachestore::ClientNamespace;
using cachestore::ClientPut;
using cachestore::EntryClass;
using cachestore::GrpcCacheClient;
using cachestore::Hash128;
using cachestore::IndexStats;
using cachestore::LookupMode;
using cachestore::LookupResult;
using cachestore::TokenId;
using ::testing::IsSubsetOf;

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kPageBudgetMib = 48;
constexpr int64_t kStateBudgetMib = 48;
constexpr int64_t kBudgetBytes = (kPageBudgetMib + kStateBudgetMib) * kMiB;
constexpr int32_t kPageSize = 16;
constexpr int64_t kMinEntryBytes = 1024;
constexpr int64_t kMaxEntryBytes = 8 * kMiB;

// The process bounds of issue 10 (items 8 and 9).
// RSS: 1.25 x (page budget + state budget) + 64 MiB, not under sanitizers
// (their shadow memory and quarantine are not the server's), judged on the
// peak (VmHWM). Was 554 MiB before entry buffers were mappings of their own
// and the heap had two arenas.
constexpr bool kCheckRssBound = true;
constexpr int64_t kMaxRssBytes = kBudgetBytes * 5 / 4 + 64 * kMiB;
// Threads, whatever the clients do (here at most ~14 concurrent streams;
// measured 21 threads at the peak).
constexpr bool kCheckThreadBound = true;
constexpr int64_t kMaxThreads = 64;

using common::kSanitized;

// A bound for a hung process or call, far above what any step takes; never a
// timing expectation. Every RPC carries it as its deadline.
constexpr absl::Duration kDeadline = absl::Seconds(60);

std::chrono::system_clock::time_point Deadline() {
  return std::chrono::system_clock::now() + absl::ToChronoSeconds(kDeadline);
}

using common::WaitFor;

// The statuses each method documents for well-formed calls (cache_client.h,
// proto/cachestore.proto); CANCELLED only where the test cancels the call.
const std::map<std::string, std::set<absl::StatusCode>>& DocumentedCodes() {
  static const auto* codes = new std::map<std::string, std::set<absl::StatusCode>>{
      // FAILED_PRECONDITION: the parent page was evicted; RESOURCE_EXHAUSTED:
      // the budget is held by in-flight or leased entries; ABORTED: the put
      // stalled and was reclaimed.
      {"Put",
       {absl::StatusCode::kOk, absl::StatusCode::kFailedPrecondition, absl::StatusCode::kResourceExhausted,
        absl::StatusCode::kAborted}},
      {"Lookup", {absl::StatusCode::kOk}},
      // NOT_FOUND: the lease lapsed (lease_ttl 2 s) before the Get.
      {"Get", {absl::StatusCode::kOk, absl::StatusCode::kNotFound}},
      {"Release", {absl::StatusCode::kOk, absl::StatusCode::kNotFound}},
      {"Stats", {absl::StatusCode::kOk}},
      // The stalled clients: a put reclaimed after put_timeout ends ABORTED;
      // the stalled Get ends when the test cancels it.
      {"StalledPut", {absl::StatusCode::kAborted}},
      {"StalledGet", {absl::StatusCode::kCancelled}},
  };
  return *codes;
}

// The status codes every call ended with, by method. Thread-safe.
class CodeLog {
 public:
  void Add(const std::string& method, absl::StatusCode code, const std::string& message) {
    absl::MutexLock lock(&mu_);
    ++counts_[method][code];
    if (!DocumentedCodes().at(method).count(code)) {
      undocumented_.push_back(absl::StrCat(method, ": ", absl::StatusCodeToString(code), " ", message));
    }
  }
  void Add(const std::string& method, const absl::Status& s) { Add(method, s.code(), std::string(s.message())); }
  int64_t Count(const std::string& method, absl::StatusCode code) const {
    absl::MutexLock lock(&mu_);
    auto it = counts_.find(method);
    if (it == counts_.end()) return 0;
    auto c = it->second.find(code);
    return c == it->second.end() ? 0 : c->second;
  }
  std::set<absl::StatusCode> Codes(const std::string& method) const {
    absl::MutexLock lock(&mu_);
    std::set<absl::StatusCode> out;
    auto it = counts_.find(method);
    if (it != counts_.end()) {
      for (const auto& [code, n] : it->second) out.insert(code);
    }
    return out;
  }
  std::vector<std::string> undocumented() const {
    absl::MutexLock lock(&mu_);
    return undocumented_;
  }
  std::string Summary() const {
    absl::MutexLock lock(&mu_);
    std::vector<std::string> parts;
    for (const auto& [method, codes] : counts_) {
      for (const auto& [code, n] : codes) {
        parts.push_back(absl::StrCat(method, " ", absl::StatusCodeToString(code), " x", n));
      }
    }
    return absl::StrJoin(parts, ", ");
  }

 private:
  mutable absl::Mutex mu_;
  std::map<std::string, std::map<absl::StatusCode, int64_t>> counts_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> undocumented_ ABSL_GUARDED_BY(mu_);
};

// The most each sampled quantity reached while the monitor ran.
struct Peaks {
  int64_t page_bytes = 0;   // resident + reserved
  int64_t state_bytes = 0;  // resident + reserved
  int64_t page_budget = 0;
  int64_t state_budget = 0;
  int64_t threads = 0;
  int64_t samples = 0;
  int64_t failed_thread_reads = 0;  // samples whose /proc/<pid>/status gave no thread count
  std::string thread_read_error;    // the first such error
};

// Samples Stats (over its own client) and the child's thread count
// (/proc/<pid>/status) every ~10 ms on a thread of its own until destroyed.
class Monitor {
 public:
  Monitor(const std::string& target, pid_t pid, CodeLog* codes) : pid_(pid), codes_(codes) {
    cachestore::GrpcCacheClientOptions options;
    options.timeout = kDeadline;
    client_ = *GrpcCacheClient::Create(target, options);
    thread_ = std::thread([this] { Loop(); });
  }
  ~Monitor() {
    stop_ = true;
    thread_.join();
  }
  // The peaks since the last call, including at least one sample taken after
  // this call began (so a phase's end state is always sampled); samples is 0
  // only if none came within kDeadline.
  Peaks TakePeaks() {
    absl::MutexLock lock(&mu_);
    const int64_t before = peaks_.samples;
    auto sampled = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return peaks_.samples > before; };
    if (!mu_.AwaitWithTimeout(absl::Condition(&sampled), kDeadline)) peaks_.samples = 0;
    Peaks p = peaks_;
    peaks_ = Peaks{};
    return p;
  }

 private:
  void Loop() {
    while (!stop_) {
      absl::StatusOr<IndexStats> s = client_->Stats();
      codes_->Add("Stats", s.status());
      const absl::StatusOr<int64_t> threads = common::ProcStatusField(pid_, "Threads");
      {
        absl::MutexLock lock(&mu_);
        if (s.ok()) {
          peaks_.page_bytes = std::max(peaks_.page_bytes, s->pages.resident_bytes + s->pages.reserved_bytes);
          peaks_.state_bytes = std::max(peaks_.state_bytes, s->states.resident_bytes + s->states.reserved_bytes);
          peaks_.page_budget = s->pages.budget_bytes;
          peaks_.state_budget = s->states.budget_bytes;
        }
        if (threads.ok()) {
          peaks_.threads = std::max(peaks_.threads, *threads);
        } else if (peaks_.failed_thread_reads++ == 0) {
          peaks_.thread_read_error = threads.status().ToString();
        }
        ++peaks_.samples;
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
  }

  const pid_t pid_;
  CodeLog* const codes_;
  std::unique_ptr<GrpcCacheClient> client_;
  std::atomic<bool> stop_{false};
  absl::Mutex mu_;
  Peaks peaks_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

// The bytes of an entry: a function of `seed` and the offset, so a Get can be
// checked byte for byte without keeping the entry.
std::string EntryBytes(uint64_t seed, int64_t size) {
  std::string s(static_cast<size_t>(size), '\0');
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(&s[i], &x, 8);
  }
  for (; i < s.size(); ++i) s[i] = static_cast<char>(seed + i);
  return s;
}

// What was put under each key, for checking Gets. Thread-safe.
class Contents {
 public:
  void Add(const Hash128& key, uint64_t seed, int64_t size) {
    absl::MutexLock lock(&mu_);
    entries_[key.ToHex()] = {seed, size};
  }
  // Whether `bytes` are what was put under `key`.
  bool Matches(const Hash128& key, const std::string& bytes) const {
    std::pair<uint64_t, int64_t> e;
    {
      absl::MutexLock lock(&mu_);
      auto it = entries_.find(key.ToHex());
      if (it == entries_.end()) return false;
      e = it->second;
    }
    return static_cast<int64_t>(bytes.size()) == e.second && bytes == EntryBytes(e.first, e.second);
  }

 private:
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::pair<uint64_t, int64_t>> entries_ ABSL_GUARDED_BY(mu_);
};

// What one phase of the mixed workload did.
struct Tally {
  std::atomic<int64_t> put_bytes_ok{0};
  std::atomic<int64_t> gets_checked{0};
  std::atomic<int64_t> get_mismatches{0};
  std::atomic<int64_t> smallest_put{INT64_MAX};
  std::atomic<int64_t> largest_put{0};
};

void Min(std::atomic<int64_t>& a, int64_t v) {
  int64_t cur = a.load();
  while (v < cur && !a.compare_exchange_weak(cur, v)) {
  }
}
void Max(std::atomic<int64_t>& a, int64_t v) {
  int64_t cur = a.load();
  while (v > cur && !a.compare_exchange_weak(cur, v)) {
  }
}

class CachestoreSoakTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto p = Process::Start(
        "cachestore", "cachestore/server/cachestore",
        {"--address=127.0.0.1:0", "--metrics_address=", absl::StrCat("--page_budget_mib=", kPageBudgetMib),
         absl::StrCat("--state_budget_mib=", kStateBudgetMib), "--put_timeout=2s", "--lease_ttl=2s",
         "--shutdown_grace=5s"},
        "CACHESTORE_READY");
    ASSERT_TRUE(p.ok()) << p.status();
    server_ = *std::move(p);
    target_ = absl::StrCat("127.0.0.1:", server_->port());
  }

  std::unique_ptr<GrpcCacheClient> NewClient() {
    cachestore::GrpcCacheClientOptions options;
    options.timeout = kDeadline;
    absl::StatusOr<std::unique_ptr<GrpcCacheClient>> c = GrpcCacheClient::Create(target_, options);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *std::move(c) : nullptr;
  }

  // One client's share of the mixed workload: conversations of pages and
  // states of log-uniform sizes (the first two puts of worker 0 are the
  // smallest and largest sizes), each put followed now and then by a lookup
  // with or without a lease; a leased hit reads the state and a page and
  // checks their bytes, then releases the lease.
  void MixedWorker(int worker, int phase, int64_t byte_target, Tally* tally) {
    std::unique_ptr<GrpcCacheClient> client = NewClient();
    ASSERT_NE(client, nullptr);
    std::mt19937_64 rng(1000 * phase + worker);
    std::uniform_real_distribution<double> log_size(std::log(static_cast<double>(kMinEntryBytes)),
                                                    std::log(static_cast<double>(kMaxEntryBytes)));
    const ClientNamespace ns{"soak-model", "", absl::StrCat("phase", phase, "-worker", worker), kPageSize};
    int64_t put_bytes = 0;
    int64_t puts = 0;
    while (put_bytes < byte_target) {
      // A new conversation: pages chained from the root.
      std::vector<TokenId> tokens;
      std::optional<Hash128> parent;
      const int pages = 1 + static_cast<int>(rng() % 6);
      for (int page = 0; page <= pages && put_bytes < byte_target; ++page) {
        const bool state = page == pages || rng() % 3 == 0;
        ClientPut put;
        put.entry_class = state ? EntryClass::kState : EntryClass::kPage;
        put.parent = parent;
        const int tail = state ? 1 + static_cast<int>(rng() % 3) : kPageSize;
        for (int i = 0; i < tail; ++i) put.tokens.push_back(static_cast<TokenId>(rng() % 50000));
        put.position = static_cast<int64_t>(tokens.size()) + tail;
        int64_t size = static_cast<int64_t>(std::exp(log_size(rng)));
        if (worker == 0 && puts == 0) size = kMinEntryBytes;
        if (worker == 0 && puts == 1) size = kMaxEntryBytes;
        size = std::clamp(size, kMinEntryBytes, kMaxEntryBytes);
        const uint64_t seed = rng();
        const std::string bytes = EntryBytes(seed, size);
        absl::StatusOr<cachestore::PutResult> r = client->Put(ns, put, bytes);
        codes_.Add("Put", r.status());
        ++puts;
        put_bytes += size;
        Min(tally->smallest_put, size);
        Max(tally->largest_put, size);
        if (!r.ok()) break;  // e.g. the parent was evicted: start a new conversation
        contents_.Add(r->key, seed, size);
        tally->put_bytes_ok += size;
        if (state) {
          std::vector<TokenId> prompt = tokens;
          prompt.insert(prompt.end(), put.tokens.begin(), put.tokens.end());
          const bool lease = rng() % 2 == 0;
          absl::StatusOr<LookupResult> l =
              client->Lookup(ns, prompt, lease ? LookupMode::kLease : LookupMode::kProbeOnly);
          codes_.Add("Lookup", l.status());
          if (l.ok() && l->lease_id != 0) {
            std::string got;
            if (l->state.has_value()) {
              const absl::Status g = client->GetInto(l->lease_id, l->state->key, &got);
              codes_.Add("Get", g);
              if (g.ok()) {
                ++tally->gets_checked;
                if (!contents_.Matches(l->state->key, got)) ++tally->get_mismatches;
              }
            }
            if (!l->pages.empty()) {
              const cachestore::EntryInfo& p = l->pages[rng() % l->pages.size()];
              const absl::Status g = client->GetInto(l->lease_id, p.key, &got);
              codes_.Add("Get", g);
              if (g.ok()) {
                ++tally->gets_checked;
                if (!contents_.Matches(p.key, got)) ++tally->get_mismatches;
              }
            }
            codes_.Add("Release", client->Release(l->lease_id));
          }
          break;  // a state ends the conversation
        }
        parent = r->key;
        tokens.insert(tokens.end(), put.tokens.begin(), put.tokens.end());
      }
    }
  }

  // Runs `workers` MixedWorkers, each putting ~byte_target bytes.
  void MixedLoad(int workers, int phase, int64_t byte_target, Tally* tally) {
    std::vector<std::thread> threads;
    for (int w = 0; w < workers; ++w) {
      threads.emplace_back([this, w, phase, byte_target, tally] { MixedWorker(w, phase, byte_target, tally); });
    }
    for (std::thread& t : threads) t.join();
  }

  // Starts the next phase's peak resident memory: resets the child's VmHWM
  // to its current VmRSS. Where the kernel refuses, the peaks count from the
  // child's start, a reading at least as strict.
  void StartPhase() {
    const absl::Status reset = common::ResetPeakResident(server_->pid());
    peak_since_ = reset.ok() ? "since the phase began" : "since the child started";
    if (!reset.ok())
      std::printf("VmHWM not reset (%s): peaks count from the child's start\n", reset.ToString().c_str());
  }

  // What holds after every phase: the monitor saw it (and took samples), no
  // class above its budget, every status documented, the process bounds.
  // Then starts the next phase.
  void CheckPhase(const std::string& phase, Monitor& monitor) {
    const Peaks p = monitor.TakePeaks();
    // The kernel's peak of the child's resident set over the phase.
    const absl::StatusOr<int64_t> peak_rss = common::PeakResidentBytes(server_->pid());
    StartPhase();
    SCOPED_TRACE(phase);
    ASSERT_GT(p.samples, 0);
    ASSERT_EQ(p.failed_thread_reads, 0) << "the child's thread count could not be read: " << p.thread_read_error;
    ASSERT_GT(p.threads, 0);
    ASSERT_TRUE(peak_rss.ok()) << "the child's VmHWM could not be read: " << peak_rss.status();
    ASSERT_GT(*peak_rss, 0);
    EXPECT_EQ(p.page_budget, kPageBudgetMib * kMiB);
    EXPECT_EQ(p.state_budget, kStateBudgetMib * kMiB);
    EXPECT_LE(p.page_bytes, p.page_budget) << "pages: resident + reserved above the budget";
    EXPECT_LE(p.state_bytes, p.state_budget) << "states: resident + reserved above the budget";
    EXPECT_THAT(codes_.undocumented(), ::testing::IsEmpty()) << codes_.Summary();
    std::printf(
        "[%s] peak pages %.1f MiB, states %.1f MiB (budgets %lld + %lld MiB); VmHWM %.1f MiB %s (bound %.1f),"
        " threads %lld (bound %lld); %lld samples\n  calls: %s\n",
        phase.c_str(), static_cast<double>(p.page_bytes) / kMiB, static_cast<double>(p.state_bytes) / kMiB,
        static_cast<long long>(kPageBudgetMib), static_cast<long long>(kStateBudgetMib),
        static_cast<double>(*peak_rss) / kMiB, peak_since_.c_str(), static_cast<double>(kMaxRssBytes) / kMiB,
        static_cast<long long>(p.threads), static_cast<long long>(kMaxThreads), static_cast<long long>(p.samples),
        codes_.Summary().c_str());
    if (kCheckRssBound && !kSanitized) EXPECT_LE(*peak_rss, kMaxRssBytes) << "VmHWM " << peak_since_;
    if (kCheckThreadBound) EXPECT_LE(p.threads, kMaxThreads) << "Threads";
  }

  void CheckMixed(const Tally& t, int64_t min_bytes_ok) {
    EXPECT_EQ(t.get_mismatches.load(), 0) << "a Get returned bytes other than those put";
    EXPECT_GT(t.gets_checked.load(), 0);
    EXPECT_GE(t.put_bytes_ok.load(), min_bytes_ok);
    EXPECT_EQ(t.smallest_put.load(), kMinEntryBytes);
    EXPECT_EQ(t.largest_put.load(), kMaxEntryBytes);
  }

  std::unique_ptr<Process> server_;
  std::string target_;
  std::string peak_since_;  // what the child's VmHWM counts from
  CodeLog codes_;
  Contents contents_;
};

// A put stream that sends its header (and `chunk_bytes` of data when > 0)
// and then nothing; its status, which the server sends when it reclaims the
// put after put_timeout.
grpc::Status StalledPut(const std::string& target, int index, int64_t chunk_bytes) {
  auto stub = v1::CacheStore::NewStub(grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(Deadline());
  v1::PutResponse resp;
  auto writer = stub->Put(&ctx, &resp);
  v1::PutRequest header;
  v1::PutHeader* h = header.mutable_header();
  h->mutable_namespace_()->set_model_fingerprint("soak-model");
  h->mutable_namespace_()->set_cache_salt("stalled");
  h->mutable_namespace_()->set_page_size(kPageSize);
  h->set_entry_class(v1::ENTRY_CLASS_STATE);
  h->set_state_kind(v1::STATE_KIND_EXACT_PREFIX);
  h->add_token_ids(index + 1);
  h->set_position(1);
  h->set_size_bytes(kMiB);
  if (!writer->Write(header)) return writer->Finish();
  if (chunk_bytes > 0) {
    v1::PutRequest chunk;
    chunk.mutable_chunk()->set_offset(0);
    chunk.mutable_chunk()->set_data(std::string(static_cast<size_t>(chunk_bytes), 'x'));
    if (!writer->Write(chunk)) return writer->Finish();
  }
  return writer->Finish();
}

absl::StatusCode ToAbsl(const grpc::Status& s) { return static_cast<absl::StatusCode>(s.error_code()); }

// Phase 1: the mixed workload alone, ~3x the budgets put by 4 clients.
// Phase 2: the same beside stalled clients: 4 puts that send a header and then
// nothing, 2 that stop after a chunk, a lease never released, and a Get of an
// 8 MiB state whose reader takes one chunk and stops reading.
// Phase 3: nothing new; the stalled Get is cancelled, and within a deadline
// the reaper has ended the stalled puts (ABORTED) and the lapsed leases.
TEST_F(CachestoreSoakTest, MixedSizesAndStalledClientsStayWithinBudgetsAndLeaveNothingBehind) {
  ASSERT_NE(server_, nullptr);
  Monitor monitor(target_, server_->pid(), &codes_);
  std::unique_ptr<GrpcCacheClient> client = NewClient();
  ASSERT_NE(client, nullptr);
  StartPhase();

  // Phase 1.
  constexpr int kWorkers = 4;
  constexpr int64_t kBytesPerWorker = 3 * kBudgetBytes / kWorkers;
  {
    Tally tally;
    MixedLoad(kWorkers, 1, kBytesPerWorker, &tally);
    CheckMixed(tally, kBudgetBytes);
    CheckPhase("phase 1: mixed", monitor);
    absl::StatusOr<IndexStats> s = client->Stats();
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_GT(s->pages.evicted_lru + s->states.evicted_lru, 0) << "the workload never filled a budget";
  }

  // Phase 2: the stalled clients first, then the mixed load beside them.
  std::vector<grpc::Status> stalled_puts(6);
  std::vector<std::thread> stalled;
  for (int i = 0; i < 6; ++i) {
    stalled.emplace_back([&, i] { stalled_puts[i] = StalledPut(target_, i, i < 4 ? 0 : 64 << 10); });
  }
  const ClientNamespace ns{"soak-model", "", "stalled-readers", kPageSize};
  ClientPut big;
  big.entry_class = EntryClass::kState;
  big.tokens = {7, 8, 9};
  big.position = 3;
  const std::string big_bytes = EntryBytes(77, kMaxEntryBytes);
  absl::StatusOr<cachestore::PutResult> put = client->Put(ns, big, big_bytes);
  codes_.Add("Put", put.status());
  ASSERT_TRUE(put.ok()) << put.status();
  // A lease never released.
  absl::StatusOr<LookupResult> forgotten = client->Lookup(ns, {7, 8, 9}, LookupMode::kLease);
  codes_.Add("Lookup", forgotten.status());
  ASSERT_TRUE(forgotten.ok() && forgotten->lease_id != 0) << forgotten.status();
  // A Get whose reader stops reading after its first 64 KiB chunk.
  absl::StatusOr<LookupResult> reading = client->Lookup(ns, {7, 8, 9}, LookupMode::kLease);
  codes_.Add("Lookup", reading.status());
  ASSERT_TRUE(reading.ok() && reading->state.has_value()) << reading.status();
  auto stub = v1::CacheStore::NewStub(grpc::CreateChannel(target_, grpc::InsecureChannelCredentials()));
  grpc::ClientContext get_ctx;
  get_ctx.set_deadline(Deadline());
  v1::GetRequest get;
  get.set_lease_id(reading->lease_id);
  get.set_key(reading->state->key.ToBytes());
  get.set_chunk_bytes(64 << 10);
  auto reader = stub->Get(&get_ctx, get);
  v1::GetResponse first;
  ASSERT_TRUE(reader->Read(&first));
  EXPECT_EQ(first.size_bytes(), static_cast<uint64_t>(kMaxEntryBytes));
  EXPECT_EQ(first.data(), big_bytes.substr(0, first.data().size()));
  {
    Tally tally;
    MixedLoad(kWorkers - 1, 2, kBytesPerWorker, &tally);
    CheckMixed(tally, kBudgetBytes / 2);
    CheckPhase("phase 2: mixed + stalled clients", monitor);
  }

  // Phase 3: the stalled Get's client gives up; the reaper does the rest.
  get_ctx.TryCancel();
  while (reader->Read(&first)) {
  }
  codes_.Add("StalledGet", ToAbsl(reader->Finish()), "");
  reader.reset();
  for (std::thread& t : stalled) t.join();
  for (const grpc::Status& s : stalled_puts) codes_.Add("StalledPut", ToAbsl(s), s.error_message());
  EXPECT_EQ(codes_.Count("StalledPut", absl::StatusCode::kAborted), 6);
  absl::StatusOr<IndexStats> last;
  EXPECT_TRUE(WaitFor([&] {
    last = client->Stats();
    return last.ok() && last->active_puts == 0 && last->active_leases == 0;
  })) << "puts "
      << (last.ok() ? last->active_puts : -1) << ", leases " << (last.ok() ? last->active_leases : -1);
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_EQ(last->pages.reserved_bytes, 0);
  EXPECT_EQ(last->states.reserved_bytes, 0);
  EXPECT_GE(last->expired_puts, 6);
  EXPECT_GE(last->expired_leases, 2);  // the forgotten lease and the stalled reader's
  // The forgotten lease is gone: releasing it now is NOT_FOUND.
  const absl::Status late = client->Release(forgotten->lease_id);
  codes_.Add("Release", late);
  EXPECT_EQ(late.code(), absl::StatusCode::kNotFound) << late;
  CheckPhase("phase 3: stalled clients gone", monitor);
  for (const std::string& method : {"Put", "Lookup", "Get", "Release", "Stats", "StalledPut", "StalledGet"}) {
    EXPECT_THAT(codes_.Codes(method), IsSubsetOf(DocumentedCodes().at(method))) << method;
  }
  const absl::StatusOr<int64_t> threads = common::ProcStatusField(server_->pid(), "Threads");
  const absl::StatusOr<int64_t> rss = common::ResidentBytes(server_->pid());
  ASSERT_TRUE(threads.ok() && rss.ok()) << threads.status() << " " << rss.status();
  std::printf("after the stalled clients: threads %lld, VmRSS %.1f MiB\n", static_cast<long long>(*threads),
              static_cast<double>(*rss) / kMiB);
  client.reset();
  stub.reset();
}

}  // namespace
}  // namespace hybridserve::e2e
