#include "engine/qwen3_next_config.h"

#include <cmath>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "engine/config_fields.h"

namespace hybridserve::engine {
namespace {

using config_internal::ConfigFields;
using config_internal::Excerpt;
using config_internal::Json;
using config_internal::TagNonFiniteTokens;

// The same bound as ParseModelConfig's (real configs are a few kB).
constexpr size_t kMaxConfigBytes = 16 << 20;

// transformers 5.23's defaults per language-model config class.
struct TextDefaults {
  int64_t vocab_size;
  int64_t hidden_size;
  int64_t intermediate_size;  // 0: the class has no such field
  int64_t num_hidden_layers;
  int64_t num_attention_heads;
  int64_t num_key_value_heads;
  int64_t num_experts;  // 0: dense
  int64_t num_experts_per_tok;
};

constexpr TextDefaults kQwen3NextDefaults{151936, 2048, 5632, 48, 16, 2, 512, 10};
constexpr TextDefaults kQwen35TextDefaults{248320, 4096, 12288, 32, 16, 4, 0, 0};
constexpr TextDefaults kQwen35MoeTextDefaults{248320, 2048, 0, 40, 16, 2, 256, 8};

absl::Status Invalid(absl::string_view field, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", why));
}

absl::StatusOr<int64_t> Positive(const ConfigFields& f, absl::string_view key, int64_t fallback) {
  ASSIGN_OR_RETURN(int64_t v, f.Int({key}, fallback));
  if (v <= 0) return Invalid(key, absl::StrCat("must be positive, got ", v));
  return v;
}

// The rope fields: rope_parameters (transformers 5) or the legacy top-level
// rope_theta / partial_rotary_factor / rope_scaling; where both name a value
// they must agree.
absl::Status ReadRope(const ConfigFields& f, absl::string_view where, Qwen3NextConfig& c) {
  std::optional<double> theta, factor;
  std::string type = "default";
  if (f.Has("rope_parameters")) {
    const Json& rp = f.Get("rope_parameters");
    if (!rp.is_object()) return Invalid("rope_parameters", absl::StrCat("must be an object, got ", Excerpt(rp)));
    ConfigFields r(rp);
    if (r.Has("rope_theta")) {
      ASSIGN_OR_RETURN(double v, r.Float({"rope_theta"}, 0.0));
      theta = v;
    }
    if (r.Has("partial_rotary_factor")) {
      ASSIGN_OR_RETURN(double v, r.Float({"partial_rotary_factor"}, 0.0));
      factor = v;
    }
    ASSIGN_OR_RETURN(type, r.String({"rope_type", "type"}, "default"));
    for (const char* key : {"mrope_section", "mrope_interleaved"}) {
      if (r.Has(key)) {
        c.ignored.push_back(absl::StrCat(where, "rope_parameters.", key,
                                         ": multimodal RoPE sections; text positions are equal in every "
                                         "section, so it is plain RoPE for text"));
      }
    }
  }
  if (f.Has("rope_scaling")) {
    const Json& rs = f.Get("rope_scaling");
    if (!rs.is_object()) return Invalid("rope_scaling", absl::StrCat("must be an object, got ", Excerpt(rs)));
    ASSIGN_OR_RETURN(std::string legacy, ConfigFields(rs).String({"rope_type", "type"}, "default"));
    if (f.Has("rope_parameters") && legacy != type) {
      return Invalid("rope_scaling", absl::StrCat("type ", legacy, " disagrees with rope_parameters' ", type));
    }
    type = legacy;
  }
  for (auto [key, slot] :
       {std::pair<const char*, std::optional<double>*>{"rope_theta", &theta}, {"partial_rotary_factor", &factor}}) {
    if (!f.Has(key)) continue;
    ASSIGN_OR_RETURN(double v, f.Float({key}, 0.0));
    if (slot->has_value() && **slot != v) {
      return Invalid(key, absl::StrCat(v, " disagrees with rope_parameters.", key, " (", **slot, ")"));
    }
    *slot = v;
  }
  c.rope_theta = theta.value_or(10000.0);
  c.partial_rotary_factor = factor.value_or(0.25);
  c.rope_type = type;
  if (!(c.rope_theta > 0.0) || !std::isfinite(c.rope_theta)) {
    return Invalid("rope_theta", absl::StrCat("must be a positive number, got ", c.rope_theta));
  }
  if (!(c.partial_rotary_factor > 0.0 && c.partial_rotary_factor <= 1.0)) {
    return Invalid("partial_rotary_factor", absl::StrCat("must be in (0, 1], got ", c.partial_rotary_factor));
  }
  return absl::OkStatus();
}

absl::Status ReadLayerPattern(const ConfigFields& f, Qwen3NextConfig& c) {
  if (f.Has("layer_types")) {
    const Json& lt = f.Get("layer_types");
    if (!lt.is_array()) return Invalid("layer_types", absl::StrCat("must be a list, got ", Excerpt(lt)));
    if (static_cast<int64_t>(lt.size()) != c.num_hidden_layers) {
      return Invalid("layer_types",
                     absl::StrCat("has ", lt.size(), " entries but num_hidden_layers is ", c.num_hidden_layers));
    }
    for (size_t i = 0; i < lt.size(); ++i) {
      const std::string field = absl::StrCat("layer_types[", i, "]");
      if (!lt[i].is_string()) return Invalid(field, absl::StrCat("must be a string, got ", Excerpt(lt[i])));
      const std::string kind = lt[i].get<std::string>();
      if (kind == "linear_attention") {
        c.layer_kinds.push_back(QwenLayerKind::kLinearAttention);
      } else if (kind == "full_attention") {
        c.layer_kinds.push_back(QwenLayerKind::kFullAttention);
      } else {
        return Invalid(field,
                       absl::StrCat("unknown layer kind \"", kind, "\" (expected linear_attention or full_attention)"));
      }
    }
    c.layer_types_explicit = true;
    return absl::OkStatus();
  }
  // transformers: layer i is full attention when (i + 1) % interval == 0.
  ASSIGN_OR_RETURN(c.full_attention_interval, Positive(f, "full_attention_interval", 4));
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    c.layer_kinds.push_back((i + 1) % c.full_attention_interval == 0 ? QwenLayerKind::kFullAttention
                                                                     : QwenLayerKind::kLinearAttention);
  }
  return absl::OkStatus();
}

void NoteIgnored(const Json& object, absl::string_view where, std::vector<std::string>& ignored) {
  for (auto it = object.begin(); it != object.end(); ++it) {
    const std::string& key = it.key();
    const std::string name = absl::StrCat(where, key);
    if (key == "vision_config") {
      ignored.push_back(absl::StrCat(name, ": the vision tower; image and video inputs are not served"));
    } else if (key == "image_token_id" || key == "video_token_id" || key == "vision_start_token_id" ||
               key == "vision_end_token_id") {
      ignored.push_back(absl::StrCat(name, ": a vision token; image and video inputs are not served"));
    } else if (absl::StartsWith(key, "mtp_")) {
      ignored.push_back(absl::StrCat(name,
                                     ": the multi-token-prediction head is not run; its mtp.* tensors are "
                                     "skipped"));
    } else if (key == "attn_output_gate") {
      ignored.push_back(absl::StrCat(name,
                                     ": not read by transformers 5.23, which always gates the attention "
                                     "output"));
    }
  }
}

absl::StatusOr<Qwen3NextConfig> ParseText(const Json& root, const Json& text, Qwen3NextConfig c) {
  ConfigFields f(text);
  const absl::string_view where = &text == &root ? "" : "text_config.";
  const TextDefaults& d = c.text_model_type == "qwen3_next"     ? kQwen3NextDefaults
                          : c.text_model_type == "qwen3_5_text" ? kQwen35TextDefaults
                                                                : kQwen35MoeTextDefaults;
  ASSIGN_OR_RETURN(std::string act, f.String({"hidden_act"}, "silu"));
  if (act != "silu") return Invalid("hidden_act", absl::StrCat("must be silu, got ", act));
  ASSIGN_OR_RETURN(c.hidden_size, Positive(f, "hidden_size", d.hidden_size));
  ASSIGN_OR_RETURN(c.vocab_size, Positive(f, "vocab_size", d.vocab_size));
  ASSIGN_OR_RETURN(c.num_hidden_layers, Positive(f, "num_hidden_layers", d.num_hidden_layers));
  RETURN_IF_ERROR(ReadLayerPattern(f, c));

  ASSIGN_OR_RETURN(c.linear_num_key_heads, Positive(f, "linear_num_key_heads", 16));
  ASSIGN_OR_RETURN(c.linear_num_value_heads, Positive(f, "linear_num_value_heads", 32));
  ASSIGN_OR_RETURN(c.linear_key_head_dim, Positive(f, "linear_key_head_dim", 128));
  ASSIGN_OR_RETURN(c.linear_value_head_dim, Positive(f, "linear_value_head_dim", 128));
  ASSIGN_OR_RETURN(c.linear_conv_kernel_dim, Positive(f, "linear_conv_kernel_dim", 4));
  if (c.linear_num_value_heads % c.linear_num_key_heads != 0) {
    return Invalid("linear_num_value_heads",
                   absl::StrCat("(", c.linear_num_value_heads, ") must be a multiple of linear_num_key_heads (",
                                c.linear_num_key_heads, ")"));
  }

  ASSIGN_OR_RETURN(c.num_attention_heads, Positive(f, "num_attention_heads", d.num_attention_heads));
  ASSIGN_OR_RETURN(c.num_key_value_heads, Positive(f, "num_key_value_heads", d.num_key_value_heads));
  ASSIGN_OR_RETURN(c.head_dim, Positive(f, "head_dim", 256));
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return Invalid("num_attention_heads",
                   absl::StrCat("(", c.num_attention_heads, ") must be a multiple of num_key_value_heads (",
                                c.num_key_value_heads, ")"));
  }
  RETURN_IF_ERROR(ReadRope(f, where, c));
  const double rotary = c.partial_rotary_factor * static_cast<double>(c.head_dim);
  if (rotary != std::floor(rotary) || static_cast<int64_t>(rotary) % 2 != 0) {
    return Invalid("partial_rotary_factor", absl::StrCat("(", c.partial_rotary_factor, ") times head_dim (", c.head_dim,
                                                         ") must be an even integer"));
  }
  ASSIGN_OR_RETURN(c.rms_norm_eps, f.Float({"rms_norm_eps"}, 1e-6));
  if (!(c.rms_norm_eps > 0.0) || !std::isfinite(c.rms_norm_eps)) {
    return Invalid("rms_norm_eps", absl::StrCat("must be a positive number, got ", c.rms_norm_eps));
  }
  ASSIGN_OR_RETURN(c.attention_bias, f.Bool({"attention_bias"}, false));

