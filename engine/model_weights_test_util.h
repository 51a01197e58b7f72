#ifndef HYBRIDSERVE_ENGINE_MODEL_WEIGHTS_TEST_UTIL_H_
#define HYBRIDSERVE_ENGINE_MODEL_WEIGHTS_TEST_UTIL_H_

// What the ModelWeights tests share: editable copies of a checkpoint's tensors,
// written back as a model directory and loaded.

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/runfiles.h"
#include "engine/model_config.h"
#include "engine/model_weights.h"
#include "engine/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hybridserve::engine::weights_testing {

inline std::string TempDir(absl::string_view name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = absl::StrCat(tmp ? tmp : "/tmp", "/", name);
  EXPECT_EQ(std::system(absl::StrCat("rm -rf '", dir, "' && mkdir -p '", dir, "'").c_str()), 0);
  return dir;
}

inline void WriteFile(const std::string& path, absl::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

inline ModelConfig Config(absl::string_view model_dir) {
  absl::StatusOr<ModelConfig> config = LoadModelConfig(common::Runfile(absl::StrCat(model_dir, "/config.json")));
  EXPECT_TRUE(config.ok()) << config.status();
  return config.ok() ? *config : ModelConfig();
}

// An editable copy of a checkpoint: name -> tensor.
struct OwnedTensor {
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};
using TensorMap = std::map<std::string, OwnedTensor>;

inline TensorMap ReadTensors(absl::string_view model_dir) {
  TensorMap out;
  auto file = SafetensorsFile::Open(common::Runfile(absl::StrCat(model_dir, "/model.safetensors")));
  EXPECT_TRUE(file.ok()) << file.status();
  if (!file.ok()) return out;
  for (const TensorInfo& info : (*file)->tensors()) {
    const TensorView v = (*file)->View(info);
    out[info.name] = OwnedTensor{info.dtype, info.shape, std::vector<uint8_t>(v.bytes.begin(), v.bytes.end())};
  }
  return out;
}

inline std::string Serialize(const TensorMap& tensors) {
  std::vector<TensorView> views;
  for (const auto& [name, t] : tensors) {
    views.push_back(TensorView{name, t.dtype, absl::MakeConstSpan(t.shape), absl::MakeConstSpan(t.bytes)});
  }
  absl::StatusOr<std::string> bytes = SerializeSafetensors(views, {{"format", "pt"}});
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  return bytes.ok() ? *bytes : std::string();
}

// Writes `tensors` as DIR/model.safetensors and returns DIR.
inline std::string WriteModel(absl::string_view name, const TensorMap& tensors) {
  const std::string dir = TempDir(name);
  WriteFile(dir + "/model.safetensors", Serialize(tensors));
  return dir;
}

inline absl::Status LoadStatus(const ModelConfig& config, const TensorMap& tensors, absl::string_view name) {
  return ModelWeights::Load(config, WriteModel(name, tensors)).status();
}

inline void ExpectInvalid(const absl::Status& s, absl::string_view substring) {
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr(std::string(substring)));
}

inline std::vector<float> Floats(const OwnedTensor& t) {
  std::vector<float> out(t.bytes.size() / 4);
  std::memcpy(out.data(), t.bytes.data(), t.bytes.size());
  return out;
}

inline int64_t TotalElements(const TensorMap& tensors) {
  int64_t n = 0;
  for (const auto& [name, t] : tensors) n += static_cast<int64_t>(t.bytes.size() / DTypeSize(t.dtype));
  return n;
}

inline std::unique_ptr<ModelWeights> MustLoad(absl::string_view dir) {
  absl::StatusOr<std::unique_ptr<ModelWeights>> w = ModelWeights::LoadDirectory(std::string(dir));
  EXPECT_TRUE(w.ok()) << w.status();
  return w.ok() ? std::move(*w) : nullptr;
}

}  // namespace hybridserve::engine::weights_testing

#endif  // HYBRIDSERVE_ENGINE_MODEL_WEIGHTS_TEST_UTIL_H_
