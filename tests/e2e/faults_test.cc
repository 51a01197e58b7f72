// Faults on the real stack. Each ends with every accepted request finished
// exactly once (tokens, or a clear status), nothing left running on decode
// or queued on prefill, and the stack serving again.

#include <algorithm>
#include <atomic>
#include <iostream>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/health.h"
#include "common/sanitizers.h"
#include "common/wait_for.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/cachestore.grpc.pb.h"
#include "proto/prefill.grpc.pb.h"
#include "tests/e2e/stack.h"

namespace hybridserve::e2e {
namespace {

// Each outcome is exactly one of: a completed stream (any finish reason) or
// a failed RPC with a status and no final message. One overlap is gRPC's:
// a client deadline can strike after the final message arrived and before
// the server's OK did. That message then says how the request really ended:
// aborted (the deadline reached the server first) or, when it finished just
// in time, normally (seen with a 16,001-token Mamba2 prompt done in 250 ms).
void ExpectFinishedOnce(const Generation& g, const std::string& what) {
  if (g.status.ok()) {
    EXPECT_TRUE(g.completed) << what << ": a stream that ended OK must carry its final message";
  } else if (g.status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED && g.completed) {
    const v1::FinishReason reason = g.complete.finish_reason();
    EXPECT_TRUE(reason == v1::FINISH_REASON_ABORT || reason == v1::FINISH_REASON_LENGTH ||
                reason == v1::FINISH_REASON_STOP)
        << what << ": finish reason " << reason;
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

// The faults that strike work in flight, on every model shape.
class ShapeFaultsTest : public ::testing::TestWithParam<ModelShape> {
 protected:
  StackOptions Options() const {
    StackOptions o;
    o.shape = GetParam();
    return o;
  }
};

// With the fallback prefill off (--fallback_prefill_max_tokens=0), requests
// whose prefill worker was killed fail, and the restarted worker serves.
TEST_P(ShapeFaultsTest, KillPrefillMidRequestsThenRestart) {
  StackOptions options = Options();
  options.decode_args = {"--fallback_prefill_max_tokens=0"};
  auto s = Stack::Start(options);
  ASSERT_TRUE(s.ok()) << s.status();
  Stack& stack = **s;
  const int prefill_metrics = MetricsPort(stack.prefill());
  double queued_at_kill = -1;
  std::vector<Generation> out = RunConcurrently(stack.decode_target(), 6, 3000, 8, "killprefill", [&] {
    // Killed with prefill calls in flight (admitted: queued or running).
    queued_at_kill = AwaitMetricAtLeast(prefill_metrics, "hybridserve_prefill_queue_depth", 2);
    stack.prefill()->Kill();
  });
  EXPECT_GE(queued_at_kill, 2) << "the kill struck no prefill call in flight";
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

// Degrade, don't fail: with default flags, kill -9 of the only prefill
// worker while 12 streams are prefilling or decoding ends none of them with
// an error: decode prefills the requests whose call failed itself
// (--fallback_prefill_max_tokens), and each stream's tokens are those of
// the same prompt uncached (a fresh salt, after the restart). A prefill
// worker started again takes the next requests: the fallback counter stops.
TEST(FaultsTest, KillTheOnlyPrefillWorkerMidStreamsAndDecodePrefillsThemItself) {
  auto s = Stack::Start(StackOptions());
  ASSERT_TRUE(s.ok()) << s.status();
  Stack& stack = **s;
  const int prefill_metrics = MetricsPort(stack.prefill());
  const int decode_metrics = MetricsPort(stack.decode());
  const std::string fallbacks = "hybridserve_decode_fallback_prefills_total";
  EXPECT_EQ(MetricSum(decode_metrics, fallbacks), 0);
  constexpr int kStreams = 12, kPrompt = 3000, kTokens = 8;
  double queued_at_kill = -1;
  std::vector<Generation> out = RunConcurrently(stack.decode_target(), kStreams, kPrompt, kTokens, "degrade", [&] {
    // Killed with prefill calls in flight (admitted: queued or running).
    queued_at_kill = AwaitMetricAtLeast(prefill_metrics, "hybridserve_prefill_queue_depth", 2);
    stack.prefill()->Kill();
  });
  ASSERT_GE(queued_at_kill, 2) << "the kill struck no prefill call in flight: the test proves nothing";
  int errors = 0;
  for (int i = 0; i < kStreams; ++i) {
    ExpectFinishedOnce(out[i], absl::StrCat("request ", i));
    EXPECT_TRUE(out[i].status.ok()) << i << ": " << out[i].status.error_message();
    if (out[i].complete.finish_reason() == v1::FINISH_REASON_ERROR) {
      ++errors;
      ADD_FAILURE() << "request " << i << " ended with an error: " << out[i].complete.error_message();
    }
    EXPECT_EQ(out[i].tokens.size(), static_cast<size_t>(kTokens)) << i;
  }
  EXPECT_EQ(errors, 0);
  // The kill struck calls that decode then prefilled itself.
  const std::optional<double> fell_back = MetricSum(decode_metrics, fallbacks);
  ASSERT_TRUE(fell_back.has_value());
  EXPECT_GT(*fell_back, 0) << "no request was prefilled by decode: the kill struck nothing";
  std::cout << "kill -9 of the only prefill worker with " << queued_at_kill << " calls queued: " << *fell_back << " of "
            << kStreams << " streams prefilled by decode, " << errors << " errors" << std::endl;
  EXPECT_EQ(MetricSum(decode_metrics, "hybridserve_decode_fallback_prefill_failures_total"), 0);
  EXPECT_EQ(AwaitMetric(decode_metrics, "hybridserve_num_requests_running", 0), 0);
  EXPECT_EQ(AwaitMetric(decode_metrics, "hybridserve_kv_pages_free", 4096), 4096);
  EXPECT_EQ(AwaitMetric(decode_metrics, "hybridserve_state_slots_free", 8), 8);

  // A prefill worker again: it takes the next requests, decode prefills none.
  // Decode calls the pool again at once, and its channel reaches the new
  // worker within the reconnect backoff (at most 1 s); until then a call
  // may still fail at once and be prefilled by decode. So: once a request
  // has been served by the new worker, every later one is.
  ASSERT_TRUE(stack.RestartPrefill().ok());
  const int new_prefill_metrics = MetricsPort(stack.prefill());
  const std::string pool_ok = "hybridserve_prefill_requests_total{outcome=\"ok\"}";
  int probes = 0;
  EXPECT_TRUE(common::WaitFor([&] {
    // A namespace of its own: nothing cached, so never a local prefill.
    v1::GenerateRequest r = Request(absl::StrCat("probe-", probes), TextPrompt(50, 1), 2);
    r.set_cache_salt(absl::StrCat("probe-", probes++));
    Generation g = Generate(stack.decode_target(), r);
    return g.status.ok() && Metric(new_prefill_metrics, pool_ok) >= 1;
  })) << "the restarted prefill worker never served a request";
  const std::optional<double> fell_back_before = MetricSum(decode_metrics, fallbacks);
  const double served_before = Metric(new_prefill_metrics, pool_ok);
  for (int i = 0; i < kStreams; ++i) {
    // The uncached answer: the same prompt in a namespace of its own.
    v1::GenerateRequest r = Request(absl::StrCat("uncached-", i), TextPrompt(kPrompt + 13 * i, i), kTokens);
    r.set_cache_salt(absl::StrCat("uncached-", i));
    Generation g = Generate(stack.decode_target(), r);
    ASSERT_TRUE(g.status.ok()) << g.status.error_message();
    EXPECT_EQ(g.complete.finish_reason(), v1::FINISH_REASON_LENGTH) << g.complete.error_message();
    EXPECT_EQ(g.complete.usage().cached_tokens(), 0) << i;
    EXPECT_EQ(out[i].tokens, g.tokens) << "request " << i;
  }
  EXPECT_EQ(MetricSum(decode_metrics, fallbacks), fell_back_before);
  EXPECT_EQ(AwaitMetric(new_prefill_metrics, pool_ok, served_before + kStreams), served_before + kStreams);
  std::cout << "after the restart: " << probes << " probe requests until the new worker served one, "
            << *fell_back_before - *fell_back << " of them prefilled by decode" << std::endl;
}

TEST_P(ShapeFaultsTest, KillDecodeMidRequestsLeavesPrefillServing) {
  auto s = Stack::Start(Options());
  ASSERT_TRUE(s.ok()) << s.status();
  Stack& stack = **s;
  const int prefill_metrics = MetricsPort(stack.prefill());
  // Idle, every page and slot of prefill's engine is free.
  const double idle_pages = Metric(prefill_metrics, "hybridserve_prefill_kv_pages_free");
  const double idle_slots = Metric(prefill_metrics, "hybridserve_prefill_state_slots_free");
  ASSERT_GT(idle_pages, 0);
  ASSERT_GT(idle_slots, 0);
  double queued_at_kill = -1;
  std::vector<Generation> out = RunConcurrently(stack.decode_target(), 4, 3000, 8, "killdecode", [&] {
    // Killed with prefill calls in flight: their pushes go to a dead peer.
    queued_at_kill = AwaitMetricAtLeast(prefill_metrics, "hybridserve_prefill_queue_depth", 2);
    stack.decode()->Kill();
  });
  ASSERT_GE(queued_at_kill, 2) << "the kill struck no prefill call in flight: the test proves nothing";
  int cut = 0;
  for (int i = 0; i < 4; ++i) {
    // The client sees its stream break (decode is gone), never an OK stream
    // without its final message.
    ExpectFinishedOnce(out[i], absl::StrCat("request ", i));
    if (!out[i].status.ok()) ++cut;
  }
  EXPECT_GT(cut, 0) << "every request finished before the kill";
  // Prefill abandons the calls (pushes to a dead peer fail within the data
  // plane's timeouts), frees every page and slot they held, and serves a new
  // decode worker.
  EXPECT_EQ(AwaitMetric(prefill_metrics, "hybridserve_prefill_queue_depth", 0, absl::Seconds(30)), 0);
  // Calls in flight at the kill were abandoned: cancelled (their caller is
  // gone) or their push failed.
  EXPECT_GE(Metric(prefill_metrics, "hybridserve_prefill_requests_total{outcome=\"cancelled\"}") +
                Metric(prefill_metrics, "hybridserve_prefill_transfer_failures_total"),
            1);
  EXPECT_EQ(AwaitMetric(prefill_metrics, "hybridserve_prefill_kv_pages_free", idle_pages), idle_pages);
  EXPECT_EQ(AwaitMetric(prefill_metrics, "hybridserve_prefill_state_slots_free", idle_slots), idle_slots);
  auto d = Process::Start(
      "decode2", "decode/decode",
      {"--model_dir=" + Runfile(GetParam().model_dir), absl::StrCat("--page_size=", GetParam().page_size),
       "--address=127.0.0.1:0", "--threads=1", absl::StrCat("--prefill=127.0.0.1:", stack.prefill()->port()),
       absl::StrCat("--cachestore=127.0.0.1:", stack.cachestore()->port())},
      "DECODE_READY");
  ASSERT_TRUE(d.ok()) << d.status();
  Generation after =
      Generate(absl::StrCat("127.0.0.1:", (*d)->port()), Request("after-decode-kill", TextPrompt(50, 2), 6));
  EXPECT_TRUE(after.status.ok()) << after.status.error_message();
  EXPECT_EQ(after.tokens.size(), 6u);
}

// The cachestore dies under four threads of chats, stays down while each
// plays two more turns, and comes back, empty, on its port. Every request
// succeeds throughout (a dead cache is a miss, never a failure), requests
// during the outage hit it (prefill's cache errors rise while they run), and
// every conversation resumes from the cache again after its return. Turn
// ends during the outage do not wait for prefill pages that cannot come
// (prefill's failed lookup tells decode to publish on its own). Each chat
// resumes within a generous bound of the return (5 s, 10 s under
// sanitizers; the reconnect itself takes about a second). Latencies of the
// healthy, down and recovery phases are printed.
TEST_P(ShapeFaultsTest, CachestoreKilledAndRestartedDuringTrafficMeansMissesNotFailures) {
  auto s = Stack::Start(Options());
  ASSERT_TRUE(s.ok()) << s.status();
  Stack& stack = **s;
  const int prefill_metrics = MetricsPort(stack.prefill());
  const int decode_metrics = MetricsPort(stack.decode());
  constexpr int kChats = 4;
  enum Phase { kHealthy = 0, kDown = 1, kBack = 2 };
  std::atomic<int> phase{kHealthy};
  absl::Mutex mu;
  int turns[3][kChats] = {};
  std::vector<double> latency_ms[3];
  std::vector<std::string> failures;
  bool resumed_after_return[kChats] = {};
  int turns_to_resume[kChats] = {};
  absl::Time returned = absl::InfiniteFuture();
  absl::Duration to_resume[kChats] = {};
  std::vector<std::thread> chats;
  for (int c = 0; c < kChats; ++c) {
    chats.emplace_back([&, c] {
      std::vector<int32_t> conversation = TextPrompt(150 + 7 * c, c);
      for (int turn = 0; turn < 300; ++turn) {
        const int at = phase.load();
        v1::GenerateRequest r = Request(absl::StrCat("chat-", c, "-", turn), conversation, 8);
        r.set_cache_salt(absl::StrCat("chat-", c));
        const absl::Time start = absl::Now();
        Generation g = Generate(stack.decode_target(), r);
        const double ms = absl::ToDoubleMilliseconds(absl::Now() - start);
        absl::MutexLock lock(&mu);
        if (!g.status.ok() || !g.completed || g.complete.finish_reason() != v1::FINISH_REASON_LENGTH) {
          failures.push_back(absl::StrCat("chat ", c, " turn ", turn, ": ", g.status.error_message(), " ",
                                          g.complete.error_message()));
          return;
        }
        ++turns[at][c];
        latency_ms[at].push_back(ms);
        if (at == kBack && g.complete.usage().resume_kind() == v1::RESUME_KIND_EXACT_PREFIX) {
          resumed_after_return[c] = true;
          turns_to_resume[c] = turns[at][c];
          to_resume[c] = absl::Now() - returned;
          return;
        }
        conversation.insert(conversation.end(), g.tokens.begin(), g.tokens.end());
        const std::vector<int32_t> more = TextPrompt(11, turn);
        conversation.insert(conversation.end(), more.begin() + 1, more.end());
      }
    });
  }
  auto each_chat_played = [&](int at, int n) {
    absl::MutexLock lock(&mu);
    auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      if (!failures.empty()) return true;
      for (int c = 0; c < kChats; ++c) {
        if (turns[at][c] < n) return false;
      }
      return true;
    };
    return mu.AwaitWithTimeout(absl::Condition(&done), absl::Seconds(120)) && failures.empty();
  };
  ASSERT_TRUE(each_chat_played(kHealthy, 2)) << "chats did not get going";
  const double errors_before = Metric(prefill_metrics, "hybridserve_prefill_cache_errors_total");
  stack.cachestore()->Kill();
  phase = kDown;  // every turn counted as "down" starts with the cachestore dead
  const bool played_down = each_chat_played(kDown, 2);
  const double errors_down = Metric(prefill_metrics, "hybridserve_prefill_cache_errors_total");
  ASSERT_TRUE(stack.RestartCachestore().ok());
  {
    absl::MutexLock lock(&mu);
    returned = absl::Now();
  }
  phase = kBack;
  for (std::thread& t : chats) t.join();
  EXPECT_TRUE(played_down);
  for (const std::string& f : failures) ADD_FAILURE() << f;
  // The outage struck the requests: every turn played while it was down had
  // its lookup fail (a dead cachestore refuses at once; it is never skipped).
  EXPECT_GE(errors_down - errors_before, 2 * kChats);
  // The clients reconnect within about a second of the return (README,
  // max_reconnect_backoff); a chat's first resume after it also waits out
  // the turn in flight and the turn end it publishes (well under a second
  // here). Generous bounds, for a loaded 2-core machine and the sanitizers'
  // slowdown.
  const absl::Duration resume_bound = common::kSanitized ? absl::Seconds(10) : absl::Seconds(5);
  for (int c = 0; c < kChats; ++c) {
    EXPECT_TRUE(resumed_after_return[c]) << "chat " << c << " never resumed from the cache after its return";
    if (resumed_after_return[c]) {
      EXPECT_LE(to_resume[c], resume_bound)
          << "chat " << c << " resumed from the cache only " << absl::ToDoubleMilliseconds(to_resume[c])
          << " ms after the cachestore's return";
    }
  }
  EXPECT_EQ(MetricSum(decode_metrics, "hybridserve_request_errors_total"), 0);
  // No turn end waited for a prefill page that could not come (it was 2 s
  // each, one after another, on decode's publisher: 13 s without a request
  // served).
  EXPECT_EQ(Metric(decode_metrics, "hybridserve_decode_publish_parent_waits_expired_total"), 0);
  auto p99 = [](std::vector<double> v) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, static_cast<size_t>(0.99 * v.size()))];
  };
  auto max = [](const std::vector<double>& v) { return v.empty() ? 0.0 : *std::max_element(v.begin(), v.end()); };
  std::cout << GetParam().name << ": cachestore outage: healthy p99 " << p99(latency_ms[kHealthy]) << " ms ("
            << latency_ms[kHealthy].size() << " turns); down p99 " << p99(latency_ms[kDown]) << " ms, max "
            << max(latency_ms[kDown]) << " ms (" << latency_ms[kDown].size() << " turns); after return max "
            << max(latency_ms[kBack]) << " ms (" << latency_ms[kBack].size()
            << " turns); each chat resumed from the cache after its return within:";
  for (int c = 0; c < kChats; ++c) {
    std::cout << " " << absl::ToDoubleMilliseconds(to_resume[c]) << " ms (" << turns_to_resume[c] << " turns)";
  }
  std::cout << "; publications that waited out their parent: "
            << Metric(decode_metrics, "hybridserve_decode_publish_parent_waits_expired_total") << std::endl;
}

// Clients that cancel must not fail other clients' requests. Prefill's queue
// holds exactly decode's batch (--max_queue=7: 8 calls at once), so one call
// left running for a request that ended makes the worker refuse the next
// request decode admits. Three rounds: 8 long prompts whose clients give up
// after 250 ms (their requests end while prefilling or waiting for room: the
// worker prefills one at a time; on a loaded machine a shorter deadline could
// lapse before a call reaches decode at all, and strike nothing),
// then 8 fresh requests at once: each fresh one completes normally. Proof that the cancels struck
// prefill work: prefill counts cancelled calls, decode counts the aborts.
TEST_P(ShapeFaultsTest, CancelledRequestsCancelTheirPrefillCallsAndNeverFailOthers) {
  StackOptions options = Options();
  options.prefill_args = {"--max_queue=7"};
  auto s = Stack::Start(options);
  ASSERT_TRUE(s.ok()) << s.status();
  Stack& stack = **s;
  const int prefill_metrics = MetricsPort(stack.prefill());
  const int decode_metrics = MetricsPort(stack.decode());
  const std::string cancelled = "hybridserve_prefill_requests_total{outcome=\"cancelled\"}";
  const std::string aborted = "hybridserve_request_success_total{finished_reason=\"abort\"}";
  // Prompts that keep prefill busy past 100 ms: 8,000 tokens (the attention
  // models' context is 8,192), 16,000 for the Mamba2 models, which have no
  // context limit and prefill fastest.
  const int long_prompt = GetParam().attention ? 8000 : 16000;
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    const double cancelled_before = std::max(0.0, Metric(prefill_metrics, cancelled));
    const double aborted_before = Metric(decode_metrics, aborted);
    std::vector<std::thread> impatient;
    std::vector<Generation> gave_up(8);
    for (int i = 0; i < 8; ++i) {
      impatient.emplace_back([&, i] {
        v1::GenerateRequest r = Request(absl::StrCat("impatient-", round, "-", i), TextPrompt(long_prompt + i, i), 4);
        r.set_cache_salt(absl::StrCat("impatient-", round, "-", i));
        gave_up[i] = Generate(stack.decode_target(), r, absl::Milliseconds(250));
      });
    }
    for (std::thread& t : impatient) t.join();
    for (int i = 0; i < 8; ++i) ExpectFinishedOnce(gave_up[i], absl::StrCat("impatient ", i));
    std::vector<Generation> fresh(8);
    std::vector<std::thread> patient;
    for (int i = 0; i < 8; ++i) {
      patient.emplace_back([&, i] {
        v1::GenerateRequest r = Request(absl::StrCat("patient-", round, "-", i), TextPrompt(40 + i, i), 6);
        fresh[i] = Generate(stack.decode_target(), r);
      });
    }
    for (std::thread& t : patient) t.join();
    for (int i = 0; i < 8; ++i) {
      ASSERT_TRUE(fresh[i].status.ok()) << i << ": " << fresh[i].status.error_message();
      EXPECT_EQ(fresh[i].complete.finish_reason(), v1::FINISH_REASON_LENGTH)
          << i << ": " << fresh[i].complete.error_message();
      EXPECT_EQ(fresh[i].tokens.size(), 6u) << i;
    }
    // The cancels reached decode while the requests were prefilling, and
    // prefill abandoned calls (queued or mid-prefill) for them.
    // Prefill counts a cancelled call when it leaves the queue or stops at a
    // segment boundary, which may come after the patient requests finished:
    // wait for it (bounded) instead of reading it once.
    EXPECT_GE(Metric(decode_metrics, aborted) - aborted_before, 1);
    EXPECT_GE(
        AwaitMetricAtLeast(prefill_metrics, cancelled, cancelled_before + 1, absl::Seconds(10)) - cancelled_before, 1);
  }
  EXPECT_EQ(MetricSum(decode_metrics, "hybridserve_request_errors_total"), 0);
  EXPECT_EQ(AwaitMetric(prefill_metrics, "hybridserve_prefill_queue_depth", 0), 0);
  EXPECT_EQ(AwaitMetric(decode_metrics, "hybridserve_decode_orphaned_prefill_calls", 0), 0);
}

