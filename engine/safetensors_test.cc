#include "engine/safetensors.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/runfiles.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hybridserve::engine {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

using common::Runfile;

std::string TempPath(absl::string_view name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return absl::StrCat(tmp ? tmp : "/tmp", "/", name);
}

void WriteFile(const std::string& path, absl::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

template <typename T>
std::vector<uint8_t> Bytes(const std::vector<T>& values) {
  std::vector<uint8_t> out(values.size() * sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), values.data(), out.size());
  return out;
}

// A tensor to serialize; owns its shape and bytes.
struct OwnedTensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;

  TensorView View() const { return TensorView{name, dtype, absl::MakeConstSpan(shape), absl::MakeConstSpan(bytes)}; }
};

std::string Serialize(const std::vector<OwnedTensor>& tensors, const std::map<std::string, std::string>& meta = {}) {
  std::vector<TensorView> views;
  for (const OwnedTensor& t : tensors) views.push_back(t.View());
  absl::StatusOr<std::string> bytes = SerializeSafetensors(views, meta);
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  return bytes.ok() ? *bytes : std::string();
}

// A file with a hand-written header and `data_size` zero bytes of data.
std::string RawFile(absl::string_view header, size_t data_size) {
  std::string out(8, '\0');
  const uint64_t len = header.size();
  std::memcpy(out.data(), &len, 8);
  absl::StrAppend(&out, header);
  out.append(data_size, '\0');
  return out;
}

absl::Status OpenBytes(const std::string& bytes) { return SafetensorsFile::FromBytes(bytes, "test").status(); }

uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Independent fp16 reference: (-1)^s * 2^(e-15) * 1.m, or 2^-14 * 0.m.
double Fp16Reference(uint16_t h) {
  const int sign = (h >> 15) & 1;
  const int e = (h >> 10) & 0x1f;
  const int m = h & 0x3ff;
  double v;
  if (e == 0x1f) {
    v = m == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  } else if (e == 0) {
    v = std::ldexp(static_cast<double>(m), -24);
  } else {
    v = std::ldexp(static_cast<double>(1024 + m), e - 25);
  }
  return sign ? -v : v;
}

std::vector<OwnedTensor> SampleTensors() {
  return {
      {"a.f32", DType::kF32, {2, 3}, Bytes(std::vector<float>{1.5f, -2.0f, 0.0f, 3.25f, 1e-30f, -7.0f})},
      {"b.bf16", DType::kBF16, {4}, Bytes(std::vector<uint16_t>{0x3F80, 0xBF80, 0x7F80, 0x0001})},
      {"c.f16",
       DType::kF16,
       {8},
       Bytes(std::vector<uint16_t>{0x3C00, 0x0001, 0x7C00, 0xFC00, 0x7E00, 0x03FF, 0x8000, 0x7BFF})},
      {"d.i32", DType::kI32, {3}, Bytes(std::vector<int32_t>{7, -1, 2147483647})},
      {"e.i64", DType::kI64, {2}, Bytes(std::vector<int64_t>{int64_t{1} << 40, -5})},
      {"f.scalar", DType::kF32, {}, Bytes(std::vector<float>{42.0f})},
      {"g.empty", DType::kF32, {0, 4}, {}},
  };
}

