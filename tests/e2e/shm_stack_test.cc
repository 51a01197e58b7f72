// The local stack with reads by shared memory on (cachestore --shm_socket,
// prefill and decode --cachestore_shm_socket) beside one without: the same
// conversations resume at the same points and produce the same tokens, and on
// the shm stack every resume byte moved by shared memory, none by gRPC Get,
// none fell back, and both workers put by shared memory; decode read each
// resumed prompt's cached pages itself
// (prefill sent only the pages after them) and its steps are those of the
// stack without, bit for bit (logprobs). The same with reads over the bulk
// port (cachestore --bulk_address, workers --cachestore_bulk_address): every
// resume byte moved over it, none by gRPC Get, none fell back, and both
// workers put over it.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/e2e/stack.h"

namespace hybridserve::e2e {
namespace {

struct Turn {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  uint32_t cached = 0;
  v1::ResumeKind kind = v1::RESUME_KIND_UNSPECIFIED;
};

// Both stacks of a comparison: every turn by the prefill worker (decode's
// local prefill of a next turn reads nothing twice and pushes nothing:
// //tests/e2e:stack_test covers it), and cache deadlines far above any
// call's. The comparisons need every turn end published in both stacks (one
// that is not resumes the next turn from an earlier state, with other
// cached_tokens and, in the fast matmul mode, other bits). Under ASan on two
// cores, with two stacks and another test running, the gRPC-only stack once
// resumed a third turn from the first turn's end (16 cached tokens, not 48);
// its logs were not kept, and a put or the wait for prefill's parent page
// running past its 2 s default is the way a turn end goes unpublished there.
// These bounds only catch a hang; Converse checks each turn was published.
StackOptions PoolOnly() {
  StackOptions o;
  o.prefill_args = {"--cache_timeout=60s"};
  o.decode_args = {"--local_prefill_max_tokens=0", "--cache_timeout=60s", "--publish_parent_wait=60s"};
  return o;
}

// Three turns of a conversation whose first prompt has `first` tokens.
std::vector<Turn> Converse(Stack& s, int first) {
  std::vector<Turn> turns;
  std::vector<int32_t> conversation = TextPrompt(first, first);
  for (int turn = 1; turn <= 3; ++turn) {
    v1::GenerateRequest r = Request(absl::StrCat("shm-", first, "-", turn), conversation, 12);
    r.set_cache_salt(absl::StrCat("shm-", first));
    r.set_return_logprobs(true);
    Generation g = Generate(s.decode_target(), r);
    EXPECT_TRUE(g.status.ok()) << g.status.error_message();
    EXPECT_TRUE(g.completed);
    EXPECT_TRUE(g.complete.usage().session().published())
        << "turn " << turn << " (first prompt " << first << ") ended unpublished";
    turns.push_back(Turn{g.tokens, g.logprobs, g.complete.usage().cached_tokens(), g.complete.usage().resume_kind()});
    conversation.insert(conversation.end(), g.tokens.begin(), g.tokens.end());
    const std::vector<int32_t> more = TextPrompt(21, turn + 3);
    conversation.insert(conversation.end(), more.begin() + 1, more.end());
  }
  return turns;
}

TEST(ShmStackTest, ResumesByShmAreExactAndEveryResumeByteMovedByShm) {
  StackOptions grpc_only = PoolOnly();
  auto plain = Stack::Start(grpc_only);
  ASSERT_TRUE(plain.ok()) << plain.status();
  StackOptions with_shm = PoolOnly();
  with_shm.shm = true;
  // These prompts are a few pages.
  with_shm.decode_args.push_back("--history_read_min_kib=0");
  auto shm = Stack::Start(with_shm);
  ASSERT_TRUE(shm.ok()) << shm.status();

  const int page = DefaultShape().page_size;
  int64_t resumed_pages = 0;    // the full pages below every resume point
  int64_t resumed_prompts = 0;  // resumes with at least one of them
  for (const int first : {5, page + 1, 150}) {
    SCOPED_TRACE(absl::StrCat("first prompt ", first));
    const std::vector<Turn> a = Converse(**plain, first);
    const std::vector<Turn> b = Converse(**shm, first);
    ASSERT_EQ(a.size(), b.size());
    for (size_t t = 0; t < a.size(); ++t) {
      SCOPED_TRACE(absl::StrCat("turn ", t + 1));
      EXPECT_EQ(a[t].tokens, b[t].tokens);
      // Bit for bit: the pages decode read and kept are the ones prefill restored.
      EXPECT_EQ(a[t].logprobs, b[t].logprobs);
      EXPECT_EQ(b[t].logprobs.size(), b[t].tokens.size());
      EXPECT_EQ(a[t].cached, b[t].cached);
      EXPECT_EQ(b[t].kind, t == 0 ? v1::RESUME_KIND_COLD : v1::RESUME_KIND_EXACT_PREFIX);
      if (t > 0) EXPECT_GT(b[t].cached, 0u);
      resumed_pages += b[t].cached / page;
      resumed_prompts += b[t].cached >= static_cast<uint32_t>(page) ? 1 : 0;
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
  EXPECT_EQ(Metric(cachestore, "hybridserve_cache_get_bytes_total"), 0);
  // Decode read the pages below each resume point itself, by shared memory:
  // the cachestore served prefill's bytes and those.
  const int decode = MetricsPort((*shm)->decode());
  ASSERT_GT(resumed_pages, 0);
  EXPECT_EQ(Metric(decode, "hybridserve_decode_history_pages_total"), resumed_pages);
  EXPECT_EQ(Metric(decode, "hybridserve_decode_history_reads_total"), resumed_prompts);
  EXPECT_EQ(Metric(decode, "hybridserve_decode_history_read_failures_total"), 0);
  // Decode's own reads by shared memory are counted as prefill's are.
  EXPECT_GE(Metric(decode, "hybridserve_decode_cache_shm_reads_total"), resumed_prompts);
  EXPECT_GT(Metric(decode, "hybridserve_decode_cache_shm_bytes_total"), 0);
  EXPECT_EQ(MetricSum(decode, "hybridserve_decode_cache_shm_fallbacks_total"), 0);
  EXPECT_GT(Metric(cachestore, "hybridserve_cache_shm_bytes_total"), shm_bytes);
  EXPECT_EQ(Metric(cachestore, "hybridserve_cache_shm_reads_total{outcome=\"error\"}"), 0);
  // Both workers put by shared memory (prefill its prompts' pages and states,
  // decode its turn-end states), and no put fell back to gRPC.
  EXPECT_GT(Metric(prefill, "hybridserve_worker_direct_put_entries_total{path=\"shm\"}"), 0);
  EXPECT_GT(Metric(decode, "hybridserve_worker_direct_put_entries_total{path=\"shm\"}"), 0);
  EXPECT_EQ(MetricSum(prefill, "hybridserve_worker_direct_put_fallbacks_total"), 0);
  EXPECT_EQ(MetricSum(decode, "hybridserve_worker_direct_put_fallbacks_total"), 0);
  EXPECT_GT(Metric(cachestore, "hybridserve_cache_shm_put_bytes_total"), 0);
  // Every publication landed. (An entry may be refused on the way: decode's
  // turn-end state before prefill's parent page is there, FAILED_PRECONDITION,
  // which the publisher puts again; the cachestore counts those as errors.)
  EXPECT_EQ(MetricSum(prefill, "hybridserve_prefill_publish_failures_total"), 0);
  EXPECT_EQ(MetricSum(decode, "hybridserve_decode_publish_failures_total"), 0);
  // The stack without it read the same bytes by gRPC, and put nothing by shared memory.
  EXPECT_EQ(Metric(MetricsPort((*plain)->cachestore()), "hybridserve_cache_shm_put_bytes_total"), 0);
  EXPECT_EQ(Metric(MetricsPort((*plain)->cachestore()), "hybridserve_cache_get_bytes_total"), shm_bytes);
  EXPECT_EQ(Metric(MetricsPort((*plain)->prefill()), "hybridserve_prefill_cache_shm_bytes_total"), 0);
  EXPECT_EQ(Metric(MetricsPort((*plain)->decode()), "hybridserve_decode_history_pages_total"), 0);
}

TEST(BulkStackTest, ResumesOverTheBulkPortAreExactAndEveryResumeByteMovedOverIt) {
  StackOptions pool_only = PoolOnly();
  auto plain = Stack::Start(pool_only);
  ASSERT_TRUE(plain.ok()) << plain.status();
  StackOptions with_bulk = pool_only;
  with_bulk.bulk = true;
  auto bulk = Stack::Start(with_bulk);
  ASSERT_TRUE(bulk.ok()) << bulk.status();
  for (const int first : {5, DefaultShape().page_size + 1, 150}) {
    SCOPED_TRACE(absl::StrCat("first prompt ", first));
    const std::vector<Turn> a = Converse(**plain, first);
    const std::vector<Turn> b = Converse(**bulk, first);
    ASSERT_EQ(a.size(), b.size());
    for (size_t t = 0; t < a.size(); ++t) {
      SCOPED_TRACE(absl::StrCat("turn ", t + 1));
      EXPECT_EQ(a[t].tokens, b[t].tokens);
      EXPECT_EQ(a[t].logprobs, b[t].logprobs);
      EXPECT_EQ(a[t].cached, b[t].cached);
      EXPECT_EQ(b[t].kind, t == 0 ? v1::RESUME_KIND_COLD : v1::RESUME_KIND_EXACT_PREFIX);
    }
  }
  const int prefill = MetricsPort((*bulk)->prefill());
  const int cachestore = MetricsPort((*bulk)->cachestore());
  const double bulk_bytes = Metric(prefill, "hybridserve_prefill_cache_bulk_bytes_total");
  EXPECT_GT(bulk_bytes, 0);
  EXPECT_GE(Metric(prefill, "hybridserve_prefill_cache_bulk_reads_total"), 6);  // six resumes
  EXPECT_EQ(MetricSum(prefill, "hybridserve_prefill_cache_bulk_fallbacks_total"), 0);
  EXPECT_EQ(Metric(prefill, "hybridserve_prefill_cache_shm_bytes_total"), 0);
  // The cachestore sent those bytes over the port, none by gRPC Get, and
  // decode read no prompt's pages itself (only by shared memory).
  EXPECT_EQ(Metric(cachestore, "hybridserve_cache_bulk_bytes_total"), bulk_bytes);
  EXPECT_EQ(Metric(cachestore, "hybridserve_cache_bulk_reads_total{outcome=\"error\"}"), 0);
  EXPECT_EQ(Metric(cachestore, "hybridserve_cache_get_bytes_total"), 0);
  EXPECT_EQ(Metric(MetricsPort((*bulk)->decode()), "hybridserve_decode_history_pages_total"), 0);
  // Both workers put over the port too, and no put fell back to gRPC.
  const int decode = MetricsPort((*bulk)->decode());
  EXPECT_GT(Metric(prefill, "hybridserve_worker_direct_put_entries_total{path=\"bulk\"}"), 0);
  EXPECT_GT(Metric(decode, "hybridserve_worker_direct_put_entries_total{path=\"bulk\"}"), 0);
  EXPECT_EQ(MetricSum(prefill, "hybridserve_worker_direct_put_fallbacks_total"), 0);
  EXPECT_EQ(MetricSum(decode, "hybridserve_worker_direct_put_fallbacks_total"), 0);
  EXPECT_GT(Metric(cachestore, "hybridserve_cache_bulk_put_bytes_total"), 0);
  // Every publication landed. (An entry may be refused on the way: decode's
  // turn-end state before prefill's parent page is there, FAILED_PRECONDITION,
  // which the publisher puts again; the cachestore counts those as errors.)
  EXPECT_EQ(MetricSum(prefill, "hybridserve_prefill_publish_failures_total"), 0);
  EXPECT_EQ(MetricSum(decode, "hybridserve_decode_publish_failures_total"), 0);
  EXPECT_EQ(Metric(cachestore, "hybridserve_cache_shm_put_bytes_total"), 0);
  // The stack without it read the same bytes by gRPC.
  EXPECT_EQ(Metric(MetricsPort((*plain)->cachestore()), "hybridserve_cache_get_bytes_total"), bulk_bytes);
}

}  // namespace
}  // namespace hybridserve::e2e
