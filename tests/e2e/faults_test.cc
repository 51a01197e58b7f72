// Faults on the real stack. Each ends with every accepted request finished
// exactly once (tokens, or a clear status), nothing left running on decode
// or queued on prefill, and the stack serving again.

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/prefill.grpc.pb.h"
#include "tests/e2e/stack.h"

namespace hybridserve::e2e {
namespace {

int MetricsPort(Process* p) { return std::stoi(p->field("metrics_port")); }

// Each outcome is exactly one of: a completed stream (any finish reason) or
// a failed RPC with a status and no final message.
void ExpectFinishedOnce(const Generation& g, const std::string& what) {
  if (g.status.ok()) {
    EXPECT_TRUE(g.completed) << what << ": a stream that ended OK must carry its final message";
  } else {
    EXPECT_FALSE(g.completed) << what;
    EXPECT_FALSE(g.status.error_message().empty()) << what;
  }
}

// Runs `n` requests with long prompts concurrently; returns their outcomes.
std::vector<Generation> RunConcurrently(const std::string& target, int n, int prompt_tokens, int max_tokens,
                                        const std::string& tag, std::function<void()> during) {
  std::vector<Generation> out(n);
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      v1::GenerateRequest r = Request(absl::StrCat(tag, "-", i), TextPrompt(prompt_tokens + 13 * i, i), max_tokens);
      r.set_cache_salt(tag);
      out[i] = Generate(target, r);
    });
  }
  during();
  for (std::thread& t : threads) t.join();
  return out;
}

