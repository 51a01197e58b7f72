#include "engine/model_weights.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/hash.h"
#include "common/status_macros.h"
#include "kernels/bf16.h"

namespace hybridserve::engine {
namespace {

constexpr const char* kPrefixes[] = {"backbone.", "model.", "model.language_model."};
constexpr const char* kEmbeddingNames[] = {"embeddings.weight", "embedding.weight", "embed_tokens.weight"};
constexpr const char* kHeadName = "lm_head.weight";
constexpr size_t kListedUnexpected = 5;

std::string ShapeString(absl::Span<const int64_t> shape) { return absl::StrCat("[", absl::StrJoin(shape, ", "), "]"); }

}  // namespace

std::vector<float> WeightMatrix::ToFloat32() const {
  if (!is_bf16()) return f32;
  std::vector<float> out(bf16.size());
  for (size_t i = 0; i < bf16.size(); ++i) out[i] = kernels::Bf16ToFloat(bf16[i]);
  return out;
}

// Fills a ModelWeights from a checkpoint, tracking which tensors were used.
class ModelWeights::Loader {
 public:
  Loader(const SafetensorsCheckpoint& checkpoint, ModelWeights& out)
      : checkpoint_(checkpoint), out_(out), config_(out.config_) {}

  absl::Status Run() {
    RETURN_IF_ERROR(DetectPrefix());
    if (config_.family == ModelFamily::kZamba2) RETURN_IF_ERROR(PrepareZamba());
    const int64_t hidden = config_.hidden_size;
    const int64_t vocab = config_.vocab_size;
    RETURN_IF_ERROR(Take(prefix_ + embedding_name_, "embeddings.weight", {vocab, hidden}, out_.embeddings_));
    out_.layers_.resize(config_.layers.size());
    for (size_t i = 0; i < config_.layers.size(); ++i) {
      LayerWeights& layer = out_.layers_[i];
      layer.kind = config_.layers[i];
      const BlockNames names = NamesOf(i);
      if (!names.norm.empty()) RETURN_IF_ERROR(TakeBody(names.norm, {hidden}, layer.norm));
      ZeroCentred(layer.norm);
      const std::string& mixer = names.body;
      switch (layer.kind) {
        case LayerKind::kMamba2:
          RETURN_IF_ERROR(LoadMamba2(mixer, layer.mixer.emplace<Mamba2LayerWeights>()));
          break;
        case LayerKind::kAttention:
          RETURN_IF_ERROR(LoadAttention(mixer, layer.mixer.emplace<AttentionLayerWeights>()));
          break;
        case LayerKind::kGatedDeltaNet:
          RETURN_IF_ERROR(LoadGatedDeltaNet(mixer, layer.mixer.emplace<GatedDeltaNetLayerWeights>()));
          break;
        case LayerKind::kMlp:
          RETURN_IF_ERROR(LoadMlp(mixer, layer.mixer.emplace<MlpLayerWeights>()));
          break;
        case LayerKind::kGatedMlp:
          RETURN_IF_ERROR(LoadGatedMlp(mixer, config_.gated_mlp.intermediate_size, config_.gated_mlp.use_bias,
                                       layer.mixer.emplace<GatedMlpLayerWeights>()));
          break;
        case LayerKind::kMoe:
          RETURN_IF_ERROR(LoadMoe(mixer, layer.mixer.emplace<MoeLayerWeights>()));
          break;
        case LayerKind::kZambaHybrid:
          RETURN_IF_ERROR(LoadZambaHybrid(i, layer.mixer.emplace<ZambaHybridLayerWeights>()));
          break;
        case LayerKind::kParallel: {
          ParallelLayerWeights& w = layer.mixer.emplace<ParallelLayerWeights>();
          RETURN_IF_ERROR(LoadMamba2(mixer + "mamba.", w.mamba));
          RETURN_IF_ERROR(LoadAttention(mixer + "self_attn.", w.attention));
          break;
        }
      }
    }
    RETURN_IF_ERROR(TakeBody(FinalNormName(), {hidden}, out_.norm_f_));
    ZeroCentred(out_.norm_f_);
    RETURN_IF_ERROR(LoadHead());
    RETURN_IF_ERROR(CheckNoUnexpected());
    out_.fingerprint_ = Fingerprint();
    return absl::OkStatus();
  }

 private:
  // Where block i's tensors live: its norm, and the prefix of its body.
  struct BlockNames {
    std::string norm;
    std::string body;
  };

  bool decoder_layers() const {
    return config_.family == ModelFamily::kBamba || config_.family == ModelFamily::kGraniteMoeHybrid ||
           config_.family == ModelFamily::kFalconH1 || config_.IsQwenFamily();
  }

  // Qwen's RMSNorms compute x * (1 + w) (Qwen3NextRMSNorm: `1.0 + self.weight.float()`,
  // an fp32 sum); the weight is held as that sum. No-op for other families.
  void ZeroCentred(std::vector<float>& w) const {
    if (!config_.IsQwenFamily()) return;
    for (float& v : w) v = 1.0f + v;
  }

