// The CUDA paged-KV append and attention kernels (kernels/cuda/attention.cu)
// against the CPU kernels (kernels/cpu/attention.h), on the emulated and the
// GPU build, plus the bit-for-bit contract of kernels/attention_params.h
// checked on the CUDA target itself.

#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <ostream>
#include <random>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/attention_params.h"
#include "kernels/backend.h"
#include "kernels/cpu/test_util.h"
#include "kernels/cuda/test_backends.h"
#include "kernels/kernel_status.h"

namespace hybridserve::kernels {
namespace {

using cpu::testing::BitsEqual;
using cpu::testing::RandomVector;
using cuda_testing::AllClose;
using cuda_testing::CudaTarget;
using cuda_testing::Download;
using cuda_testing::MakeCudaTestBackendOrSkip;
using cuda_testing::Upload;

// The CUDA kernel and the CPU kernel each compute every output (a convex
// combination of values in [-1, 1]) within ~1e-6 of the exact result: fp32
// dot products over head_dim terms in different summation orders, the CPU's
// ~1-ulp vector exp against the GPU's __expf, and fp32 sums over up to ~270
// keys. __expf errs by up to 2 + floor(|1.16 x|) ulp, i.e. a relative
// (2 + 1.16 |x|) * 2^-23, and the emulator errs by exactly that (cuda_emu.h):
// for x = s - m <= 0 a weight e^x is then off by at most
// e^x (2 + 1.16 |x|) 2^-23 <= 2^-22 (~2.4e-7; the maximum is at x = 0) against
// a normalizer >= 1, and so is a rescale alpha. 2e-5 absolute plus 2e-5
// relative is a ~10x margin over the two errors combined.
constexpr double kAtol = 2e-5;
constexpr double kRtol = 2e-5;

struct Geometry {
  int64_t n_heads;
  int64_t n_kv_heads;
  int64_t head_dim;
  int64_t page_size;
};

void PrintTo(const Geometry& g, std::ostream* os) {
  *os << "heads " << g.n_heads << " kv_heads " << g.n_kv_heads << " head_dim " << g.head_dim << " page " << g.page_size;
}

// Padding of every q row and out row: strides are exercised everywhere, and
// the padding of out must never be written.
constexpr int64_t kQPad = 3;
constexpr int64_t kOutPad = 5;
constexpr float kSentinel = -777.0f;

// All-ones bytes: a NaN in every float of an unwritten page slot, so a read of
// one shows in the output.
constexpr uint8_t kNanByte = 0xFF;

// One KV pool, held twice: host memory for the CPU kernels and device memory
// of the backend under test, both starting as NaN bytes.
class Pool {
 public:
  Pool(Backend& gpu, const Geometry& geo, int64_t num_pages) : geo_(geo), num_pages_(num_pages) {
    const int64_t elems = num_pages * geo.page_size * geo.n_kv_heads * geo.head_dim;
    cpu_k_.resize(elems);
    cpu_v_.resize(elems);
    std::memset(cpu_k_.data(), kNanByte, elems * sizeof(float));
    std::memset(cpu_v_.data(), kNanByte, elems * sizeof(float));
    gpu_k_ = cuda_testing::Zeros(gpu, elems * sizeof(float));
    gpu_v_ = cuda_testing::Zeros(gpu, elems * sizeof(float));
    EXPECT_EQ(gpu.Fill(gpu_k_.data(), kNanByte, elems * sizeof(float)), kKernelOk);
    EXPECT_EQ(gpu.Fill(gpu_v_.data(), kNanByte, elems * sizeof(float)), kKernelOk);
  }

  PagedKvCache Cpu() { return Cache(cpu_k_.data(), cpu_v_.data()); }
  PagedKvCache Gpu() { return Cache(gpu_k_.as<float>(), gpu_v_.as<float>()); }
  int64_t elems() const { return static_cast<int64_t>(cpu_k_.size()); }
  const std::vector<float>& cpu_k() const { return cpu_k_; }
  const std::vector<float>& cpu_v() const { return cpu_v_; }
  const DeviceBuffer& gpu_k() const { return gpu_k_; }
  const DeviceBuffer& gpu_v() const { return gpu_v_; }
  const Geometry& geo() const { return geo_; }
  int64_t num_pages() const { return num_pages_; }

 private:
  PagedKvCache Cache(float* k, float* v) const {
    PagedKvCache c;
    c.k = k;
    c.v = v;
    c.num_pages = num_pages_;
    c.page_size = geo_.page_size;
    c.n_kv_heads = geo_.n_kv_heads;
    c.head_dim = geo_.head_dim;
    return c;
  }

  Geometry geo_;
  int64_t num_pages_;
  std::vector<float> cpu_k_, cpu_v_;
  DeviceBuffer gpu_k_, gpu_v_;
};

// One sequence of n tokens: q (rows padded by kQPad), k, v, and its block
// table, on the host and uploaded.
class Seq {
 public:
  Seq(Backend& gpu, const Geometry& geo, int64_t n, uint32_t seed, std::vector<int32_t> table)
      : geo_(geo), n_(n), table_(std::move(table)) {
    std::mt19937 rng(seed);
    q_ = RandomVector(rng, n * QStride(), -1.5f, 1.5f);
    k_ = RandomVector(rng, n * KvRow(), -1.5f, 1.5f);
    v_ = RandomVector(rng, n * KvRow());
    dq_ = Upload(gpu, q_);
    dk_ = Upload(gpu, k_);
    dv_ = Upload(gpu, v_);
    dtable_ = Upload(gpu, table_);
  }