TEST(SafetensorsTest, RoundTripThroughAFileKeepsNamesShapesBytesAndMetadata) {
  const std::vector<OwnedTensor> tensors = SampleTensors();
  const std::string path = TempPath("round_trip.safetensors");
  WriteFile(path, Serialize(tensors, {{"format", "pt"}}));
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  const SafetensorsFile& f = **file;
  ASSERT_EQ(f.tensors().size(), tensors.size());
  EXPECT_EQ(f.metadata().at("format"), "pt");
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorInfo& info = f.tensors()[i];
    EXPECT_EQ(info.name, tensors[i].name);  // sorted by name, as written
    EXPECT_EQ(info.dtype, tensors[i].dtype);
    EXPECT_EQ(info.shape, tensors[i].shape);
    absl::StatusOr<TensorView> view = f.Tensor(info.name);
    ASSERT_TRUE(view.ok());
    EXPECT_EQ(std::vector<uint8_t>(view->bytes.begin(), view->bytes.end()), tensors[i].bytes) << info.name;
  }
  EXPECT_TRUE(f.Contains("c.f16"));
  EXPECT_FALSE(f.Contains("nope"));
  EXPECT_EQ(f.Tensor("nope").status().code(), absl::StatusCode::kNotFound);

  absl::StatusOr<std::vector<float>> f32 = ToFloat32(*f.Tensor("a.f32"));
  ASSERT_TRUE(f32.ok());
  EXPECT_THAT(*f32, ElementsAre(1.5f, -2.0f, 0.0f, 3.25f, 1e-30f, -7.0f));
  absl::StatusOr<std::vector<float>> scalar = ToFloat32(*f.Tensor("f.scalar"));
  ASSERT_TRUE(scalar.ok());
  EXPECT_THAT(*scalar, ElementsAre(42.0f));
  absl::StatusOr<std::vector<float>> empty = ToFloat32(*f.Tensor("g.empty"));
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->empty());
  absl::StatusOr<std::vector<int64_t>> i32 = ToInt64(*f.Tensor("d.i32"));
  ASSERT_TRUE(i32.ok());
  EXPECT_THAT(*i32, ElementsAre(7, -1, 2147483647));
  absl::StatusOr<std::vector<int64_t>> i64 = ToInt64(*f.Tensor("e.i64"));
  ASSERT_TRUE(i64.ok());
  EXPECT_THAT(*i64, ElementsAre(int64_t{1} << 40, -5));
}

TEST(SafetensorsTest, Bf16AndFp16ConvertExactly) {
  const std::string bytes = Serialize(SampleTensors());
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::FromBytes(bytes, "mem");
  ASSERT_TRUE(file.ok()) << file.status();
  absl::StatusOr<std::vector<float>> bf16 = ToFloat32(*(*file)->Tensor("b.bf16"));
  ASSERT_TRUE(bf16.ok());
  EXPECT_EQ((*bf16)[0], 1.0f);  // 0x3F80
  EXPECT_EQ((*bf16)[1], -1.0f);
  EXPECT_EQ((*bf16)[2], std::numeric_limits<float>::infinity());
  EXPECT_EQ((*bf16)[3], std::ldexp(1.0f, -133));  // smallest bf16 subnormal
  absl::StatusOr<std::vector<float>> f16 = ToFloat32(*(*file)->Tensor("c.f16"));
  ASSERT_TRUE(f16.ok());
  EXPECT_EQ((*f16)[0], 1.0f);                   // 0x3C00
  EXPECT_EQ((*f16)[1], std::ldexp(1.0f, -24));  // 0x0001, smallest subnormal
  EXPECT_EQ((*f16)[2], std::numeric_limits<float>::infinity());
  EXPECT_EQ((*f16)[3], -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan((*f16)[4]));
  EXPECT_EQ((*f16)[5], 1023.0f * std::ldexp(1.0f, -24));  // largest subnormal
  EXPECT_EQ(FloatBits((*f16)[6]), 0x80000000u);           // -0
  EXPECT_EQ((*f16)[7], 65504.0f);                         // largest finite
}

TEST(SafetensorsTest, EveryFp16BitPatternMatchesTheReference) {
  for (uint32_t bits = 0; bits <= 0xFFFF; ++bits) {
    const float got = Fp16ToFloat(static_cast<uint16_t>(bits));
    const double want = Fp16Reference(static_cast<uint16_t>(bits));
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << std::hex << bits;
      ASSERT_EQ(FloatBits(got) >> 31, bits >> 15) << std::hex << bits;
    } else {
      ASSERT_EQ(static_cast<double>(got), want) << std::hex << bits;
      ASSERT_EQ(std::signbit(got), std::signbit(want)) << std::hex << bits;
    }
  }
}