// The workers refuse a bad duration flag at start, naming it.
TEST(FaultsTest, NegativeWaitsAreRefusedAtStartNamingTheFlag) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"decode/decode", "--cache_failure_backoff=-1s"},
      {"decode/decode", "--prefill_unavailable_wait=-1s"},
      {"decode/decode", "--publish_parent_wait=-5ms"},
      {"prefill/prefill", "--cache_failure_backoff=-1s"},
  };
  for (const auto& [binary, flag] : cases) {
    std::vector<std::string> args = {"--model_dir=" + Runfile("models/default"), "--address=127.0.0.1:0", flag};
    if (binary == "decode/decode") args.push_back("--prefill=127.0.0.1:1");
    auto p = Process::Start("bad-flag", binary, args, "READY");
    ASSERT_FALSE(p.ok()) << binary << " started with " << flag;
    const std::string name = flag.substr(0, flag.find('='));
    EXPECT_NE(p.status().message().find(name + " must be >= 0"), std::string::npos) << p.status();
  }
}

TEST(FaultsTest, AnAdmissionIntervalOffTheEngineGridIsRefusedAtStart) {
  // The default model's engine checkpoints every 256 tokens.
  auto p = Process::Start(
      "bad-flag", "prefill/prefill",
      {"--model_dir=" + Runfile("models/default"), "--address=127.0.0.1:0", "--checkpoint_publish_interval=100"},
      "READY");
  ASSERT_FALSE(p.ok()) << "prefill started with --checkpoint_publish_interval=100";
  EXPECT_NE(p.status().message().find("--checkpoint_publish_interval=100: must be -1, 0 or a multiple"),
            std::string::npos)
      << p.status();
}

