// The cachestore binary as deployed, in a child process on loopback: its flags
// refused at start, reflection, the Prometheus endpoint after known traffic
// (cachestore_cli's demo), the background reaper with its real interval, and
// the SIGTERM drain.

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "cachestore/client/grpc_cache_client.h"
#include "common/hash.h"
#include "common/wait_for.h"
#include "gmock/gmock.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/cachestore.grpc.pb.h"
#include "tests/e2e/stack.h"

namespace hybridserve::e2e {
namespace {

using ::testing::HasSubstr;

// A bound for a hung process or call, far above what any step takes (tens of
// milliseconds); never a timing expectation.
constexpr absl::Duration kDeadline = absl::Seconds(60);

std::chrono::system_clock::time_point Deadline() {
  return std::chrono::system_clock::now() + absl::ToChronoSeconds(kDeadline);
}

using common::WaitFor;

struct Exit {
  int code = -1;  // -1: killed at the deadline
  std::string output;
};

// Runs a binary (a runfile path) to its exit; its exit code and its stdout
// and stderr together.
Exit RunToExit(const std::string& binary, const std::vector<std::string>& args) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  static int counter = 0;
  const std::string out_path = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/run-", getpid(), "-", ++counter, ".out");
  absl::StatusOr<pid_t> spawned = Spawn(binary, args, out_path);
  if (!spawned.ok()) return Exit{-1, std::string(spawned.status().message())};
  const pid_t pid = *spawned;
  Exit result;
  int status = 0;
  bool exited = WaitFor([&] { return waitpid(pid, &status, WNOHANG) == pid; });
  if (!exited) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
  } else {
    result.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  std::ifstream in(out_path);
  std::stringstream s;
  s << in.rdbuf();
  result.output = s.str();
  return result;
}

std::unique_ptr<Process> StartCachestore(const std::vector<std::string>& extra) {
  std::vector<std::string> args = {"--address=127.0.0.1:0", "--metrics_address=127.0.0.1:0", "--page_budget_mib=64",
                                   "--state_budget_mib=256"};
  args.insert(args.end(), extra.begin(), extra.end());
  auto p = Process::Start("cachestore", "cachestore/server/cachestore", args, "CACHESTORE_READY");
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? *std::move(p) : nullptr;
}

std::string Target(Process& p) { return absl::StrCat("127.0.0.1:", p.port()); }

std::string ToString(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string out;
  if (!buffer.Dump(&slices).ok()) return out;
  for (const grpc::Slice& s : slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

// One request on a streaming method called by name with raw bytes (the
// health and reflection services have no generated C++ code here); collects
// every response until the call ends. Thread-safe.
class RawStream : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  RawStream(const std::string& target, const std::string& method, const std::string& request)
      : stub_(grpc::CreateChannel(target, grpc::InsecureChannelCredentials())) {
    grpc::Slice slice(request);
    request_ = grpc::ByteBuffer(&slice, 1);
    ctx_.set_deadline(Deadline());
    stub_.PrepareBidiStreamingCall(&ctx_, method, grpc::StubOptions(), this);
    StartWriteLast(&request_, grpc::WriteOptions());
    StartRead(&response_);
    StartCall();
  }
  ~RawStream() override {
    ctx_.TryCancel();
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&done_));
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;
    {
      absl::MutexLock lock(&mu_);
      responses_.push_back(ToString(response_));
    }
    StartRead(&response_);
  }
  void OnDone(const grpc::Status& status) override {
    absl::MutexLock lock(&mu_);
    status_ = status;
    done_ = true;
  }

