#include "engine/snapshot_codec.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/hash.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hybridserve::engine {
namespace {

using ::testing::HasSubstr;

// Nemotron-H-like shapes, scaled down so that a test encodes in microseconds.
StateLayout SmallHybridLayout() {
  return StateLayout{.mamba_layers = 3,
                     .ssm_heads = 2,
                     .ssm_head_dim = 3,
                     .ssm_state = 4,
                     .conv_dim = 5,
                     .conv_kernel = 4,
                     .attention_layers = 2,
                     .kv_heads = 2,
                     .kv_head_dim = 3,
                     .page_size = 4,
                     .vocab = 7};
}

// Seeded values that exercise the bit-exactness of the copy: signed zeros,
// infinities, denormals and NaNs with payloads alongside ordinary floats.
std::vector<float> RandomFloats(std::mt19937& rng, int64_t n) {
  std::vector<float> out(n);
  std::uniform_int_distribution<uint32_t> bits;
  std::normal_distribution<float> normal;
  for (int64_t i = 0; i < n; ++i) {
    if (i % 7 == 3) {
      const uint32_t b = bits(rng);  // any bit pattern, NaNs included
      std::memcpy(&out[i], &b, 4);
    } else {
      out[i] = normal(rng);
    }
  }
  if (n > 0) out[0] = -0.0f;
  if (n > 1) out[1] = std::numeric_limits<float>::denorm_min();
  return out;
}

Snapshot MakeSnapshot(const StateLayout& layout, int64_t position, bool with_logits, uint32_t seed = 1) {
  std::mt19937 rng(seed);
  Snapshot s;
  s.model_fingerprint = common::HashBytes("model-a");
  s.prefix_hash = common::HashBytes("prefix");
  s.position = position;
  s.layout = layout;
  for (int l = 0; l < layout.mamba_layers; ++l) {
    s.ssm_states.push_back(RandomFloats(rng, layout.ssm_state_floats()));
    s.conv_states.push_back(RandomFloats(rng, layout.conv_state_floats()));
  }
  for (int l = 0; l < layout.attention_layers; ++l) {
    s.tail_k.push_back(RandomFloats(rng, layout.tail_kv_floats(position)));
    s.tail_v.push_back(RandomFloats(rng, layout.tail_kv_floats(position)));
  }
  if (with_logits) s.last_logits = RandomFloats(rng, layout.vocab);
  return s;
}

std::string EncodeOrDie(const Snapshot& s) {
  absl::StatusOr<std::string> bytes = EncodeSnapshot(s);
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  return bytes.ok() ? *bytes : std::string();
}

bool BitIdentical(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

bool BitIdentical(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!BitIdentical(a[i], b[i])) return false;
  }
  return true;
}

void ExpectBitIdentical(const Snapshot& a, const Snapshot& b) {
  EXPECT_EQ(a.model_fingerprint, b.model_fingerprint);
  EXPECT_EQ(a.prefix_hash, b.prefix_hash);
  EXPECT_EQ(a.position, b.position);
  EXPECT_EQ(a.layout, b.layout);
  EXPECT_TRUE(BitIdentical(a.ssm_states, b.ssm_states));
  EXPECT_TRUE(BitIdentical(a.conv_states, b.conv_states));
  EXPECT_TRUE(BitIdentical(a.tail_k, b.tail_k));
  EXPECT_TRUE(BitIdentical(a.tail_v, b.tail_v));
  EXPECT_TRUE(BitIdentical(a.last_logits, b.last_logits));
}

bool SameBytes(absl::Span<const uint8_t> view, const std::vector<float>& a) {
  return view.size() == a.size() * sizeof(float) && (a.empty() || std::memcmp(view.data(), a.data(), view.size()) == 0);
}

bool SameBytes(const std::vector<absl::Span<const uint8_t>>& views, const std::vector<std::vector<float>>& arrays) {
  if (views.size() != arrays.size()) return false;
  for (size_t i = 0; i < views.size(); ++i) {
    if (!SameBytes(views[i], arrays[i])) return false;
  }
  return true;
}

void ExpectViewMatches(const SnapshotView& view, const Snapshot& s) {
  EXPECT_EQ(view.model_fingerprint, s.model_fingerprint);
  EXPECT_EQ(view.prefix_hash, s.prefix_hash);
  EXPECT_EQ(view.position, s.position);
  EXPECT_EQ(view.layout, s.layout);
  EXPECT_TRUE(SameBytes(view.ssm_states, s.ssm_states));
  EXPECT_TRUE(SameBytes(view.conv_states, s.conv_states));
  EXPECT_TRUE(SameBytes(view.tail_k, s.tail_k));
  EXPECT_TRUE(SameBytes(view.tail_v, s.tail_v));
  EXPECT_TRUE(SameBytes(view.last_logits, s.last_logits));
}