TEST(FaultsTest, KillPrefillMidRequestsThenRestart) {
  auto s = Stack::Start(StackOptions{});
  ASSERT_TRUE(s.ok()) << s.status();
  Stack& stack = **s;
  std::vector<Generation> out = RunConcurrently(stack.decode_target(), 6, 3000, 8, "killprefill", [&] {
    absl::SleepFor(absl::Milliseconds(150));
    stack.prefill()->Kill();
  });
  int failed = 0;
  for (int i = 0; i < 6; ++i) {
    ExpectFinishedOnce(out[i], absl::StrCat("request ", i));
    if (!out[i].status.ok() || out[i].complete.finish_reason() == v1::FINISH_REASON_ERROR) ++failed;
  }
  EXPECT_GT(failed, 0) << "the kill came after every request had finished: the test proves nothing";
  const int decode_metrics = MetricsPort(stack.decode());
  EXPECT_EQ(AwaitMetric(decode_metrics, "hybridserve_num_requests_running", 0), 0);
  EXPECT_EQ(AwaitMetric(decode_metrics, "hybridserve_num_requests_waiting", 0), 0);
  // Every reservation is back: all KV pages (--max_pages 4096) and state slots (--max_batch 8) free.
  EXPECT_EQ(AwaitMetric(decode_metrics, "hybridserve_kv_pages_free", 4096), 4096);
  EXPECT_EQ(AwaitMetric(decode_metrics, "hybridserve_state_slots_free", 8), 8);
  ASSERT_TRUE(stack.RestartPrefill().ok());
  Generation after = Generate(stack.decode_target(), Request("after-kill", TextPrompt(50, 1), 6));
  EXPECT_TRUE(after.status.ok()) << after.status.error_message();
  EXPECT_EQ(after.complete.finish_reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(after.tokens.size(), 6u);
}

TEST(FaultsTest, KillDecodeMidRequestsLeavesPrefillServing) {
  auto s = Stack::Start(StackOptions{});
  ASSERT_TRUE(s.ok()) << s.status();
  Stack& stack = **s;
  std::vector<Generation> out = RunConcurrently(stack.decode_target(), 4, 3000, 8, "killdecode", [&] {
    absl::SleepFor(absl::Milliseconds(150));
    stack.decode()->Kill();
  });
  for (int i = 0; i < 4; ++i) {
    EXPECT_FALSE(out[i].status.ok() && out[i].completed && out[i].tokens.empty()) << i;
  }
  // Prefill drains its queue (pushes to a dead peer fail within the data
  // plane's timeouts) and serves a new decode worker.
  const int prefill_metrics = MetricsPort(stack.prefill());
  EXPECT_EQ(AwaitMetric(prefill_metrics, "hybridserve_prefill_queue_depth", 0, absl::Seconds(30)), 0);
  auto d = Process::Start("decode2", "decode/decode",
                          {"--model_dir=" + Runfile("models/default"), "--address=127.0.0.1:0", "--threads=1",
                           absl::StrCat("--prefill=127.0.0.1:", stack.prefill()->port()),
                           absl::StrCat("--cachestore=127.0.0.1:", stack.cachestore()->port())},
                          "DECODE_READY");
  ASSERT_TRUE(d.ok()) << d.status();
  Generation after =
      Generate(absl::StrCat("127.0.0.1:", (*d)->port()), Request("after-decode-kill", TextPrompt(50, 2), 6));
  EXPECT_TRUE(after.status.ok()) << after.status.error_message();
  EXPECT_EQ(after.tokens.size(), 6u);
}

TEST(FaultsTest, CachestoreKilledAndRestartedDuringTrafficMeansMissesNotFailures) {
  auto s = Stack::Start(StackOptions{});
  ASSERT_TRUE(s.ok()) << s.status();
  Stack& stack = **s;
  std::vector<int32_t> conversation = TextPrompt(200, 3);
  Generation t1 = Generate(stack.decode_target(), Request("cs-1", conversation, 10));
  ASSERT_TRUE(t1.status.ok());
  conversation.insert(conversation.end(), t1.tokens.begin(), t1.tokens.end());
  std::vector<Generation> out = RunConcurrently(stack.decode_target(), 4, 500, 10, "cskill", [&] {
    absl::SleepFor(absl::Milliseconds(50));
    stack.cachestore()->Kill();
  });
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(out[i].status.ok()) << out[i].status.error_message();
    EXPECT_EQ(out[i].complete.finish_reason(), v1::FINISH_REASON_LENGTH) << i;
  }
  // With the cachestore down: a miss, not a failure.
  Generation down = Generate(stack.decode_target(), Request("cs-2", conversation, 10));
  ASSERT_TRUE(down.status.ok()) << down.status.error_message();
  EXPECT_EQ(down.complete.finish_reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(down.complete.usage().resume_kind(), v1::RESUME_KIND_COLD);
  EXPECT_GT(Metric(MetricsPort(stack.prefill()), "hybridserve_prefill_cache_errors_total"), 0);
  // Back up (empty): the next turn is cold again, the one after resumes.
  ASSERT_TRUE(stack.RestartCachestore().ok());
  conversation.insert(conversation.end(), down.tokens.begin(), down.tokens.end());
  Generation t3 = Generate(stack.decode_target(), Request("cs-3", conversation, 10));
  ASSERT_TRUE(t3.status.ok()) << t3.status.error_message();
  conversation.insert(conversation.end(), t3.tokens.begin(), t3.tokens.end());
  Generation t4;
  for (int attempt = 0; attempt < 50; ++attempt) {  // the channels reconnect within their backoff
    t4 = Generate(stack.decode_target(), Request(absl::StrCat("cs-4-", attempt), conversation, 4));
    if (t4.status.ok() && t4.complete.usage().resume_kind() == v1::RESUME_KIND_EXACT_PREFIX) break;
    conversation.insert(conversation.end(), t4.tokens.begin(), t4.tokens.end());
    absl::SleepFor(absl::Milliseconds(200));
  }
  EXPECT_EQ(t4.complete.usage().resume_kind(), v1::RESUME_KIND_EXACT_PREFIX);
}

// A prefill worker that accepts every call and never answers.
class SilentPrefill final : public v1::Prefill::Service {
 public:
  grpc::Status Prefill(grpc::ServerContext* context, const v1::PrefillRequest*, v1::PrefillResponse*) override {
    calls_.fetch_add(1);
    while (!context->IsCancelled()) absl::SleepFor(absl::Milliseconds(10));
    return grpc::Status(grpc::StatusCode::CANCELLED, "gone");
  }
  std::atomic<int> calls_{0};
};

TEST(FaultsTest, PrefillThatNeverAnswersFailsTheRequestWithinTheTransferTimeout) {
  SilentPrefill silent;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&silent);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(port, 0);
  auto d = Process::Start(
      "decode-silent", "decode/decode",
      {"--model_dir=" + Runfile("models/default"), "--address=127.0.0.1:0", "--threads=1",
       "--metrics_address=127.0.0.1:0", absl::StrCat("--prefill=127.0.0.1:", port), "--transfer_timeout=2s"},
      "DECODE_READY");
  ASSERT_TRUE(d.ok()) << d.status();
  const std::string target = absl::StrCat("127.0.0.1:", (*d)->port());
  const absl::Time start = absl::Now();
  Generation g = Generate(target, Request("silent", TextPrompt(30, 1), 5));
  const absl::Duration took = absl::Now() - start;
  EXPECT_GE(silent.calls_.load(), 1);
  ExpectFinishedOnce(g, "silent");
  ASSERT_TRUE(g.status.ok()) << g.status.error_message();
  EXPECT_EQ(g.complete.finish_reason(), v1::FINISH_REASON_ERROR);
  EXPECT_NE(g.complete.error_message().find("prefill"), std::string::npos) << g.complete.error_message();
  EXPECT_LT(took, absl::Seconds(20));
  EXPECT_EQ(AwaitMetric(MetricsPort(d->get()), "hybridserve_num_requests_running", 0), 0);
  EXPECT_EQ(AwaitMetric(MetricsPort(d->get()), "hybridserve_kv_pages_free", 4096), 4096);
  EXPECT_EQ(AwaitMetric(MetricsPort(d->get()), "hybridserve_state_slots_free", 8), 8);
  server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
}

