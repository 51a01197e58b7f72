#include "engine/model_metadata.h"

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/runfiles.h"
#include "engine/model_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hybridserve::engine {

bool operator==(const SpecialToken& a, const SpecialToken& b) { return a.id == b.id && a.text == b.text; }

void PrintTo(const SpecialToken& t, std::ostream* os) { *os << "{" << t.id << ", \"" << t.text << "\"}"; }

namespace {

using common::Runfile;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

std::string TempDir(absl::string_view name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = absl::StrCat(tmp ? tmp : "/tmp", "/", name);
  EXPECT_EQ(std::system(absl::StrCat("rm -rf '", dir, "' && mkdir -p '", dir, "'").c_str()), 0);
  return dir;
}

void WriteFile(const std::string& path, absl::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

// What LoadModelMetadata reads of config.json.
ModelConfig Config(std::vector<int64_t> eos, std::string name_or_path = "") {
  ModelConfig config;
  config.vocab_size = 64;
  config.eos_token_ids = std::move(eos);
  config.name_or_path = std::move(name_or_path);
  return config;
}

ModelMetadata Load(const std::string& dir, const ModelConfig& config, absl::string_view served = "") {
  absl::StatusOr<ModelMetadata> metadata = LoadModelMetadata(dir, config, served);
  EXPECT_TRUE(metadata.ok()) << metadata.status();
  return metadata.ok() ? *metadata : ModelMetadata{};
}

TEST(ModelMetadataTest, DefaultModelWithoutTokenizerFilesEndsTurnsAtConfigEosAndIsNamedByItsDirectory) {
  const std::string dir = Runfile("models/default");
  absl::StatusOr<ModelConfig> config = LoadModelConfig(dir + "/config.json");
  ASSERT_TRUE(config.ok()) << config.status();
  const ModelMetadata metadata = Load(dir, *config);
  EXPECT_EQ(metadata.name, "default");
  EXPECT_THAT(metadata.end_of_turn_tokens, ElementsAre(SpecialToken{258, ""}));
}

TEST(ModelMetadataTest, ByteTokenizerFixtureNamesTheEosToken) {
  const std::string dir = Runfile("tests/fixtures/byte_tokenizer");
  ModelConfig config = Config({258});
  config.vocab_size = 259;
  EXPECT_THAT(Load(dir, config).end_of_turn_tokens, ElementsAre(SpecialToken{258, "<eos>"}));
}

TEST(ModelMetadataTest, GenerationConfigIdsComeFirstThenTheTokenizerConfigEosEachOnce) {
  const std::string dir = TempDir("union");
  WriteFile(dir + "/generation_config.json", R"({"eos_token_id": [5, 7, 9]})");
  WriteFile(dir + "/tokenizer_config.json", R"({
    "eos_token": {"content": "<|im_end|>", "special": true},
    "added_tokens_decoder": {"5": {"content": "<|endoftext|>"}, "9": {"content": "<|im_end|>"},
                             "11": {"content": "<|turn|>"}}})");
  // Names the one id tokenizer_config.json leaves unnamed; its other entries
  // lose to tokenizer_config.json's.
  WriteFile(dir + "/tokenizer.json", R"({"added_tokens": [{"id": 7, "content": "<|eot|>"},
                                                          {"id": 9, "content": "<|other|>"}],
                                         "model": {"type": "BPE", "vocab": {"a": 0}}})");
  EXPECT_THAT(Load(dir, Config({3})).end_of_turn_tokens,
              ElementsAre(SpecialToken{5, "<|endoftext|>"}, SpecialToken{7, "<|eot|>"}, SpecialToken{9, "<|im_end|>"}));

  // The eos_token string adds its id when generation_config.json lacks it.
  WriteFile(dir + "/generation_config.json", R"({"eos_token_id": 5})");
  EXPECT_THAT(Load(dir, Config({3})).end_of_turn_tokens,
              ElementsAre(SpecialToken{5, "<|endoftext|>"}, SpecialToken{9, "<|im_end|>"}));
}