  int64_t QRow() const { return geo_.n_heads * geo_.head_dim; }
  int64_t QStride() const { return QRow() + kQPad; }
  int64_t OutStride() const { return QRow() + kOutPad; }
  int64_t KvRow() const { return geo_.n_kv_heads * geo_.head_dim; }
  int64_t n() const { return n_; }
  const std::vector<float>& q() const { return q_; }
  const std::vector<int32_t>& table() const { return table_; }

  KvAppendParams AppendParams(const PagedKvCache& cache, bool on_gpu, int64_t begin, int64_t end) const {
    KvAppendParams a;
    a.cache = cache;
    a.k = (on_gpu ? dk_.as<const float>() : k_.data()) + begin * KvRow();
    a.v = (on_gpu ? dv_.as<const float>() : v_.data()) + begin * KvRow();
    a.block_table = on_gpu ? dtable_.as<const int32_t>() : table_.data();
    a.start_pos = begin;
    a.n_tokens = end - begin;
    return a;
  }

  // Appends [begin, end) to both pools.
  void Append(Backend& gpu, Pool& pool, int64_t begin, int64_t end) const {
    ASSERT_EQ(cpu::KvAppend(AppendParams(pool.Cpu(), false, begin, end), nullptr), kKernelOk);
    ASSERT_EQ(gpu.KvAppend(AppendParams(pool.Gpu(), true, begin, end)), kKernelOk);
  }

  AttentionPrefillParams PrefillParams(const PagedKvCache& cache, const float* q, float* out, const int32_t* table,
                                       int64_t begin, int64_t end) const {
    AttentionPrefillParams p;
    p.cache = cache;
    p.q = q + begin * QStride();
    p.out = out;
    p.block_table = table;
    p.start_pos = begin;
    p.n_tokens = end - begin;
    p.n_heads = geo_.n_heads;
    p.q_token_stride = QStride();
    p.out_token_stride = OutStride();
    return p;
  }

  // Attention of queries [begin, end) (their K/V appended) on the GPU
  // target: [end - begin, n_heads * head_dim]; checks the padding of out.
  std::vector<float> GpuPrefill(Backend& gpu, Pool& pool, int64_t begin, int64_t end) const {
    const int64_t rows = end - begin;
    std::vector<float> init(rows * OutStride(), kSentinel);
    DeviceBuffer out = Upload(gpu, init);
    EXPECT_EQ(gpu.AttentionPrefill(PrefillParams(pool.Gpu(), dq_.as<const float>(), out.as<float>(),
                                                 dtable_.as<const int32_t>(), begin, end)),
              kKernelOk);
    EXPECT_EQ(gpu.Synchronize(), kKernelOk);
    return Unpad(Download<float>(gpu, out.data(), rows * OutStride()), rows, OutStride());
  }

  std::vector<float> CpuPrefill(Pool& pool, int64_t begin, int64_t end) const {
    const int64_t rows = end - begin;
    std::vector<float> out(rows * OutStride(), kSentinel);
    EXPECT_EQ(
        cpu::AttentionPrefill(PrefillParams(pool.Cpu(), q_.data(), out.data(), table_.data(), begin, end), nullptr),
        kKernelOk);
    return Unpad(out, rows, OutStride());
  }

  // The q rows of `out` ([rows, stride]); expects the padding untouched.
  std::vector<float> Unpad(const std::vector<float>& out, int64_t rows, int64_t stride) const {
    std::vector<float> packed;
    for (int64_t r = 0; r < rows; ++r) {
      packed.insert(packed.end(), out.begin() + r * stride, out.begin() + r * stride + QRow());
      for (int64_t i = QRow(); i < stride; ++i) EXPECT_EQ(out[r * stride + i], kSentinel) << "padding of row " << r;
    }
    return packed;
  }