// Recomputes the trailing checksum so that a deliberately edited header is
// seen by the structural checks rather than as corruption.
void Reseal(std::string* bytes) {
  const uint64_t sum = common::Checksum64(bytes->data(), bytes->size() - kSnapshotTrailerBytes);
  std::memcpy(bytes->data() + bytes->size() - kSnapshotTrailerBytes, &sum, 8);
}

template <typename T>
void Poke(std::string* bytes, size_t offset, T value) {
  std::memcpy(bytes->data() + offset, &value, sizeof(T));
}

template <typename T>
T Peek(const std::string& bytes, size_t offset) {
  T value;
  std::memcpy(&value, bytes.data() + offset, sizeof(T));
  return value;
}

struct RoundTripCase {
  const char* name;
  StateLayout layout;
  int64_t position;
  bool with_logits;
};

TEST(SnapshotCodecTest, RoundTripIsBitIdenticalForEveryLayoutKind) {
  StateLayout pure_mamba = SmallHybridLayout();
  pure_mamba.attention_layers = pure_mamba.kv_heads = pure_mamba.kv_head_dim = 0;
  StateLayout attention_only = SmallHybridLayout();
  attention_only.mamba_layers = attention_only.ssm_heads = attention_only.ssm_head_dim = 0;
  attention_only.ssm_state = attention_only.conv_dim = attention_only.conv_kernel = 0;
  StateLayout kernel_one = SmallHybridLayout();
  kernel_one.conv_kernel = 1;  // a conv state with no columns
  const RoundTripCase cases[] = {
      {"hybrid, partial page, logits", SmallHybridLayout(), 11, true},
      {"hybrid, partial page, no logits", SmallHybridLayout(), 11, false},
      {"hybrid, tail 0", SmallHybridLayout(), 12, false},
      {"hybrid, tail 0, logits", SmallHybridLayout(), 12, true},
      {"position 0", SmallHybridLayout(), 0, false},
      {"large position", SmallHybridLayout(), (int64_t{1} << 40) + 3, true},
      {"pure mamba", pure_mamba, 5, true},
      {"attention only", attention_only, 7, false},
      {"conv kernel 1", kernel_one, 9, false},
  };
  for (const RoundTripCase& c : cases) {
    SCOPED_TRACE(c.name);
    const Snapshot original = MakeSnapshot(c.layout, c.position, c.with_logits);
    const std::string bytes = EncodeOrDie(original);
    absl::StatusOr<size_t> size = EncodedSnapshotSize(c.layout, c.position, c.with_logits);
    ASSERT_TRUE(size.ok()) << size.status();
    EXPECT_EQ(bytes.size(), *size);
    absl::StatusOr<Snapshot> decoded = DecodeSnapshot(bytes);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    ExpectBitIdentical(*decoded, original);
    // Re-encoding the decoded snapshot gives the same bytes: the format is canonical.
    EXPECT_EQ(EncodeOrDie(*decoded), bytes);
    // The zero-copy reader sees the same arrays.
    absl::StatusOr<SnapshotView> view = ParseSnapshot(bytes);
    ASSERT_TRUE(view.ok()) << view.status();
    ExpectViewMatches(*view, original);
  }
}

TEST(SnapshotCodecTest, EncodedSizeIsHeaderPayloadAndChecksum) {
  // ssm 3 x 2*3*4, conv 3 x 5*3, tail (11 mod 4 = 3 tokens) 2 layers x 2 x 3*2*3, logits 7.
  const size_t payload_floats = 3 * 24 + 3 * 15 + 2 * 2 * 18 + 7;
  absl::StatusOr<size_t> size = EncodedSnapshotSize(SmallHybridLayout(), 11, true);
  ASSERT_TRUE(size.ok()) << size.status();
  EXPECT_EQ(*size, 128 + 4 * payload_floats + 8);
}

TEST(SnapshotCodecTest, WireFormatMatchesTheDocumentedLayout) {
  const Snapshot s = MakeSnapshot(SmallHybridLayout(), 11, true);
  const std::string bytes = EncodeOrDie(s);
  EXPECT_EQ(bytes.substr(0, 8), absl::string_view("HSSNAP\x1a\n", 8));
  EXPECT_EQ(Peek<uint32_t>(bytes, 8), 1u);     // version
  EXPECT_EQ(Peek<uint32_t>(bytes, 12), 128u);  // header bytes
  EXPECT_EQ(Peek<uint32_t>(bytes, 16), 1u);    // fp32
  EXPECT_EQ(Peek<uint32_t>(bytes, 20), 1u);    // flags: logits
  EXPECT_EQ(bytes.substr(24, 16), s.model_fingerprint.ToBytes());
  EXPECT_EQ(bytes.substr(40, 16), s.prefix_hash.ToBytes());
  EXPECT_EQ(Peek<int64_t>(bytes, 56), 11);
  const int32_t layout[11] = {3, 2, 3, 4, 5, 4, 2, 2, 3, 4, 7};
  for (int i = 0; i < 11; ++i) EXPECT_EQ(Peek<int32_t>(bytes, 64 + 4 * i), layout[i]) << "layout field " << i;
  EXPECT_EQ(Peek<uint32_t>(bytes, 108), 3u);  // tail tokens
  EXPECT_EQ(Peek<uint64_t>(bytes, 112), bytes.size() - 136);
  EXPECT_EQ(Peek<uint64_t>(bytes, 120), 0u);
  // Payload order: ssm states, conv states, then K and V of each attention layer, then logits.
  size_t offset = 128;
  auto expect_array = [&](const std::vector<float>& a, const char* what) {
    EXPECT_EQ(std::memcmp(bytes.data() + offset, a.data(), a.size() * 4), 0) << what << " at " << offset;
    offset += a.size() * 4;
  };
  for (const auto& a : s.ssm_states) expect_array(a, "ssm");
  for (const auto& a : s.conv_states) expect_array(a, "conv");
  for (size_t l = 0; l < s.tail_k.size(); ++l) {
    expect_array(s.tail_k[l], "k");
    expect_array(s.tail_v[l], "v");
  }
  expect_array(s.last_logits, "logits");
  EXPECT_EQ(offset, bytes.size() - 8);
  EXPECT_EQ(Peek<uint64_t>(bytes, offset), common::Checksum64(bytes.data(), offset));
}