  BlockNames NamesOf(size_t i) const {
    if (config_.family == ModelFamily::kZamba2) {
      const std::string base = absl::StrCat("layers.", i, ".");
      if (config_.layers[i] == LayerKind::kZambaHybrid) return {"", base};  // norms inside (LoadZambaHybrid)
      return {base + "input_layernorm.weight", base + "mamba."};
    }
    if (!decoder_layers()) {
      const std::string base = absl::StrCat("layers.", i, ".");
      return {base + "norm.weight", base + "mixer."};
    }
    const std::string base = absl::StrCat("layers.", i / 2, ".");
    if (config_.IsQwenFamily()) {
      if (i % 2 != 0) return {base + "post_attention_layernorm.weight", base + "mlp."};
      return {base + "input_layernorm.weight",
              base + (config_.layers[i] == LayerKind::kAttention ? "self_attn." : "linear_attn.")};
    }
    if (i % 2 == 0 && config_.layers[i] == LayerKind::kParallel) return {base + "input_layernorm.weight", base};
    if (i % 2 == 0) {
      return {base + "input_layernorm.weight",
              base + (config_.layers[i] == LayerKind::kAttention ? "self_attn." : "mamba.")};
    }
    if (config_.family != ModelFamily::kGraniteMoeHybrid) {
      return {base + "pre_ff_layernorm.weight", base + "feed_forward."};
    }
    return {base + "post_attention_layernorm.weight", base};
  }

  std::string FinalNormName() const {
    switch (config_.family) {
      case ModelFamily::kBamba:
      case ModelFamily::kFalconH1:
      case ModelFamily::kZamba2:
        return "final_layernorm.weight";
      case ModelFamily::kGraniteMoeHybrid:
      case ModelFamily::kQwen3Next:
      case ModelFamily::kQwen3_5:
      case ModelFamily::kQwen3_5Moe:
        return "norm.weight";
      default:
        return "norm_f.weight";
    }
  }

  struct Used {
    std::string canonical;  // name without the body prefix
    TensorView view;
  };

  absl::Status DetectPrefix() {
    std::vector<std::pair<std::string, std::string>> found;  // (prefix, embedding name)
    for (const char* prefix : kPrefixes) {
      for (const char* name : kEmbeddingNames) {
        if (checkpoint_.Contains(absl::StrCat(prefix, name))) found.emplace_back(prefix, name);
      }
    }
    if (found.empty()) {
      return absl::InvalidArgumentError(
          "missing tensor backbone.embeddings.weight (also looked for model.embeddings.weight and "
          "backbone.embedding.weight)");
    }
    if (found.size() > 1) {
      return absl::InvalidArgumentError(absl::StrCat("ambiguous embeddings: both ", found[0].first, found[0].second,
                                                     " and ", found[1].first, found[1].second));
    }
    prefix_ = found[0].first;
    embedding_name_ = found[0].second;
    return absl::OkStatus();
  }

  template <typename Dst>
  absl::Status TakeBody(const std::string& name, std::vector<int64_t> shape, Dst& dst) {
    return Take(prefix_ + name, name, std::move(shape), dst);
  }

  // Optional bias: loaded when `present`, otherwise left empty (and, if the
  // file has it anyway, reported as unexpected).
  absl::Status TakeBodyIf(bool present, const std::string& name, std::vector<int64_t> shape, std::vector<float>& dst) {
    if (!present) return absl::OkStatus();
    return TakeBody(name, std::move(shape), dst);
  }

  // A vector: always fp32.
  absl::Status Take(const std::string& full_name, const std::string& canonical, std::vector<int64_t> shape,
                    std::vector<float>& dst) {
    ASSIGN_OR_RETURN(TensorView view, Find(full_name, canonical, std::move(shape)));
    ASSIGN_OR_RETURN(dst, ToFloat32(view));
    out_.resident_bytes_ += static_cast<int64_t>(dst.size() * sizeof(float));
    return absl::OkStatus();
  }

  // A matrix: bf16 stays bf16 (bit patterns copied as stored), anything else
  // becomes fp32.
  absl::Status Take(const std::string& full_name, const std::string& canonical, std::vector<int64_t> shape,
                    WeightMatrix& dst) {
    ASSIGN_OR_RETURN(TensorView view, Find(full_name, canonical, std::move(shape)));
    dst = WeightMatrix();
    if (view.dtype == DType::kBF16) {
      dst.bf16.resize(static_cast<size_t>(view.num_elements()));
      std::memcpy(dst.bf16.data(), view.bytes.data(), dst.bf16.size() * sizeof(uint16_t));
      out_.has_bf16_ = true;
    } else {
      ASSIGN_OR_RETURN(dst.f32, ToFloat32(view));
    }
    out_.resident_bytes_ += dst.bytes();
    return absl::OkStatus();
  }