  // Waits (up to kDeadline) until some response satisfies `match`.
  bool WaitForResponse(const std::function<bool(const std::string&)>& match) {
    absl::MutexLock lock(&mu_);
    auto seen = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      for (const std::string& r : responses_) {
        if (match(r)) return true;
      }
      return done_;
    };
    mu_.AwaitWithTimeout(absl::Condition(&seen), kDeadline);
    for (const std::string& r : responses_) {
      if (match(r)) return true;
    }
    return false;
  }
  void Cancel() { ctx_.TryCancel(); }
  grpc::Status Wait() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&done_));
    return status_;
  }
  std::vector<std::string> responses() {
    absl::MutexLock lock(&mu_);
    return responses_;
  }

 private:
  grpc::GenericStub stub_;
  grpc::ClientContext ctx_;
  grpc::ByteBuffer request_;
  grpc::ByteBuffer response_;
  absl::Mutex mu_;
  std::vector<std::string> responses_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
};

// grpc.health.v1.HealthCheckResponse{status} as bytes: field 1, varint.
const std::string kServing("\x08\x01", 2);
const std::string kNotServing("\x08\x02", 2);

// A TCP socket listening on a free loopback port, closed on destruction.
struct TakenPort {
  TakenPort() {
    fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    listen(fd, 1);
    socklen_t len = sizeof(addr);
    getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    port = ntohs(addr.sin_port);
  }
  ~TakenPort() { close(fd); }
  int fd = -1;
  int port = 0;
};

TEST(CachestoreProcessTest, BadFlagsAreRefusedAtStartNamingTheFlag) {
  TakenPort taken;
  const std::string busy = absl::StrCat("127.0.0.1:", taken.port);
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--page_budget_mib=0"}, "bad flag --page_budget_mib=0: must be in [1, 8388608]"},
      {{"--state_budget_mib=-1"}, "bad flag --state_budget_mib=-1: must be in [1, 8388608]"},
      {{"--page_budget_mib=9000000000000"}, "bad flag --page_budget_mib=9000000000000: must be in [1, 8388608]"},
      {{"--max_chunk_kib=0"}, "bad flag --max_chunk_kib=0: must be in [1, 65536]"},
      {{"--pin_budget_mib=-2"}, "bad flag --pin_budget_mib=-2: must be in [-1, 8388608]"},
      {{"--max_streams=0"}, "bad flag --max_streams=0: must be in [1, 1048576]"},
      {{"--max_streams_per_peer=-1"}, "bad flag --max_streams_per_peer=-1: must be in [1, 1048576]"},
      {{"--max_threads=1"}, "bad flag --max_threads=1: must be in [2, 65536]"},
      {{"--put_timeout=0s"}, "bad flag --put_timeout=0: must be a finite duration > 0"},
      {{"--lease_ttl=-5s"}, "bad flag --lease_ttl=-5s: must be a finite duration > 0"},
      {{"--shutdown_grace=-1s"}, "bad flag --shutdown_grace=-1s: must be >= 0"},
      {{"--max_connection_age=-1s"}, "bad flag --max_connection_age=-1s: must be >= 0"},
      {{"--max_connection_age_grace=-2s"}, "bad flag --max_connection_age_grace=-2s: must be >= 0"},
      {{"--page_budget_mib=abc"}, "Illegal value 'abc' specified for flag 'page_budget_mib'"},
      {{"--address=" + busy, "--metrics_address="}, "cannot listen on " + busy},
      {{"--address=127.0.0.1:0", "--metrics_address=" + busy}, "metrics exposer cannot bind " + busy},
  };
  for (const Case& c : cases) {
    Exit e = RunToExit("cachestore/server/cachestore", c.args);
    EXPECT_NE(e.code, 0) << c.args[0];
    EXPECT_NE(e.code, -1) << c.args[0] << " did not exit";
    EXPECT_THAT(e.output, HasSubstr(c.message)) << c.args[0];
    EXPECT_THAT(e.output, ::testing::Not(HasSubstr("CACHESTORE_READY"))) << c.args[0];
  }
}

