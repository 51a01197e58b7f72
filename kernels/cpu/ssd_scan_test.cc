#include "kernels/cpu/ssd_scan.h"

#include <cmath>
#include <ostream>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/activations.h"
#include "kernels/cpu/test_util.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/kernel_status.h"

namespace hybridserve::kernels::cpu {
namespace {

using testing::BitsEqual;
using testing::CloseToScale;

struct Shape {
  int64_t seqlen;
  int64_t n_heads;
  int64_t head_dim;
  int64_t d_state;
  int64_t n_groups;
  int64_t chunk_size;
  int64_t start_pos = 0;
  int64_t block_size = 0;
};

void PrintTo(const Shape& s, std::ostream* os) {
  *os << "seqlen " << s.seqlen << " heads " << s.n_heads << " head_dim " << s.head_dim << " d_state " << s.d_state
      << " groups " << s.n_groups << " chunk " << s.chunk_size << " start " << s.start_pos << " block " << s.block_size;
}

// Inputs of a whole sequence [0, total); a test scans windows of it.
struct Problem {
  Shape s;
  int64_t total = 0;
  std::vector<float> x, dt, A, B, C, D, init;

  Problem(const Shape& shape, uint32_t seed) : s(shape), total(shape.start_pos + shape.seqlen) {
    std::mt19937 rng(seed);
    x = testing::RandomVector(rng, total * s.n_heads * s.head_dim);
    B = testing::RandomVector(rng, total * s.n_groups * s.d_state);
    C = testing::RandomVector(rng, total * s.n_groups * s.d_state);
    // Realistic Mamba2 ranges: dt = softplus(.) in ~[1e-3, 0.1], A = -exp(A_log) in [-16, -1].
    std::uniform_real_distribution<float> log_dt(std::log(1e-3f), std::log(0.1f));
    dt.resize(total * s.n_heads);
    for (float& v : dt) v = std::exp(log_dt(rng));
    A = testing::RandomVector(rng, s.n_heads, -16.0f, -1.0f);
    D = testing::RandomVector(rng, s.n_heads);
    init = testing::RandomVector(rng, s.n_heads * s.head_dim * s.d_state, -0.5f, 0.5f);
  }

  int64_t StateElems() const { return s.n_heads * s.head_dim * s.d_state; }

