#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <ostream>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/attention_reference.h"
#include "kernels/cpu/test_util.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/kernel_status.h"

namespace hybridserve::kernels::cpu {
namespace {

using testing::BitsEqual;

struct Geometry {
  int64_t n_heads;
  int64_t n_kv_heads;
  int64_t head_dim;
  int64_t page_size;
};

void PrintTo(const Geometry& g, std::ostream* os) {
  *os << "heads " << g.n_heads << " kv_heads " << g.n_kv_heads << " head_dim " << g.head_dim << " page " << g.page_size;
}

// One sequence's q/k/v for positions [0, n) and a paged cache holding its K/V.
class Sequence {
 public:
  Sequence(const Geometry& geo, int64_t n, uint32_t seed, bool shuffle_pages, int64_t num_pages = 0) : geo_(geo) {
    std::mt19937 rng(seed);
    q_ = testing::RandomVector(rng, n * geo.n_heads * geo.head_dim, -1.5f, 1.5f);
    k_ = testing::RandomVector(rng, n * geo.n_kv_heads * geo.head_dim, -1.5f, 1.5f);
    v_ = testing::RandomVector(rng, n * geo.n_kv_heads * geo.head_dim);
    const int64_t pages = (n + geo.page_size - 1) / geo.page_size;
    num_pages_ = num_pages ? num_pages : pages + 5;
    std::vector<int32_t> all(num_pages_);
    std::iota(all.begin(), all.end(), 0);
    if (shuffle_pages) std::shuffle(all.begin(), all.end(), rng);
    table_.assign(all.begin(), all.begin() + pages);
    const int64_t pool_elems = num_pages_ * geo.page_size * geo.n_kv_heads * geo.head_dim;
    k_pool_.assign(pool_elems, NAN);  // unwritten slots must never be read
    v_pool_.assign(pool_elems, NAN);
  }

  PagedKvCache Cache() {
    PagedKvCache c;
    c.k = k_pool_.data();
    c.v = v_pool_.data();
    c.num_pages = num_pages_;
    c.page_size = geo_.page_size;
    c.n_kv_heads = geo_.n_kv_heads;
    c.head_dim = geo_.head_dim;
    return c;
  }

  int64_t QRow() const { return geo_.n_heads * geo_.head_dim; }
  int64_t KvRow() const { return geo_.n_kv_heads * geo_.head_dim; }

  void Append(int64_t begin, int64_t end) {
    KvAppendParams a;
    a.cache = Cache();
    a.k = k_.data() + begin * KvRow();
    a.v = v_.data() + begin * KvRow();
    a.block_table = table_.data();
    a.start_pos = begin;
    a.n_tokens = end - begin;
    ASSERT_EQ(KvAppend(a, nullptr), kKernelOk);
  }

  // Appends [begin, end) then attends its queries; returns [end - begin, n_heads, head_dim].
  std::vector<float> Prefill(int64_t begin, int64_t end, ThreadPool* pool) {
    Append(begin, end);
    return Attend(begin, end, ActiveKernelPath(), pool);
  }

  // Attends the queries of [begin, end) (their K/V appended) on `path`.
  std::vector<float> Attend(int64_t begin, int64_t end, KernelPath path, ThreadPool* pool) {
    std::vector<float> out((end - begin) * QRow(), NAN);
    AttentionPrefillParams p;
    p.cache = Cache();
    p.q = q_.data() + begin * QRow();
    p.out = out.data();
    p.block_table = table_.data();
    p.start_pos = begin;
    p.n_tokens = end - begin;
    p.n_heads = geo_.n_heads;
    EXPECT_EQ(AttentionPrefillOnPath(p, path, pool), kKernelOk);
    return out;
  }

  const std::vector<float>& q() const { return q_; }
  const std::vector<float>& k() const { return k_; }
  const std::vector<float>& v() const { return v_; }
  const std::vector<int32_t>& table() const { return table_; }

