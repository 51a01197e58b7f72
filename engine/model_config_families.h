#ifndef HYBRIDSERVE_ENGINE_MODEL_CONFIG_FAMILIES_H_
#define HYBRIDSERVE_ENGINE_MODEL_CONFIG_FAMILIES_H_

// Internal to model_config: the parser of each family
// (model_config_families.cc) and the helpers the files of model_config share
// (model_config.cc parses the common fields and dispatches on model_type;
// model_config_validate.cc checks the result). Semantics and error rules:
// model_config.h.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/config_fields.h"
#include "engine/model_config.h"

namespace hybridserve::engine::config_internal {

// Upper bound of every dimension and of derived widths (d_inner, conv_dim,
// in_proj rows, q/kv widths): keeps every matrix size far from int64 overflow.
inline constexpr int64_t kMaxDim = int64_t{1} << 24;
inline constexpr int64_t kMaxLayers = 4096;
// transformers' defaults for fields the parsers treat as optional.
inline constexpr int64_t kDefaultConvKernel = 4;
inline constexpr int64_t kDefaultMamba2Chunk = 256;
inline constexpr int64_t kDefaultMamba2Expand = 2;

// INVALID_ARGUMENT naming `name` unless 1 <= value <= kMaxDim.
absl::Status CheckDim(absl::string_view name, int64_t value);
// One LayerKindSymbol per layer ("M*M-").
std::string PatternOf(const std::vector<LayerKind>& layers);
// A layers_block_type / layer_types entry: mamba|linear_attention,
// attention|full_attention, mlp, moe.
absl::StatusOr<LayerKind> KindFromBlockType(const Json& v, size_t index);
// UNIMPLEMENTED unless `key` is silu (or swish; absent means silu).
absl::Status CheckSiluActivation(const ConfigFields& f, absl::string_view key);

// model_type "nemotron_h", "mamba2", "bamba", "granitemoehybrid", "falcon_h1",
// "zamba2": fill `c` (whose common fields ParseCommon has set).
absl::Status ParseNemotronH(const ConfigFields& f, ModelConfig& c);
absl::Status ParseMamba2(const ConfigFields& f, ModelConfig& c);
absl::Status ParseBamba(const ConfigFields& f, ModelConfig& c);
absl::Status ParseGraniteMoeHybrid(const ConfigFields& f, ModelConfig& c);
absl::Status ParseFalconH1(const ConfigFields& f, ModelConfig& c);
absl::Status ParseZamba2(const ConfigFields& f, ModelConfig& c);

// model_type "qwen3_next", "qwen3_5", "qwen3_5_moe", "qwen3_5_text",
// "qwen3_5_moe_text" (model_config_qwen.cc): the whole of `c`, common fields
// included (the image-text forms keep them in text_config), from the file's
// text and its parsed root.
bool IsQwenModelType(absl::string_view model_type);
absl::Status ParseQwen(absl::string_view json_text, const Json& root, ModelConfig& c);

}  // namespace hybridserve::engine::config_internal

#endif  // HYBRIDSERVE_ENGINE_MODEL_CONFIG_FAMILIES_H_
