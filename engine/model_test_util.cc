#include "engine/model_test_util.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/runfiles.h"
#include "engine/model_config.h"
#include "engine/safetensors.h"
#include "gtest/gtest.h"
#include "kernels/bf16.h"
#include "kernels/cuda/test_backends.h"

namespace hybridserve::engine::testing {

using common::Runfile;

std::unique_ptr<ModelWeights> LoadWeights(absl::string_view model_dir) {
  auto config = LoadModelConfig(Runfile(absl::StrCat(model_dir, "/config.json")));
  if (!config.ok()) {
    ADD_FAILURE() << model_dir << ": " << config.status();
    return nullptr;
  }
  auto weights = ModelWeights::Load(*config, Runfile(model_dir));
  if (!weights.ok()) {
    ADD_FAILURE() << model_dir << ": " << weights.status();
    return nullptr;
  }
  return std::move(weights).value();
}

std::unique_ptr<ModelWeights> LoadWeightsCutToBf16(absl::string_view model_dir, bool as_bf16) {
  auto config = LoadModelConfig(Runfile(absl::StrCat(model_dir, "/config.json")));
  auto file = SafetensorsFile::Open(Runfile(absl::StrCat(model_dir, "/model.safetensors")));
  if (!config.ok() || !file.ok()) {
    ADD_FAILURE() << model_dir << ": " << config.status() << " / " << file.status();
    return nullptr;
  }
  struct Cut {
    std::string name;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
  };
  std::vector<Cut> cuts;
  for (const TensorInfo& info : (*file)->tensors()) {
    const TensorView v = (*file)->View(info);
    if (info.dtype != DType::kF32) {
      ADD_FAILURE() << info.name << " is not F32";
      return nullptr;
    }
    const size_t n = v.bytes.size() / 4;
    Cut cut{info.name, info.shape, std::vector<uint8_t>(as_bf16 ? 2 * n : 4 * n, 0)};
    for (size_t i = 0; i < n; ++i) {
      uint32_t bits;
      std::memcpy(&bits, v.bytes.data() + 4 * i, 4);
      const uint16_t top = static_cast<uint16_t>(bits >> 16);
      if (as_bf16) {
        std::memcpy(cut.bytes.data() + 2 * i, &top, 2);
      } else {
        const float widened = kernels::Bf16ToFloat(top);
        std::memcpy(cut.bytes.data() + 4 * i, &widened, 4);
      }
    }
    cuts.push_back(std::move(cut));
  }
  std::vector<TensorView> views;
  for (const Cut& c : cuts) {
    views.push_back(TensorView{c.name, as_bf16 ? DType::kBF16 : DType::kF32, absl::MakeConstSpan(c.shape),
                               absl::MakeConstSpan(c.bytes)});
  }
  auto bytes = SerializeSafetensors(views, {{"format", "pt"}});
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = absl::StrCat(tmp ? tmp : "/tmp", "/cut_to_bf16_", as_bf16 ? "bf16" : "f32");
  std::filesystem::create_directories(dir);
  std::ofstream out(dir + "/model.safetensors", std::ios::binary | std::ios::trunc);
  if (bytes.ok()) out.write(bytes->data(), static_cast<std::streamsize>(bytes->size()));
  out.close();
  if (!bytes.ok() || !out.good()) {
    ADD_FAILURE() << "writing " << dir << ": " << bytes.status();
    return nullptr;
  }
  auto weights = ModelWeights::Load(*config, dir);
  if (!weights.ok()) {
    ADD_FAILURE() << dir << ": " << weights.status();
    return nullptr;
  }
  return std::move(weights).value();
}

std::unique_ptr<Model> MakeModel(const ModelWeights& weights, const ModelOptions& options) {
  auto model = Model::Create(weights.config(), weights, options);
  if (!model.ok()) {
    ADD_FAILURE() << model.status();
    return nullptr;
  }
  return std::move(model).value();
}

std::string FixtureTestName(absl::string_view model_dir) {
  const size_t slash = model_dir.rfind('/');
  const absl::string_view base = slash == absl::string_view::npos ? model_dir : model_dir.substr(slash + 1);
  std::string name;
  bool upper = true;
  for (char c : base) {
    if (c == '_') {
      upper = true;
      continue;
    }
    name.push_back(upper ? absl::ascii_toupper(static_cast<unsigned char>(c)) : c);
    upper = false;
  }
  return name;
}

std::string TestTargetName(TestTarget target) {
  switch (target) {
    case TestTarget::kCpu:
      return "";
    case TestTarget::kCudaEmulated:
      return "CudaEmulated";
    case TestTarget::kCudaGpu:
      return "CudaGpu";
  }
  return "Unknown";
}

std::unique_ptr<kernels::Backend> MakeTargetBackend(TestTarget target, bool* skipped) {
  *skipped = false;
  if (target == TestTarget::kCpu) return nullptr;
  std::unique_ptr<kernels::Backend> backend = kernels::cuda_testing::MakeCudaTestBackendOrSkip(
      target == TestTarget::kCudaEmulated ? kernels::cuda_testing::CudaTarget::kEmulated
                                          : kernels::cuda_testing::CudaTarget::kGpu);
  *skipped = backend == nullptr && ::testing::Test::IsSkipped();  // no GPU, or the emulator under TSan
  return backend;
}

namespace {

template <typename T>
bool ReadTensor(const SafetensorsFile& file, const std::string& name, std::vector<T>* out) {
  auto view = file.Tensor(name);
  if (!view.ok()) {
    ADD_FAILURE() << view.status();
    return false;
  }
  if constexpr (std::is_same_v<T, float>) {
    auto values = ToFloat32(*view);
    if (!values.ok()) {
      ADD_FAILURE() << values.status();
      return false;
    }
    *out = std::move(values).value();
  } else {
    auto values = ToInt64(*view);
    if (!values.ok()) {
      ADD_FAILURE() << values.status();
      return false;
    }
    out->assign(values->begin(), values->end());
  }
  return true;
}

}  // namespace

std::vector<GoldenCase> LoadGolden(absl::string_view model_dir) {
  std::vector<GoldenCase> cases;
  auto file = SafetensorsFile::Open(Runfile(absl::StrCat(model_dir, "/golden.safetensors")));
  if (!file.ok()) {
    ADD_FAILURE() << file.status();
    return cases;
  }
  for (int i = 0; (*file)->Contains(absl::StrCat("prompt_", i)); ++i) {
    GoldenCase c;
    if (!ReadTensor(**file, absl::StrCat("prompt_", i), &c.prompt) ||
        !ReadTensor(**file, absl::StrCat("logits_", i), &c.logits) ||
        !ReadTensor(**file, absl::StrCat("greedy_", i), &c.greedy) ||
        !ReadTensor(**file, absl::StrCat("greedy_logits_", i), &c.greedy_logits)) {
      return {};
    }
    cases.push_back(std::move(c));
  }
  return cases;
}

std::vector<TokenId> RandomTokens(uint64_t seed, int64_t n, int64_t vocab) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<TokenId> dist(0, static_cast<TokenId>(vocab - 1));
  std::vector<TokenId> tokens(static_cast<size_t>(n));
  for (TokenId& t : tokens) t = dist(rng);
  return tokens;
}