  c.is_moe = c.text_model_type != "qwen3_5_text";
  if (d.intermediate_size > 0) {
    ASSIGN_OR_RETURN(c.intermediate_size, Positive(f, "intermediate_size", d.intermediate_size));
  }
  if (c.is_moe) {
    ASSIGN_OR_RETURN(c.num_experts, f.Int({"num_experts"}, d.num_experts));
    if (c.num_experts < 0) return Invalid("num_experts", absl::StrCat("must not be negative, got ", c.num_experts));
    if (c.text_model_type == "qwen3_5_moe_text" && c.num_experts == 0) {
      return Invalid("num_experts", "must be positive: every qwen3_5_moe layer is a sparse MoE block");
    }
    ASSIGN_OR_RETURN(c.num_experts_per_tok, Positive(f, "num_experts_per_tok", d.num_experts_per_tok));
    if (c.num_experts > 0 && c.num_experts_per_tok > c.num_experts) {
      return Invalid("num_experts_per_tok",
                     absl::StrCat("(", c.num_experts_per_tok, ") exceeds num_experts (", c.num_experts, ")"));
    }
    ASSIGN_OR_RETURN(c.moe_intermediate_size, Positive(f, "moe_intermediate_size", 512));
    ASSIGN_OR_RETURN(c.shared_expert_intermediate_size, f.Int({"shared_expert_intermediate_size"}, 512));
    if (c.shared_expert_intermediate_size < 0) {
      return Invalid("shared_expert_intermediate_size",
                     absl::StrCat("must not be negative, got ", c.shared_expert_intermediate_size));
    }
  }
  if (c.text_model_type == "qwen3_next") {
    ASSIGN_OR_RETURN(c.norm_topk_prob, f.Bool({"norm_topk_prob"}, true));
    ASSIGN_OR_RETURN(c.decoder_sparse_step, Positive(f, "decoder_sparse_step", 1));
    if (f.Has("mlp_only_layers")) {
      const Json& m = f.Get("mlp_only_layers");
      if (!m.is_array()) return Invalid("mlp_only_layers", absl::StrCat("must be a list, got ", Excerpt(m)));
      std::set<int64_t> seen;
      for (size_t i = 0; i < m.size(); ++i) {
        const std::string field = absl::StrCat("mlp_only_layers[", i, "]");
        ASSIGN_OR_RETURN(int64_t layer, ConfigFields::ToInt(field, m[i]));
        if (layer < 0 || layer >= c.num_hidden_layers) {
          return Invalid(field, absl::StrCat("layer ", layer, " is outside [0, ", c.num_hidden_layers, ")"));
        }
        if (!seen.insert(layer).second) return Invalid(field, absl::StrCat("layer ", layer, " is listed twice"));
        c.mlp_only_layers.push_back(layer);
      }
    }
  }
  // Fields of other Qwen configs that this model_type's transformers class
  // does not read (a qwen3_5_moe layer is always sparse and renormalises).
  std::vector<const char*> unread;
  if (c.text_model_type == "qwen3_5_moe_text") {
    unread = {"intermediate_size", "mlp_only_layers", "decoder_sparse_step", "norm_topk_prob"};
  } else if (c.text_model_type == "qwen3_5_text") {
    unread = {"num_experts",     "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size",
              "mlp_only_layers", "decoder_sparse_step", "norm_topk_prob"};
  }
  for (const char* key : unread) {
    if (text.contains(key)) {
      c.ignored.push_back(
          absl::StrCat(where, key, ": not read by transformers 5.23 for ", c.text_model_type, " (every layer ",
                       c.is_moe ? "is a sparse MoE block with renormalised top-k weights)" : "is a dense MLP)"));
    }
  }
  NoteIgnored(text, where, c.ignored);
  if (&text != &root) NoteIgnored(root, "", c.ignored);
  return c;
}

}  // namespace

