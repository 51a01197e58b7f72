// The real binaries with two cachestore processes as shards (issue 49, "A lost
// shard costs misses only"): kill -9 of one in the middle of conversations
// fails no request and changes no answer; the chains it held are re-published
// to the other on their next turn; it rejoins on its port without a restart of
// anything else, and its chains return to it.

#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/e2e/stack.h"

namespace hybridserve::e2e {
namespace {

constexpr int kChats = 8;
constexpr int kTurnsPerPhase = 2;
enum Phase { kBoth = 0, kOneKilled = 1, kRejoined = 2, kPhases = 3 };

absl::StatusOr<std::unique_ptr<Process>> StartShard(const std::string& name, int port) {
  return Process::Start(
      name, "cachestore/server/cachestore",
      {absl::StrCat("--address=127.0.0.1:", port), "--metrics_address=127.0.0.1:0", "--shutdown_grace=2s",
       "--page_budget_mib=256", "--state_budget_mib=256", "--shard_name=" + name},
      "CACHESTORE_READY");
}

// One conversation: its prompt grows by each answer and a few more tokens.
struct Chat {
  std::vector<int32_t> conversation;
  std::vector<std::vector<int32_t>> answers;  // per turn
  std::vector<v1::ResumeKind> resumed;        // per turn
};

// Plays turn `turn` of chat `c` in `salt`'s namespace; false (with a failure
// added) when the request fails.
bool PlayChatTurn(const std::string& target, const std::string& salt, int turn, int c, Chat& chat) {
  v1::GenerateRequest r = Request(absl::StrCat(salt, "-", c, "-", turn), chat.conversation, 8);
  r.set_cache_salt(salt);
  Generation g = Generate(target, r);
  if (!g.status.ok() || !g.completed || g.complete.finish_reason() != v1::FINISH_REASON_LENGTH) {
    ADD_FAILURE() << salt << " chat " << c << " turn " << turn << ": " << g.status.error_message() << " "
                  << g.complete.error_message();
    return false;
  }
  chat.answers.push_back(g.tokens);
  chat.resumed.push_back(g.complete.usage().resume_kind());
  chat.conversation.insert(chat.conversation.end(), g.tokens.begin(), g.tokens.end());
  const std::vector<int32_t> more = TextPrompt(11, 1000 + turn);
  chat.conversation.insert(chat.conversation.end(), more.begin() + 1, more.end());
  return true;
}

bool PlayTurn(const std::string& target, const std::string& salt, int turn, std::vector<Chat>& chats) {
  for (int c = 0; c < kChats; ++c) {
    if (!PlayChatTurn(target, salt, turn, c, chats[c])) return false;
  }
  return true;
}

std::vector<Chat> NewChats() {
  std::vector<Chat> chats(kChats);
  for (int c = 0; c < kChats; ++c) chats[c].conversation = TextPrompt(40 + 3 * c, 100 + c);
  return chats;
}

double Lookups(Process& shard) {
  return MetricSum(MetricsPort(&shard), "hybridserve_cache_lookups_total").value_or(-1);
}

TEST(ShardsTest, KillingOneOfTwoShardsMidConversationsFailsNoRequestAndChangesNoAnswer) {
  const std::vector<std::string> names = {"shard-a", "shard-b"};
  std::vector<std::unique_ptr<Process>> shard(2);
  std::vector<std::string> targets(2);
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<std::unique_ptr<Process>> p = StartShard(names[i], 0);
    ASSERT_TRUE(p.ok()) << p.status();
    shard[i] = *std::move(p);
    targets[i] = absl::StrCat("127.0.0.1:", shard[i]->port());
  }
  const std::string flag = absl::StrCat("--cachestore=", targets[0], ",", targets[1]);
  StackOptions o;
  o.cachestore = false;
  o.prefill_args = {flag};
  o.decode_args = {flag};
  auto s = Stack::Start(o);
  ASSERT_TRUE(s.ok()) << s.status();
  Stack& stack = **s;
  const int decode_metrics = MetricsPort(stack.decode());
  const int prefill_metrics = MetricsPort(stack.prefill());

  // The answers with both shards up, in a namespace of their own.
  std::vector<Chat> reference = NewChats();
  for (int turn = 0; turn < kPhases * kTurnsPerPhase; ++turn) {
    ASSERT_TRUE(PlayTurn(stack.decode_target(), "reference", turn, reference));
  }