 private:
  Geometry geo_;
  int64_t n_;
  std::vector<float> q_, k_, v_;
  std::vector<int32_t> table_;
  DeviceBuffer dq_, dk_, dv_, dtable_;
};

// Pages [first, first + count) of a pool, shuffled (or in order).
std::vector<int32_t> Pages(int32_t first, int64_t count, bool shuffle, uint32_t seed) {
  std::vector<int32_t> pages(count);
  std::iota(pages.begin(), pages.end(), first);
  std::mt19937 rng(seed);
  if (shuffle) std::shuffle(pages.begin(), pages.end(), rng);
  return pages;
}

int64_t PagesFor(int64_t n, int64_t page_size) { return (n + page_size - 1) / page_size; }

// Decode of one query per sequence: sequence seqs[b] at position positions[b]
// (its K/V through that position appended), q row = that position's q. Runs
// on the GPU target or the CPU kernel; returns [batch, n_heads * head_dim].
std::vector<float> Decode(Backend* gpu, Pool& pool, const std::vector<const Seq*>& seqs,
                          const std::vector<int64_t>& positions) {
  const Seq& s0 = *seqs[0];
  const int64_t batch = static_cast<int64_t>(seqs.size());
  const int64_t q_stride = s0.QStride() + 2;  // rows of the batch padded differently from the sequences'
  const int64_t out_stride = s0.OutStride();
  int64_t table_stride = 0;
  for (const Seq* s : seqs) table_stride = std::max(table_stride, static_cast<int64_t>(s->table().size()) + 1);
  std::vector<float> q(batch * q_stride, 0.0f);
  std::vector<int32_t> tables(batch * table_stride, -1);  // entries past a sequence's pages are never read
  std::vector<int32_t> lens(batch);
  for (int64_t b = 0; b < batch; ++b) {
    std::copy_n(seqs[b]->q().begin() + positions[b] * s0.QStride(), s0.QRow(), q.begin() + b * q_stride);
    std::copy(seqs[b]->table().begin(), seqs[b]->table().end(), tables.begin() + b * table_stride);
    lens[b] = static_cast<int32_t>(positions[b] + 1);
  }
  std::vector<float> out(batch * out_stride, kSentinel);
  AttentionDecodeParams d;
  d.batch = batch;
  d.n_heads = pool.geo().n_heads;
  d.block_table_stride = table_stride;
  d.q_batch_stride = q_stride;
  d.out_batch_stride = out_stride;
  if (gpu == nullptr) {
    d.cache = pool.Cpu();
    d.q = q.data();
    d.out = out.data();
    d.block_tables = tables.data();
    d.seq_lens = lens.data();
    EXPECT_EQ(cpu::AttentionDecode(d, nullptr), kKernelOk);
  } else {
    DeviceBuffer dq = Upload(*gpu, q), dout = Upload(*gpu, out), dtables = Upload(*gpu, tables),
                 dlens = Upload(*gpu, lens);
    d.cache = pool.Gpu();
    d.q = dq.as<const float>();
    d.out = dout.as<float>();
    d.block_tables = dtables.as<const int32_t>();
    d.seq_lens = dlens.as<const int32_t>();
    EXPECT_EQ(gpu->AttentionDecode(d), kKernelOk);
    EXPECT_EQ(gpu->Synchronize(), kKernelOk);
    out = Download<float>(*gpu, dout.data(), batch * out_stride);
  }
  return s0.Unpad(out, batch, out_stride);
}

::testing::AssertionResult PoolsEqual(Backend& gpu, const Pool& pool) {
  const std::vector<float> k = Download<float>(gpu, pool.gpu_k().data(), pool.elems());
  const std::vector<float> v = Download<float>(gpu, pool.gpu_v().data(), pool.elems());
  for (int64_t i = 0; i < pool.elems(); ++i) {
    if (std::memcmp(&k[i], &pool.cpu_k()[i], sizeof(float)) != 0 ||
        std::memcmp(&v[i], &pool.cpu_v()[i], sizeof(float)) != 0) {
      return ::testing::AssertionFailure() << "pools differ at element " << i << ": k " << k[i] << " vs "
                                           << pool.cpu_k()[i] << ", v " << v[i] << " vs " << pool.cpu_v()[i];
    }
  }
  return ::testing::AssertionSuccess();
}

class AttentionCudaTest : public ::testing::TestWithParam<CudaTarget> {};

TEST_P(AttentionCudaTest, KvAppendCopiesExactlyFromMidPageIntoShuffledPages) {
  std::unique_ptr<Backend> gpu = MakeCudaTestBackendOrSkip(GetParam());
  if (gpu == nullptr) return;
  const Geometry geo{4, 2, 16, 3};
  Pool pool(*gpu, geo, 12);
  const Seq seq(*gpu, geo, 20, 1, Pages(0, 7, /*shuffle=*/true, 2));
  // Segments starting at slots 0, 1 and 2 of a page.
  for (const auto& [begin, end] : std::vector<std::pair<int64_t, int64_t>>{{0, 4}, {4, 11}, {11, 12}, {12, 20}}) {
    seq.Append(*gpu, pool, begin, end);
  }
  EXPECT_TRUE(PoolsEqual(*gpu, pool));

  // Token strides wider than a row (e.g. K and V inside a fused QKV output).
  const int64_t row = geo.n_kv_heads * geo.head_dim;
  std::mt19937 rng(3);
  const std::vector<float> kv = RandomVector(rng, 5 * 3 * row);
  const std::vector<int32_t> table = {11, 10, 9};
  DeviceBuffer dkv = Upload(*gpu, kv), dtable = Upload(*gpu, table);
  KvAppendParams a;
  a.cache = pool.Cpu();
  a.k = kv.data();
  a.v = kv.data() + row;
  a.block_table = table.data();
  a.start_pos = 2;
  a.n_tokens = 5;
  a.k_token_stride = 3 * row;
  a.v_token_stride = 3 * row;
  ASSERT_EQ(cpu::KvAppend(a, nullptr), kKernelOk);
  a.cache = pool.Gpu();
  a.k = dkv.as<const float>();
  a.v = dkv.as<const float>() + row;
  a.block_table = dtable.as<const int32_t>();
  ASSERT_EQ(gpu->KvAppend(a), kKernelOk);
  EXPECT_EQ(gpu->Synchronize(), kKernelOk);
  EXPECT_TRUE(PoolsEqual(*gpu, pool));
}

TEST_P(AttentionCudaTest, KvAppendDecodeWritesEachSequencesTokenExactly) {
  std::unique_ptr<Backend> gpu = MakeCudaTestBackendOrSkip(GetParam());
  if (gpu == nullptr) return;
  const Geometry geo{2, 2, 8, 4};
  Pool pool(*gpu, geo, 9);
  const int64_t row = geo.n_kv_heads * geo.head_dim;
  const int64_t stride = 3;
  const std::vector<int32_t> tables = {5, 2, -1, 0, 8, -1, 7, 1, 3};  // -1: never read
  const std::vector<int32_t> lens = {6, 1, 12};                       // positions 5, 0, 11
  std::mt19937 rng(4);
  const std::vector<float> k = RandomVector(rng, 3 * (row + 2)), v = RandomVector(rng, 3 * (row + 7));
  KvAppendDecodeParams a;
  a.cache = pool.Cpu();
  a.k = k.data();
  a.v = v.data();
  a.block_tables = tables.data();
  a.seq_lens = lens.data();
  a.batch = 3;
  a.block_table_stride = stride;
  a.k_batch_stride = row + 2;
  a.v_batch_stride = row + 7;
  ASSERT_EQ(cpu::KvAppendDecode(a, nullptr), kKernelOk);
  DeviceBuffer dk = Upload(*gpu, k), dv = Upload(*gpu, v), dtables = Upload(*gpu, tables), dlens = Upload(*gpu, lens);
  a.cache = pool.Gpu();
  a.k = dk.as<const float>();
  a.v = dv.as<const float>();
  a.block_tables = dtables.as<const int32_t>();
  a.seq_lens = dlens.as<const int32_t>();
  ASSERT_EQ(gpu->KvAppendDecode(a), kKernelOk);
  EXPECT_EQ(gpu->Synchronize(), kKernelOk);
  EXPECT_TRUE(PoolsEqual(*gpu, pool));
}

// GQA ratios 1, 2 and 4; head_dim 8, 16, 40 (a tail), 64, 128 and 256; pages
// of 1, 3, 5 and 16 tokens.
const Geometry kGeometries[] = {
    {2, 2, 8, 1},   {4, 2, 16, 3}, {8, 2, 64, 16}, {4, 1, 64, 3},
    {4, 1, 16, 16}, {2, 1, 40, 5}, {2, 2, 128, 4}, {2, 1, 256, 16},
};

TEST_P(AttentionCudaTest, PrefillInTwoSegmentsMatchesCpu) {
  std::unique_ptr<Backend> gpu = MakeCudaTestBackendOrSkip(GetParam());
  if (gpu == nullptr) return;
  for (const Geometry& geo : kGeometries) {
    SCOPED_TRACE(::testing::PrintToString(geo));
    const int64_t n = 37;
    Pool pool(*gpu, geo, PagesFor(n, geo.page_size) + 4);
    const Seq seq(*gpu, geo, n, 7, Pages(0, PagesFor(n, geo.page_size) + 4, true, 8));
    // [0, 22) then [22, 37): the second starts mid-page for pages of 3, 5 and
    // 16 and attends cached pages plus its own tokens.
    for (const auto& [begin, end] : std::vector<std::pair<int64_t, int64_t>>{{0, 22}, {22, n}}) {
      seq.Append(*gpu, pool, begin, end);
      EXPECT_TRUE(AllClose(seq.GpuPrefill(*gpu, pool, begin, end), seq.CpuPrefill(pool, begin, end), kAtol, kRtol))
          << "segment [" << begin << ", " << end << ")";
    }
  }
}

TEST_P(AttentionCudaTest, DecodeBatchMatchesCpuAndEachSequenceAloneBitForBit) {
  std::unique_ptr<Backend> gpu = MakeCudaTestBackendOrSkip(GetParam());
  if (gpu == nullptr) return;
  for (const Geometry& geo : {Geometry{8, 2, 64, 16}, Geometry{4, 4, 16, 3}, Geometry{20, 1, 8, 5}}) {
    SCOPED_TRACE(::testing::PrintToString(geo));
    const std::vector<int64_t> lens = {1, 17, 33, 5, 48, 16, 2, 40};
    const int64_t pages_each = PagesFor(48, geo.page_size);
    Pool pool(*gpu, geo, 8 * pages_each);
    std::vector<std::unique_ptr<Seq>> seqs;
    std::vector<const Seq*> batch;
    std::vector<int64_t> positions;
    for (int64_t b = 0; b < 8; ++b) {
      // Sequence b owns pages [b * pages_each, (b + 1) * pages_each), shuffled.
      seqs.push_back(std::make_unique<Seq>(*gpu, geo, lens[b], 20 + static_cast<uint32_t>(b),
                                           Pages(static_cast<int32_t>(b * pages_each), PagesFor(lens[b], geo.page_size),
                                                 true, static_cast<uint32_t>(30 + b))));
      seqs.back()->Append(*gpu, pool, 0, lens[b]);
      batch.push_back(seqs.back().get());
      positions.push_back(lens[b] - 1);
    }
    const std::vector<float> got = Decode(gpu.get(), pool, batch, positions);
    EXPECT_TRUE(AllClose(got, Decode(nullptr, pool, batch, positions), kAtol, kRtol));
    const int64_t qrow = geo.n_heads * geo.head_dim;
    for (int64_t b = 0; b < 8; ++b) {
      const std::vector<float> alone = Decode(gpu.get(), pool, {batch[b]}, {positions[b]});
      EXPECT_TRUE(BitsEqual(alone.data(), got.data() + b * qrow, qrow)) << "sequence " << b;
    }
  }
}

// Decode of position t gives the bits of prefill row t. Pages of 257 keys of
// head_dim 64 also take the prefill through its recomputed-scores path (16
// rows x 257 scores do not fit its shared memory) and through several K/V
// chunks per page, while decode keeps its scores: the same bits either way.
TEST_P(AttentionCudaTest, DecodeAtPositionEqualsPrefillRowBitForBit) {
  std::unique_ptr<Backend> gpu = MakeCudaTestBackendOrSkip(GetParam());
  if (gpu == nullptr) return;
  struct Case {
    Geometry geo;
    int64_t n;
    std::vector<int64_t> positions;
  };
  const std::vector<Case> cases = {
      {{4, 2, 64, 16}, 70, {0, 1, 15, 16, 17, 31, 32, 47, 63, 64, 69}},
      {{2, 1, 16, 3}, 20, {0, 2, 3, 4, 10, 19}},
      {{2, 2, 8, 1}, 9, {0, 1, 8}},
      {{2, 1, 256, 16}, 20, {0, 15, 16, 19}},
      {{2, 1, 64, 257}, 262, {0, 63, 64, 256, 257, 261}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::PrintToString(c.geo));
    const int64_t pages = PagesFor(c.n, c.geo.page_size);
    Pool pool(*gpu, c.geo, pages + 2);
    const Seq seq(*gpu, c.geo, c.n, 9, Pages(0, pages + 2, true, 10));
    seq.Append(*gpu, pool, 0, c.n);
    const std::vector<float> prefill = seq.GpuPrefill(*gpu, pool, 0, c.n);
    for (int64_t t : c.positions) {
      const std::vector<float> decode = Decode(gpu.get(), pool, {&seq}, {t});
      EXPECT_TRUE(BitsEqual(decode.data(), prefill.data() + t * seq.QRow(), seq.QRow())) << "position " << t;
    }
    if (c.geo.page_size == 257) {
      EXPECT_TRUE(AllClose(prefill, seq.CpuPrefill(pool, 0, c.n), kAtol, kRtol));
    }
  }
}

TEST_P(AttentionCudaTest, PrefillSplitIntoSegmentsIsBitIdenticalToOneCall) {
  std::unique_ptr<Backend> gpu = MakeCudaTestBackendOrSkip(GetParam());
  if (gpu == nullptr) return;
  for (const Geometry& geo : {Geometry{4, 2, 16, 3}, Geometry{4, 1, 64, 16}}) {
    SCOPED_TRACE(::testing::PrintToString(geo));
    const int64_t n = 40;
    const int64_t pages = PagesFor(n, geo.page_size);
    Pool whole_pool(*gpu, geo, pages + 1);
    const std::vector<int32_t> table = Pages(0, pages + 1, true, 11);
    const Seq whole_seq(*gpu, geo, n, 12, table);
    whole_seq.Append(*gpu, whole_pool, 0, n);
    const std::vector<float> whole = whole_seq.GpuPrefill(*gpu, whole_pool, 0, n);
    for (const std::vector<int64_t>& cuts : {std::vector<int64_t>{1}, {7, 8, 9}, {16, 33}, {39}}) {
      Pool pool(*gpu, geo, pages + 1);
      const Seq seq(*gpu, geo, n, 12, table);  // same data, same pages
      std::vector<float> joined;
      int64_t begin = 0;
      std::vector<int64_t> ends = cuts;
      ends.push_back(n);
      for (int64_t end : ends) {
        seq.Append(*gpu, pool, begin, end);
        const std::vector<float> part = seq.GpuPrefill(*gpu, pool, begin, end);
        joined.insert(joined.end(), part.begin(), part.end());
        begin = end;
      }
      EXPECT_TRUE(BitsEqual(joined, whole)) << "first cut " << cuts[0];
    }
  }
}

TEST_P(AttentionCudaTest, PhysicalPagePlacementDoesNotChangeBits) {
  std::unique_ptr<Backend> gpu = MakeCudaTestBackendOrSkip(GetParam());
  if (gpu == nullptr) return;
  const Geometry geo{4, 2, 64, 4};
  const int64_t n = 30;
  const int64_t pages = PagesFor(n, geo.page_size);
  Pool pool_a(*gpu, geo, pages + 3), pool_b(*gpu, geo, pages + 3);
  const Seq shuffled(*gpu, geo, n, 13, Pages(0, pages, true, 14));
  const Seq in_order(*gpu, geo, n, 13, Pages(3, pages, false, 0));
  ASSERT_NE(shuffled.table(), in_order.table());
  shuffled.Append(*gpu, pool_a, 0, n);
  in_order.Append(*gpu, pool_b, 0, n);
  EXPECT_TRUE(BitsEqual(shuffled.GpuPrefill(*gpu, pool_a, 0, n), in_order.GpuPrefill(*gpu, pool_b, 0, n)));
  EXPECT_TRUE(
      BitsEqual(Decode(gpu.get(), pool_a, {&shuffled}, {n - 1}), Decode(gpu.get(), pool_b, {&in_order}, {n - 1})));
}

// A block-table entry out of range, or a bad sequence length, met on the
// device: the rows that need it are skipped (nothing written), the others
// are computed, and the next Synchronize() reports kKernelInvalidArgument.
TEST_P(AttentionCudaTest, BadDeviceIndicesSkipTheirRowsAndRaiseTheFlag) {
  std::unique_ptr<Backend> gpu = MakeCudaTestBackendOrSkip(GetParam());
  if (gpu == nullptr) return;
  const Geometry geo{2, 1, 8, 4};
  const int64_t n = 12;
  Pool pool(*gpu, geo, 4);
  const Seq seq(*gpu, geo, n, 15, {2, 0, 3});
  seq.Append(*gpu, pool, 0, n);
  const std::vector<float> good = seq.GpuPrefill(*gpu, pool, 0, n);
  const int64_t qrow = seq.QRow();

  for (const int32_t bad : {4, -1}) {
    SCOPED_TRACE(bad);
    // Prefill: logical page 2 (positions 8..11) out of range.
    const std::vector<int32_t> table = {2, 0, bad};
    DeviceBuffer dtable = Upload(*gpu, table);
    std::vector<float> init(n * seq.OutStride(), kSentinel);
    DeviceBuffer out = Upload(*gpu, init);
    const DeviceBuffer dq = Upload(*gpu, seq.q());
    ASSERT_EQ(gpu->AttentionPrefill(seq.PrefillParams(pool.Gpu(), dq.as<const float>(), out.as<float>(),
                                                      dtable.as<const int32_t>(), 0, n)),
              kKernelOk);
    EXPECT_EQ(gpu->Synchronize(), kKernelInvalidArgument);
    EXPECT_EQ(gpu->Synchronize(), kKernelOk) << "the flag is cleared once reported";
    const std::vector<float> got = Download<float>(*gpu, out.data(), n * seq.OutStride());
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t i = 0; i < qrow; ++i) {
        const float want = t < 8 ? good[t * qrow + i] : kSentinel;
        ASSERT_EQ(got[t * seq.OutStride() + i], want) << "row " << t << " element " << i;
      }
    }