// `service` on a free loopback port (`*port`; 0 when it could not start).
std::unique_ptr<grpc::Server> ServeOnLoopback(grpc::Service* service, int* port) {
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), port);
  builder.RegisterService(service);
  return builder.BuildAndStart();
}

// A cachestore that hangs: it accepts every call and answers none until the
// caller gives up (its --cache_timeout).
class HungCachestore final : public v1::CacheStore::Service {
 public:
  grpc::Status Lookup(grpc::ServerContext* c, const v1::LookupRequest*, v1::LookupResponse*) override {
    return Hang(c);
  }
  grpc::Status Put(grpc::ServerContext* c, grpc::ServerReader<v1::PutRequest>*, v1::PutResponse*) override {
    return Hang(c);
  }
  grpc::Status Get(grpc::ServerContext* c, const v1::GetRequest*, grpc::ServerWriter<v1::GetResponse>*) override {
    return Hang(c);
  }
  grpc::Status GetMany(grpc::ServerContext* c, const v1::GetManyRequest*,
                       grpc::ServerWriter<v1::GetManyResponse>*) override {
    return Hang(c);
  }
  grpc::Status Stats(grpc::ServerContext* c, const v1::StatsRequest*, v1::StatsResponse*) override { return Hang(c); }
  std::atomic<int> calls_{0};