TEST(FaultsTest, SigtermDrainsUnderLoad) {
  // A grace period far above the six generations' time, however slow the
  // build (ASan) or loaded the machine: the test checks that the drain lets
  // in-flight requests finish, not how fast they are (5 s was too short
  // under ASan on a busy 2-core machine: the drain cancelled them).
  StackOptions options;
  options.decode_args = {"--shutdown_grace=120s"};
  auto s = Stack::Start(options);
  ASSERT_TRUE(s.ok()) << s.status();
  Stack& stack = **s;
  const std::string target = stack.decode_target();
  Generation refused;
  double running_at_sigterm = -1;
  // Long generations, and SIGTERM only once all six are running: the drain is
  // under way (not already over) when the next request arrives, however fast
  // or loaded the machine.
  constexpr int kTokens = 1000;
  std::vector<Generation> out = RunConcurrently(target, 6, 100, kTokens, "drain", [&] {
    running_at_sigterm = AwaitMetric(MetricsPort(stack.decode()), "hybridserve_num_requests_running", 6);
    kill(stack.decode()->pid(), SIGTERM);
    absl::SleepFor(absl::Milliseconds(100));
    refused = Generate(target, Request("after-sigterm", TextPrompt(10, 1), 3));
  });
  ASSERT_EQ(running_at_sigterm, 6) << "the six requests never ran at once: the test proves nothing";
  // Every in-flight request finished normally within the grace period.
  for (int i = 0; i < 6; ++i) {
    ASSERT_TRUE(out[i].status.ok()) << i << ": " << out[i].status.error_message();
    EXPECT_EQ(out[i].complete.finish_reason(), v1::FINISH_REASON_LENGTH) << i;
    EXPECT_EQ(out[i].tokens.size(), static_cast<size_t>(kTokens)) << i;
  }
  // A new request during the drain is refused (UNAVAILABLE: draining or the
  // listener already closed).
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::UNAVAILABLE) << refused.status.error_message();
  EXPECT_EQ(stack.decode()->Terminate(), 0) << stack.decode()->log();
  EXPECT_EQ(stack.prefill()->Terminate(), 0);
  EXPECT_EQ(stack.cachestore()->Terminate(), 0);
}

}  // namespace
}  // namespace hybridserve::e2e