    // KvAppend onto the bad page: nothing written there, the other tokens are.
    const Seq other(*gpu, geo, n, 16, table);
    KvAppendParams a = other.AppendParams(pool.Gpu(), true, 6, 10);
    a.block_table = dtable.as<const int32_t>();
    const std::vector<float> k_before = Download<float>(*gpu, pool.gpu_k().data(), pool.elems());
    ASSERT_EQ(gpu->KvAppend(a), kKernelOk);
    EXPECT_EQ(gpu->Synchronize(), kKernelInvalidArgument);
    const std::vector<float> k_after = Download<float>(*gpu, pool.gpu_k().data(), pool.elems());
    const int64_t token = geo.n_kv_heads * geo.head_dim;
    for (int64_t page = 0; page < pool.num_pages(); ++page) {
      for (int64_t slot = 0; slot < geo.page_size; ++slot) {
        // Positions 6 and 7 live in page 0 (logical 1), slots 2 and 3.
        const bool written = page == 0 && slot >= 2;
        const int64_t e = (page * geo.page_size + slot) * token;
        EXPECT_EQ(std::memcmp(&k_before[e], &k_after[e], token * sizeof(float)) != 0, written)
            << "page " << page << " slot " << slot;
      }
    }
    seq.Append(*gpu, pool, 0, n);  // restore the pool
    EXPECT_EQ(gpu->Synchronize(), kKernelOk);
  }