  // Params for tokens [begin, begin + len) starting from `state` (null: zeros).
  SsdChunkScanParams Params(int64_t begin, int64_t len, const float* state) const {
    SsdChunkScanParams p;
    p.x = x.data() + begin * s.n_heads * s.head_dim;
    p.dt = dt.data() + begin * s.n_heads;
    p.A = A.data();
    p.B = B.data() + begin * s.n_groups * s.d_state;
    p.C = C.data() + begin * s.n_groups * s.d_state;
    p.D = D.data();
    p.initial_state = state;
    p.seqlen = len;
    p.n_heads = s.n_heads;
    p.head_dim = s.head_dim;
    p.d_state = s.d_state;
    p.n_groups = s.n_groups;
    p.chunk_size = s.chunk_size;
    p.start_pos = begin;
    p.block_size = s.block_size;
    return p;
  }
};

struct ScanOutput {
  std::vector<float> y, final_state, chunk_states;
};

ScanOutput RunScan(bool chunked, SsdChunkScanParams p, ThreadPool* pool) {
  ScanOutput out;
  out.y.assign(p.seqlen * p.n_heads * p.head_dim, NAN);
  out.final_state.assign(p.n_heads * p.head_dim * p.d_state, NAN);
  out.chunk_states.assign(SsdNumChunkStates(p.start_pos, p.seqlen, p.chunk_size) * p.n_heads * p.head_dim * p.d_state,
                          NAN);
  p.y = out.y.data();
  p.final_state = out.final_state.data();
  p.chunk_states = out.chunk_states.empty() ? nullptr : out.chunk_states.data();
  const int rc = chunked ? SsdChunkScan(p, pool) : SsdSequentialScan(p, pool);
  EXPECT_EQ(rc, kKernelOk);
  return out;
}

// The sequential oracle itself against a double-precision recurrence.
TEST(SsdSequentialScanTest, MatchesDoublePrecisionRecurrence) {
  const Shape s{
      .seqlen = 70, .n_heads = 4, .head_dim = 6, .d_state = 13, .n_groups = 2, .chunk_size = 16, .start_pos = 0};
  const Problem pr(s, 7);
  const ScanOutput got = RunScan(false, pr.Params(0, s.seqlen, pr.init.data()), nullptr);

  const int64_t P = s.head_dim, N = s.d_state, H = s.n_heads;
  std::vector<double> state(pr.init.begin(), pr.init.end());
  std::vector<double> y(s.seqlen * H * P);
  for (int64_t t = 0; t < s.seqlen; ++t) {
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / (H / s.n_groups);
      const double dt = pr.dt[t * H + h];
      const double dA = std::exp(dt * pr.A[h]);
      for (int64_t p = 0; p < P; ++p) {
        const double xv = pr.x[(t * H + h) * P + p];
        double acc = 0;
        for (int64_t n = 0; n < N; ++n) {
          double& st = state[(h * P + p) * N + n];
          st = dA * st + dt * xv * pr.B[(t * s.n_groups + g) * N + n];
          acc += st * pr.C[(t * s.n_groups + g) * N + n];
        }
        y[(t * H + h) * P + p] = acc + pr.D[h] * xv;
      }
    }
  }
  // fp32 vs fp64 of the same recurrence: per-step rounding of ~d_state terms,
  // contracting over time (dA < 1). 1e-5 of the tensor scale is ~100 ulps.
  EXPECT_TRUE(CloseToScale(got.y, y, 1e-5));
  EXPECT_TRUE(CloseToScale(got.final_state, state, 1e-5));
}

class ChunkVsSequentialTest : public ::testing::TestWithParam<Shape> {};

// Chunked and token-by-token scans agree within fp32 rounding of two summation
// orders. The chunk form sums ~block + d_state products per output in a
// different order and rebuilds decays as exp of prefix-sum differences
// (absolute error ~ |S| * 2^-24, |S| <= block * 0.1 * 16): each contributes
// errors of order 1e-6 of the scale; 1e-4 leaves a 10-100x margin while a
// wrong decay, a missing term or a misaligned block fails by orders of magnitude.
TEST_P(ChunkVsSequentialTest, MatchesSequentialOracle) {
  const Shape s = GetParam();
  const Problem pr(s, 1234 + static_cast<uint32_t>(s.seqlen));
  ThreadPool pool(2);
  for (const float* init : {static_cast<const float*>(nullptr), pr.init.data()}) {
    const SsdChunkScanParams p = pr.Params(s.start_pos, s.seqlen, init);
    const ScanOutput want = RunScan(false, p, &pool);
    const ScanOutput got = RunScan(true, p, &pool);
    EXPECT_TRUE(CloseToScale(got.y, want.y, 1e-4));
    EXPECT_TRUE(CloseToScale(got.final_state, want.final_state, 1e-4));
    ASSERT_EQ(got.chunk_states.size(), want.chunk_states.size());
    EXPECT_TRUE(CloseToScale(got.chunk_states, want.chunk_states, 1e-4));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, ChunkVsSequentialTest,
    ::testing::Values(
        // Aligned start, length not a multiple of the chunk.
        Shape{.seqlen = 300, .n_heads = 8, .head_dim = 16, .d_state = 32, .n_groups = 2, .chunk_size = 64},
        // Start inside a chunk and inside a block; odd dims exercise vector tails.
        Shape{.seqlen = 213,
              .n_heads = 6,
              .head_dim = 13,
              .d_state = 19,
              .n_groups = 3,
              .chunk_size = 32,
              .start_pos = 45},
        // One group, many heads, block = chunk.
        Shape{.seqlen = 129,
              .n_heads = 12,
              .head_dim = 8,
              .d_state = 16,
              .n_groups = 1,
              .chunk_size = 16,
              .start_pos = 3,
              .block_size = 16},
        // Shorter than one block, crossing no boundary.
        Shape{.seqlen = 5,
              .n_heads = 2,
              .head_dim = 64,
              .d_state = 128,
              .n_groups = 1,
              .chunk_size = 256,
              .start_pos = 7},
        // Realistic head geometry, explicit non-default block.
        Shape{.seqlen = 400,
              .n_heads = 4,
              .head_dim = 64,
              .d_state = 128,
              .n_groups = 2,
              .chunk_size = 128,
              .start_pos = 128,
              .block_size = 64},
        // Block of 8 with a chunk of 24 (block divides chunk, chunk not a power of two).
        Shape{.seqlen = 100,
              .n_heads = 2,
              .head_dim = 9,
              .d_state = 7,
              .n_groups = 1,
              .chunk_size = 24,
              .start_pos = 10,
              .block_size = 8}));

// Grid contract (docs/ARCHITECTURE.md section 3): scanning [0, P) in one call, or [0, q) and
// then [q, P) from the state at q (q a multiple of chunk_size), gives identical bits.
TEST(SsdChunkScanTest, SplitAtGridPointIsBitIdenticalToOneCall) {
  const Shape s{.seqlen = 1000, .n_heads = 8, .head_dim = 32, .d_state = 64, .n_groups = 2, .chunk_size = 128};
  const Problem pr(s, 99);
  ThreadPool pool(2);
  const int64_t total = s.seqlen;  // not a multiple of chunk_size
  const int64_t HP = s.n_heads * s.head_dim;
  const int64_t SE = pr.StateElems();
  const ScanOutput whole = RunScan(true, pr.Params(0, total, pr.init.data()), &pool);
  ASSERT_EQ(whole.chunk_states.size(), static_cast<size_t>(7 * SE));

  for (int64_t q : {128, 256, 640, 896}) {
    SCOPED_TRACE(q);
    const ScanOutput head = RunScan(true, pr.Params(0, q, pr.init.data()), &pool);
    // The checkpoint at q is the last chunk state of the first call and its final state.
    const float* checkpoint = head.chunk_states.data() + (q / s.chunk_size - 1) * SE;
    ASSERT_TRUE(BitsEqual(checkpoint, head.final_state.data(), SE));
    const ScanOutput tail = RunScan(true, pr.Params(q, total - q, checkpoint), &pool);

    EXPECT_TRUE(BitsEqual(head.y.data(), whole.y.data(), q * HP));
    EXPECT_TRUE(BitsEqual(tail.y.data(), whole.y.data() + q * HP, (total - q) * HP));
    EXPECT_TRUE(BitsEqual(tail.final_state, whole.final_state));
    EXPECT_TRUE(
        BitsEqual(head.chunk_states.data(), whole.chunk_states.data(), static_cast<int64_t>(head.chunk_states.size())));
    EXPECT_TRUE(BitsEqual(tail.chunk_states.data(), whole.chunk_states.data() + (q / s.chunk_size) * SE,
                          static_cast<int64_t>(tail.chunk_states.size())));
  }
}

TEST(SsdChunkScanTest, ChunkStatesMatchOracleStatesAtBoundaries) {
  const Shape s{
      .seqlen = 333, .n_heads = 4, .head_dim = 16, .d_state = 24, .n_groups = 4, .chunk_size = 64, .start_pos = 17};
  const Problem pr(s, 5);
  const int64_t SE = pr.StateElems();
  const ScanOutput got = RunScan(true, pr.Params(s.start_pos, s.seqlen, pr.init.data()), nullptr);
  // Boundaries 64, 128, 192, 256, 320 lie in (17, 350].
  ASSERT_EQ(got.chunk_states.size(), static_cast<size_t>(5 * SE));
  for (int64_t i = 0; i < 5; ++i) {
    const int64_t boundary = 64 * (i + 1);
    const ScanOutput oracle = RunScan(false, pr.Params(s.start_pos, boundary - s.start_pos, pr.init.data()), nullptr);
    std::vector<float> got_i(got.chunk_states.begin() + i * SE, got.chunk_states.begin() + (i + 1) * SE);
    EXPECT_TRUE(CloseToScale(got_i, oracle.final_state, 1e-4)) << "boundary " << boundary;
  }
}

TEST(SsdChunkScanTest, ResultsDoNotDependOnThreadCount) {
  for (int64_t n_groups : {1, 4}) {
    const Shape s{.seqlen = 300,
                  .n_heads = 8,
                  .head_dim = 16,
                  .d_state = 32,
                  .n_groups = n_groups,
                  .chunk_size = 64,
                  .start_pos = 64};
    const Problem pr(s, 11);
    const SsdChunkScanParams p = pr.Params(s.start_pos, s.seqlen, pr.init.data());
    const ScanOutput serial = RunScan(true, p, nullptr);
    for (int threads : {1, 2, 3}) {
      ThreadPool pool(threads);
      const ScanOutput par = RunScan(true, p, &pool);
      EXPECT_TRUE(BitsEqual(par.y, serial.y)) << threads;
      EXPECT_TRUE(BitsEqual(par.final_state, serial.final_state)) << threads;
      EXPECT_TRUE(BitsEqual(par.chunk_states, serial.chunk_states)) << threads;
    }
  }
}

TEST(SsdChunkScanTest, FinalStateMayAliasInitialState) {
  const Shape s{.seqlen = 77, .n_heads = 4, .head_dim = 8, .d_state = 16, .n_groups = 2, .chunk_size = 32};
  const Problem pr(s, 3);
  const ScanOutput want = RunScan(true, pr.Params(0, s.seqlen, pr.init.data()), nullptr);
  std::vector<float> state = pr.init;
  std::vector<float> y(s.seqlen * s.n_heads * s.head_dim);
  SsdChunkScanParams p = pr.Params(0, s.seqlen, state.data());
  p.final_state = state.data();
  p.y = y.data();
  ThreadPool pool(2);
  ASSERT_EQ(SsdChunkScan(p, &pool), kKernelOk);
  EXPECT_TRUE(BitsEqual(state, want.final_state));
  EXPECT_TRUE(BitsEqual(y, want.y));
}

TEST(SsdChunkScanTest, RejectsInvalidParams) {
  const Shape s{.seqlen = 10, .n_heads = 4, .head_dim = 8, .d_state = 16, .n_groups = 2, .chunk_size = 32};
  const Problem pr(s, 3);
  std::vector<float> y(s.seqlen * s.n_heads * s.head_dim);
  SsdChunkScanParams good = pr.Params(0, s.seqlen, nullptr);
  good.y = y.data();
  ASSERT_EQ(SsdChunkScan(good, nullptr), kKernelOk);

  SsdChunkScanParams p = good;
  p.n_groups = 3;  // does not divide n_heads
  EXPECT_EQ(SsdChunkScan(p, nullptr), kKernelInvalidArgument);
  EXPECT_EQ(SsdSequentialScan(p, nullptr), kKernelInvalidArgument);
  p = good;
  p.block_size = 24;  // does not divide chunk_size
  EXPECT_EQ(SsdChunkScan(p, nullptr), kKernelInvalidArgument);
  p = good;
  p.x = nullptr;
  EXPECT_EQ(SsdChunkScan(p, nullptr), kKernelInvalidArgument);
  p = good;
  p.chunk_size = 0;
  EXPECT_EQ(SsdChunkScan(p, nullptr), kKernelInvalidArgument);
}

TEST(SsdNumChunkStatesTest, CountsBoundariesCrossed) {
  EXPECT_EQ(SsdNumChunkStates(0, 256, 128), 2);
  EXPECT_EQ(SsdNumChunkStates(0, 255, 128), 1);
  EXPECT_EQ(SsdNumChunkStates(128, 1, 128), 0);
  EXPECT_EQ(SsdNumChunkStates(127, 1, 128), 1);
  EXPECT_EQ(SsdNumChunkStates(100, 0, 128), 0);
}

// A decode batch of state updates gives the bits of the sequential scan's steps.
TEST(SelectiveStateUpdateTest, MatchesSequentialScanStepsBitForBit) {
  const Shape s{.seqlen = 6, .n_heads = 8, .head_dim = 16, .d_state = 20, .n_groups = 2, .chunk_size = 4};
  const int64_t H = s.n_heads, P = s.head_dim, N = s.d_state, G = s.n_groups;
  const int64_t SE = H * P * N;
  const int kBatch = 3;
  std::vector<Problem> seqs;
  for (int b = 0; b < kBatch; ++b) {
    seqs.emplace_back(s, 100 + b);
    seqs[b].A = seqs[0].A;  // A and D are per layer: the same for every sequence
    seqs[b].D = seqs[0].D;
  }
  std::vector<ScanOutput> want;
  for (int b = 0; b < kBatch; ++b) {
    want.push_back(RunScan(false, seqs[b].Params(0, s.seqlen, seqs[b].init.data()), nullptr));
  }

  // Pool of 5 slots; sequence b lives in slot slots[b]; one padding row (-1).
  const std::vector<int32_t> slots = {3, -1, 0, 4};
  const std::vector<int> seq_of_row = {0, -1, 1, 2};
  const int64_t rows = static_cast<int64_t>(slots.size());
  std::vector<float> pool_states(5 * SE, 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    if (slots[r] >= 0) {
      std::copy(seqs[seq_of_row[r]].init.begin(), seqs[seq_of_row[r]].init.end(), pool_states.begin() + slots[r] * SE);
    }
  }
  ThreadPool pool(2);
  std::vector<float> x(rows * H * P), dt(rows * H), B(rows * G * N), C(rows * G * N);
  std::vector<float> y(rows * H * P);
  for (int64_t t = 0; t < s.seqlen; ++t) {
    for (int64_t r = 0; r < rows; ++r) {
      const Problem& pr = seqs[seq_of_row[r] < 0 ? 0 : seq_of_row[r]];
      std::copy_n(pr.x.begin() + t * H * P, H * P, x.begin() + r * H * P);
      std::copy_n(pr.dt.begin() + t * H, H, dt.begin() + r * H);
      std::copy_n(pr.B.begin() + t * G * N, G * N, B.begin() + r * G * N);
      std::copy_n(pr.C.begin() + t * G * N, G * N, C.begin() + r * G * N);
    }
    std::fill(y.begin(), y.end(), -7.0f);
    SelectiveStateUpdateParams p;
    p.state = pool_states.data();
    p.state_slots = slots.data();
    p.x = x.data();
    p.dt = dt.data();
    p.A = seqs[0].A.data();
    p.B = B.data();
    p.C = C.data();
    p.D = seqs[0].D.data();
    p.y = y.data();
    p.batch = rows;
    p.num_slots = 5;
    p.n_heads = H;
    p.head_dim = P;
    p.d_state = N;
    p.n_groups = G;
    ASSERT_EQ(SelectiveStateUpdate(p, &pool), kKernelOk);
    for (int64_t r = 0; r < rows; ++r) {
      if (slots[r] < 0) {
        EXPECT_EQ(y[r * H * P], -7.0f) << "padding row written";
        continue;
      }
      EXPECT_TRUE(BitsEqual(y.data() + r * H * P, want[seq_of_row[r]].y.data() + t * H * P, H * P))
          << "step " << t << " row " << r;
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    if (slots[r] < 0) continue;
    EXPECT_TRUE(BitsEqual(pool_states.data() + slots[r] * SE, want[seq_of_row[r]].final_state.data(), SE));
  }
  // Slots not referenced stay untouched.
  for (int64_t i = 1 * SE; i < 3 * SE; ++i) ASSERT_EQ(pool_states[i], 0.0f);
}

TEST(SelectiveStateUpdateTest, GateMultipliesBySiluOfZ) {
  const Shape s{.seqlen = 1, .n_heads = 4, .head_dim = 8, .d_state = 16, .n_groups = 1, .chunk_size = 4};
  const Problem pr(s, 21);
  std::mt19937 rng(4);
  const std::vector<float> z = testing::RandomVector(rng, 4 * 8, -3.0f, 3.0f);
  std::vector<float> y_plain(32), y_gated(32);
  for (bool gated : {false, true}) {
    std::vector<float> state = pr.init;
    SelectiveStateUpdateParams p;
    p.state = state.data();
    p.x = pr.x.data();
    p.dt = pr.dt.data();
    p.A = pr.A.data();
    p.B = pr.B.data();
    p.C = pr.C.data();
    p.D = pr.D.data();
    p.z = gated ? z.data() : nullptr;
    p.y = gated ? y_gated.data() : y_plain.data();
    p.batch = 1;
    p.num_slots = 1;
    p.n_heads = 4;
    p.head_dim = 8;
    p.d_state = 16;
    ASSERT_EQ(SelectiveStateUpdate(p, nullptr), kKernelOk);
  }
  for (int i = 0; i < 32; ++i) EXPECT_EQ(y_gated[i], y_plain[i] * Silu(z[i])) << i;
}

TEST(SelectiveStateUpdateTest, RejectsSlotOutOfRange) {
  std::vector<float> state(16), x(4), dt(1), A(1), B(4), C(4), y(4);
  const int32_t slot = 1;
  SelectiveStateUpdateParams p;
  p.state = state.data();
  p.state_slots = &slot;
  p.x = x.data();
  p.dt = dt.data();
  p.A = A.data();
  p.B = B.data();
  p.C = C.data();
  p.y = y.data();
  p.batch = 1;
  p.num_slots = 1;
  p.n_heads = 1;
  p.head_dim = 4;
  p.d_state = 4;
  EXPECT_EQ(SelectiveStateUpdate(p, nullptr), kKernelInvalidArgument);
}

}  // namespace
}  // namespace hybridserve::kernels::cpu