// The codec computes XXH3 stripe by stripe inside its copy loops; it must
// equal the library's one-shot XXH3-64 for every length (short inputs, block
// boundaries every 1024 bytes, the last stripe) and for pieces that straddle
// stripes in every way.
TEST(SnapshotCodecTest, ChecksumIsXxh3OfTheBytesForEveryLengthAndPieceAlignment) {
  // Attention only, one float per token: the hashed length runs over
  // 128 + 8 t (+ 4 with one logit), t < 1024, past seven block boundaries.
  StateLayout tail_only{.attention_layers = 1, .kv_heads = 1, .kv_head_dim = 1, .page_size = 1024, .vocab = 1};
  // Many tiny Mamba arrays (12 and 60 bytes): almost every stripe straddles pieces.
  StateLayout tiny_pieces{.mamba_layers = 1,
                          .ssm_heads = 1,
                          .ssm_head_dim = 1,
                          .ssm_state = 3,
                          .conv_dim = 5,
                          .conv_kernel = 4,
                          .page_size = 16,
                          .vocab = 3};
  std::vector<std::pair<StateLayout, int64_t>> cases;
  for (int64_t t = 0; t < 1024; ++t) cases.push_back({tail_only, t});
  for (int32_t layers = 1; layers <= 200; ++layers) {
    tiny_pieces.mamba_layers = layers;
    cases.push_back({tiny_pieces, layers});
  }
  for (const auto& [layout, position] : cases) {
    for (bool with_logits : {false, true}) {
      const std::string bytes = EncodeOrDie(MakeSnapshot(layout, position, with_logits));
      const size_t body = bytes.size() - kSnapshotTrailerBytes;
      ASSERT_EQ(Peek<uint64_t>(bytes, body), common::Checksum64(bytes.data(), body))
          << "length " << body << " layout " << layout.ToString();
      absl::StatusOr<Snapshot> decoded = DecodeSnapshot(bytes);
      ASSERT_TRUE(decoded.ok()) << "length " << body << ": " << decoded.status();
    }
  }
}

TEST(SnapshotCodecTest, AllEncodersProduceTheSameBytesAndReuseBuffers) {
  const Snapshot big = MakeSnapshot(SmallHybridLayout(), 11, true, 1);
  const Snapshot small = MakeSnapshot(SmallHybridLayout(), 4, false, 2);
  const std::string expected_big = EncodeOrDie(big);
  const std::string expected_small = EncodeOrDie(small);

  std::string reused;
  ASSERT_TRUE(EncodeSnapshotInto(big, &reused).ok());
  EXPECT_EQ(reused, expected_big);
  ASSERT_TRUE(EncodeSnapshotInto(small, &reused).ok());  // shrinks: old contents must not leak
  EXPECT_EQ(reused, expected_small);

  std::vector<char> buffer(expected_big.size());
  ASSERT_TRUE(EncodeSnapshotToBuffer(big, absl::MakeSpan(buffer)).ok());
  EXPECT_EQ(std::string(buffer.begin(), buffer.end()), expected_big);
  std::vector<char> wrong(expected_big.size() + 1);
  EXPECT_EQ(EncodeSnapshotToBuffer(big, absl::MakeSpan(wrong)).code(), absl::StatusCode::kInvalidArgument);

  // Decoding into a snapshot of another shape replaces every field.
  Snapshot target = MakeSnapshot(SmallHybridLayout(), 11, true, 3);
  ASSERT_TRUE(DecodeSnapshotInto(expected_small, {}, &target).ok());
  ExpectBitIdentical(target, small);
  ASSERT_TRUE(DecodeSnapshotInto(expected_big, {}, &target).ok());
  ExpectBitIdentical(target, big);
}