int64_t ArgMax(absl::Span<const float> row) { return std::max_element(row.begin(), row.end()) - row.begin(); }

float MaxAbsDiff(absl::Span<const float> a, absl::Span<const float> b) {
  if (a.size() != b.size()) return INFINITY;
  float m = 0.0f;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) return INFINITY;
    m = std::max(m, std::fabs(a[i] - b[i]));
  }
  return m;
}

::testing::AssertionResult BitEqual(absl::Span<const float> a, absl::Span<const float> b) {
  if (a.size() != b.size()) {
    return ::testing::AssertionFailure() << "sizes differ: " << a.size() << " vs " << b.size();
  }
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) {
      return ::testing::AssertionFailure()
             << "non-finite value at element " << i << " of " << a.size() << ": " << a[i] << " vs " << b[i];
    }
  }
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) {
      return ::testing::AssertionFailure() << "bits differ first at element " << i << " of " << a.size() << ": " << a[i]
                                           << " vs " << b[i] << " (max abs diff " << MaxAbsDiff(a, b) << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

namespace {

bool ArraysBitEqual(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b,
                    absl::string_view name, std::string* what) {
  if (a.size() != b.size()) {
    *what = absl::StrCat(name, ": ", a.size(), " vs ", b.size(), " layers");
    return false;
  }
  for (size_t l = 0; l < a.size(); ++l) {
    if (const ::testing::AssertionResult equal = BitEqual(a[l], b[l]); !equal) {
      *what = absl::StrCat(name, "[", l, "]: ", equal.message());
      return false;
    }
  }
  return true;
}

}  // namespace

bool StatesBitEqual(const SequenceState& a, const SequenceState& b, std::string* what) {
  if (a.position != b.position) {
    *what = absl::StrCat("position ", a.position, " vs ", b.position);
    return false;
  }
  if (!ArraysBitEqual(a.ssm_states, b.ssm_states, "ssm_states", what) ||
      !ArraysBitEqual(a.conv_states, b.conv_states, "conv_states", what) ||
      !ArraysBitEqual(a.tail_k, b.tail_k, "tail_k", what) || !ArraysBitEqual(a.tail_v, b.tail_v, "tail_v", what)) {
    return false;
  }
  if (const ::testing::AssertionResult equal = BitEqual(a.last_logits, b.last_logits); !equal) {
    *what = absl::StrCat("last_logits: ", equal.message());
    return false;
  }
  return true;
}

float StatesMaxAbsDiff(const SequenceState& a, const SequenceState& b) {
  if (a.ssm_states.size() != b.ssm_states.size() || a.conv_states.size() != b.conv_states.size()) return INFINITY;
  float m = 0.0f;
  for (size_t l = 0; l < a.ssm_states.size(); ++l) m = std::max(m, MaxAbsDiff(a.ssm_states[l], b.ssm_states[l]));
  for (size_t l = 0; l < a.conv_states.size(); ++l) m = std::max(m, MaxAbsDiff(a.conv_states[l], b.conv_states[l]));
  return m;
}

std::vector<std::string> ExportPages(const Model& model, SequenceId id, int64_t n_pages) {
  std::vector<std::string> pages;
  for (int64_t i = 0; i < n_pages; ++i) {
    auto page = model.sequences().ExportPage(id, i);
    if (!page.ok()) {
      ADD_FAILURE() << "page " << i << ": " << page.status();
      return {};
    }
    pages.push_back(std::move(page).value());
  }
  return pages;
}

std::vector<absl::string_view> Views(const std::vector<std::string>& pages) {
  return std::vector<absl::string_view>(pages.begin(), pages.end());
}

std::vector<TokenId> GreedyDecode(Model& model, SequenceId id, absl::Span<const float> logits, int steps) {
  std::vector<TokenId> tokens;
  std::vector<float> row(logits.begin(), logits.end());
  for (int s = 0; s < steps; ++s) {
    const TokenId next = static_cast<TokenId>(ArgMax(row));
    tokens.push_back(next);
    if (s + 1 == steps) break;
    const SequenceId ids[] = {id};
    const TokenId toks[] = {next};
    auto out = model.DecodeStep(ids, toks);
    if (!out.ok()) {
      ADD_FAILURE() << out.status();
      return tokens;
    }
    row = std::move(out).value();
  }
  return tokens;
}

}  // namespace hybridserve::engine::testing