 private:
  grpc::Status Hang(grpc::ServerContext* c) {
    calls_.fetch_add(1);
    // The synchronous API has no cancellation callback: the fake asks.
    while (!c->IsCancelled()) absl::SleepFor(absl::Milliseconds(5));
    return grpc::Status(grpc::StatusCode::CANCELLED, "gone");
  }
};

// Both workers notice the first timeout of a hung cachestore and skip the
// cache for --cache_failure_backoff (an hour here): six requests all
// succeed, cold, and cost prefill one lookup timeout and decode one timeout
// (its local-prefill probe of the first prompt), not one each per request
// (the hung server sees the startup Stats calls and those two). Decode's
// publications then all skip the cache.
TEST(FaultsTest, AHungCachestoreCostsOneTimeoutNotOnePerRequest) {
  HungCachestore hung;
  int port = 0;
  std::unique_ptr<grpc::Server> server = ServeOnLoopback(&hung, &port);
  ASSERT_NE(port, 0);
  const std::string cache = absl::StrCat("--cachestore=127.0.0.1:", port);
  StackOptions options;
  options.cachestore = false;
  options.prefill_args = {cache, "--cache_timeout=300ms", "--cache_failure_backoff=1h"};
  options.decode_args = {cache, "--cache_timeout=300ms", "--cache_failure_backoff=1h"};
  auto s = Stack::Start(options);
  ASSERT_TRUE(s.ok()) << s.status();
  Stack& stack = **s;
  const int startup_calls = hung.calls_.load();
  for (int i = 0; i < 6; ++i) {
    Generation g = Generate(stack.decode_target(), Request(absl::StrCat("hung-", i), TextPrompt(60, i), 8));
    ASSERT_TRUE(g.status.ok()) << g.status.error_message();
    EXPECT_EQ(g.complete.finish_reason(), v1::FINISH_REASON_LENGTH) << i;
    EXPECT_EQ(g.complete.usage().resume_kind(), v1::RESUME_KIND_COLD) << i;
    EXPECT_FALSE(g.complete.usage().session().published()) << i;
  }
  const int prefill_metrics = MetricsPort(stack.prefill());
  const int decode_metrics = MetricsPort(stack.decode());
  EXPECT_EQ(Metric(prefill_metrics, "hybridserve_prefill_cache_lookups_total"), 1);
  EXPECT_EQ(Metric(decode_metrics, "hybridserve_decode_publish_failures_total{reason=\"unavailable\"}"), 6);
  EXPECT_EQ(MetricSum(decode_metrics, "hybridserve_decode_publish_failures_total"), 6);
  EXPECT_EQ(Metric(decode_metrics, "hybridserve_decode_local_prefills_total"), 0);
  EXPECT_EQ(hung.calls_.load() - startup_calls, 2);
  server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
}