TEST(SnapshotCodecTest, DecodesFromAnUnalignedBuffer) {
  const Snapshot s = MakeSnapshot(SmallHybridLayout(), 6, true);
  const std::string bytes = EncodeOrDie(s);
  for (size_t shift = 1; shift < 4; ++shift) {
    std::string padded = std::string(shift, 'x') + bytes;
    absl::StatusOr<Snapshot> decoded = DecodeSnapshot(absl::string_view(padded).substr(shift));
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    ExpectBitIdentical(*decoded, s);
  }
}

TEST(SnapshotCodecTest, EveryBitFlipAnywhereIsDataLoss) {
  const std::string bytes = EncodeOrDie(MakeSnapshot(SmallHybridLayout(), 11, true));
  ASSERT_LT(bytes.size(), 2000u);
  for (size_t i = 0; i < bytes.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string corrupt = bytes;
      corrupt[i] = static_cast<char>(corrupt[i] ^ (1 << bit));
      absl::StatusOr<Snapshot> decoded = DecodeSnapshot(corrupt);
      ASSERT_EQ(decoded.status().code(), absl::StatusCode::kDataLoss)
          << "byte " << i << " bit " << bit << ": " << decoded.status();
    }
  }
}

TEST(SnapshotCodecTest, ParseSnapshotVerifiesLikeDecode) {
  const Snapshot s = MakeSnapshot(SmallHybridLayout(), 11, true);
  const std::string bytes = EncodeOrDie(s);
  for (size_t i = 0; i < bytes.size(); i += 7) {
    std::string corrupt = bytes;
    corrupt[i] ^= 0x10;
    EXPECT_EQ(ParseSnapshot(corrupt).status().code(), absl::StatusCode::kDataLoss) << "byte " << i;
  }
  EXPECT_EQ(ParseSnapshot(absl::string_view(bytes).substr(0, bytes.size() - 1)).status().code(),
            absl::StatusCode::kDataLoss);
  SnapshotExpectation other_position;
  other_position.position = 10;
  EXPECT_EQ(ParseSnapshot(bytes, other_position).status().code(), absl::StatusCode::kFailedPrecondition);
  // Views into an unaligned copy still describe the same bytes.
  const std::string padded = "x" + bytes;
  absl::StatusOr<SnapshotView> view = ParseSnapshot(absl::string_view(padded).substr(1));
  ASSERT_TRUE(view.ok()) << view.status();
  ExpectViewMatches(*view, s);
}

TEST(SnapshotCodecTest, EveryTruncationAndAnyExtensionIsDataLoss) {
  const std::string bytes = EncodeOrDie(MakeSnapshot(SmallHybridLayout(), 11, true));
  for (size_t n = 0; n < bytes.size(); ++n) {
    absl::StatusOr<Snapshot> decoded = DecodeSnapshot(absl::string_view(bytes).substr(0, n));
    ASSERT_EQ(decoded.status().code(), absl::StatusCode::kDataLoss) << "length " << n << ": " << decoded.status();
  }
  for (const std::string& extra : {std::string(1, '\0'), std::string(8, '\0'), std::string(100, 'z')}) {
    EXPECT_EQ(DecodeSnapshot(bytes + extra).status().code(), absl::StatusCode::kDataLoss) << extra.size();
  }
}

TEST(SnapshotCodecTest, SnapshotOfAnotherModelLayoutPositionOrPrefixIsFailedPrecondition) {
  const Snapshot s = MakeSnapshot(SmallHybridLayout(), 11, true);
  const std::string bytes = EncodeOrDie(s);
  const SnapshotExpectation matching{s.model_fingerprint, s.layout, s.position, s.prefix_hash};
  ASSERT_TRUE(DecodeSnapshot(bytes, matching).ok());

  StateLayout other_layout = s.layout;
  other_layout.vocab += 1;
  struct Case {
    SnapshotExpectation expect;
    const char* message;
  };
  Case cases[] = {
      {matching, "model"},
      {matching, "layout"},
      {matching, "position"},
      {matching, "prefix"},
  };
  cases[0].expect.model_fingerprint = common::HashBytes("model-b");
  cases[1].expect.layout = other_layout;
  cases[2].expect.position = 12;
  cases[3].expect.prefix_hash = common::HashBytes("another prefix");
  for (const Case& c : cases) {
    absl::StatusOr<Snapshot> decoded = DecodeSnapshot(bytes, c.expect);
    EXPECT_EQ(decoded.status().code(), absl::StatusCode::kFailedPrecondition) << c.message;
    EXPECT_THAT(std::string(decoded.status().message()), HasSubstr(c.message));
  }
  // A corrupted snapshot is reported as corruption even when it also mismatches.
  std::string corrupt = bytes;
  corrupt[200] ^= 1;
  EXPECT_EQ(DecodeSnapshot(corrupt, cases[0].expect).status().code(), absl::StatusCode::kDataLoss);
}