absl::string_view QwenLayerKindName(QwenLayerKind kind) {
  return kind == QwenLayerKind::kFullAttention ? "full_attention" : "linear_attention";
}

bool Qwen3NextConfig::LayerIsMoe(int64_t i) const {
  if (!is_moe || num_experts == 0) return false;
  for (int64_t layer : mlp_only_layers) {
    if (layer == i) return false;
  }
  return (i + 1) % decoder_sparse_step == 0;
}

absl::StatusOr<Qwen3NextConfig> ParseQwen3NextConfig(absl::string_view json_text) {
  if (json_text.size() > kMaxConfigBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.json is ", json_text.size(), " bytes, over the limit of ", kMaxConfigBytes));
  }
  Json root;
  try {
    root = Json::parse(TagNonFiniteTokens(json_text));
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("config.json is not valid JSON: ", e.what()));
  }
  if (!root.is_object()) return absl::InvalidArgumentError("config.json must be a JSON object");
  ConfigFields top(root);
  if (!top.Has("model_type")) return absl::InvalidArgumentError("model_type is required but missing");
  ASSIGN_OR_RETURN(std::string model_type, top.String({"model_type"}, ""));
  Qwen3NextConfig c;
  c.model_type = model_type;
  c.tensor_prefix = "model.";
  if (model_type == "qwen3_next" || model_type == "qwen3_5_text" || model_type == "qwen3_5_moe_text") {
    c.text_model_type = model_type;
    ASSIGN_OR_RETURN(c.tie_word_embeddings, top.Bool({"tie_word_embeddings"}, false));
    return ParseText(root, root, std::move(c));
  }
  if (model_type != "qwen3_5" && model_type != "qwen3_5_moe") {
    return Invalid("model_type", absl::StrCat("\"", model_type,
                                              "\" is not qwen3_next, qwen3_5, qwen3_5_moe, qwen3_5_text or "
                                              "qwen3_5_moe_text"));
  }
  c.text_model_type = model_type + "_text";
  c.tensor_prefix = "model.language_model.";
  // The image-text forms tie by the top-level field (transformers 5.23).
  ASSIGN_OR_RETURN(c.tie_word_embeddings, top.Bool({"tie_word_embeddings"}, false));
  static const Json kEmpty = Json::object();
  const Json* text = &kEmpty;
  if (top.Has("text_config")) {
    text = &top.Get("text_config");
    if (!text->is_object()) {
      return Invalid("text_config", absl::StrCat("must be an object, got ", Excerpt(*text)));
    }
    ConfigFields tf(*text);
    ASSIGN_OR_RETURN(std::string inner, tf.String({"model_type"}, c.text_model_type));
    if (inner != c.text_model_type) {
      return Invalid("text_config.model_type", absl::StrCat("\"", inner, "\" does not match model_type ", model_type,
                                                            " (expected ", c.text_model_type, ")"));
    }
  }
  auto parsed = ParseText(root, *text, std::move(c));
  if (!parsed.ok() && top.Has("text_config")) {
    return absl::Status(parsed.status().code(), absl::StrCat("text_config.", parsed.status().message()));
  }
  return parsed;
}