 private:
  Geometry geo_;
  int64_t num_pages_;
  std::vector<float> q_, k_, v_, k_pool_, v_pool_;
  std::vector<int32_t> table_;
};

class AttentionGqaTest : public ::testing::TestWithParam<Geometry> {};

// Outputs are convex combinations of values in [-1, 1]. The kernel's fp32 dot
// products (head_dim terms), the ~1-ulp vector exp and the sequential fp32 sums
// over up to ~100 keys each contribute <~1e-6 absolute; 1e-5 is a 10x margin.
TEST_P(AttentionGqaTest, PrefillMatchesNaiveOracle) {
  const Geometry geo = GetParam();
  const int64_t n = 83;
  Sequence seq(geo, n, 17, /*shuffle_pages=*/true);
  ThreadPool pool(2);
  // Two segments: [0, 50) and [50, 83) (the second starts mid-page).
  std::vector<float> out = seq.Prefill(0, 50, &pool);
  const std::vector<float> tail = seq.Prefill(50, n, &pool);
  out.insert(out.end(), tail.begin(), tail.end());
  const std::vector<double> want =
      reference::CausalAttention(seq.q(), seq.k(), seq.v(), 0, n, geo.n_heads, geo.n_kv_heads, geo.head_dim,
                                 1.0 / std::sqrt(static_cast<double>(geo.head_dim)));
  EXPECT_TRUE(testing::AllClose(out, want, 1e-5, 1e-5));
}

// Every instruction-set path this CPU has (the AVX-512 one accumulates the
// values 16 lanes at a time) gives the avx2 path's bits.
TEST_P(AttentionGqaTest, EveryKernelPathHasTheBitsOfTheAvx2Path) {
  const Geometry geo = GetParam();
  const int64_t n = 90;
  Sequence seq(geo, n, 23, /*shuffle_pages=*/true);
  seq.Append(0, n);
  ThreadPool pool(2);
  const std::vector<float> avx2 = seq.Attend(40, n, KernelPath::kAvx2, &pool);
  for (const KernelPath path : {KernelPath::kAvx512, KernelPath::kAvx512Bf16}) {
    if (static_cast<int>(path) > static_cast<int>(DetectedKernelPath())) continue;
    const std::vector<float> out = seq.Attend(40, n, path, &pool);
    EXPECT_TRUE(BitsEqual(out.data(), avx2.data(), static_cast<int64_t>(avx2.size()))) << KernelPathName(path);
  }
  if (DetectedKernelPath() == KernelPath::kAvx2) GTEST_SKIP() << "this CPU has only the avx2 path";
}

TEST_P(AttentionGqaTest, PrefillSplitAnywhereIsBitIdenticalToOneCall) {
  const Geometry geo = GetParam();
  const int64_t n = 70;
  Sequence whole_seq(geo, n, 5, true);
  ThreadPool pool(2);
  const std::vector<float> whole = whole_seq.Prefill(0, n, &pool);
  for (const std::vector<int64_t>& cuts : {std::vector<int64_t>{1}, {7, 8, 9}, {16}, {33, 61}, {69}}) {
    Sequence seq(geo, n, 5, true);  // same data, same page table
    std::vector<float> joined;
    int64_t begin = 0;
    std::vector<int64_t> ends = cuts;
    ends.push_back(n);
    for (int64_t end : ends) {
      const std::vector<float> part = seq.Prefill(begin, end, begin % 2 ? nullptr : &pool);
      joined.insert(joined.end(), part.begin(), part.end());
      begin = end;
    }
    EXPECT_TRUE(BitsEqual(joined, whole)) << "first cut " << cuts[0];
  }
}

// A few tokens after a long context (a resumed turn) take a few large tiles,
// as many as keep every thread busy, instead of small paired ones: the same
// bits for any thread count and any number of new tokens.
TEST_P(AttentionGqaTest, ATurnAfterALongContextIsBitIdenticalToOneCall) {
  const Geometry geo = GetParam();
  const int64_t n = 300;
  Sequence whole_seq(geo, n, 6, true);
  ThreadPool two(2);
  const std::vector<float> whole = whole_seq.Prefill(0, n, &two);
  const int64_t row = geo.n_heads * geo.head_dim;
  for (const int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    for (const int64_t cut : {int64_t{240}, int64_t{263}, int64_t{299}}) {
      Sequence seq(geo, n, 6, true);  // same data, same page table
      (void)seq.Prefill(0, cut, &two);
      const std::vector<float> turn = seq.Prefill(cut, n, threads == 1 ? nullptr : &pool);
      const std::vector<float> want(whole.begin() + cut * row, whole.end());
      EXPECT_TRUE(BitsEqual(turn, want)) << threads << " threads, " << n - cut << " tokens after " << cut;
    }
  }
}

TEST_P(AttentionGqaTest, PhysicalPagePlacementDoesNotChangeBits) {
  const Geometry geo = GetParam();
  Sequence shuffled(geo, 45, 8, /*shuffle_pages=*/true);
  Sequence identity(geo, 45, 8, /*shuffle_pages=*/false);
  ASSERT_NE(shuffled.table(), identity.table());
  EXPECT_TRUE(BitsEqual(shuffled.Prefill(0, 45, nullptr), identity.Prefill(0, 45, nullptr)));
}

// Decode shares the prefill's per-row arithmetic: decoding the token at
// position t gives exactly prefill row t (checked bit for bit).
TEST_P(AttentionGqaTest, DecodeAtPositionEqualsPrefillRowBitForBit) {
  const Geometry geo = GetParam();
  // Past 128 keys: rows on both sides of many page boundaries.
  const int64_t n = 150;
  Sequence seq(geo, n, 9, true);
  const std::vector<float> prefill = seq.Prefill(0, n, nullptr);
  for (int64_t t : {0, 1, 7, 8, 15, 16, 39, 62, 63, 64, 65, 127, 128, 149}) {
    std::vector<float> out(seq.QRow(), NAN);
    const int32_t len = static_cast<int32_t>(t + 1);
    AttentionDecodeParams d;
    d.cache = seq.Cache();
    d.q = seq.q().data() + t * seq.QRow();
    d.out = out.data();
    d.block_tables = seq.table().data();
    d.seq_lens = &len;
    d.batch = 1;
    d.n_heads = geo.n_heads;
    d.block_table_stride = static_cast<int64_t>(seq.table().size());
    ASSERT_EQ(AttentionDecode(d, nullptr), kKernelOk);
    EXPECT_TRUE(BitsEqual(out.data(), prefill.data() + t * seq.QRow(), seq.QRow())) << t;
  }
}

INSTANTIATE_TEST_SUITE_P(GqaRatios, AttentionGqaTest,
                         ::testing::Values(Geometry{4, 4, 64, 16},   // ratio 1
                                           Geometry{4, 2, 40, 8},    // ratio 2, head_dim tail
                                           Geometry{8, 2, 128, 16},  // ratio 4
                                           Geometry{4, 1, 16, 4},    // ratio 4, tiny pages
                                           Geometry{6, 1, 64, 16},   // ratio 6: rows in blocks of 4 and 2
                                           Geometry{16, 2, 64, 8},   // ratio 8
                                           Geometry{12, 1, 24, 16},  // ratio 12: blocks of 8 and 4
                                           Geometry{3, 1, 40, 8}));  // ratio 3: blocks of 2 and 1

// A decode batch gives each sequence the bits it gets alone, for any thread count.
TEST(AttentionDecodeTest, BatchRowsAreBitIdenticalToSequencesAlone) {
  const Geometry geo{8, 2, 64, 16};
  const std::vector<int64_t> lens = {1, 37, 64, 5};
  const int64_t num_pages = 40;
  // All sequences share one pool: build it from four Sequences' data.
  std::vector<Sequence> seqs;
  for (size_t b = 0; b < lens.size(); ++b) {
    seqs.emplace_back(geo, lens[b], 100 + static_cast<uint32_t>(b), true, num_pages);
  }
  // Disjoint pages per sequence in the shared pool: sequence b uses pages 10b..10b+3 shuffled.
  std::mt19937 rng(3);
  const int64_t stride = 6;
  std::vector<int32_t> tables(lens.size() * stride, -1);
  const int64_t pool_elems = num_pages * geo.page_size * geo.n_kv_heads * geo.head_dim;
  std::vector<float> k_pool(pool_elems, NAN), v_pool(pool_elems, NAN);
  PagedKvCache cache;
  cache.k = k_pool.data();
  cache.v = v_pool.data();
  cache.num_pages = num_pages;
  cache.page_size = geo.page_size;
  cache.n_kv_heads = geo.n_kv_heads;
  cache.head_dim = geo.head_dim;
  std::vector<float> q(lens.size() * geo.n_heads * geo.head_dim);
  std::vector<int32_t> seq_lens;
  for (size_t b = 0; b < lens.size(); ++b) {
    std::vector<int32_t> pages = {0, 1, 2, 3};
    std::shuffle(pages.begin(), pages.end(), rng);
    for (int i = 0; i < 4; ++i) tables[b * stride + i] = static_cast<int32_t>(10 * b) + pages[i];
    KvAppendParams a;
    a.cache = cache;
    a.k = seqs[b].k().data();
    a.v = seqs[b].v().data();
    a.block_table = tables.data() + b * stride;
    a.n_tokens = lens[b];
    ASSERT_EQ(KvAppend(a, nullptr), kKernelOk);
    const int64_t qrow = geo.n_heads * geo.head_dim;
    std::copy_n(seqs[b].q().begin() + (lens[b] - 1) * qrow, qrow, q.begin() + b * qrow);
    seq_lens.push_back(static_cast<int32_t>(lens[b]));
  }
  auto decode = [&](int64_t first, int64_t count, ThreadPool* pool) {
    const int64_t qrow = geo.n_heads * geo.head_dim;
    std::vector<float> out(count * qrow, NAN);
    AttentionDecodeParams d;
    d.cache = cache;
    d.q = q.data() + first * qrow;
    d.out = out.data();
    d.block_tables = tables.data() + first * stride;
    d.seq_lens = seq_lens.data() + first;
    d.batch = count;
    d.n_heads = geo.n_heads;
    d.block_table_stride = stride;
    EXPECT_EQ(AttentionDecode(d, pool), kKernelOk);
    return out;
  };
  ThreadPool pool(2);
  const std::vector<float> batch = decode(0, 4, &pool);
  const int64_t qrow = geo.n_heads * geo.head_dim;
  for (int64_t b = 0; b < 4; ++b) {
    const std::vector<float> alone = decode(b, 1, nullptr);
    EXPECT_TRUE(BitsEqual(alone.data(), batch.data() + b * qrow, qrow)) << "sequence " << b;
  }
  // The oracle agrees with the batch for the longest sequence.
  const std::vector<double> want = reference::CausalAttention(seqs[2].q(), seqs[2].k(), seqs[2].v(), 0, lens[2],
                                                              geo.n_heads, geo.n_kv_heads, geo.head_dim, 1.0 / 8.0);
  std::vector<float> got(batch.begin() + 2 * qrow, batch.begin() + 3 * qrow);
  std::vector<double> want_last(want.end() - qrow, want.end());
  EXPECT_TRUE(testing::AllClose(got, want_last, 1e-5, 1e-5));
}

TEST(KvAppendDecodeTest, WritesOneTokenAtEachSequencesPosition) {
  const Geometry geo{2, 1, 8, 4};
  const int64_t num_pages = 6;
  const int64_t elems = num_pages * geo.page_size * geo.head_dim;
  std::vector<float> k_pool(elems, 0.0f), v_pool(elems, 0.0f);
  PagedKvCache cache{k_pool.data(), v_pool.data(), num_pages, geo.page_size, 1, geo.head_dim};
  const std::vector<int32_t> tables = {5, 2, 0, 3};  // two sequences, stride 2
  const std::vector<int32_t> lens = {6, 3};          // positions 5 and 2
  std::vector<float> k(2 * 8), v(2 * 8);
  for (int i = 0; i < 16; ++i) {
    k[i] = static_cast<float>(i + 1);
    v[i] = static_cast<float>(-i - 1);
  }
  KvAppendDecodeParams a;
  a.cache = cache;
  a.k = k.data();
  a.v = v.data();
  a.block_tables = tables.data();
  a.seq_lens = lens.data();
  a.batch = 2;
  a.block_table_stride = 2;
  ASSERT_EQ(KvAppendDecode(a, nullptr), kKernelOk);
  // Sequence 0, position 5: logical page 1 -> physical 2, slot 1.
  EXPECT_EQ(k_pool[(2 * 4 + 1) * 8 + 0], 1.0f);
  EXPECT_EQ(v_pool[(2 * 4 + 1) * 8 + 7], -8.0f);
  // Sequence 1, position 2: logical page 0 -> physical 0, slot 2.
  EXPECT_EQ(k_pool[(0 * 4 + 2) * 8 + 0], 9.0f);
}

// A GQA group's query heads are attended together, in blocks of up to 8 rows
// that share each key and value load; every head still gets the bits it gets
// alone. Alone here: the same heads with each KV head copied once per query
// head (ratio 1, one row at a time), for ratios that split into every block
// size (8, 4, 2, 1).
TEST(AttentionTest, GroupedHeadsHaveTheBitsOfEachHeadAlone) {
  std::mt19937 rng(21);
  std::uniform_real_distribution<float> uniform(-2.0f, 2.0f);
  for (const int64_t ratio : {2, 3, 4, 7, 8, 15}) {
    for (const int64_t head_dim : {8, 40, 64, 100}) {
      const int64_t kv_heads = 2, n_heads = kv_heads * ratio, page = 16, start = 29, n_tokens = 21;
      const int64_t pages = (start + n_tokens + page - 1) / page;
      std::vector<float> k(static_cast<size_t>(pages * page * kv_heads * head_dim));
      std::vector<float> v(k.size());
      std::vector<float> q(static_cast<size_t>(n_tokens * n_heads * head_dim));
      for (float& x : k) x = uniform(rng);
      for (float& x : v) x = uniform(rng);
      for (float& x : q) x = uniform(rng);
      // The same keys and values with KV head h copied to heads h * ratio .. h * ratio + ratio - 1.
      std::vector<float> k_alone(static_cast<size_t>(pages * page * n_heads * head_dim));
      std::vector<float> v_alone(k_alone.size());
      for (int64_t slot = 0; slot < pages * page; ++slot) {
        for (int64_t h = 0; h < n_heads; ++h) {
          const int64_t from = (slot * kv_heads + h / ratio) * head_dim, to = (slot * n_heads + h) * head_dim;
          std::copy_n(k.begin() + from, head_dim, k_alone.begin() + to);
          std::copy_n(v.begin() + from, head_dim, v_alone.begin() + to);
        }
      }
      std::vector<int32_t> table(static_cast<size_t>(pages));
      std::iota(table.begin(), table.end(), 0);
      std::vector<float> grouped(q.size(), NAN), alone(q.size(), NAN);
      AttentionPrefillParams p;
      p.q = q.data();
      p.block_table = table.data();
      p.start_pos = start;
      p.n_tokens = n_tokens;
      p.n_heads = n_heads;
      p.cache = PagedKvCache{k.data(), v.data(), pages, page, kv_heads, head_dim};
      p.out = grouped.data();
      ASSERT_EQ(AttentionPrefill(p, nullptr), kKernelOk);
      p.cache = PagedKvCache{k_alone.data(), v_alone.data(), pages, page, n_heads, head_dim};
      p.out = alone.data();
      ASSERT_EQ(AttentionPrefill(p, nullptr), kKernelOk);
      EXPECT_TRUE(BitsEqual(grouped, alone)) << "ratio " << ratio << ", head_dim " << head_dim;
    }
  }
}

TEST(AttentionTest, RejectsPageIndexOutOfRange) {
  std::vector<float> pool_k(2 * 4 * 8), pool_v(2 * 4 * 8), q(2 * 8), out(2 * 8);
  const std::vector<int32_t> table = {0, 2};  // page 2 does not exist
  AttentionPrefillParams p;
  p.cache = PagedKvCache{pool_k.data(), pool_v.data(), 2, 4, 1, 8};
  p.q = q.data();
  p.out = out.data();
  p.block_table = table.data();
  p.start_pos = 4;
  p.n_tokens = 1;
  p.n_heads = 2;
  EXPECT_EQ(AttentionPrefill(p, nullptr), kKernelInvalidArgument);
  p.start_pos = 0;  // only page 0 needed: valid
  EXPECT_EQ(AttentionPrefill(p, nullptr), kKernelOk);
  p.n_heads = 3;
  p.cache.n_kv_heads = 2;  // 3 query heads cannot share 2 KV heads evenly
  EXPECT_EQ(AttentionPrefill(p, nullptr), kKernelInvalidArgument);
}

}  // namespace
}  // namespace hybridserve::kernels::cpu