TEST(SnapshotCodecTest, IntactBytesWithAnInvalidHeaderAreRejectedByField) {
  const std::string good = EncodeOrDie(MakeSnapshot(SmallHybridLayout(), 11, true));
  struct Case {
    const char* name;
    size_t offset;
    int64_t value;
    int width;  // bytes written at offset
    absl::StatusCode code;
    const char* message;
  };
  const int64_t kMaxI32 = std::numeric_limits<int32_t>::max();
  const Case cases[] = {
      {"magic", 0, 'X', 1, absl::StatusCode::kInvalidArgument, "magic"},
      {"version", 8, 2, 4, absl::StatusCode::kInvalidArgument, "version 2"},
      {"header bytes", 12, 256, 4, absl::StatusCode::kInvalidArgument, "header bytes"},
      {"bf16", 16, 2, 4, absl::StatusCode::kUnimplemented, "bf16"},
      {"dtype", 16, 9, 4, absl::StatusCode::kInvalidArgument, "dtype"},
      {"flags", 20, 3, 4, absl::StatusCode::kInvalidArgument, "flags"},
      {"no logits flag", 20, 0, 4, absl::StatusCode::kInvalidArgument, "payload bytes"},
      {"negative position", 56, -11, 8, absl::StatusCode::kInvalidArgument, "position"},
      {"other position", 56, 10, 8, absl::StatusCode::kInvalidArgument, "tail tokens"},
      {"negative layer count", 64, -1, 4, absl::StatusCode::kInvalidArgument, "mamba_layers"},
      {"huge layer count", 64, kMaxI32, 4, absl::StatusCode::kInvalidArgument, "mamba_layers <= 16384"},
      {"huge attention layers", 88, kMaxI32, 4, absl::StatusCode::kInvalidArgument, "attention_layers <= 16384"},
      {"overflowing ssm", 68, int64_t{0x7FFFFFFF7FFFFFFF}, 8, absl::StatusCode::kInvalidArgument, "2^40"},
      {"zero page size", 100, 0, 4, absl::StatusCode::kInvalidArgument, "page_size"},
      {"zero vocab with logits", 104, 0, 4, absl::StatusCode::kInvalidArgument, "vocab"},
      {"tail tokens", 108, 2, 4, absl::StatusCode::kInvalidArgument, "tail tokens"},
      {"payload bytes", 112, 4, 8, absl::StatusCode::kInvalidArgument, "payload bytes"},
      {"reserved", 120, 1, 8, absl::StatusCode::kInvalidArgument, "reserved"},
  };
  for (const Case& c : cases) {
    std::string bytes = good;
    std::memcpy(bytes.data() + c.offset, &c.value, c.width);  // little-endian: the low bytes
    Reseal(&bytes);
    absl::StatusOr<Snapshot> decoded = DecodeSnapshot(bytes);
    EXPECT_EQ(decoded.status().code(), c.code) << c.name << ": " << decoded.status();
    EXPECT_THAT(std::string(decoded.status().message()), HasSubstr(c.message)) << c.name;
  }
}

TEST(SnapshotCodecTest, HeaderClaimingMoreBytesThanTheInputIsRejectedWithoutAllocating) {
  std::string bytes = EncodeOrDie(MakeSnapshot(SmallHybridLayout(), 11, false));
  // A consistent header for 16384 layers of 2^40-float SSM states: claims
  // petabytes; the decoder must compare with the input length, not allocate.
  Poke<int32_t>(&bytes, 64, kStateMaxLayers);
  Poke<int32_t>(&bytes, 68, 1 << 20);
  Poke<int32_t>(&bytes, 72, 1 << 10);
  Poke<int32_t>(&bytes, 76, 1 << 10);
  absl::StatusOr<size_t> claimed =
      EncodedSnapshotSize(StateLayout{kStateMaxLayers, 1 << 20, 1 << 10, 1 << 10, 5, 4, 2, 2, 3, 4, 7}, 11, false);
  ASSERT_TRUE(claimed.ok()) << claimed.status();
  Poke<uint64_t>(&bytes, 112, *claimed - 136);
  Reseal(&bytes);
  absl::StatusOr<Snapshot> decoded = DecodeSnapshot(bytes);
  EXPECT_EQ(decoded.status().code(), absl::StatusCode::kInvalidArgument) << decoded.status();
  EXPECT_THAT(std::string(decoded.status().message()), HasSubstr("header describes"));
}

// ---- Corruptions beyond single bits ----

// One named byte range of an encoded snapshot: a header field or a payload array.
struct Section {
  std::string name;
  size_t offset;
  size_t size;
};