// ServerReflectionRequest{list_services: "*"} (field 7); the answer names the
// cachestore, health and reflection services.
TEST(CachestoreProcessTest, ReflectionListsTheServices) {
  std::unique_ptr<Process> server = StartCachestore({});
  ASSERT_NE(server, nullptr);
  std::vector<std::string> responses;
  {
    RawStream list(Target(*server), "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
                   std::string("\x3a\x01*", 3));
    grpc::Status s = list.Wait();
    ASSERT_TRUE(s.ok()) << s.error_message();
    responses = list.responses();
  }
  ASSERT_EQ(responses.size(), 1u);
  const std::string& answer = responses[0];
  EXPECT_THAT(answer, HasSubstr("hybridserve.v1.CacheStore"));
  EXPECT_THAT(answer, HasSubstr("grpc.health.v1.Health"));
  EXPECT_THAT(answer, HasSubstr("grpc.reflection.v1alpha.ServerReflection"));
  EXPECT_EQ(server->Terminate(), 0) << server->log();
}

// cachestore_cli demo plays three turns (70, 150, 300 tokens, page size 16):
// 18 pages of 4 KiB and 3 states of 512 KiB put, 3 lookups of which turns 2
// and 3 hit an exact-prefix state, and turn 2 reads 4 pages + a state, turn 3
// 9 pages + a state. The CLI's output, its stats and the metrics say exactly
// that.
TEST(CachestoreProcessTest, CliDemoAndStatsAndTheMetricsOfTheirTraffic) {
  std::unique_ptr<Process> server = StartCachestore({});
  ASSERT_NE(server, nullptr);
  const std::string target = "--target=" + Target(*server);
  Exit demo = RunToExit("client/cachestore_cli", {target, "demo"});
  ASSERT_EQ(demo.code, 0) << demo.output;
  EXPECT_THAT(demo.output, HasSubstr("turn 1: prompt 70 tokens, resume at 0 (cold), kv match 0, prefill 70 tokens"));
  EXPECT_THAT(demo.output, HasSubstr("turn 2: prompt 150 tokens, resume at 70 (exact-prefix snapshot), kv match 64, "
                                     "prefill 80 tokens"));
  EXPECT_THAT(demo.output, HasSubstr("turn 3: prompt 300 tokens, resume at 150 (exact-prefix snapshot), kv match "
                                     "144, prefill 150 tokens"));
  Exit stats = RunToExit("client/cachestore_cli", {target, "stats"});
  ASSERT_EQ(stats.code, 0) << stats.output;
  EXPECT_THAT(stats.output, HasSubstr("namespaces 1  leases 0  puts in flight 0  lookups 3  hits 2"));
  EXPECT_THAT(stats.output, HasSubstr("pages  entries 18  resident 73728 B  reserved 0 B  budget 67108864 B"));
  EXPECT_THAT(stats.output, HasSubstr("states entries 3  resident 1572864 B  reserved 0 B  budget 268435456 B"));
  Exit bad = RunToExit("client/cachestore_cli", {target, "frobnicate"});
  EXPECT_EQ(bad.code, 1);
  EXPECT_THAT(bad.output, HasSubstr("unknown command frobnicate"));

  const int metrics_port = std::stoi(server->field("metrics_port"));
  const std::map<std::string, double> expected = {
      {"hybridserve_cache_lookups_total", 3},
      {"hybridserve_cache_hits_total{kind=\"exact_prefix\"}", 2},
      {"hybridserve_cache_hits_total{kind=\"grid_checkpoint\"}", 0},
      {"hybridserve_cache_puts_total{outcome=\"ok\"}", 21},
      {"hybridserve_cache_puts_total{outcome=\"error\"}", 0},
      {"hybridserve_cache_put_bytes_total", 18 * 4096 + 3 * 524288},
      {"hybridserve_cache_gets_total{outcome=\"ok\"}", 15},
      {"hybridserve_cache_gets_total{outcome=\"error\"}", 0},
      {"hybridserve_cache_get_bytes_total", 13 * 4096 + 2 * 524288},
      {"hybridserve_cache_resume_depth_tokens_sum", 0 + 70 + 150},
      {"hybridserve_cache_kv_match_depth_tokens_sum", 0 + 64 + 144},
      // Gauges, copied from the store by the reaper (every 500 ms).
      {"hybridserve_cache_bytes{class=\"page\",state=\"resident\"}", 73728},
      {"hybridserve_cache_bytes{class=\"state\",state=\"resident\"}", 1572864},
      {"hybridserve_cache_bytes{class=\"page\",state=\"reserved\"}", 0},
      {"hybridserve_cache_active_leases", 0},
      {"hybridserve_cache_evictions_total{class=\"page\",reason=\"lru\"}", 0},
      {"hybridserve_cache_expired_puts_total", 0},
  };
  std::map<std::string, double> seen;
  auto matches = [&] {
    absl::StatusOr<std::map<std::string, double>> m = ScrapeMetrics(metrics_port);
    if (!m.ok()) return false;
    seen.clear();
    for (const auto& [name, value] : expected) {
      auto it = m->find(name);
      if (it != m->end()) seen[name] = it->second;
    }
    return seen == expected;
  };
  // The counters are exact at once; the gauges within a reaper interval.
  EXPECT_TRUE(WaitFor(matches));
  for (const auto& [name, value] : expected) EXPECT_EQ(seen[name], value) << name;
  EXPECT_EQ(server->Terminate(), 0) << server->log();
}