TEST(SafetensorsTest, ConversionRejectsWrongOutputSizeAndIntegerDtypes) {
  const std::string bytes = Serialize(SampleTensors());
  auto file = SafetensorsFile::FromBytes(bytes, "mem");
  ASSERT_TRUE(file.ok());
  std::vector<float> out(5);
  EXPECT_EQ(ConvertToFloat32(*(*file)->Tensor("a.f32"), absl::MakeSpan(out)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ToFloat32(*(*file)->Tensor("d.i32")).status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(ToInt64(*(*file)->Tensor("a.f32")).status().code(), absl::StatusCode::kUnimplemented);
}

TEST(SafetensorsTest, GoldenFixtureOpensWithIntegerPromptsAndFloatLogits) {
  auto file = SafetensorsFile::Open(Runfile("tests/fixtures/golden/nemotron_h_tiny/golden.safetensors"));
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->metadata().at("format"), "np");
  const TensorInfo* prompt = (*file)->Find("prompt_1");
  ASSERT_NE(prompt, nullptr);
  EXPECT_EQ(prompt->dtype, DType::kI32);
  EXPECT_THAT(prompt->shape, ElementsAre(5));
  const TensorInfo* logits = (*file)->Find("logits_1");
  ASSERT_NE(logits, nullptr);
  EXPECT_EQ(logits->dtype, DType::kF32);
  EXPECT_THAT(logits->shape, ElementsAre(5, 96));
  absl::StatusOr<std::vector<int64_t>> ids = ToInt64((*file)->View(*prompt));
  ASSERT_TRUE(ids.ok());
  for (int64_t id : *ids) {
    EXPECT_GE(id, 0);
    EXPECT_LT(id, 96);
  }
}

TEST(SafetensorsTest, ShortFilesAreInvalid) {
  EXPECT_EQ(OpenBytes("").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(OpenBytes(std::string(7, '\0')).code(), absl::StatusCode::kInvalidArgument);
  const std::string path = TempPath("empty.safetensors");
  WriteFile(path, "");
  EXPECT_EQ(SafetensorsFile::Open(path).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(SafetensorsTest, TruncatedFileIsInvalid) {
  const std::string bytes = Serialize(SampleTensors());
  for (size_t cut : {size_t{1}, size_t{4}, bytes.size() / 2, bytes.size() - 9}) {
    absl::Status s = OpenBytes(bytes.substr(0, bytes.size() - cut));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << cut;
  }
  const std::string path = TempPath("truncated.safetensors");
  WriteFile(path, bytes.substr(0, bytes.size() - 3));
  EXPECT_EQ(SafetensorsFile::Open(path).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(SafetensorsTest, HeaderLengthPastEndOfFileIsInvalid) {
  std::string bytes = Serialize(SampleTensors());
  for (uint64_t len : {uint64_t{0}, uint64_t{bytes.size()}, uint64_t{1} << 40, ~uint64_t{0}}) {
    std::memcpy(bytes.data(), &len, 8);
    absl::Status s = OpenBytes(bytes);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << len;
    EXPECT_THAT(std::string(s.message()), HasSubstr("header length"));
  }
}

TEST(SafetensorsTest, HeaderThatIsNotAJsonObjectIsInvalid) {
  EXPECT_THAT(std::string(OpenBytes(RawFile("{not json}", 0)).message()), HasSubstr("not valid JSON"));
  EXPECT_EQ(OpenBytes(RawFile("[1, 2]  ", 0)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(OpenBytes(RawFile(std::string("{\"a\":\0}", 7), 0)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(OpenBytes(RawFile("{}      ", 0)).code(), absl::StatusCode::kOk);  // no tensors is valid
}

TEST(SafetensorsTest, OffsetsOutOfRangeAreInvalid) {
  absl::Status s = OpenBytes(RawFile(R"({"w":{"dtype":"F32","shape":[250],"data_offsets":[0,1000]}})", 16));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("tensor w: data_offsets [0, 1000] run past"));
  s = OpenBytes(RawFile(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[18446744073709551612,0]}})", 16));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  s = OpenBytes(RawFile(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", 16));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
}

TEST(SafetensorsTest, OverlappingTensorsAreInvalid) {
  absl::Status s = OpenBytes(RawFile(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                                     R"("b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})",
                                     24));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("overlap tensor a"));
  s = OpenBytes(RawFile(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                        R"("b":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})",
                        16));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
}

TEST(SafetensorsTest, HolesAndTrailingBytesAreInvalid) {
  absl::Status s = OpenBytes(RawFile(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                     R"("b":{"dtype":"F32","shape":[2],"data_offsets":[16,24]}})",
                                     24));
  EXPECT_THAT(std::string(s.message()), HasSubstr("hole"));
  s = OpenBytes(RawFile(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 12));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("cover 8 of the 12 bytes"));
}

TEST(SafetensorsTest, DtypeTimesShapeMustMatchOffsets) {
  absl::Status s = OpenBytes(RawFile(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("tensor w: F32 shape [3] needs 3 * 4 bytes"));
  s = OpenBytes(RawFile(R"({"w":{"dtype":"BF16","shape":[3],"data_offsets":[0,12]}})", 12));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  s = OpenBytes(RawFile(R"({"w":{"dtype":"F32","shape":[4611686018427387904,4611686018427387904],)"
                        R"("data_offsets":[0,0]}})",
                        0));
  EXPECT_THAT(std::string(s.message()), HasSubstr("overflows"));
  s = OpenBytes(RawFile(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8));
  EXPECT_THAT(std::string(s.message()), HasSubstr("reversed"));
}

TEST(SafetensorsTest, MalformedEntriesAreInvalidAndNamed) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,0]}})", "shape entry"},
      {R"({"w":{"dtype":"F32","shape":[1.5],"data_offsets":[0,0]}})", "shape entry"},
      {R"({"w":{"dtype":"F32","shape":"2","data_offsets":[0,0]}})", "shape must be a list"},
      {R"({"w":{"dtype":"F32","shape":[0]}})", "needs dtype, shape and data_offsets"},
      {R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[0,0],"extra":1}})", "unexpected field \"extra\""},
      {R"({"w":{"dtype":"Q7","shape":[0],"data_offsets":[0,0]}})", "unknown dtype \"Q7\""},
      {R"({"w":{"dtype":7,"shape":[0],"data_offsets":[0,0]}})", "dtype must be a string"},
      {R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[0]}})", "data_offsets must be [begin, end]"},
      {R"({"w":[1,2]})", "entry must be an object"},
      {R"({"":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}})", "empty name"},
      {R"({"__metadata__":{"format":3}})", "__metadata__ value of \"format\""},
      {R"({"__metadata__":[1]})", "__metadata__ must be an object"},
  };
  for (const auto& [header, message] : cases) {
    absl::Status s = OpenBytes(RawFile(header, 0));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << header;
    EXPECT_THAT(std::string(s.message()), HasSubstr(message)) << header;
  }
}