// Every section of `s`'s encoding, in order, tiling [0, encoded size).
std::vector<Section> Sections(const Snapshot& s, size_t encoded_size) {
  std::vector<Section> out = {{"magic", 0, 8},  {"version", 8, 4},       {"header bytes", 12, 4}, {"dtype", 16, 4},
                              {"flags", 20, 4}, {"fingerprint", 24, 16}, {"prefix hash", 40, 16}, {"position", 56, 8}};
  for (int i = 0; i < 11; ++i) out.push_back({absl::StrCat("layout field ", i), 64 + 4 * static_cast<size_t>(i), 4});
  out.push_back({"tail tokens", 108, 4});
  out.push_back({"payload bytes", 112, 8});
  out.push_back({"reserved", 120, 8});
  size_t at = kSnapshotHeaderBytes;
  auto add = [&](const std::string& name, size_t floats) {
    out.push_back({name, at, floats * sizeof(float)});
    at += floats * sizeof(float);
  };
  for (size_t l = 0; l < s.ssm_states.size(); ++l) {
    add(absl::StrCat("ssm_states[", l, "]"), s.ssm_states[l].size());
  }
  for (size_t l = 0; l < s.conv_states.size(); ++l) {
    add(absl::StrCat("conv_states[", l, "]"), s.conv_states[l].size());
  }
  for (size_t l = 0; l < s.tail_k.size(); ++l) {
    add(absl::StrCat("tail_k[", l, "]"), s.tail_k[l].size());
    add(absl::StrCat("tail_v[", l, "]"), s.tail_v[l].size());
  }
  if (!s.last_logits.empty()) add("last_logits", s.last_logits.size());
  out.push_back({"checksum", at, kSnapshotTrailerBytes});
  EXPECT_EQ(at + kSnapshotTrailerBytes, encoded_size);
  return out;
}

const Section& Find(const std::vector<Section>& sections, absl::string_view name) {
  for (const Section& s : sections) {
    if (s.name == name) return s;
  }
  ADD_FAILURE() << "no section " << name;
  return sections.front();
}

// Decode and Parse both return `code` for `bytes` (`what` names the case).
void ExpectBothReject(const std::string& bytes, absl::StatusCode code, const std::string& what,
                      const SnapshotExpectation& expect = {}) {
  absl::StatusOr<Snapshot> decoded = DecodeSnapshot(bytes, expect);
  EXPECT_EQ(decoded.status().code(), code) << what << ": " << decoded.status();
  absl::StatusOr<SnapshotView> parsed = ParseSnapshot(bytes, expect);
  EXPECT_EQ(parsed.status().code(), code) << what << ": " << parsed.status();
}

// Neither Decode nor Parse accepts `bytes`, and the code is one of `codes`.
void ExpectBothRejectWithOneOf(const std::string& bytes, std::vector<absl::StatusCode> codes, const std::string& what,
                               const SnapshotExpectation& expect = {}) {
  absl::StatusOr<Snapshot> decoded = DecodeSnapshot(bytes, expect);
  absl::StatusOr<SnapshotView> parsed = ParseSnapshot(bytes, expect);
  EXPECT_FALSE(decoded.ok()) << what << " was accepted";
  EXPECT_THAT(codes, ::testing::Contains(decoded.status().code())) << what << ": " << decoded.status();
  EXPECT_EQ(parsed.status().code(), decoded.status().code()) << what << ": " << parsed.status();
}

// 4000 seeded corruptions of 2 to 64 bytes: scattered bytes, contiguous
// bursts of random bytes, zeroed and 0xFF-filled runs, a payload byte together
// with the checksum. Every one is DATA_LOSS from both Decode and Parse.
TEST(SnapshotCodecTest, MultiByteCorruptionsAnywhereAreDataLoss) {
  const std::string good = EncodeOrDie(MakeSnapshot(SmallHybridLayout(), 11, true));
  std::mt19937_64 rng(6);
  for (int trial = 0; trial < 4000; ++trial) {
    std::string bytes = good;
    const int kind = trial % 5;
    const size_t n = 2 + rng() % 63;
    const size_t start = rng() % (good.size() - n + 1);
    switch (kind) {
      case 0:  // scattered bytes
        for (size_t k = 0; k < n; ++k) bytes[rng() % bytes.size()] = static_cast<char>(rng());
        break;
      case 1:  // a burst of random bytes
        for (size_t k = 0; k < n; ++k) bytes[start + k] = static_cast<char>(rng());
        break;
      case 2:  // a zeroed run
        std::memset(bytes.data() + start, 0, n);
        break;
      case 3:  // a run of 0xFF
        std::memset(bytes.data() + start, 0xFF, n);
        break;
      default: {  // a payload byte and a checksum byte
        const size_t payload = kSnapshotHeaderBytes + rng() % (good.size() - kSnapshotHeaderBytes - 8);
        bytes[payload] = static_cast<char>(bytes[payload] ^ (1 + rng() % 255));
        const size_t sum = good.size() - 8 + rng() % 8;
        bytes[sum] = static_cast<char>(bytes[sum] ^ (1 + rng() % 255));
        break;
      }
    }
    if (bytes == good) continue;  // a random run that rewrote the same bytes
    ExpectBothReject(bytes, absl::StatusCode::kDataLoss, absl::StrCat("trial ", trial, " kind ", kind));
    if (::testing::Test::HasFailure()) return;
  }
}

