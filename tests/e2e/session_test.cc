// Session breakpoints through the real stack: a pinned conversation survives
// a flood that evicts every unpinned one; a pinned one whose keep time has
// passed is gone; a pin beyond the tenant's quota is refused in the usage,
// not the request.

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cachestore/client/grpc_cache_client.h"
#include "grpcpp/grpcpp.h"
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

class SessionTest : public ::testing::TestWithParam<ModelShape> {};

TEST_P(SessionTest, PinnedSessionSurvivesAFloodAndAnExpiredOneIsGone) {
  StackOptions o;
  o.shape = GetParam();
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
  // A probe of the unpinned conversation's next prompt (a lookup refreshes
  // what it finds in the LRU: only before the quota pins and after the flood).
  auto cache = cachestore::GrpcCacheClient::Create(absl::StrCat("127.0.0.1:", (*s)->cachestore()->port()));
  ASSERT_TRUE(cache.ok()) << cache.status();
  auto stub = v1::Generation::NewStub(grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
  grpc::ClientContext info_context;
  v1::ModelInfo info;
  ASSERT_TRUE(stub->GetModelInfo(&info_context, v1::GetModelInfoRequest(), &info).ok());
  const cachestore::ClientNamespace unpinned_ns{info.fingerprint(), "", "unpinned",
                                                static_cast<int32_t>(info.page_size())};
  auto unpinned_cached = [&] {
    absl::StatusOr<cachestore::LookupResult> r =
        (*cache)->Lookup(unpinned_ns, sessions[2].conversation, cachestore::LookupMode::kProbeOnly);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() && r->resume_position > 0;
  };
  ASSERT_TRUE(unpinned_cached()) << "the unpinned conversation was never cached: the flood proves nothing";
  // The tenant's quota (1 MiB) holds a few states (more of a small model's):
  // a pin in the same tenant beyond it is refused in the usage, and the
  // request still succeeds.
  int refused = 0;
  for (int i = 0; i < 400 && refused == 0; ++i) {
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
  // A flood of unrelated conversations, sized from what one of them puts:
  // twice the budgets (7 MiB), so every unpinned entry older than the flood
  // is evicted whatever the model's state size.
  const int cache_metrics = MetricsPort((*s)->cachestore());
  const std::string put_bytes = "hybridserve_cache_put_bytes_total";
  const double before_one = Metric(cache_metrics, put_bytes);
  Generation one = Generate(target, Turn("flood-0", TextPrompt(120, 100), "flood-0", absl::ZeroDuration(), false));
  ASSERT_TRUE(one.status.ok()) << one.status.error_message();
  const double per_conversation = Metric(cache_metrics, put_bytes) - before_one;
  ASSERT_GT(per_conversation, 0);
  const int flood = std::min(2000, static_cast<int>(2 * (7 << 20) / per_conversation) + 4);
  for (int i = 1; i < flood; ++i) {
    Generation g = Generate(target, Turn(absl::StrCat("flood-", i), TextPrompt(120, 100 + i), absl::StrCat("flood-", i),
                                         absl::ZeroDuration(), false));
    ASSERT_TRUE(g.status.ok()) << g.status.error_message();
  }
  EXPECT_FALSE(unpinned_cached()) << "a flood of " << flood << " conversations did not evict the unpinned one";
  // The flood evicted states by LRU ("unpinned" among them); "pinned-briefly"
  // leaves by its keep time (2 s): the one state that expires by TTL. The
  // cachestore's counters follow its index on its reaper's beat: waited for,
  // not read once (read once, 1 run in 10 saw 0 before the next sync).
  EXPECT_GE(AwaitMetricAtLeast(cache_metrics, "hybridserve_cache_evictions_total{class=\"state\",reason=\"lru\"}", 1),
            1);
  EXPECT_EQ(AwaitMetricAtLeast(cache_metrics, "hybridserve_cache_evictions_total{class=\"state\",reason=\"ttl\"}", 1),
            1);
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

INSTANTIATE_TEST_SUITE_P(Shapes, SessionTest, ::testing::ValuesIn(ModelShapes()),
                         [](const ::testing::TestParamInfo<ModelShape>& info) { return info.param.name; });

}  // namespace
}  // namespace hybridserve::e2e