// Decode's readiness says whether it can serve: a resolved prefill pool or
// the fallback prefill on. With no prefill worker resolved and no
// cachestore, the default (fallback on) is ready and answers by prefilling
// itself, as a healthy stack would (the same tokens); with
// --fallback_prefill_max_tokens=0 it is not ready (and its requests fail);
// a resolved worker, even one not up yet, makes it ready again.
TEST(FaultsTest, DecodeIsReadyWhileAPrefillWorkerIsResolvedOrTheFallbackIsOn) {
  auto decode = [](const std::string& name, const std::string& prefill, const std::string& fallback) {
    return Process::Start(name, "decode/decode",
                          {"--model_dir=" + Runfile("models/default"), "--address=127.0.0.1:0", "--threads=1",
                           "--metrics_address=127.0.0.1:0", "--prefill=" + prefill, "--prefill_unavailable_wait=0s",
                           "--fallback_prefill_max_tokens=" + fallback},
                          "DECODE_READY");
  };
  const v1::GenerateRequest request = Request("ready", TextPrompt(40, 3), 6);
  auto fallback = decode("decode-fallback", "no-such-host.invalid:1", "8192");
  ASSERT_TRUE(fallback.ok()) << fallback.status();
  const std::string fallback_target = absl::StrCat("127.0.0.1:", (*fallback)->port());
  EXPECT_TRUE(HealthServing(fallback_target));
  Generation here = Generate(fallback_target, request);
  ASSERT_TRUE(here.status.ok()) << here.status.error_message();
  EXPECT_EQ(here.complete.finish_reason(), v1::FINISH_REASON_LENGTH) << here.complete.error_message();
  EXPECT_EQ(Metric(MetricsPort(fallback->get()), "hybridserve_decode_fallback_prefills_total{reason=\"unavailable\"}"),
            1);

  auto off = decode("decode-no-fallback", "no-such-host.invalid:1", "0");
  ASSERT_TRUE(off.ok()) << off.status();
  const std::string off_target = absl::StrCat("127.0.0.1:", (*off)->port());
  EXPECT_FALSE(HealthServing(off_target));
  EXPECT_TRUE(HealthServing(off_target, common::kLivenessHealthService));  // alive, not ready
  Generation failed = Generate(off_target, request);
  ASSERT_TRUE(failed.status.ok()) << failed.status.error_message();
  EXPECT_EQ(failed.complete.finish_reason(), v1::FINISH_REASON_ERROR);
  EXPECT_NE(failed.complete.error_message().find("no prefill worker is known"), std::string::npos)
      << failed.complete.error_message();

  // A worker resolved (an address: it resolves to itself), not up: ready.
  auto resolved = decode("decode-resolved", "127.0.0.1:1", "0");
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_TRUE(HealthServing(absl::StrCat("127.0.0.1:", (*resolved)->port())));

  // The healthy stack's answer to the same request.
  auto s = Stack::Start(StackOptions());
  ASSERT_TRUE(s.ok()) << s.status();
  Generation pool = Generate((*s)->decode_target(), request);
  ASSERT_TRUE(pool.status.ok()) << pool.status.error_message();
  EXPECT_EQ(here.tokens, pool.tokens);
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

// With the fallback prefill off: the transfer timeout ends the request
// (with it on, decode would then prefill the request itself).
TEST(FaultsTest, PrefillThatNeverAnswersFailsTheRequestWithinTheTransferTimeout) {
  SilentPrefill silent;
  int port = 0;
  std::unique_ptr<grpc::Server> server = ServeOnLoopback(&silent, &port);
  ASSERT_NE(port, 0);
  auto d = Process::Start("decode-silent", "decode/decode",
                          {"--model_dir=" + Runfile("models/default"), "--address=127.0.0.1:0", "--threads=1",
                           "--metrics_address=127.0.0.1:0", absl::StrCat("--prefill=127.0.0.1:", port),
                           "--transfer_timeout=2s", "--fallback_prefill_max_tokens=0"},
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
  // Ended by --transfer_timeout (2 s): not before it, and by its deadline
  // (decode counts the request's error as deadline_exceeded), not by the
  // client's 60 s deadline, the only other thing that could end it; the
  // upper bound leaves room for a sanitizer build on a busy 2-core machine.
  EXPECT_GE(took, absl::Seconds(2));
  EXPECT_LT(took, absl::Seconds(30));
  EXPECT_EQ(AwaitMetric(MetricsPort(d->get()), "hybridserve_request_errors_total{reason=\"deadline_exceeded\"}", 1), 1);
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
  bool alive_while_draining = false;
  // Long generations, and SIGTERM only once all six are running: the drain is
  // under way (not already over) when the next request arrives, however fast
  // or loaded the machine.
  constexpr int kTokens = 1000;
  std::vector<Generation> out = RunConcurrently(target, 6, 100, kTokens, "drain", [&] {
    running_at_sigterm = AwaitMetric(MetricsPort(stack.decode()), "hybridserve_num_requests_running", 6);
    kill(stack.decode()->pid(), SIGTERM);
    // Once health says NOT_SERVING the drain has begun (or the listener is
    // already gone).
    EXPECT_TRUE(common::WaitFor([&] { return !HealthServing(target); })) << "the drain never began";
    // Draining is not dead: the liveness service (Kubernetes' liveness and
    // startup probes) stays SERVING, so the kubelet never kills a draining
    // worker before its grace.
    alive_while_draining = HealthServing(target, common::kLivenessHealthService);
    refused = Generate(target, Request("after-sigterm", TextPrompt(10, 1), 3));
  });
  ASSERT_EQ(running_at_sigterm, 6) << "the six requests never ran at once: the test proves nothing";
  // Every in-flight request finished normally within the grace period.
  for (int i = 0; i < 6; ++i) {
    ASSERT_TRUE(out[i].status.ok()) << i << ": " << out[i].status.error_message();
    EXPECT_EQ(out[i].complete.finish_reason(), v1::FINISH_REASON_LENGTH) << i;
    EXPECT_EQ(out[i].tokens.size(), static_cast<size_t>(kTokens)) << i;
  }
  EXPECT_TRUE(alive_while_draining);
  // A new request during the drain is refused (UNAVAILABLE: draining or the
  // listener already closed).
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::UNAVAILABLE) << refused.status.error_message();
  EXPECT_EQ(stack.decode()->Terminate(), 0) << stack.decode()->log();
  EXPECT_EQ(stack.prefill()->Terminate(), 0);
  EXPECT_EQ(stack.cachestore()->Terminate(), 0);
}

INSTANTIATE_TEST_SUITE_P(Shapes, ShapeFaultsTest, ::testing::ValuesIn(ModelShapes()),
                         [](const ::testing::TestParamInfo<ModelShape>& info) { return info.param.name; });

}  // namespace
}  // namespace hybridserve::e2e