// The reaper as deployed (not disabled, its real interval): a put that stalls
// after its first chunk is reclaimed after --put_timeout, its stream ends
// ABORTED, and its reservation and metrics say so.
TEST(CachestoreProcessTest, TheReaperReclaimsAStalledPutAfterPutTimeout) {
  std::unique_ptr<Process> server = StartCachestore({"--put_timeout=1s"});
  ASSERT_NE(server, nullptr);
  {
    // The call is scoped: a live ClientContext keeps the stream (and with it
    // the server's drain) open after the status arrived.
    auto stub = v1::CacheStore::NewStub(grpc::CreateChannel(Target(*server), grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    ctx.set_deadline(Deadline());
    v1::PutResponse resp;
    auto writer = stub->Put(&ctx, &resp);
    v1::PutRequest header;
    v1::PutHeader* h = header.mutable_header();
    h->mutable_namespace_()->set_model_fingerprint("fp");
    h->mutable_namespace_()->set_page_size(16);
    h->set_entry_class(v1::ENTRY_CLASS_STATE);
    h->set_state_kind(v1::STATE_KIND_EXACT_PREFIX);
    h->add_token_ids(5);
    h->set_position(1);
    h->set_size_bytes(1 << 20);
    ASSERT_TRUE(writer->Write(header));
    v1::PutRequest chunk;
    chunk.mutable_chunk()->set_offset(0);
    chunk.mutable_chunk()->set_data(std::string(1000, 'x'));
    ASSERT_TRUE(writer->Write(chunk));
    // Then nothing: Finish returns when the server ends the stream.
    const grpc::Status s = writer->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::ABORTED) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr("reclaimed"));
    EXPECT_THAT(s.error_message(), HasSubstr("put_timeout (1s)"));
  }
  cachestore::GrpcCacheClientOptions options;
  options.timeout = kDeadline;
  auto client = cachestore::GrpcCacheClient::Create(Target(*server), options);
  ASSERT_TRUE(client.ok());
  absl::StatusOr<cachestore::IndexStats> stats = (*client)->Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->expired_puts, 1);
  EXPECT_EQ(stats->active_puts, 0);
  EXPECT_EQ(stats->states.reserved_bytes, 0);
  EXPECT_EQ(stats->states.entries, 0);
  const int metrics_port = std::stoi(server->field("metrics_port"));
  EXPECT_TRUE(WaitFor([&] {
    auto m = ScrapeMetrics(metrics_port);
    return m.ok() && (*m)["hybridserve_cache_expired_puts_total"] == 1 &&
           (*m)["hybridserve_cache_puts_total{outcome=\"error\"}"] == 1 &&
           (*m)["hybridserve_cache_bytes{class=\"state\",state=\"reserved\"}"] == 0;
  })) << "metrics of the reclaimed put";
  client->reset();  // an open channel would hold the drain until its grace
  EXPECT_EQ(server->Terminate(), 0) << server->log();
}