// Sections exchanged with others of the same size (states of two layers, K
// and V, the two hashes, two layout fields, neighbouring floats of one array):
// every length still matches, only the checksum can tell, and it does.
TEST(SnapshotCodecTest, SwappedSectionsAreDataLoss) {
  const Snapshot snap = MakeSnapshot(SmallHybridLayout(), 11, true);
  const std::string good = EncodeOrDie(snap);
  const std::vector<Section> sections = Sections(snap, good.size());
  const std::vector<std::pair<std::string, std::string>> swaps = {
      {"ssm_states[0]", "ssm_states[1]"},   {"ssm_states[0]", "ssm_states[2]"}, {"conv_states[1]", "conv_states[2]"},
      {"tail_k[0]", "tail_v[0]"},           {"tail_k[1]", "tail_v[1]"},         {"tail_k[0]", "tail_k[1]"},
      {"tail_v[0]", "tail_k[1]"},           {"fingerprint", "prefix hash"},     {"layout field 1", "layout field 2"},
      {"layout field 0", "layout field 6"}, {"header bytes", "version"},        {"flags", "tail tokens"},
  };
  int swapped = 0;
  for (const auto& [a_name, b_name] : swaps) {
    const Section& a = Find(sections, a_name);
    const Section& b = Find(sections, b_name);
    ASSERT_EQ(a.size, b.size) << a_name << " / " << b_name;
    std::string bytes = good;
    std::memcpy(bytes.data() + a.offset, good.data() + b.offset, b.size);
    std::memcpy(bytes.data() + b.offset, good.data() + a.offset, a.size);
    if (bytes == good) continue;  // equal contents (cannot happen with random states)
    ++swapped;
    ExpectBothReject(bytes, absl::StatusCode::kDataLoss, absl::StrCat(a_name, " <-> ", b_name));
  }
  EXPECT_EQ(swapped, static_cast<int>(swaps.size()));
  // Two neighbouring floats of every payload array.
  for (const Section& s : sections) {
    if (s.offset < kSnapshotHeaderBytes || s.name == "checksum" || s.size < 8) continue;
    std::string bytes = good;
    std::memcpy(bytes.data() + s.offset, good.data() + s.offset + 4, 4);
    std::memcpy(bytes.data() + s.offset + 4, good.data() + s.offset, 4);
    if (bytes == good) continue;
    ExpectBothReject(bytes, absl::StatusCode::kDataLoss, absl::StrCat("first two floats of ", s.name));
  }
}

// Every size-bearing header field (header bytes, position, each layout field,
// tail tokens, payload bytes) set to 0, value - 1, value + 1, 2 * value and
// its type's maximum. As written (checksum stale): DATA_LOSS. With the
// checksum recomputed, so that the structural checks see the field: still
// rejected, INVALID_ARGUMENT (a length that no longer matches the input or a
// field out of range), or FAILED_PRECONDITION where the change describes a
// consistent snapshot of another layout or position than the one expected.
TEST(SnapshotCodecTest, ModifiedLengthFieldsAreRejectedWithOrWithoutAValidChecksum) {
  const Snapshot snap = MakeSnapshot(SmallHybridLayout(), 11, true);
  const std::string good = EncodeOrDie(snap);
  const SnapshotExpectation expect{snap.model_fingerprint, snap.layout, snap.position, snap.prefix_hash};
  ASSERT_TRUE(DecodeSnapshot(good, expect).ok());
  struct Field {
    std::string name;
    size_t offset;
    int width;  // 4 or 8 bytes
  };
  std::vector<Field> fields = {
      {"header bytes", 12, 4}, {"position", 56, 8}, {"tail tokens", 108, 4}, {"payload bytes", 112, 8}};
  for (int i = 0; i < 11; ++i) fields.push_back({absl::StrCat("layout field ", i), 64 + 4 * static_cast<size_t>(i), 4});
  int cases = 0;
  for (const Field& f : fields) {
    const int64_t value = f.width == 4 ? Peek<int32_t>(good, f.offset) : Peek<int64_t>(good, f.offset);
    const int64_t max = f.width == 4 ? std::numeric_limits<int32_t>::max() : std::numeric_limits<int64_t>::max();
    for (int64_t changed : {int64_t{0}, value - 1, value + 1, 2 * value, max, int64_t{-1}}) {
      if (changed == value) continue;
      std::string bytes = good;
      if (f.width == 4) {
        Poke<int32_t>(&bytes, f.offset, static_cast<int32_t>(changed));
      } else {
        Poke<int64_t>(&bytes, f.offset, changed);
      }
      const std::string what = absl::StrCat(f.name, " ", value, " -> ", changed);
      ExpectBothReject(bytes, absl::StatusCode::kDataLoss, what, expect);
      Reseal(&bytes);
      ExpectBothRejectWithOneOf(bytes, {absl::StatusCode::kInvalidArgument, absl::StatusCode::kFailedPrecondition},
                                what + " (resealed)", expect);
      ++cases;
    }
  }
  EXPECT_GE(cases, 15 * 4);
}

