// The local stack with reads by shared memory on (cachestore --shm_socket,
// prefill --cachestore_shm_socket) beside one without: the same conversations
// resume at the same points and produce the same tokens, and on the shm stack
// every resume byte moved by shared memory, none by gRPC Get, none fell back.

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/e2e/stack.h"

namespace hybridserve::e2e {
namespace {

struct Turn {
  std::vector<int32_t> tokens;
  uint32_t cached = 0;
  v1::ResumeKind kind = v1::RESUME_KIND_UNSPECIFIED;
};

// Three turns of a conversation whose first prompt has `first` tokens.
std::vector<Turn> Converse(Stack& s, int first) {
  std::vector<Turn> turns;
  std::vector<int32_t> conversation = TextPrompt(first, first);
  for (int turn = 1; turn <= 3; ++turn) {
    v1::GenerateRequest r = Request(absl::StrCat("shm-", first, "-", turn), conversation, 12);
    r.set_cache_salt(absl::StrCat("shm-", first));
    Generation g = Generate(s.decode_target(), r);
    EXPECT_TRUE(g.status.ok()) << g.status.error_message();
    EXPECT_TRUE(g.completed);
    turns.push_back(Turn{g.tokens, g.complete.usage().cached_tokens(), g.complete.usage().resume_kind()});
    conversation.insert(conversation.end(), g.tokens.begin(), g.tokens.end());
    const std::vector<int32_t> more = TextPrompt(21, turn + 3);
    conversation.insert(conversation.end(), more.begin() + 1, more.end());
  }
  return turns;
}

TEST(ShmStackTest, ResumesByShmAreExactAndEveryResumeByteMovedByShm) {
  StackOptions grpc_only;
  auto plain = Stack::Start(grpc_only);
  ASSERT_TRUE(plain.ok()) << plain.status();
  StackOptions with_shm;
  with_shm.shm = true;
  auto shm = Stack::Start(with_shm);
  ASSERT_TRUE(shm.ok()) << shm.status();

  const int page = DefaultShape().page_size;
  for (const int first : {5, page + 1, 150}) {
    SCOPED_TRACE(absl::StrCat("first prompt ", first));
    const std::vector<Turn> a = Converse(**plain, first);
    const std::vector<Turn> b = Converse(**shm, first);
    ASSERT_EQ(a.size(), b.size());
    for (size_t t = 0; t < a.size(); ++t) {
      SCOPED_TRACE(absl::StrCat("turn ", t + 1));
      EXPECT_EQ(a[t].tokens, b[t].tokens);
      EXPECT_EQ(a[t].cached, b[t].cached);
      EXPECT_EQ(b[t].kind, t == 0 ? v1::RESUME_KIND_COLD : v1::RESUME_KIND_EXACT_PREFIX);
      if (t > 0) EXPECT_GT(b[t].cached, 0u);
    }
  }
  const int prefill = MetricsPort((*shm)->prefill());
  const int cachestore = MetricsPort((*shm)->cachestore());
  const double shm_bytes = Metric(prefill, "hybridserve_prefill_cache_shm_bytes_total");
  EXPECT_GT(shm_bytes, 0);
  // Six resumes (two per conversation), each a state and, past a page, pages.
  EXPECT_GE(Metric(prefill, "hybridserve_prefill_cache_shm_reads_total"), 6);
  EXPECT_EQ(MetricSum(prefill, "hybridserve_prefill_cache_shm_fallbacks_total"), 0);
  // Both ends count the same bytes, and nothing was read by gRPC Get.
  EXPECT_EQ(Metric(cachestore, "hybridserve_cache_shm_bytes_total"), shm_bytes);
  EXPECT_EQ(Metric(cachestore, "hybridserve_cache_get_bytes_total"), 0);
  EXPECT_EQ(Metric(cachestore, "hybridserve_cache_shm_reads_total{outcome=\"error\"}"), 0);
  // The stack without it read the same bytes by gRPC.
  EXPECT_EQ(Metric(MetricsPort((*plain)->cachestore()), "hybridserve_cache_get_bytes_total"), shm_bytes);
  EXPECT_EQ(Metric(MetricsPort((*plain)->prefill()), "hybridserve_prefill_cache_shm_bytes_total"), 0);
}

}  // namespace
}  // namespace hybridserve::e2e
