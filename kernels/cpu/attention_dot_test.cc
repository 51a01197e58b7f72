// The eight-key score path of the CPU attention (Dot8, used for each full group
// of eight keys in a block) is bit-identical to the single-key path (Dot, used
// for the last count % 8 keys) on the same keys, so a score never depends on
// where its key falls in a block, the page size or its neighbours.

#include "kernels/cpu/attention_dot.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/test_util.h"

namespace hybridserve::kernels::cpu::attention_internal {
namespace {

using testing::BitsEqual;

// Head dims around and between multiples of 8 (the FMA chain's width and its
// zero-padded tail) and the model sizes.
constexpr int64_t kHeadDims[] = {1, 2, 3, 7, 8, 9, 15, 16, 17, 24, 31, 32, 33, 48, 63, 64, 80, 96, 100, 128, 256};

// Values whose exponents span 2^-12 .. 2^12, so that any change in the order
// of the additions changes the rounded sum with high probability.
std::vector<float> WideRangeVector(std::mt19937& rng, int64_t n) {
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-12, 12);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& f : v) f = std::ldexp(mantissa(rng), exponent(rng));
  return v;
}

TEST(AttentionDotTest, EachLaneOfDot8HasTheBitsOfDotOnItsKey) {
  std::mt19937 rng(8);
  for (bool wide : {false, true}) {
    for (int64_t d : kHeadDims) {
      for (int64_t stride : {d, 2 * d + 3}) {
        const std::vector<float> q = wide ? WideRangeVector(rng, d) : testing::RandomVector(rng, d, -1.5f, 1.5f);
        const std::vector<float> k =
            wide ? WideRangeVector(rng, 8 * stride) : testing::RandomVector(rng, 8 * stride, -1.5f, 1.5f);
        alignas(32) float lanes[8];
        _mm256_store_ps(lanes, Dot8(q.data(), k.data(), stride, d));
        std::vector<float> single(8);
        for (int64_t j = 0; j < 8; ++j) single[static_cast<size_t>(j)] = Dot(q.data(), k.data() + j * stride, d);
        EXPECT_TRUE(BitsEqual(lanes, single.data(), 8))
            << "head_dim " << d << ", stride " << stride << (wide ? ", wide range" : "");
      }
    }
  }
}

// ScoreKeys over 1..41 keys (full groups of eight, a remainder, or both) gives
// each key the bits of Dot on that key alone, times the scale.
TEST(AttentionDotTest, ScoreKeysEqualsDotPerKeyForAnyKeyCount) {
  std::mt19937 rng(88);
  for (int64_t d : kHeadDims) {
    const int64_t stride = 2 * d;  // two KV heads per token, as in the paged cache
    const std::vector<float> q = WideRangeVector(rng, d);
    const std::vector<float> k = WideRangeVector(rng, 41 * stride);
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
    for (int64_t count = 1; count <= 41; ++count) {
      std::vector<float> scores(static_cast<size_t>(count), NAN);
      ScoreKeys(q.data(), k.data(), stride, d, count, scale, scores.data());
      std::vector<float> want(static_cast<size_t>(count));
      for (int64_t i = 0; i < count; ++i)
        want[static_cast<size_t>(i)] = Dot(q.data(), k.data() + i * stride, d) * scale;
      EXPECT_TRUE(BitsEqual(scores, want)) << "head_dim " << d << ", " << count << " keys";
    }
  }
}

// The same key scores the same bits whether it is the first, a middle or the
// last key of a group of eight, or in the remainder.
TEST(AttentionDotTest, KeyScoreDoesNotDependOnItsSlotInTheBlock) {
  std::mt19937 rng(888);
  for (int64_t d : kHeadDims) {
    const std::vector<float> q = WideRangeVector(rng, d);
    const std::vector<float> key = WideRangeVector(rng, d);
    const float want = Dot(q.data(), key.data(), d);
    for (int64_t slot = 0; slot < 13; ++slot) {
      std::vector<float> k = WideRangeVector(rng, 13 * d);
      std::copy(key.begin(), key.end(), k.begin() + slot * d);
      std::vector<float> scores(13);
      ScoreKeys(q.data(), k.data(), d, d, 13, 1.0f, scores.data());
      EXPECT_TRUE(BitsEqual(&scores[static_cast<size_t>(slot)], &want, 1)) << "head_dim " << d << ", slot " << slot;
    }
  }
}

// ScoreKeysRows, R rows of a GQA group against the same keys, gives every
// (row, key) the bits of Dot on that pair alone, times the scale, for any key
// count (full groups of 8 / R keys and a remainder) and head_dim.
template <int R>
void ExpectRowsScoreLikeDot(std::mt19937& rng) {
  for (int64_t d : kHeadDims) {
    const int64_t stride = 2 * d;  // two KV heads per token, as in the paged cache
    const int64_t q_stride = d;    // the group's query heads side by side
    const std::vector<float> q = WideRangeVector(rng, R * q_stride);
    const std::vector<float> k = WideRangeVector(rng, 19 * stride);
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
    for (int64_t count = 1; count <= 19; ++count) {
      const int64_t ld = 24;
      std::vector<float> scores(static_cast<size_t>(R * ld), NAN);
      ScoreKeysRows<R>(q.data(), q_stride, k.data(), stride, d, count, scale, scores.data(), ld);
      for (int r = 0; r < R; ++r) {
        for (int64_t i = 0; i < count; ++i) {
          const float want = Dot(q.data() + r * q_stride, k.data() + i * stride, d) * scale;
          EXPECT_TRUE(BitsEqual(&scores[static_cast<size_t>(r * ld + i)], &want, 1))
              << R << " rows, head_dim " << d << ", " << count << " keys: row " << r << ", key " << i;
        }
      }
    }
  }
}

TEST(AttentionDotTest, ScoreKeysRowsGivesEachRowAndKeyTheBitsOfDot) {
  std::mt19937 rng(8888);
  ExpectRowsScoreLikeDot<1>(rng);
  ExpectRowsScoreLikeDot<2>(rng);
  ExpectRowsScoreLikeDot<4>(rng);
  ExpectRowsScoreLikeDot<8>(rng);
}

}  // namespace
}  // namespace hybridserve::kernels::cpu::attention_internal