// Truncated at every section boundary and at every byte of the header, with
// the stale checksum (the last 8 bytes are then not the checksum) and with a
// valid checksum of the truncated bytes appended: never accepted. Too short
// for a header is DATA_LOSS; a resealed truncation past the header is a length
// that does not match the header, INVALID_ARGUMENT. Extended past the end
// and resealed: INVALID_ARGUMENT.
TEST(SnapshotCodecTest, TruncationAtEverySectionBoundaryAndHeaderByteIsRejectedEvenResealed) {
  const Snapshot snap = MakeSnapshot(SmallHybridLayout(), 11, true);
  const std::string good = EncodeOrDie(snap);
  std::vector<size_t> cuts;
  for (size_t n = 0; n <= kSnapshotHeaderBytes; ++n) cuts.push_back(n);
  for (const Section& s : Sections(snap, good.size())) {
    cuts.push_back(s.offset);
    cuts.push_back(s.offset + s.size);
  }
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  ASSERT_EQ(cuts.back(), good.size());
  cuts.pop_back();  // the whole encoding is not a truncation
  for (size_t n : cuts) {
    const std::string truncated = good.substr(0, n);
    ExpectBothReject(truncated, absl::StatusCode::kDataLoss, absl::StrCat("truncated to ", n));
    if (n == good.size() - kSnapshotTrailerBytes) continue;  // resealed, it is the valid encoding
    // The first n bytes sealed with their own checksum.
    std::string resealed = truncated + std::string(8, '\0');
    Reseal(&resealed);
    const absl::StatusCode want = resealed.size() < kSnapshotHeaderBytes + kSnapshotTrailerBytes
                                      ? absl::StatusCode::kDataLoss
                                      : absl::StatusCode::kInvalidArgument;
    ExpectBothReject(resealed, want, absl::StrCat("truncated to ", n, ", resealed"));
  }
  for (size_t extra : {size_t{4}, size_t{8}, size_t{28}}) {
    std::string extended = good.substr(0, good.size() - 8) + std::string(extra, '\x5a') + std::string(8, '\0');
    Reseal(&extended);
    ExpectBothReject(extended, absl::StatusCode::kInvalidArgument, absl::StrCat("extended by ", extra, ", resealed"));
  }
}

TEST(SnapshotCodecTest, EncodeRejectsArraysThatDoNotMatchTheLayout) {
  const Snapshot good = MakeSnapshot(SmallHybridLayout(), 11, true);
  struct Case {
    const char* name;
    void (*mutate)(Snapshot*);
    const char* message;
  };
  const Case cases[] = {
      {"missing ssm layer", [](Snapshot* s) { s->ssm_states.pop_back(); }, "ssm_states"},
      {"short ssm state", [](Snapshot* s) { s->ssm_states[1].pop_back(); }, "ssm_states[1]"},
      {"long conv state", [](Snapshot* s) { s->conv_states[2].push_back(0); }, "conv_states[2]"},
      {"extra k layer", [](Snapshot* s) { s->tail_k.push_back(s->tail_k[0]); }, "tail_k"},
      {"short v", [](Snapshot* s) { s->tail_v[0].resize(3); }, "tail_v[0]"},
      {"tail of another position", [](Snapshot* s) { s->position = 12; }, "tail_k[0]"},
      {"logits of another vocab", [](Snapshot* s) { s->last_logits.push_back(1); }, "last_logits"},
      {"logits without vocab", [](Snapshot* s) { s->layout.vocab = 0; }, "vocab"},
      {"negative position", [](Snapshot* s) { s->position = -1; }, "position"},
      {"invalid layout", [](Snapshot* s) { s->layout.kv_heads = 0; }, "kv_heads"},
  };
  for (const Case& c : cases) {
    Snapshot s = good;
    c.mutate(&s);
    absl::StatusOr<std::string> bytes = EncodeSnapshot(s);
    EXPECT_EQ(bytes.status().code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_THAT(std::string(bytes.status().message()), HasSubstr(c.message)) << c.name;
  }
}

TEST(SnapshotCodecTest, LayoutValidationNamesTheField) {
  EXPECT_TRUE(SmallHybridLayout().Validate().ok());
  EXPECT_TRUE(StateLayout{.page_size = 1}.Validate().ok());  // a stateless model
  StateLayout layout = SmallHybridLayout();
  layout.ssm_state = 0;
  EXPECT_THAT(std::string(layout.Validate().message()), HasSubstr("ssm_state"));
  layout = SmallHybridLayout();
  layout.conv_kernel = -2;
  EXPECT_THAT(std::string(layout.Validate().message()), HasSubstr("conv_kernel"));
  layout = SmallHybridLayout();
  layout.page_size = std::numeric_limits<int32_t>::max();
  layout.kv_heads = layout.kv_head_dim = 1024;
  EXPECT_EQ(layout.Validate().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EncodedSnapshotSize(SmallHybridLayout(), -1, false).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace hybridserve::engine