  // Decode: sequence 0 fine, 1 with length 0, 2 needing more pages than the
  // table stride, 3 naming page 4 of 4.
  const std::vector<int32_t> tables = {2, 0, 3, 2, 0, 3, 2, 0, 3, 2, 0, 4};
  const std::vector<int32_t> lens = {12, 0, 13, 12};
  std::vector<float> q(4 * qrow);
  for (int b = 0; b < 4; ++b) std::copy_n(seq.q().begin() + 11 * seq.QStride(), qrow, q.begin() + b * qrow);
  std::vector<float> init(4 * qrow, kSentinel);
  DeviceBuffer dq = Upload(*gpu, q), dout = Upload(*gpu, init), dtables = Upload(*gpu, tables),
               dlens = Upload(*gpu, lens);
  AttentionDecodeParams d;
  d.cache = pool.Gpu();
  d.q = dq.as<const float>();
  d.out = dout.as<float>();
  d.block_tables = dtables.as<const int32_t>();
  d.seq_lens = dlens.as<const int32_t>();
  d.batch = 4;
  d.n_heads = geo.n_heads;
  d.block_table_stride = 3;
  ASSERT_EQ(gpu->AttentionDecode(d), kKernelOk);
  EXPECT_EQ(gpu->Synchronize(), kKernelInvalidArgument);
  const std::vector<float> got = Download<float>(*gpu, dout.data(), 4 * qrow);
  EXPECT_TRUE(BitsEqual(got.data(), good.data() + 11 * qrow, qrow));
  for (int64_t i = qrow; i < 4 * qrow; ++i) ASSERT_EQ(got[i], kSentinel) << "element " << i;