std::vector<QwenTensorSpec> QwenLanguageModelTensors(const Qwen3NextConfig& c, QwenExpertLayout experts) {
  std::vector<QwenTensorSpec> out;
  const int64_t h = c.hidden_size;
  auto add = [&](std::string name, std::vector<int64_t> shape) {
    out.push_back({absl::StrCat(c.tensor_prefix, name), std::move(shape)});
  };
  add("embed_tokens.weight", {c.vocab_size, h});
  const int64_t key_dim = c.linear_num_key_heads * c.linear_key_head_dim;
  const int64_t value_dim = c.linear_num_value_heads * c.linear_value_head_dim;
  const int64_t nv = c.linear_num_value_heads;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string l = absl::StrCat("layers.", i, ".");
    if (c.layer_kinds[i] == QwenLayerKind::kLinearAttention) {
      const std::string a = l + "linear_attn.";
      add(a + "conv1d.weight", {2 * key_dim + value_dim, 1, c.linear_conv_kernel_dim});
      if (c.text_model_type == "qwen3_next") {
        add(a + "in_proj_qkvz.weight", {2 * key_dim + 2 * value_dim, h});
        add(a + "in_proj_ba.weight", {2 * nv, h});
      } else {
        add(a + "in_proj_qkv.weight", {2 * key_dim + value_dim, h});
        add(a + "in_proj_z.weight", {value_dim, h});
        add(a + "in_proj_b.weight", {nv, h});
        add(a + "in_proj_a.weight", {nv, h});
      }
      add(a + "dt_bias", {nv});
      add(a + "A_log", {nv});
      add(a + "norm.weight", {c.linear_value_head_dim});
      add(a + "out_proj.weight", {h, value_dim});
    } else {
      const std::string a = l + "self_attn.";
      const int64_t q = c.num_attention_heads * c.head_dim;
      const int64_t kv = c.num_key_value_heads * c.head_dim;
      add(a + "q_proj.weight", {2 * q, h});  // the output gate's rows follow each head's query
      add(a + "k_proj.weight", {kv, h});
      add(a + "v_proj.weight", {kv, h});
      add(a + "o_proj.weight", {h, q});
      if (c.attention_bias) {
        add(a + "q_proj.bias", {2 * q});
        add(a + "k_proj.bias", {kv});
        add(a + "v_proj.bias", {kv});
        add(a + "o_proj.bias", {h});
      }
      add(a + "q_norm.weight", {c.head_dim});
      add(a + "k_norm.weight", {c.head_dim});
    }
    if (c.LayerIsMoe(i)) {
      const int64_t e = c.num_experts;
      const int64_t m = c.moe_intermediate_size;
      const int64_t s = c.shared_expert_intermediate_size;
      add(l + "mlp.gate.weight", {e, h});
      if (experts == QwenExpertLayout::kFused) {
        add(l + "mlp.experts.gate_up_proj", {e, 2 * m, h});
        add(l + "mlp.experts.down_proj", {e, h, m});
      } else {
        for (int64_t x = 0; x < e; ++x) {
          const std::string ex = absl::StrCat(l, "mlp.experts.", x, ".");
          add(ex + "gate_proj.weight", {m, h});
          add(ex + "up_proj.weight", {m, h});
          add(ex + "down_proj.weight", {h, m});
        }
      }
      add(l + "mlp.shared_expert.gate_proj.weight", {s, h});
      add(l + "mlp.shared_expert.up_proj.weight", {s, h});
      add(l + "mlp.shared_expert.down_proj.weight", {h, s});
      add(l + "mlp.shared_expert_gate.weight", {1, h});
    } else {
      add(l + "mlp.gate_proj.weight", {c.intermediate_size, h});
      add(l + "mlp.up_proj.weight", {c.intermediate_size, h});
      add(l + "mlp.down_proj.weight", {h, c.intermediate_size});
    }
    add(l + "input_layernorm.weight", {h});
    add(l + "post_attention_layernorm.weight", {h});
  }
  add("norm.weight", {h});
  if (!c.tie_word_embeddings) out.push_back({"lm_head.weight", {c.vocab_size, h}});
  return out;
}

}  // namespace hybridserve::engine