  // The view of a tensor of the expected shape, recorded as used.
  absl::StatusOr<TensorView> Find(const std::string& full_name, const std::string& canonical,
                                  std::vector<int64_t> shape) {
    const TensorInfo* info = checkpoint_.Find(full_name);
    if (info == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("missing tensor ", full_name, " (expected shape ", ShapeString(shape), ")"));
    }
    if (info->shape != shape) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", full_name, " has shape ", ShapeString(info->shape),
                                                     ", expected ", ShapeString(shape)));
    }
    ASSIGN_OR_RETURN(TensorView view, checkpoint_.Tensor(full_name));
    consumed_.insert(full_name);
    if (recorded_.insert(canonical).second) {  // Zamba2's blocks may load one tensor twice
      used_.push_back(Used{canonical, view});
      out_.num_parameters_ += view.num_elements();
    }
    return view;
  }

  absl::Status LoadMamba2(const std::string& p, Mamba2LayerWeights& w) {
    const Mamba2Params& m = config_.mamba;
    const int64_t hidden = config_.hidden_size;
    RETURN_IF_ERROR(TakeBody(p + "in_proj.weight", {m.in_proj_rows(), hidden}, w.in_proj));
    RETURN_IF_ERROR(TakeBodyIf(m.use_in_proj_bias, p + "in_proj.bias", {m.in_proj_rows()}, w.in_proj_bias));
    RETURN_IF_ERROR(TakeBody(p + "conv1d.weight", {m.conv_dim(), 1, m.conv_kernel}, w.conv1d_weight));
    RETURN_IF_ERROR(TakeBodyIf(m.use_conv_bias, p + "conv1d.bias", {m.conv_dim()}, w.conv1d_bias));
    RETURN_IF_ERROR(TakeBody(p + "dt_bias", {m.num_heads}, w.dt_bias));
    RETURN_IF_ERROR(TakeBody(p + "A_log", {m.num_heads}, w.A_log));
    RETURN_IF_ERROR(TakeBody(p + "D", {m.num_heads}, w.D));
    RETURN_IF_ERROR(TakeBodyIf(m.gated_norm, p + "norm.weight", {m.d_inner()}, w.norm));
    RETURN_IF_ERROR(TakeBody(p + "out_proj.weight", {hidden, m.d_inner()}, w.out_proj));
    RETURN_IF_ERROR(TakeBodyIf(m.use_out_proj_bias, p + "out_proj.bias", {hidden}, w.out_proj_bias));
    return absl::OkStatus();
  }

  absl::Status LoadAttention(const std::string& p, AttentionLayerWeights& w) {
    const AttentionParams& a = config_.attention;
    const int64_t hidden = config_.hidden_size;
    if (a.output_gate) {
      RETURN_IF_ERROR(LoadGatedQuery(p, w));
    } else {
      RETURN_IF_ERROR(TakeBody(p + "q_proj.weight", {a.q_dim(), hidden}, w.q_proj));
      RETURN_IF_ERROR(TakeBodyIf(a.use_bias, p + "q_proj.bias", {a.q_dim()}, w.q_proj_bias));
    }
    if (a.qk_norm) {
      RETURN_IF_ERROR(TakeBody(p + "q_norm.weight", {a.head_dim}, w.q_norm));
      RETURN_IF_ERROR(TakeBody(p + "k_norm.weight", {a.head_dim}, w.k_norm));
      ZeroCentred(w.q_norm);
      ZeroCentred(w.k_norm);
    }
    RETURN_IF_ERROR(TakeBody(p + "k_proj.weight", {a.kv_dim(), hidden}, w.k_proj));
    RETURN_IF_ERROR(TakeBody(p + "v_proj.weight", {a.kv_dim(), hidden}, w.v_proj));
    RETURN_IF_ERROR(TakeBody(p + "o_proj.weight", {hidden, a.q_dim()}, w.o_proj));
    RETURN_IF_ERROR(TakeBodyIf(a.use_bias, p + "k_proj.bias", {a.kv_dim()}, w.k_proj_bias));
    RETURN_IF_ERROR(TakeBodyIf(a.use_bias, p + "v_proj.bias", {a.kv_dim()}, w.v_proj_bias));
    RETURN_IF_ERROR(TakeBodyIf(a.use_bias, p + "o_proj.bias", {hidden}, w.o_proj_bias));
    return absl::OkStatus();
  }

  absl::Status LoadMlp(const std::string& p, MlpLayerWeights& w) {
    const MlpParams& mlp = config_.mlp;
    const int64_t hidden = config_.hidden_size;
    RETURN_IF_ERROR(TakeBody(p + "up_proj.weight", {mlp.intermediate_size, hidden}, w.up_proj));
    RETURN_IF_ERROR(TakeBodyIf(mlp.use_bias, p + "up_proj.bias", {mlp.intermediate_size}, w.up_proj_bias));
    RETURN_IF_ERROR(TakeBody(p + "down_proj.weight", {hidden, mlp.intermediate_size}, w.down_proj));
    RETURN_IF_ERROR(TakeBodyIf(mlp.use_bias, p + "down_proj.bias", {hidden}, w.down_proj_bias));
    return absl::OkStatus();
  }

  // Bamba: feed_forward.{gate,up,down}_proj; Granite's dense block: the
  // shared_mlp alone (input_linear [gate | up], output_linear).
  absl::Status LoadGatedMlp(const std::string& p, int64_t inter, bool bias, GatedMlpLayerWeights& w) {
    const int64_t hidden = config_.hidden_size;
    if (config_.family == ModelFamily::kGraniteMoeHybrid) {
      const std::string s = p + "shared_mlp.";
      RETURN_IF_ERROR(TakeBody(s + "input_linear.weight", {2 * inter, hidden}, w.gate_up));
      return TakeBody(s + "output_linear.weight", {hidden, inter}, w.down_proj);
    }
    WeightMatrix gate;
    WeightMatrix up;
    RETURN_IF_ERROR(TakeBody(p + "gate_proj.weight", {inter, hidden}, gate));
    RETURN_IF_ERROR(TakeBody(p + "up_proj.weight", {inter, hidden}, up));
    w.gate_up = ConcatRows({gate, up});  // the bytes Take counted for the two, held once
    if (bias) {
      std::vector<float> gate_bias;
      RETURN_IF_ERROR(TakeBody(p + "gate_proj.bias", {inter}, gate_bias));
      RETURN_IF_ERROR(TakeBody(p + "up_proj.bias", {inter}, w.gate_up_bias));
      w.gate_up_bias.insert(w.gate_up_bias.begin(), gate_bias.begin(), gate_bias.end());
    }
    RETURN_IF_ERROR(TakeBody(p + "down_proj.weight", {hidden, inter}, w.down_proj));
    return TakeBodyIf(bias, p + "down_proj.bias", {hidden}, w.down_proj_bias);
  }

  absl::Status LoadMoe(const std::string& p, MoeLayerWeights& w) {
    const MoeParams& moe = config_.moe;
    const int64_t hidden = config_.hidden_size;
    const int64_t experts = moe.num_experts;
    const int64_t inter = moe.intermediate_size;
    const int64_t shared = moe.shared_intermediate_size;
    if (config_.family == ModelFamily::kGraniteMoeHybrid) {
      // block_sparse_moe.{router.layer, input_linear, output_linear} and the shared_mlp.
      const std::string m = p + "block_sparse_moe.";
      RETURN_IF_ERROR(TakeBody(m + "router.layer.weight", {experts, hidden}, w.router));
      RETURN_IF_ERROR(TakeBody(m + "input_linear.weight", {experts, moe.up_rows(inter), hidden}, w.experts_up));
      RETURN_IF_ERROR(TakeBody(m + "output_linear.weight", {experts, hidden, inter}, w.experts_down));
      if (shared == 0) return absl::OkStatus();
      RETURN_IF_ERROR(TakeBody(p + "shared_mlp.input_linear.weight", {moe.up_rows(shared), hidden}, w.shared_up));
      return TakeBody(p + "shared_mlp.output_linear.weight", {hidden, shared}, w.shared_down);
    }
    if (config_.IsQwenFamily()) return LoadQwenMoe(p, w);
    // Nemotron-H: mixer.{gate, fc1_latent_proj, fc2_latent_proj, experts, shared_experts}.
    RETURN_IF_ERROR(TakeBody(p + "gate.weight", {experts, hidden}, w.router));
    RETURN_IF_ERROR(TakeBody(p + "gate.e_score_correction_bias", {experts}, w.router_bias));
    const int64_t dim = moe.expert_dim(hidden);
    if (moe.latent_size > 0) {
      RETURN_IF_ERROR(TakeBody(p + "fc1_latent_proj.weight", {moe.latent_size, hidden}, w.latent_in));
      RETURN_IF_ERROR(TakeBody(p + "fc2_latent_proj.weight", {hidden, moe.latent_size}, w.latent_out));
    }
    if (checkpoint_.Contains(prefix_ + p + "experts.up_proj")) {
      RETURN_IF_ERROR(TakeBody(p + "experts.up_proj", {experts, inter, dim}, w.experts_up));
      RETURN_IF_ERROR(TakeBody(p + "experts.down_proj", {experts, dim, inter}, w.experts_down));
    } else {
      std::vector<WeightMatrix> ups(static_cast<size_t>(experts));
      std::vector<WeightMatrix> downs(static_cast<size_t>(experts));
      for (int64_t e = 0; e < experts; ++e) {
        const std::string x = absl::StrCat(p, "experts.", e, ".");
        RETURN_IF_ERROR(TakeBody(x + "up_proj.weight", {inter, dim}, ups[static_cast<size_t>(e)]));
        RETURN_IF_ERROR(TakeBody(x + "down_proj.weight", {dim, inter}, downs[static_cast<size_t>(e)]));
      }
      w.experts_up = ConcatRows(ups);
      w.experts_down = ConcatRows(downs);
    }
    if (shared == 0) return absl::OkStatus();
    RETURN_IF_ERROR(TakeBody(p + "shared_experts.up_proj.weight", {shared, hidden}, w.shared_up));
    RETURN_IF_ERROR(TakeBody(p + "shared_experts.down_proj.weight", {hidden, shared}, w.shared_down));
    RETURN_IF_ERROR(TakeBodyIf(moe.shared_bias, p + "shared_experts.up_proj.bias", {shared}, w.shared_up_bias));
    return TakeBodyIf(moe.shared_bias, p + "shared_experts.down_proj.bias", {hidden}, w.shared_down_bias);
  }

  // Qwen's q_proj [2 * q_dim, hidden] (and its bias) holds per head the
  // query rows then the gate rows; split into q_proj and gate_proj.
  absl::Status LoadGatedQuery(const std::string& p, AttentionLayerWeights& w) {
    const AttentionParams& a = config_.attention;
    const int64_t hidden = config_.hidden_size;
    const int64_t d = a.head_dim;
    WeightMatrix both;
    RETURN_IF_ERROR(TakeBody(p + "q_proj.weight", {2 * a.q_dim(), hidden}, both));
    std::vector<RowRange> query, gate;
    for (int64_t h = 0; h < a.num_heads; ++h) {
      query.push_back({2 * h * d, d});
      gate.push_back({2 * h * d + d, d});
    }
    w.q_proj = PickRows(both, hidden, query);
    w.gate_proj = PickRows(both, hidden, gate);
    if (!a.use_bias) return absl::OkStatus();
    std::vector<float> bias;
    RETURN_IF_ERROR(TakeBody(p + "q_proj.bias", {2 * a.q_dim()}, bias));
    for (const RowRange& r : query) w.q_proj_bias.insert(w.q_proj_bias.end(), &bias[r.first], &bias[r.first] + r.count);
    for (const RowRange& r : gate) {
      w.gate_proj_bias.insert(w.gate_proj_bias.end(), &bias[r.first], &bias[r.first] + r.count);
    }
    return absl::OkStatus();
  }

  // A Gated DeltaNet mixer; its input projections into the row order
  // [q | k | v | z | b | a] (model_weights.h).
  absl::Status LoadGatedDeltaNet(const std::string& p, GatedDeltaNetLayerWeights& w) {
    const GatedDeltaNetParams& g = config_.gdn;
    const int64_t hidden = config_.hidden_size;
    const int64_t nk = g.num_k_heads;
    const int64_t nv = g.num_v_heads;
    const int64_t r = nv / nk;  // value heads per key head
    const int64_t dk = g.k_head_dim;
    const int64_t dv = g.v_head_dim;
    if (config_.family == ModelFamily::kQwen3Next) {
      // Qwen3-Next: per key head j, qkvz rows [q_j (dk) | k_j (dk) | v_j (r dv) | z_j (r dv)]
      // and ba rows [b_j (r) | a_j (r)].
      const int64_t group = 2 * dk + 2 * r * dv;
      WeightMatrix qkvz, ba;
      RETURN_IF_ERROR(TakeBody(p + "in_proj_qkvz.weight", {nk * group, hidden}, qkvz));
      RETURN_IF_ERROR(TakeBody(p + "in_proj_ba.weight", {nk * 2 * r, hidden}, ba));
      std::vector<RowRange> q, k, v, z, b, a;
      for (int64_t j = 0; j < nk; ++j) {
        q.push_back({j * group, dk});
        k.push_back({j * group + dk, dk});
        v.push_back({j * group + 2 * dk, r * dv});
        z.push_back({j * group + 2 * dk + r * dv, r * dv});
        b.push_back({j * 2 * r, r});
        a.push_back({j * 2 * r + r, r});
      }
      for (auto* part : {&k, &v, &z}) q.insert(q.end(), part->begin(), part->end());
      b.insert(b.end(), a.begin(), a.end());
      w.in_proj = ConcatRows({PickRows(qkvz, hidden, q), PickRows(ba, hidden, b)});
    } else {
      // Qwen3.5: the four matrices already in that order.
      WeightMatrix qkv, z, b, a;
      RETURN_IF_ERROR(TakeBody(p + "in_proj_qkv.weight", {g.conv_dim(), hidden}, qkv));
      RETURN_IF_ERROR(TakeBody(p + "in_proj_z.weight", {g.value_dim(), hidden}, z));
      RETURN_IF_ERROR(TakeBody(p + "in_proj_b.weight", {nv, hidden}, b));
      RETURN_IF_ERROR(TakeBody(p + "in_proj_a.weight", {nv, hidden}, a));
      w.in_proj = ConcatRows({qkv, z, b, a});
    }
    RETURN_IF_ERROR(TakeBody(p + "conv1d.weight", {g.conv_dim(), 1, g.conv_kernel}, w.conv1d_weight));
    RETURN_IF_ERROR(TakeBody(p + "dt_bias", {nv}, w.dt_bias));
    RETURN_IF_ERROR(TakeBody(p + "A_log", {nv}, w.A_log));
    std::vector<float> norm;
    RETURN_IF_ERROR(TakeBody(p + "norm.weight", {dv}, norm));
    for (int64_t h = 0; h < nv; ++h) w.norm.insert(w.norm.end(), norm.begin(), norm.end());
    return TakeBody(p + "out_proj.weight", {hidden, g.value_dim()}, w.out_proj);
  }

  // Qwen's sparse MoE block: mlp.gate (the router), the routed experts (one
  // tensor per expert as checkpoints hold them, or transformers' fused 3-D
  // form), the shared expert and its gate (the router's last row).
  absl::Status LoadQwenMoe(const std::string& p, MoeLayerWeights& w) {
    const MoeParams& moe = config_.moe;
    const int64_t hidden = config_.hidden_size;
    const int64_t experts = moe.num_experts;
    const int64_t inter = moe.intermediate_size;
    const int64_t shared = moe.shared_intermediate_size;
    WeightMatrix router;
    RETURN_IF_ERROR(TakeBody(p + "gate.weight", {experts, hidden}, router));
    if (checkpoint_.Contains(prefix_ + p + "experts.gate_up_proj")) {
      RETURN_IF_ERROR(TakeBody(p + "experts.gate_up_proj", {experts, 2 * inter, hidden}, w.experts_up));
      RETURN_IF_ERROR(TakeBody(p + "experts.down_proj", {experts, hidden, inter}, w.experts_down));
    } else {
      std::vector<WeightMatrix> ups;
      std::vector<WeightMatrix> downs(static_cast<size_t>(experts));
      for (int64_t e = 0; e < experts; ++e) {
        const std::string x = absl::StrCat(p, "experts.", e, ".");
        RETURN_IF_ERROR(TakeBody(x + "gate_proj.weight", {inter, hidden}, ups.emplace_back()));
        RETURN_IF_ERROR(TakeBody(x + "up_proj.weight", {inter, hidden}, ups.emplace_back()));
        RETURN_IF_ERROR(TakeBody(x + "down_proj.weight", {hidden, inter}, downs[static_cast<size_t>(e)]));
      }
      w.experts_up = ConcatRows(ups);
      w.experts_down = ConcatRows(downs);
    }
    if (shared == 0) {
      w.router = std::move(router);
      return absl::OkStatus();
    }
    WeightMatrix gate, up;
    RETURN_IF_ERROR(TakeBody(p + "shared_expert.gate_proj.weight", {shared, hidden}, gate));
    RETURN_IF_ERROR(TakeBody(p + "shared_expert.up_proj.weight", {shared, hidden}, up));
    w.shared_up = ConcatRows({gate, up});
    RETURN_IF_ERROR(TakeBody(p + "shared_expert.down_proj.weight", {hidden, shared}, w.shared_down));
    WeightMatrix shared_gate;
    RETURN_IF_ERROR(TakeBody(p + "shared_expert_gate.weight", {1, hidden}, shared_gate));
    w.router = ConcatRows({router, shared_gate});
    return absl::OkStatus();
  }

  struct RowRange {
    int64_t first = 0;
    int64_t count = 0;
  };

  // The rows of `m` (row width `cols`) named by `ranges`, in their order.
  static WeightMatrix PickRows(const WeightMatrix& m, int64_t cols, const std::vector<RowRange>& ranges) {
    WeightMatrix out;
    for (const RowRange& r : ranges) {
      if (m.is_bf16()) {
        out.bf16.insert(out.bf16.end(), m.bf16.begin() + r.first * cols, m.bf16.begin() + (r.first + r.count) * cols);
      } else {
        out.f32.insert(out.f32.end(), m.f32.begin() + r.first * cols, m.f32.begin() + (r.first + r.count) * cols);
      }
    }
    return out;
  }

  // A visitor loading each tensor as hybrid layer i runs it.
  auto TakeSharedOf(size_t i) {
    return [this, i](const std::string& s, std::vector<int64_t> shape, auto& dst) -> absl::Status {
      ASSIGN_OR_RETURN(SharedSource source, Shared(i, s, shape));
      return Take(source.full_name, source.canonical, std::move(shape), dst);
    };
  }

  // Zamba2 hybrid layer i (use u = its rank among the hybrid layers, memory
  // block b = u % num_mem_blocks): its own tensors, its use's adapters and the
  // shared block it runs, each tensor resolved as transformers does (see the
  // header). The block is one of shared_blocks_: the one already loaded when
  // every tensor resolves to values an earlier layer of block b runs, else a
  // block of its own.
  absl::Status LoadZambaHybrid(size_t i, ZambaHybridLayerWeights& w) {
    const int64_t hidden = config_.hidden_size;
    const int64_t use = UseOf(i);
    w.use = use;
    w.mem_block = use % config_.zamba.num_mem_blocks;
    ZambaSharedBlockWeights ignored;
    std::string key;
    RETURN_IF_ERROR(ForEachSharedBlockTensor(ignored, [&](const std::string& s, std::vector<int64_t> shape, auto&) {
      ASSIGN_OR_RETURN(SharedSource source, Shared(i, s, shape));
      absl::StrAppend(&key, source.canonical, "\n");
      return absl::OkStatus();
    }));
    const auto found = zamba_block_index_.find(key);
    if (found != zamba_block_index_.end()) {
      w.block = found->second;
    } else {
      w.block = static_cast<int64_t>(out_.shared_blocks_.size());
      zamba_block_index_[key] = w.block;
      RETURN_IF_ERROR(ForEachSharedBlockTensor(out_.shared_blocks_.emplace_back(), TakeSharedOf(i)));
    }
    RETURN_IF_ERROR(ForEachAdapterTensor(use, w, TakeSharedOf(i)));
    const std::string base = absl::StrCat("layers.", i, ".");
    RETURN_IF_ERROR(TakeBody(base + "linear.weight", {hidden, hidden}, w.linear));
    RETURN_IF_ERROR(TakeBody(base + "mamba_decoder.input_layernorm.weight", {hidden}, w.mamba_norm));
    return LoadMamba2(base + "mamba_decoder.mamba.", w.mamba);
  }

  // visit(suffix, shape, destination) for each tensor of a shared block, the
  // suffix after model.layers.{j}.shared_transformer.
  template <typename Visit>
  absl::Status ForEachSharedBlockTensor(ZambaSharedBlockWeights& b, Visit visit) const {
    const int64_t hidden = config_.hidden_size;
    const AttentionParams& a = config_.attention;
    const int64_t inter = config_.gated_mlp.intermediate_size;
    RETURN_IF_ERROR(visit("input_layernorm.weight", {2 * hidden}, b.input_norm));
    RETURN_IF_ERROR(visit("self_attn.q_proj.weight", {a.q_dim(), 2 * hidden}, b.attention.q_proj));
    RETURN_IF_ERROR(visit("self_attn.k_proj.weight", {a.kv_dim(), 2 * hidden}, b.attention.k_proj));
    RETURN_IF_ERROR(visit("self_attn.v_proj.weight", {a.kv_dim(), 2 * hidden}, b.attention.v_proj));
    RETURN_IF_ERROR(visit("self_attn.o_proj.weight", {hidden, a.q_dim()}, b.attention.o_proj));
    RETURN_IF_ERROR(visit("pre_ff_layernorm.weight", {hidden}, b.pre_ff_norm));
    RETURN_IF_ERROR(visit("feed_forward.gate_up_proj.weight", {2 * inter, hidden}, b.mlp.gate_up));
    if (config_.gated_mlp.use_bias) {
      RETURN_IF_ERROR(visit("feed_forward.gate_up_proj.bias", {2 * inter}, b.mlp.gate_up_bias));
    }
    RETURN_IF_ERROR(visit("feed_forward.down_proj.weight", {hidden, inter}, b.mlp.down_proj));
    if (config_.gated_mlp.use_bias)
      RETURN_IF_ERROR(visit("feed_forward.down_proj.bias", {hidden}, b.mlp.down_proj_bias));
    return absl::OkStatus();
  }

  // visit(suffix, shape, destination) for each adapter matrix of use `use`
  // (the attention ones only with use_shared_attention_adapter).
  template <typename Visit>
  absl::Status ForEachAdapterTensor(int64_t use, ZambaHybridLayerWeights& w, Visit visit) const {
    const int64_t hidden = config_.hidden_size;
    const AttentionParams& a = config_.attention;
    const int64_t inter = config_.gated_mlp.intermediate_size;
    const int64_t r = config_.zamba.adapter_rank;
    const auto lora = [&](const std::string& p, int64_t in, int64_t out, LoraWeights& l) -> absl::Status {
      RETURN_IF_ERROR(visit(absl::StrCat(p, ".", use, ".0.weight"), {r, in}, l.down));
      return visit(absl::StrCat(p, ".", use, ".1.weight"), {out, r}, l.up);
    };
    if (config_.zamba.use_adapters) {
      RETURN_IF_ERROR(lora("self_attn.linear_q_adapter_list", 2 * hidden, a.q_dim(), w.q_adapter));
      RETURN_IF_ERROR(lora("self_attn.linear_k_adapter_list", 2 * hidden, a.kv_dim(), w.k_adapter));
      RETURN_IF_ERROR(lora("self_attn.linear_v_adapter_list", 2 * hidden, a.kv_dim(), w.v_adapter));
    }
    return lora("feed_forward.gate_up_proj_adapter_list", hidden, 2 * inter, w.gate_up_adapter);
  }

  // Zamba2, before any layer is read: the hybrid layers in order, and every
  // model.layers.{j}.shared_transformer.* tensor that transformers' module of
  // hybrid layer j has (its block's tensors, the adapters of every use of its
  // memory block) checked for its shape and marked consumed, used or not.
  absl::Status PrepareZamba() {
    for (size_t j = 0; j < config_.layers.size(); ++j) {
      if (config_.layers[j] == LayerKind::kZambaHybrid) zamba_hybrid_.push_back(j);
    }
    const auto check = [&](size_t j) {
      return [this, j](const std::string& s, std::vector<int64_t> shape, auto&) -> absl::Status {
        const std::string name = SharedName(j, s);
        const TensorInfo* info = checkpoint_.Find(name);
        if (info == nullptr) return absl::OkStatus();
        if (info->shape != shape) {
          return absl::InvalidArgumentError(absl::StrCat("tensor ", name, " has shape ", ShapeString(info->shape),
                                                         ", expected ", ShapeString(shape)));
        }
        consumed_.insert(name);
        return absl::OkStatus();
      };
    };
    ZambaSharedBlockWeights block;
    ZambaHybridLayerWeights adapters;
    for (size_t u = 0; u < zamba_hybrid_.size(); ++u) {
      const size_t j = zamba_hybrid_[u];
      RETURN_IF_ERROR(ForEachSharedBlockTensor(block, check(j)));
      for (size_t other : UsesOfBlockOf(j)) {
        RETURN_IF_ERROR(ForEachAdapterTensor(UseOf(other), adapters, check(j)));
      }
    }
    return absl::OkStatus();
  }

  // The hybrid layers sharing hybrid layer j's memory block, j included, in order.
  std::vector<size_t> UsesOfBlockOf(size_t j) const {
    const int64_t blocks = config_.zamba.num_mem_blocks;
    const int64_t use = UseOf(j);
    std::vector<size_t> out;
    for (size_t u = 0; u < zamba_hybrid_.size(); ++u) {
      if (static_cast<int64_t>(u) % blocks == use % blocks) out.push_back(zamba_hybrid_[u]);
    }
    return out;
  }

  // Hybrid layer j's rank among the hybrid layers.
  int64_t UseOf(size_t j) const {
    return std::find(zamba_hybrid_.begin(), zamba_hybrid_.end(), j) - zamba_hybrid_.begin();
  }

  std::string SharedName(size_t j, absl::string_view suffix) const {
    return absl::StrCat(prefix_, "layers.", j, ".shared_transformer.", suffix);
  }

  // Zamba2: where a tensor of hybrid layer j's shared block comes from.
  struct SharedSource {
    std::string full_name;  // the checkpoint's tensor holding the values layer j runs
    std::string canonical;  // the name they are counted and fingerprinted under
  };

  // The checkpoint tensor whose values hybrid layer j runs as
  // shared_transformer.`suffix`: its own when stored; otherwise, the config tied
  // (tie_word_embeddings), the first stored among its memory block's layers.
  absl::StatusOr<std::string> SharedTensorName(size_t j, const std::string& suffix,
                                               const std::vector<int64_t>& shape) const {
    const std::string own = SharedName(j, suffix);
    if (checkpoint_.Contains(own)) return own;
    const std::vector<size_t> uses = UsesOfBlockOf(j);
    if (!config_.tie_word_embeddings) {
      return absl::InvalidArgumentError(absl::StrCat(
          "missing tensor ", own, " (expected shape ", ShapeString(shape),
          "): with tie_word_embeddings false each hybrid layer runs its own shared block (transformers would "
          "initialise this one at random)"));
    }
    for (size_t other : uses) {
      const std::string name = SharedName(other, suffix);
      if (checkpoint_.Contains(name)) return name;
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "missing tensor ", SharedName(uses.front(), suffix), " (expected shape ", ShapeString(shape),
        "), nor under any other hybrid layer using shared block ", UseOf(j) % config_.zamba.num_mem_blocks));
  }

  // Hybrid layer j's source of shared_transformer.`suffix`: canonically the name
  // under the first layer of its memory block that runs the same values (dtype,
  // shape and bytes), so equal copies are loaded, counted and fingerprinted once.
  absl::StatusOr<SharedSource> Shared(size_t j, const std::string& suffix, const std::vector<int64_t>& shape) const {
    ASSIGN_OR_RETURN(std::string full, SharedTensorName(j, suffix, shape));
    ASSIGN_OR_RETURN(TensorView mine, checkpoint_.Tensor(full));
    for (size_t other : UsesOfBlockOf(j)) {
      if (other == j) break;
      const absl::StatusOr<std::string> theirs = SharedTensorName(other, suffix, shape);
      if (!theirs.ok()) continue;
      ASSIGN_OR_RETURN(TensorView view, checkpoint_.Tensor(*theirs));
      if (*theirs == full || SameTensor(view, mine)) {
        return SharedSource{full, SharedName(other, suffix).substr(prefix_.size())};
      }
    }
    return SharedSource{full, SharedName(j, suffix).substr(prefix_.size())};
  }

  // Same dtype, shape and bytes.
  static bool SameTensor(const TensorView& a, const TensorView& b) {
    return a.dtype == b.dtype && std::equal(a.shape.begin(), a.shape.end(), b.shape.begin(), b.shape.end()) &&
           a.bytes.size() == b.bytes.size() && std::memcmp(a.bytes.data(), b.bytes.data(), a.bytes.size()) == 0;
  }

  // Rows of the parts, one after another: bf16 when every part is, else fp32.
  static WeightMatrix ConcatRows(const std::vector<WeightMatrix>& parts) {
    WeightMatrix out;
    const bool bf16 = std::all_of(parts.begin(), parts.end(), [](const WeightMatrix& m) { return m.is_bf16(); });
    for (const WeightMatrix& m : parts) {
      if (bf16) {
        out.bf16.insert(out.bf16.end(), m.bf16.begin(), m.bf16.end());
      } else {
        const std::vector<float> widened = m.ToFloat32();
        out.f32.insert(out.f32.end(), widened.begin(), widened.end());
      }
    }
    return out;
  }

  // The head rule of the header comment: a stored lm_head.weight is the head
  // unless the model is tied and it is a byte-for-byte copy of the embeddings
  // (then the embeddings are shared, and the copy is neither counted nor
  // fingerprinted); a tied model without one uses its embeddings.
  absl::Status LoadHead() {
    const int64_t hidden = config_.hidden_size;
    const int64_t vocab = config_.vocab_size;
    out_.tied_ = false;
    if (config_.tie_word_embeddings) {
      if (!checkpoint_.Contains(kHeadName)) {
        out_.tied_ = true;
        return absl::OkStatus();
      }
      ASSIGN_OR_RETURN(const bool copy, StoredHeadIsEmbeddingsCopy());
      if (copy) {
        consumed_.insert(kHeadName);
        out_.tied_ = true;
        return absl::OkStatus();
      }
    }
    return Take(kHeadName, kHeadName, {vocab, hidden}, out_.lm_head_);
  }

  // Whether the stored lm_head.weight has the embeddings' dtype, shape and bytes.
  absl::StatusOr<bool> StoredHeadIsEmbeddingsCopy() const {
    ASSIGN_OR_RETURN(TensorView head, checkpoint_.Tensor(kHeadName));
    ASSIGN_OR_RETURN(TensorView emb, checkpoint_.Tensor(prefix_ + embedding_name_));
    return SameTensor(head, emb);
  }

  absl::Status CheckNoUnexpected() const {
    std::vector<std::string> unexpected;
    for (const std::string& name : checkpoint_.names()) {
      if (consumed_.contains(name)) continue;
      if (config_.family == ModelFamily::kNemotronH && absl::StartsWith(name, "mtp.")) continue;
      // Qwen: the multi-token-prediction head and the image-text form's vision
      // tower, which the engine does not run (README: what is not served).
      if (config_.IsQwenFamily() && (absl::StartsWith(name, "mtp.") || absl::StartsWith(name, "model.visual."))) {
        continue;
      }
      unexpected.push_back(name);
    }
    if (unexpected.empty()) return absl::OkStatus();
    const size_t listed = std::min(unexpected.size(), kListedUnexpected);
    return absl::InvalidArgumentError(absl::StrCat(
        unexpected.size(), " unexpected tensor(s) for a ", ModelFamilyName(config_.family), " model with pattern \"",
        config_.LayerPattern(), "\": ", absl::StrJoin(unexpected.begin(), unexpected.begin() + listed, ", "),
        unexpected.size() > listed ? ", ..." : ""));
  }

  common::Hash128 Fingerprint() {
    std::sort(used_.begin(), used_.end(), [](const Used& a, const Used& b) { return a.canonical < b.canonical; });
    const std::string canonical_config = config_.CanonicalString();
    common::Hash128 fp = common::HashBytes(canonical_config);
    for (const Used& u : used_) {
      const common::Hash128 digest = common::HashBytes(u.view.bytes.data(), u.view.bytes.size());
      const std::string record = absl::StrCat(u.canonical, "|", DTypeName(u.view.dtype), "|", ShapeString(u.view.shape),
                                              "|", digest.ToBytes());
      fp = common::HashChain(fp, record.data(), record.size());
    }
    return fp;
  }

  const SafetensorsCheckpoint& checkpoint_;
  ModelWeights& out_;
  const ModelConfig& config_;
  std::string prefix_;
  std::string embedding_name_;
  absl::flat_hash_set<std::string> consumed_;
  std::vector<Used> used_;
  absl::flat_hash_set<std::string> recorded_;  // canonical names in used_
  // Zamba2: the hybrid layers in order; a shared block's canonical names -> its index.
  std::vector<size_t> zamba_hybrid_;
  absl::flat_hash_map<std::string, int64_t> zamba_block_index_;
};

