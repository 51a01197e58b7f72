// Session breakpoints through the real stack: a pinned conversation survives
// a flood that evicts every unpinned one; a pinned one whose keep time has
// passed is gone; a pin beyond the tenant's quota is refused in the usage,
// not the request.

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/e2e/stack.h"

namespace hybridserve::e2e {
namespace {

v1::GenerateRequest Turn(const std::string& id, const std::vector<int32_t>& prompt, const std::string& salt,
                         absl::Duration keep, bool pin) {
  v1::GenerateRequest r = Request(id, prompt, 6);
  r.set_cache_salt(salt);
  if (keep > absl::ZeroDuration() || pin) {
    r.mutable_session()->mutable_keep()->set_seconds(absl::ToInt64Seconds(keep));
    r.mutable_session()->set_pin(pin);
  }
  return r;
}

TEST(SessionTest, PinnedSessionSurvivesAFloodAndAnExpiredOneIsGone) {
  StackOptions o;
  // Room for about a dozen turn-end states of the default model (~0.2 MiB
  // each) and their pages; half the state budget may be pinned.
  o.cachestore_args = {"--page_budget_mib=4", "--state_budget_mib=3", "--pin_quota_mib=1", "--max_session_ttl=1h"};
  auto s = Stack::Start(o);
  ASSERT_TRUE(s.ok()) << s.status();
  const std::string target = (*s)->decode_target();

  struct Session {
    std::string salt;
    absl::Duration keep;
    bool pin;
    std::vector<int32_t> conversation;
  };
  std::vector<Session> sessions = {
      {"pinned", absl::Minutes(10), true, TextPrompt(100, 1)},
      {"pinned-briefly", absl::Seconds(2), true, TextPrompt(100, 2)},
      {"unpinned", absl::Minutes(10), false, TextPrompt(100, 3)},
  };
  for (Session& x : sessions) {
    Generation g = Generate(target, Turn(x.salt + "-1", x.conversation, x.salt, x.keep, x.pin));
    ASSERT_TRUE(g.status.ok()) << g.status.error_message();
    const v1::SessionOutcome& out = g.complete.usage().session();
    EXPECT_TRUE(out.published()) << x.salt;
    EXPECT_EQ(out.pinned(), x.pin) << x.salt << ": " << out.pin_refused_reason();
    EXPECT_EQ(out.keep().seconds(), absl::ToInt64Seconds(x.keep)) << x.salt;
    x.conversation.insert(x.conversation.end(), g.tokens.begin(), g.tokens.end());
  }
  // The tenant's quota (1 MiB) holds a few states: a third pin in the same
  // tenant beyond it is refused in the usage, and the request still succeeds.
  int refused = 0;
  for (int i = 0; i < 8; ++i) {
    Generation g =
        Generate(target, Turn(absl::StrCat("quota-", i), TextPrompt(60, 40 + i), "pinned", absl::ZeroDuration(), true));
    ASSERT_TRUE(g.status.ok()) << g.status.error_message();
    ASSERT_EQ(g.complete.finish_reason(), v1::FINISH_REASON_LENGTH);
    if (!g.complete.usage().session().pinned()) {
      ++refused;
      EXPECT_NE(g.complete.usage().session().pin_refused_reason().find("quota"), std::string::npos)
          << g.complete.usage().session().pin_refused_reason();
    }
  }
  EXPECT_GT(refused, 0);
  // A flood of 40 unrelated conversations: several times the budgets.
  for (int i = 0; i < 40; ++i) {
    Generation g = Generate(target, Turn(absl::StrCat("flood-", i), TextPrompt(120, 100 + i), absl::StrCat("flood-", i),
                                         absl::ZeroDuration(), false));
    ASSERT_TRUE(g.status.ok()) << g.status.error_message();
  }
  absl::SleepFor(absl::Seconds(3));  // past "pinned-briefly"'s keep; the cachestore reaps every 0.5 s
  for (Session& x : sessions) {
    x.conversation.push_back('\n');
    Generation g = Generate(target, Turn(x.salt + "-2", x.conversation, x.salt, x.keep, x.pin));
    ASSERT_TRUE(g.status.ok()) << g.status.error_message();
    const v1::Usage& u = g.complete.usage();
    if (x.salt == "pinned") {
      EXPECT_EQ(u.resume_kind(), v1::RESUME_KIND_EXACT_PREFIX) << x.salt;
      EXPECT_EQ(u.cached_tokens(), x.conversation.size() - 2) << x.salt;
    } else {
      EXPECT_EQ(u.resume_kind(), v1::RESUME_KIND_COLD) << x.salt;
    }
  }
}

}  // namespace
}  // namespace hybridserve::e2e