// SIGTERM with a streaming Get in flight (a 48 MiB state its reader has not
// drained): health goes NOT_SERVING, new calls are refused, the Get still
// delivers every byte, and the process exits 0.
TEST(CachestoreProcessTest, SigtermDrainsAnInFlightGetAndRefusesNewCalls) {
  std::unique_ptr<Process> server = StartCachestore({"--shutdown_grace=60s"});
  ASSERT_NE(server, nullptr);
  const std::string target = Target(*server);
  cachestore::GrpcCacheClientOptions options;
  options.timeout = kDeadline;
  auto client = cachestore::GrpcCacheClient::Create(target, options);
  ASSERT_TRUE(client.ok());
  cachestore::ClientNamespace ns{"fp", "", "", 16};
  cachestore::ClientPut state;
  state.entry_class = cachestore::EntryClass::kState;
  state.tokens = {1, 2, 3};
  state.position = 3;
  std::string bytes(48 << 20, '\0');
  for (size_t i = 0; i < bytes.size(); i += 4096) bytes[i] = static_cast<char>(i >> 12);
  ASSERT_TRUE((*client)->Put(ns, state, bytes).ok());
  auto lookup = (*client)->Lookup(ns, {1, 2, 3}, cachestore::LookupMode::kLease);
  ASSERT_TRUE(lookup.ok() && lookup->state.has_value()) << lookup.status();

  // The Get starts; the reader takes one 64 KiB chunk and stops reading, so
  // the server's writes wait on flow control.
  auto stub = v1::CacheStore::NewStub(grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
  auto get_ctx = std::make_unique<grpc::ClientContext>();
  get_ctx->set_deadline(Deadline());
  v1::GetRequest get;
  get.set_lease_id(lookup->lease_id);
  get.set_key(lookup->state->key.ToBytes());
  get.set_chunk_bytes(64 << 10);
  auto reader = stub->Get(get_ctx.get(), get);
  v1::GetResponse msg;
  ASSERT_TRUE(reader->Read(&msg));
  ASSERT_EQ(msg.size_bytes(), bytes.size());
  std::string received = msg.data();

  auto watch = std::make_unique<RawStream>(target, "/grpc.health.v1.Health/Watch", "");
  ASSERT_TRUE(watch->WaitForResponse([](const std::string& r) { return r == kServing; }));

  ASSERT_EQ(kill(server->pid(), SIGTERM), 0);
  EXPECT_TRUE(watch->WaitForResponse([](const std::string& r) { return r == kNotServing; }))
      << "health did not go NOT_SERVING";
  watch.reset();  // a watch never ends by itself; it would hold the drain
  // New calls are refused: UNAVAILABLE once the drain has closed the
  // listener. A call that meets the instant the drain begins may still be
  // served or be CANCELLED by gRPC; the wait is for UNAVAILABLE, and no other
  // code may appear on the way.
  std::vector<std::string> unexpected;
  EXPECT_TRUE(WaitFor([&] {
    auto fresh = cachestore::GrpcCacheClient::Create(target, options);
    if (!fresh.ok()) return false;
    const absl::Status refused = (*fresh)->Stats().status();
    if (!refused.ok() && refused.code() != absl::StatusCode::kUnavailable &&
        refused.code() != absl::StatusCode::kCancelled) {
      unexpected.push_back(refused.ToString());
    }
    return refused.code() == absl::StatusCode::kUnavailable;
  })) << "new calls were not refused with UNAVAILABLE";
  EXPECT_THAT(unexpected, ::testing::IsEmpty());

  // The in-flight Get still delivers every byte.
  while (reader->Read(&msg)) {
    ASSERT_EQ(msg.offset(), received.size());
    received += msg.data();
  }
  const grpc::Status s = reader->Finish();
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(received.size(), bytes.size());
  EXPECT_TRUE(received == bytes);
  // Open channels would hold the end of the drain until its grace.
  reader.reset();
  get_ctx.reset();
  stub.reset();
  client->reset();
  EXPECT_EQ(server->Terminate(kDeadline), 0) << server->log();
}

}  // namespace
}  // namespace hybridserve::e2e