  // KvAppendDecode with the same bad rows: only sequence 0's token is written.
  KvAppendDecodeParams ad;
  ad.cache = pool.Gpu();
  ad.k = dq.as<const float>();  // any [4, n_kv_heads * head_dim] data
  ad.v = dq.as<const float>();
  ad.block_tables = dtables.as<const int32_t>();
  ad.seq_lens = dlens.as<const int32_t>();
  ad.batch = 4;
  ad.block_table_stride = 3;
  ad.k_batch_stride = qrow;
  ad.v_batch_stride = qrow;
  const std::vector<float> before = Download<float>(*gpu, pool.gpu_k().data(), pool.elems());
  ASSERT_EQ(gpu->KvAppendDecode(ad), kKernelOk);
  EXPECT_EQ(gpu->Synchronize(), kKernelInvalidArgument);
  const std::vector<float> after = Download<float>(*gpu, pool.gpu_k().data(), pool.elems());
  int64_t changed = 0;
  for (int64_t i = 0; i < pool.elems(); ++i) changed += std::memcmp(&before[i], &after[i], sizeof(float)) != 0;
  EXPECT_LE(changed, geo.n_kv_heads * geo.head_dim);  // position 11 of sequence 0 only (page 3, slot 3)
  EXPECT_EQ(std::memcmp(&after[(3 * 4 + 3) * 8], q.data(), 8 * sizeof(float)), 0);
}

