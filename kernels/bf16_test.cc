#include "kernels/bf16.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "gtest/gtest.h"

namespace hybridserve::kernels {
namespace {

uint32_t FloatBits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return bits;
}

float FromBits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

TEST(Bf16Test, EveryBf16BitPatternIsTheTopHalfOfAFloat) {
  for (uint32_t bits = 0; bits <= 0xFFFF; ++bits) {
    ASSERT_EQ(FloatBits(Bf16ToFloat(static_cast<uint16_t>(bits))), bits << 16);
  }
}

TEST(Bf16Test, NarrowingIsExactForEveryBf16Value) {
  for (uint32_t bits = 0; bits <= 0xFFFF; ++bits) {
    const float f = FromBits(bits << 16);
    if (std::isnan(f)) continue;
    ASSERT_EQ(FloatToBf16(f), bits) << std::hex << bits;
  }
}

TEST(Bf16Test, NarrowingRoundsToNearestWithTiesToEven) {
  // 1.0 is 0x3F80'0000; the dropped half of the bits decides.
  EXPECT_EQ(FloatToBf16(FromBits(0x3F807FFFu)), 0x3F80u);  // below half: down
  EXPECT_EQ(FloatToBf16(FromBits(0x3F808001u)), 0x3F81u);  // above half: up
  EXPECT_EQ(FloatToBf16(FromBits(0x3F808000u)), 0x3F80u);  // tie, even below: down
  EXPECT_EQ(FloatToBf16(FromBits(0x3F818000u)), 0x3F82u);  // tie, odd below: up to even
  // The largest finite floats round up to infinity, as IEEE rounding does.
  EXPECT_EQ(FloatToBf16(std::numeric_limits<float>::max()), 0x7F80u);
  EXPECT_EQ(FloatToBf16(-0.0f), 0x8000u);
}

TEST(Bf16Test, NarrowingKeepsNanANanWithTheQuietBitSet) {
  EXPECT_EQ(FloatToBf16(FromBits(0x7F800001u)), 0x7FC0u);  // signalling, payload only in the low bits
  EXPECT_EQ(FloatToBf16(FromBits(0xFFC00000u)), 0xFFC0u);
  EXPECT_EQ(FloatToBf16(FromBits(0x7FA10000u)), 0x7FE1u);
  EXPECT_EQ(FloatToBf16(std::numeric_limits<float>::infinity()), 0x7F80u);
}

}  // namespace
}  // namespace hybridserve::kernels