absl::StatusOr<std::unique_ptr<ModelWeights>> ModelWeights::FromCheckpoint(const ModelConfig& config,
                                                                           const SafetensorsCheckpoint& checkpoint) {
  RETURN_IF_ERROR(config.Validate());
  std::unique_ptr<ModelWeights> weights(new ModelWeights());
  weights->config_ = config;
  Loader loader(checkpoint, *weights);
  RETURN_IF_ERROR(loader.Run());
  return weights;
}

absl::StatusOr<std::unique_ptr<ModelWeights>> ModelWeights::Load(const ModelConfig& config,
                                                                 const std::string& model_dir) {
  ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsCheckpoint> checkpoint, SafetensorsCheckpoint::OpenDirectory(model_dir));
  absl::StatusOr<std::unique_ptr<ModelWeights>> weights = FromCheckpoint(config, *checkpoint);
  if (!weights.ok()) {
    return absl::Status(weights.status().code(), absl::StrCat(model_dir, ": ", weights.status().message()));
  }
  return weights;
}

absl::StatusOr<std::unique_ptr<ModelWeights>> ModelWeights::LoadDirectory(const std::string& model_dir) {
  ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(absl::StrCat(model_dir, "/config.json")));
  return Load(config, model_dir);
}

}  // namespace hybridserve::engine