TEST_P(AttentionCudaTest, InvalidArgumentsAreRejectedLikeTheCpu) {
  std::unique_ptr<Backend> gpu = MakeCudaTestBackendOrSkip(GetParam());
  if (gpu == nullptr) return;
  const Geometry geo{4, 2, 8, 4};
  Pool pool(*gpu, geo, 3);
  DeviceBuffer buf = cuda_testing::Zeros(*gpu, 4096), out_buf = cuda_testing::Zeros(*gpu, 4096);
  const float* f = buf.as<const float>();
  float* out = out_buf.as<float>();
  const int32_t* idx = buf.as<const int32_t>();

  AttentionPrefillParams p;
  p.cache = pool.Gpu();
  p.q = f;
  p.out = out;
  p.block_table = idx;
  p.n_tokens = 2;
  p.n_heads = 4;
  auto prefill = [&](auto mutate) {
    AttentionPrefillParams m = p;
    mutate(m);
    const int gpu_status = gpu->AttentionPrefill(m);
    const int cpu_status = [&] {
      // The CPU launcher sees the same host-visible fields (its table pointer
      // is host memory holding valid entries).
      const std::vector<int32_t> table(8, 0);
      std::vector<float> host(1024, 0.0f);
      AttentionPrefillParams c = m;
      c.cache = pool.Cpu();
      c.cache.num_pages = m.cache.num_pages;
      c.cache.page_size = m.cache.page_size;
      c.cache.n_kv_heads = m.cache.n_kv_heads;
      c.cache.head_dim = m.cache.head_dim;
      if (m.cache.k == nullptr) c.cache.k = nullptr;
      if (m.cache.v == nullptr) c.cache.v = nullptr;
      c.q = m.q ? host.data() : nullptr;
      c.out = m.out ? host.data() : nullptr;
      c.block_table = m.block_table ? table.data() : nullptr;
      return cpu::AttentionPrefill(c, nullptr);
    }();
    EXPECT_EQ(gpu_status, cpu_status);
    return gpu_status;
  };
  EXPECT_EQ(prefill([](AttentionPrefillParams&) {}), kKernelOk);
  EXPECT_EQ(prefill([](AttentionPrefillParams& m) { m.q = nullptr; }), kKernelInvalidArgument);
  EXPECT_EQ(prefill([](AttentionPrefillParams& m) { m.out = nullptr; }), kKernelInvalidArgument);
  EXPECT_EQ(prefill([](AttentionPrefillParams& m) { m.block_table = nullptr; }), kKernelInvalidArgument);
  EXPECT_EQ(prefill([](AttentionPrefillParams& m) { m.cache.k = nullptr; }), kKernelInvalidArgument);
  EXPECT_EQ(prefill([](AttentionPrefillParams& m) { m.cache.page_size = 0; }), kKernelInvalidArgument);
  EXPECT_EQ(prefill([](AttentionPrefillParams& m) { m.cache.num_pages = 0; }), kKernelInvalidArgument);
  EXPECT_EQ(prefill([](AttentionPrefillParams& m) { m.start_pos = -1; }), kKernelInvalidArgument);
  EXPECT_EQ(prefill([](AttentionPrefillParams& m) { m.n_tokens = -1; }), kKernelInvalidArgument);
  EXPECT_EQ(prefill([](AttentionPrefillParams& m) { m.n_heads = 3; }), kKernelInvalidArgument);
  EXPECT_EQ(prefill([](AttentionPrefillParams& m) { m.n_heads = 0; }), kKernelInvalidArgument);
  EXPECT_EQ(prefill([](AttentionPrefillParams& m) { m.scale = -1.0f; }), kKernelInvalidArgument);
  EXPECT_EQ(prefill([](AttentionPrefillParams& m) { m.scale = NAN; }), kKernelInvalidArgument);
  EXPECT_EQ(gpu->Synchronize(), kKernelOk);

  AttentionDecodeParams d;
  d.cache = pool.Gpu();
  d.q = f;
  d.out = out;
  d.block_tables = idx;
  d.seq_lens = idx;
  d.batch = 1;
  d.n_heads = 4;
  d.block_table_stride = 1;
  auto decode = [&](auto mutate) {
    AttentionDecodeParams m = d;
    mutate(m);
    return gpu->AttentionDecode(m);
  };
  EXPECT_EQ(decode([](AttentionDecodeParams& m) { m.batch = 0; }), kKernelOk);
  EXPECT_EQ(decode([](AttentionDecodeParams& m) { m.batch = -1; }), kKernelInvalidArgument);
  EXPECT_EQ(decode([](AttentionDecodeParams& m) { m.q = nullptr; }), kKernelInvalidArgument);
  EXPECT_EQ(decode([](AttentionDecodeParams& m) { m.out = nullptr; }), kKernelInvalidArgument);
  EXPECT_EQ(decode([](AttentionDecodeParams& m) { m.seq_lens = nullptr; }), kKernelInvalidArgument);
  EXPECT_EQ(decode([](AttentionDecodeParams& m) { m.block_tables = nullptr; }), kKernelInvalidArgument);
  EXPECT_EQ(decode([](AttentionDecodeParams& m) { m.cache.v = nullptr; }), kKernelInvalidArgument);
  EXPECT_EQ(decode([](AttentionDecodeParams& m) { m.cache.n_kv_heads = 3; }), kKernelInvalidArgument);
  EXPECT_EQ(decode([](AttentionDecodeParams& m) { m.scale = -0.5f; }), kKernelInvalidArgument);
  EXPECT_EQ(decode([](AttentionDecodeParams& m) { m.cache.head_dim = 0; }), kKernelInvalidArgument);
  // The CPU kernel takes any head_dim; this backend stops at 256.
  EXPECT_EQ(decode([](AttentionDecodeParams& m) { m.cache.head_dim = 257; }), kKernelUnsupported);

  KvAppendParams a;
  a.cache = pool.Gpu();
  a.k = f;
  a.v = f;
  a.block_table = idx;
  a.n_tokens = 1;
  auto append = [&](auto mutate) {
    KvAppendParams m = a;
    mutate(m);
    return gpu->KvAppend(m);
  };
  EXPECT_EQ(append([](KvAppendParams& m) { m.n_tokens = 0; }), kKernelOk);
  EXPECT_EQ(append([](KvAppendParams& m) { m.k = nullptr; }), kKernelInvalidArgument);
  EXPECT_EQ(append([](KvAppendParams& m) { m.v = nullptr; }), kKernelInvalidArgument);
  EXPECT_EQ(append([](KvAppendParams& m) { m.block_table = nullptr; }), kKernelInvalidArgument);
  EXPECT_EQ(append([](KvAppendParams& m) { m.start_pos = -2; }), kKernelInvalidArgument);
  EXPECT_EQ(append([](KvAppendParams& m) { m.n_tokens = -1; }), kKernelInvalidArgument);
  EXPECT_EQ(append([](KvAppendParams& m) { m.cache.n_kv_heads = 0; }), kKernelInvalidArgument);

  KvAppendDecodeParams ad;
  ad.cache = pool.Gpu();
  ad.k = f;
  ad.v = f;
  ad.block_tables = idx;
  ad.seq_lens = idx;
  ad.batch = 1;
  ad.block_table_stride = 1;
  auto append_decode = [&](auto mutate) {
    KvAppendDecodeParams m = ad;
    mutate(m);
    return gpu->KvAppendDecode(m);
  };
  EXPECT_EQ(append_decode([](KvAppendDecodeParams& m) { m.batch = 0; }), kKernelOk);
  EXPECT_EQ(append_decode([](KvAppendDecodeParams& m) { m.batch = -1; }), kKernelInvalidArgument);
  EXPECT_EQ(append_decode([](KvAppendDecodeParams& m) { m.k = nullptr; }), kKernelInvalidArgument);
  EXPECT_EQ(append_decode([](KvAppendDecodeParams& m) { m.seq_lens = nullptr; }), kKernelInvalidArgument);
  EXPECT_EQ(append_decode([](KvAppendDecodeParams& m) { m.block_tables = nullptr; }), kKernelInvalidArgument);
  EXPECT_EQ(append_decode([](KvAppendDecodeParams& m) { m.cache.k = nullptr; }), kKernelInvalidArgument);
  EXPECT_EQ(gpu->Synchronize(), kKernelOk);
}

INSTANTIATE_TEST_SUITE_P(Cuda, AttentionCudaTest, cuda_testing::CudaTestTargets(), cuda_testing::CudaTargetName);

}  // namespace
}  // namespace hybridserve::kernels
