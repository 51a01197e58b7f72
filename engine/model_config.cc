// ModelConfig: reading config.json, its common fields and the dispatch on
// model_type, the names of families and kinds. The families' parsers are in
// model_config_families.cc, Validate in model_config_validate.cc,
// CanonicalString in model_config_canonical.cc.

#include "engine/model_config.h"

#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "engine/config_fields.h"
#include "engine/model_config_families.h"

namespace hybridserve::engine {
namespace config_internal {

std::string PatternOf(const std::vector<LayerKind>& layers) {
  std::string pattern;
  for (LayerKind kind : layers) pattern.push_back(LayerKindSymbol(kind));
  return pattern;
}

}  // namespace config_internal

namespace {

using config_internal::ConfigFields;
using config_internal::Json;
using config_internal::TagNonFiniteTokens;

constexpr size_t kMaxConfigBytes = 16 << 20;

// transformers' default for a field this parser treats as optional.
constexpr double kDefaultNormEps = 1e-5;

absl::Status WithPrefix(const absl::Status& s, absl::string_view prefix) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(prefix, s.message()));
}

absl::Status ParseCommon(const ConfigFields& f, ModelConfig& c) {
  ASSIGN_OR_RETURN(c.vocab_size, f.Int({"vocab_size"}, std::nullopt));
  ASSIGN_OR_RETURN(c.hidden_size, f.Int({"hidden_size"}, std::nullopt));
  ASSIGN_OR_RETURN(double eps, f.Float({"layer_norm_epsilon", "rms_norm_eps"}, kDefaultNormEps));
  c.norm_eps = static_cast<float>(eps);
  ASSIGN_OR_RETURN(c.tie_word_embeddings, f.Bool({"tie_word_embeddings"}, false));
  ASSIGN_OR_RETURN(c.eos_token_ids, f.TokenIds("eos_token_id"));
  ASSIGN_OR_RETURN(c.bos_token_ids, f.TokenIds("bos_token_id"));
  ASSIGN_OR_RETURN(c.pad_token_ids, f.TokenIds("pad_token_id"));
  ASSIGN_OR_RETURN(c.max_position_embeddings, f.Int({"max_position_embeddings"}, 0));
  ASSIGN_OR_RETURN(c.dtype, f.String({"dtype", "torch_dtype"}, ""));
  ASSIGN_OR_RETURN(c.name_or_path, f.String({"_name_or_path"}, ""));
  return absl::OkStatus();
}

}  // namespace

absl::string_view ModelFamilyName(ModelFamily family) {
  switch (family) {
    case ModelFamily::kNemotronH:
      return "nemotron_h";
    case ModelFamily::kMamba2:
      return "mamba2";
    case ModelFamily::kBamba:
      return "bamba";
    case ModelFamily::kGraniteMoeHybrid:
      return "granitemoehybrid";
    case ModelFamily::kFalconH1:
      return "falcon_h1";
    case ModelFamily::kZamba2:
      return "zamba2";
    case ModelFamily::kQwen3Next:
      return "qwen3_next";
    case ModelFamily::kQwen3_5:
      return "qwen3_5";
    case ModelFamily::kQwen3_5Moe:
      return "qwen3_5_moe";
  }
  return "unknown";
}

absl::string_view LayerKindName(LayerKind kind) {
  switch (kind) {
    case LayerKind::kMamba2:
      return "mamba2";
    case LayerKind::kAttention:
      return "attention";
    case LayerKind::kMlp:
      return "mlp";
    case LayerKind::kGatedMlp:
      return "gated_mlp";
    case LayerKind::kMoe:
      return "moe";
    case LayerKind::kParallel:
      return "parallel";
    case LayerKind::kZambaHybrid:
      return "zamba_hybrid";
    case LayerKind::kGatedDeltaNet:
      return "gated_deltanet";
  }
  return "unknown";
}

char LayerKindSymbol(LayerKind kind) {
  switch (kind) {
    case LayerKind::kMamba2:
      return 'M';
    case LayerKind::kAttention:
      return '*';
    case LayerKind::kMlp:
      return '-';
    case LayerKind::kGatedMlp:
      return 'G';
    case LayerKind::kMoe:
      return 'E';
    case LayerKind::kParallel:
      return 'P';
    case LayerKind::kZambaHybrid:
      return 'Z';
    case LayerKind::kGatedDeltaNet:
      return 'D';
  }
  return '?';
}

int64_t ModelConfig::CountLayers(LayerKind kind) const {
  int64_t n = 0;
  for (LayerKind k : layers) n += k == kind ? 1 : 0;
  return n;
}

std::string ModelConfig::LayerPattern() const { return config_internal::PatternOf(layers); }

absl::StatusOr<ModelConfig> ParseModelConfig(absl::string_view json_text) {
  if (json_text.size() > kMaxConfigBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.json is ", json_text.size(), " bytes, over the limit of ", kMaxConfigBytes));
  }
  Json root;
  // nlohmann reports malformed input by exception; this is the boundary that
  // turns it into a Status.
  try {
    root = Json::parse(TagNonFiniteTokens(json_text));
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("config.json is not valid JSON: ", e.what()));
  }
  if (!root.is_object()) return absl::InvalidArgumentError("config.json must hold a JSON object");
  ConfigFields fields(root);
  ModelConfig config;
  absl::Status status;
  try {
    ASSIGN_OR_RETURN(std::string model_type, fields.String({"model_type"}, ""));
    if (model_type.empty()) return absl::InvalidArgumentError("model_type is required but missing");
    if (config_internal::IsQwenModelType(model_type)) {
      RETURN_IF_ERROR(config_internal::ParseQwen(json_text, root, config));
      RETURN_IF_ERROR(config.Validate());
      return config;
    }
    RETURN_IF_ERROR(ParseCommon(fields, config));
    if (model_type == "nemotron_h") {
      status = config_internal::ParseNemotronH(fields, config);
    } else if (model_type == "mamba2") {
      status = config_internal::ParseMamba2(fields, config);
    } else if (model_type == "bamba") {
      status = config_internal::ParseBamba(fields, config);
    } else if (model_type == "granitemoehybrid") {
      status = config_internal::ParseGraniteMoeHybrid(fields, config);
    } else if (model_type == "falcon_h1") {
      status = config_internal::ParseFalconH1(fields, config);
    } else if (model_type == "zamba2") {
      status = config_internal::ParseZamba2(fields, config);
    } else {
      return absl::UnimplementedError(absl::StrCat(
          "model_type \"", model_type,
          "\" is not supported (nemotron_h, mamba2, bamba, granitemoehybrid, falcon_h1, zamba2, qwen3_next, "
          "qwen3_5, qwen3_5_moe, qwen3_5_text, qwen3_5_moe_text)"));
    }
  } catch (const Json::exception& e) {
    // Every access above is type-checked first; this only guards the boundary.
    return absl::InvalidArgumentError(absl::StrCat("config.json: ", e.what()));
  }
  RETURN_IF_ERROR(status);
  RETURN_IF_ERROR(config.Validate());
  return config;
}

absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("cannot read ", path));
  absl::StatusOr<ModelConfig> config = ParseModelConfig(text.str());
  if (!config.ok()) return WithPrefix(config.status(), absl::StrCat(path, ": "));
  return config;
}

}  // namespace hybridserve::engine