  // The first turn chat by chat: each one's lookups go to the shard that
  // owns it (shards are named by their targets, whose ports vary).
  std::vector<Chat> chats = NewChats();
  std::vector<int> owner(kChats, -1);
  std::vector<int> owned(2, 0);
  for (int c = 0; c < kChats; ++c) {
    const double before[2] = {Lookups(*shard[0]), Lookups(*shard[1])};
    ASSERT_TRUE(PlayChatTurn(stack.decode_target(), "run", 0, c, chats[c]));
    const double gained[2] = {Lookups(*shard[0]) - before[0], Lookups(*shard[1]) - before[1]};
    ASSERT_TRUE((gained[0] > 0) != (gained[1] > 0)) << "chat " << c << ": " << gained[0] << ", " << gained[1];
    owner[c] = gained[0] > 0 ? 0 : 1;
    ++owned[owner[c]];
  }
  for (int turn = 1; turn < kTurnsPerPhase; ++turn) ASSERT_TRUE(PlayTurn(stack.decode_target(), "run", turn, chats));
  const int victim = owned[0] >= owned[1] ? 0 : 1;
  const std::string up = absl::StrCat("hybridserve_cache_shard_up{shard=\"", targets[victim], "\"}");
  const std::string failures = absl::StrCat("hybridserve_cache_shard_failures_total{shard=\"", targets[victim], "\"}");
  EXPECT_EQ(Metric(decode_metrics, up), 1);

  shard[victim]->Kill();
  for (int turn = kTurnsPerPhase; turn < 2 * kTurnsPerPhase; ++turn) {
    ASSERT_TRUE(PlayTurn(stack.decode_target(), "run", turn, chats));
  }
  // The kill struck: each worker's first call to the victim found it gone,
  // and no call went to it after that (one failure each, whatever the number
  // of its chats played); exactly its chats missed once on the other shard,
  // then resumed there.
  EXPECT_EQ(Metric(decode_metrics, failures), 1);
  EXPECT_EQ(Metric(prefill_metrics, failures), 1);
  EXPECT_EQ(Metric(decode_metrics, up), 0);
  for (int c = 0; c < kChats; ++c) {
    const int first = kTurnsPerPhase;
    EXPECT_EQ(chats[c].resumed[first] == v1::RESUME_KIND_EXACT_PREFIX, owner[c] != victim) << "chat " << c;
    EXPECT_EQ(chats[c].resumed[first + 1], v1::RESUME_KIND_EXACT_PREFIX) << "chat " << c;
  }

  // Back on its port: the workers' probes find it, and its chains return to
  // it (empty: a miss once, then resumed there).
  absl::StatusOr<std::unique_ptr<Process>> back = StartShard(names[victim], shard[victim]->port());
  ASSERT_TRUE(back.ok()) << back.status();
  shard[victim] = *std::move(back);
  EXPECT_EQ(AwaitMetric(decode_metrics, up, 1), 1);
  EXPECT_EQ(AwaitMetric(prefill_metrics, up, 1), 1);
  for (int turn = 2 * kTurnsPerPhase; turn < 3 * kTurnsPerPhase; ++turn) {
    ASSERT_TRUE(PlayTurn(stack.decode_target(), "run", turn, chats));
  }
  for (int c = 0; c < kChats; ++c) {
    const int first = 2 * kTurnsPerPhase;
    EXPECT_EQ(chats[c].resumed[first] == v1::RESUME_KIND_EXACT_PREFIX, owner[c] != victim) << "chat " << c;
    EXPECT_EQ(chats[c].resumed[first + 1], v1::RESUME_KIND_EXACT_PREFIX) << "chat " << c;
  }
  EXPECT_GT(Lookups(*shard[victim]), 0);

  // Every answer is the one given with both shards up.
  for (int c = 0; c < kChats; ++c) {
    for (int turn = 0; turn < kPhases * kTurnsPerPhase; ++turn) {
      EXPECT_EQ(chats[c].answers[turn], reference[c].answers[turn]) << "chat " << c << " turn " << turn;
    }
  }
  EXPECT_EQ(MetricSum(decode_metrics, "hybridserve_request_errors_total"), 0);
  std::cout << names[victim] << " (" << owned[victim] << " of " << kChats
            << " chats) killed: each missed once on the other shard, then resumed there; calls that found it gone: "
               "decode "
            << Metric(decode_metrics, failures) << ", prefill " << Metric(prefill_metrics, failures)
            << "; after its return each missed once there, then resumed" << std::endl;
}

}  // namespace
}  // namespace hybridserve::e2e