TEST(SafetensorsTest, KnownButUnsupportedDtypeIsUnimplemented) {
  absl::Status s = OpenBytes(RawFile(R"({"w":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", 8));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(s.message()), HasSubstr("tensor w: dtype F64"));
}

TEST(SafetensorsTest, OpeningAMissingPathOrADirectoryFails) {
  EXPECT_EQ(SafetensorsFile::Open("/nonexistent/model.safetensors").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(SafetensorsFile::Open(TempPath("")).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(SafetensorsTest, SerializeRejectsInconsistentInput) {
  std::vector<OwnedTensor> tensors = SampleTensors();
  tensors.push_back(tensors[0]);
  std::vector<TensorView> views;
  for (const OwnedTensor& t : tensors) views.push_back(t.View());
  EXPECT_EQ(SerializeSafetensors(views).status().code(), absl::StatusCode::kInvalidArgument);
  OwnedTensor bad{"x", DType::kF32, {3}, std::vector<uint8_t>(8)};
  const TensorView bad_view = bad.View();
  EXPECT_EQ(SerializeSafetensors(absl::MakeConstSpan(&bad_view, 1)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Where a mutation of RandomHeaderMutations lands in a valid file.
enum class MutationClass {
  kLengthPrefix,  // the u64 header length
  kStringText,    // inside a JSON string: names, dtypes, keys, metadata
  kDigit,         // a digit of a shape or of data_offsets
  kStructure,     // {}[]:," and spaces outside strings
};
constexpr int kNumMutationClasses = 4;

// Positions of each class in `file` (header length `header_len`).
std::vector<std::vector<size_t>> PositionsByClass(const std::string& file, size_t header_len) {
  std::vector<std::vector<size_t>> out(kNumMutationClasses);
  for (size_t i = 0; i < 8; ++i) out[static_cast<int>(MutationClass::kLengthPrefix)].push_back(i);
  bool in_string = false;
  for (size_t i = 8; i < 8 + header_len; ++i) {
    const char c = file[i];
    if (c == '"') {
      in_string = !in_string;
      out[static_cast<int>(MutationClass::kStructure)].push_back(i);
    } else if (in_string) {
      out[static_cast<int>(MutationClass::kStringText)].push_back(i);
    } else if (c >= '0' && c <= '9') {
      out[static_cast<int>(MutationClass::kDigit)].push_back(i);
    } else {
      out[static_cast<int>(MutationClass::kStructure)].push_back(i);
    }
  }
  return out;
}

// An accepted file's tensors agree with its header as parsed here, with
// nlohmann::json, independently of the reader, and every view lies in the data
// section of the file's own bytes, at the offsets the header gives, with the
// bytes that were written there; together the tensors tile the data section.
void ExpectViewsInsideTheDataSection(const SafetensorsFile& file, const std::string& bytes) {
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), 8);
  ASSERT_EQ(file.data_start(), 8 + header_len);
  ASSERT_LE(file.data_start(), bytes.size());
  const nlohmann::json header = nlohmann::json::parse(bytes.substr(8, header_len));
  const absl::Span<const uint8_t> all = file.file_bytes();
  ASSERT_EQ(all.size(), bytes.size());
  const uint8_t* data = all.data() + file.data_start();
  const uint64_t data_size = bytes.size() - file.data_start();
  size_t header_tensors = 0;
  for (const auto& [key, value] : header.items()) header_tensors += key == "__metadata__" ? 0 : 1;
  ASSERT_EQ(file.tensors().size(), header_tensors);
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const TensorInfo& info : file.tensors()) {
    ASSERT_TRUE(header.contains(info.name)) << info.name;
    const nlohmann::json& entry = header.at(info.name);
    EXPECT_EQ(entry.at("dtype").get<std::string>(), DTypeName(info.dtype)) << info.name;
    EXPECT_EQ(entry.at("shape").get<std::vector<int64_t>>(), info.shape) << info.name;
    EXPECT_EQ(entry.at("data_offsets").at(0).get<uint64_t>(), info.data_begin) << info.name;
    EXPECT_EQ(entry.at("data_offsets").at(1).get<uint64_t>(), info.data_end) << info.name;
    ASSERT_LE(info.data_begin, info.data_end) << info.name;
    ASSERT_LE(info.data_end, data_size) << info.name;
    const TensorView view = file.View(info);
    EXPECT_EQ(view.bytes.size(), static_cast<uint64_t>(info.num_elements()) * DTypeSize(info.dtype)) << info.name;
    ASSERT_EQ(view.bytes.size(), info.data_end - info.data_begin) << info.name;
    if (!view.bytes.empty()) {
      ASSERT_EQ(view.bytes.data(), data + info.data_begin) << info.name;
      ASSERT_GE(view.bytes.data(), all.data()) << info.name;
      ASSERT_LE(view.bytes.data() + view.bytes.size(), all.data() + all.size()) << info.name;
      EXPECT_EQ(absl::string_view(reinterpret_cast<const char*>(view.bytes.data()), view.bytes.size()),
                absl::string_view(bytes).substr(file.data_start() + info.data_begin, view.bytes.size()))
          << info.name;
    }
    if (info.dtype == DType::kF32 || info.dtype == DType::kBF16 || info.dtype == DType::kF16) {
      EXPECT_TRUE(ToFloat32(view).ok()) << info.name;
    } else {
      EXPECT_TRUE(ToInt64(view).ok()) << info.name;
    }
    if (info.data_end > info.data_begin) ranges.emplace_back(info.data_begin, info.data_end);
  }
  std::sort(ranges.begin(), ranges.end());
  uint64_t covered = 0;
  for (const auto& [begin, end] : ranges) {
    EXPECT_EQ(begin, covered) << "hole or overlap";
    covered = end;
  }
  EXPECT_EQ(covered, data_size);
}

// Random mutations of the length prefix and the header of a valid file, 500
// per class, 1 to 3 bytes each (a flipped bit or a random byte). Open never
// crashes (run under --config=asan for out-of-bounds reads); a rejected file is
// INVALID_ARGUMENT, or UNIMPLEMENTED naming a known dtype; an accepted file's
// views lie in its data section as its header says. Exact outcomes where the
// format decides them: a changed length prefix or a changed structural
// character is always rejected; strings and digits are sometimes accepted
// (a renamed tensor, a changed metadata value, the 0 of an empty tensor's
// shape kept) and sometimes rejected.
TEST(SafetensorsTest, RandomHeaderMutationsAreRejectedOrGiveViewsInsideTheFile) {
  const std::string valid = Serialize(SampleTensors(), {{"format", "pt"}});
  uint64_t header_len = 0;
  std::memcpy(&header_len, valid.data(), 8);
  const std::vector<std::vector<size_t>> positions = PositionsByClass(valid, static_cast<size_t>(header_len));
  for (const std::vector<size_t>& p : positions) ASSERT_FALSE(p.empty());
  std::mt19937_64 rng(20240601);
  const std::string path = TempPath("mutated.safetensors");
  constexpr int kPerClass = 500;
  std::vector<int> accepted(kNumMutationClasses, 0);
  std::vector<int> rejected(kNumMutationClasses, 0);
  int unimplemented = 0;
  for (int iter = 0; iter < kNumMutationClasses * kPerClass; ++iter) {
    const int mutation_class = iter % kNumMutationClasses;
    const std::vector<size_t>& where = positions[static_cast<size_t>(mutation_class)];
    std::string bytes = valid;
    const int changes = 1 + static_cast<int>(rng() % 3);
    for (int k = 0; k < changes; ++k) {
      const size_t pos = where[rng() % where.size()];
      if (rng() % 2 == 0) {
        bytes[pos] = static_cast<char>(bytes[pos] ^ (1u << (rng() % 8)));  // one bit
      } else {
        bytes[pos] = static_cast<char>(rng() % 256);  // any byte
      }
    }
    if (bytes == valid) {  // a random byte equal to the one it replaced
      --iter;
      continue;
    }
    WriteFile(path, bytes);
    absl::StatusOr<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(path);
    if (!file.ok()) {
      ++rejected[static_cast<size_t>(mutation_class)];
      const absl::Status& s = file.status();
      if (s.code() == absl::StatusCode::kUnimplemented) {
        ++unimplemented;
        EXPECT_THAT(std::string(s.message()), HasSubstr("is not supported")) << s;
      } else {
        ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
      }
      continue;
    }
    ++accepted[static_cast<size_t>(mutation_class)];
    ASSERT_NO_FATAL_FAILURE(ExpectViewsInsideTheDataSection(**file, bytes)) << "iteration " << iter;
  }
  std::cout << "accepted by class (length, string, digit, structure):";
  for (int c = 0; c < kNumMutationClasses; ++c) std::cout << " " << accepted[static_cast<size_t>(c)];
  std::cout << "; unimplemented " << unimplemented << "\n";
  EXPECT_EQ(accepted[static_cast<int>(MutationClass::kLengthPrefix)], 0);
  EXPECT_EQ(accepted[static_cast<int>(MutationClass::kStructure)], 0);
  for (MutationClass c : {MutationClass::kStringText, MutationClass::kDigit}) {
    EXPECT_GT(accepted[static_cast<int>(c)], 0) << static_cast<int>(c);
    EXPECT_GT(rejected[static_cast<int>(c)], 0) << static_cast<int>(c);
  }
}

class ShardedCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TempPath(::testing::UnitTest::GetInstance()->current_test_info()->name());
    ASSERT_EQ(std::system(absl::StrCat("rm -rf '", dir_, "' && mkdir -p '", dir_, "'").c_str()), 0);
    std::vector<OwnedTensor> all = SampleTensors();
    WriteFile(dir_ + "/shard-1.safetensors", Serialize({all[0], all[1], all[2]}));
    WriteFile(dir_ + "/shard-2.safetensors", Serialize({all[3], all[4]}));
  }

  void WriteIndex(absl::string_view weight_map) {
    WriteFile(dir_ + "/model.safetensors.index.json",
              absl::StrCat(R"({"metadata":{"total_size":1},"weight_map":)", weight_map, "}"));
  }

  std::string dir_;
};

TEST_F(ShardedCheckpointTest, IndexJoinsShards) {
  WriteIndex(R"({"a.f32":"shard-1.safetensors","b.bf16":"shard-1.safetensors","c.f16":"shard-1.safetensors",)"
             R"("d.i32":"shard-2.safetensors","e.i64":"shard-2.safetensors"})");
  auto checkpoint = SafetensorsCheckpoint::OpenDirectory(dir_);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  EXPECT_THAT((*checkpoint)->names(), ElementsAre("a.f32", "b.bf16", "c.f16", "d.i32", "e.i64"));
  EXPECT_EQ((*checkpoint)->files().size(), 2u);
  absl::StatusOr<TensorView> view = (*checkpoint)->Tensor("e.i64");
  ASSERT_TRUE(view.ok());
  EXPECT_THAT(*ToInt64(*view), ElementsAre(int64_t{1} << 40, -5));
  EXPECT_EQ((*checkpoint)->Tensor("zzz").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(ShardedCheckpointTest, IndexNamingATensorItsShardLacksIsInvalid) {
  WriteIndex(R"({"a.f32":"shard-1.safetensors","b.bf16":"shard-1.safetensors","c.f16":"shard-1.safetensors",)"
             R"("d.i32":"shard-2.safetensors","e.i64":"shard-2.safetensors","z":"shard-2.safetensors"})");
  absl::Status s = SafetensorsCheckpoint::OpenDirectory(dir_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("tensor z in shard shard-2.safetensors, which lacks it"));
}

TEST_F(ShardedCheckpointTest, ShardTensorMissingFromIndexIsInvalid) {
  WriteIndex(R"({"a.f32":"shard-1.safetensors","b.bf16":"shard-1.safetensors","c.f16":"shard-1.safetensors",)"
             R"("d.i32":"shard-2.safetensors"})");
  absl::Status s = SafetensorsCheckpoint::OpenDirectory(dir_).status();
  EXPECT_THAT(std::string(s.message()), HasSubstr("tensor e.i64 of shard shard-2.safetensors is not in weight_map"));
}

TEST_F(ShardedCheckpointTest, IndexPointingOutsideTheDirectoryIsInvalid) {
  WriteIndex(R"({"a.f32":"../shard-1.safetensors"})");
  absl::Status s = SafetensorsCheckpoint::OpenDirectory(dir_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("not a file of the model directory"));
  WriteIndex(R"([1])");
  EXPECT_EQ(SafetensorsCheckpoint::OpenDirectory(dir_).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(ShardedCheckpointTest, MissingShardIsNotFound) {
  WriteIndex(R"({"a.f32":"shard-9.safetensors"})");
  EXPECT_EQ(SafetensorsCheckpoint::OpenDirectory(dir_).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(ShardedCheckpointTest, DirectoryWithoutWeightsIsNotFound) {
  EXPECT_EQ(SafetensorsCheckpoint::OpenDirectory(dir_).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace hybridserve::engine