TEST(ModelMetadataTest, EosTokenStringResolvesThroughTheTokenizerJsonVocabulary) {
  const std::string dir = TempDir("vocab");
  WriteFile(dir + "/tokenizer_config.json", R"({"eos_token": "</s>"})");
  WriteFile(dir + "/tokenizer.json", R"({"added_tokens": [], "model": {"vocab": {"<s>": 1, "</s>": 2, "x": 3}}})");
  EXPECT_THAT(Load(dir, Config({3})).end_of_turn_tokens, ElementsAre(SpecialToken{2, "</s>"}));
}

TEST(ModelMetadataTest, UnresolvedEosStringFallsBackToConfigIds) {
  const std::string dir = TempDir("unresolved");
  WriteFile(dir + "/tokenizer_config.json", R"({"eos_token": "<unknown>", "bos_token": null})");
  EXPECT_THAT(Load(dir, Config({3, 4})).end_of_turn_tokens, ElementsAre(SpecialToken{3, ""}, SpecialToken{4, ""}));
  // A null eos_token_id is absent too.
  WriteFile(dir + "/generation_config.json", R"({"eos_token_id": null})");
  EXPECT_THAT(Load(dir, Config({3})).end_of_turn_tokens, ElementsAre(SpecialToken{3, ""}));
  EXPECT_THAT(Load(dir, Config({})).end_of_turn_tokens, IsEmpty());
}

TEST(ModelMetadataTest, NameIsTheServedNameThenNameOrPathThenTheDirectoryNeverAFullPath) {
  const std::string dir = TempDir("my-checkpoint");
  EXPECT_EQ(Load(dir, Config({3}, "nvidia/Nemotron-H-8B-Base-8K"), "served").name, "served");
  EXPECT_EQ(Load(dir, Config({3}, "nvidia/Nemotron-H-8B-Base-8K")).name, "nvidia/Nemotron-H-8B-Base-8K");
  EXPECT_EQ(Load(dir, Config({3}, "/tmp/hs-1b/")).name, "hs-1b");
  EXPECT_EQ(Load(dir, Config({3}, "./out/tiny")).name, "tiny");
  EXPECT_EQ(Load(dir, Config({3}, "~/models/m2")).name, "m2");
  EXPECT_EQ(Load(dir, Config({3}, "/")).name, "my-checkpoint");
  EXPECT_EQ(Load(dir, Config({3})).name, "my-checkpoint");
  EXPECT_EQ(Load(dir + "/", Config({3})).name, "my-checkpoint");
}

TEST(ModelMetadataTest, MalformedFilesAreInvalidArgumentNamingFileAndField) {
  const std::string dir = TempDir("malformed");
  auto error = [&] {
    absl::StatusOr<ModelMetadata> metadata = LoadModelMetadata(dir, Config({3}), "");
    EXPECT_EQ(metadata.status().code(), absl::StatusCode::kInvalidArgument) << metadata.status();
    return std::string(metadata.status().message());
  };
  WriteFile(dir + "/generation_config.json", R"({"eos_token_id": [5, "six"]})");
  EXPECT_THAT(error(), HasSubstr("generation_config.json: eos_token_id[1] must be an integer id"));
  WriteFile(dir + "/generation_config.json", R"({"eos_token_id": 64})");
  EXPECT_THAT(error(), HasSubstr("end-of-turn token id 64 is outside the vocabulary [0, 64)"));
  WriteFile(dir + "/generation_config.json", "{");
  EXPECT_THAT(error(), HasSubstr("generation_config.json: not valid JSON"));
  WriteFile(dir + "/generation_config.json", "{}");
  WriteFile(dir + "/tokenizer_config.json", R"({"eos_token": 2})");
  EXPECT_THAT(error(), HasSubstr("tokenizer_config.json: eos_token must be a string"));
  WriteFile(dir + "/tokenizer_config.json", R"({"eos_token": "</s>", "added_tokens_decoder": {"x": {}}})");
  EXPECT_THAT(error(), HasSubstr("added_tokens_decoder[\"x\"]"));
  WriteFile(dir + "/tokenizer_config.json", R"({"eos_token": "</s>"})");
  WriteFile(dir + "/tokenizer.json", R"({"added_tokens": [{"content": "</s>"}]})");
  EXPECT_THAT(error(), HasSubstr("tokenizer.json: added_tokens[0] must be"));
}

}  // namespace
}  // namespace hybridserve::engine
