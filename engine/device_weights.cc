#include "engine/device_weights.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/backend_registry.h"

namespace hybridserve::engine {

// Uploads host tensors into `out`, keeping the buffers alive there.
class DeviceWeights::Uploader {
 public:
  Uploader(kernels::Backend& backend, DeviceWeights& out) : backend_(backend), out_(out) {}

  // The device copy (or alias) of a host tensor that outlives the weights;
  // null for an empty tensor (an absent bias).
  absl::StatusOr<const float*> Constant(const std::vector<float>& host, const char* what) {
    if (host.empty()) return nullptr;
    kernels::DeviceBuffer buffer;
    RETURN_IF_ERROR(KernelStatusToStatus(
        backend_.UploadConstant(host.data(), static_cast<int64_t>(host.size() * sizeof(float)), &buffer),
        absl::StrCat("uploading ", what)));
    return static_cast<const float*>(Keep(std::move(buffer), /*allocated=*/false));
  }

  // The device copy (or alias) of a host matrix in its resident dtype.
  absl::StatusOr<DeviceMatrix> Matrix(const WeightMatrix& host, const char* what) {
    DeviceMatrix out;
    if (host.is_bf16()) {
      kernels::DeviceBuffer buffer;
      RETURN_IF_ERROR(KernelStatusToStatus(backend_.UploadConstant(host.bf16.data(), host.bytes(), &buffer),
                                           absl::StrCat("uploading ", what)));
      out.bf16 = static_cast<const uint16_t*>(Keep(std::move(buffer), /*allocated=*/false));
    } else {
      ASSIGN_OR_RETURN(out.f32, Constant(host.f32, what));
    }
    return out;
  }

  // A device tensor made from a temporary host vector (a derived tensor).
  template <typename T>
  absl::StatusOr<const T*> Derived(const std::vector<T>& host, const char* what) {
    const auto bytes = static_cast<int64_t>(host.size() * sizeof(T));
    kernels::DeviceBuffer buffer;
    RETURN_IF_ERROR(KernelStatusToStatus(backend_.Allocate(bytes, &buffer), absl::StrCat("allocating ", what)));
    RETURN_IF_ERROR(KernelStatusToStatus(backend_.CopyToDevice(buffer.data(), host.data(), bytes),
                                         absl::StrCat("uploading ", what)));
    return static_cast<const T*>(Keep(std::move(buffer), /*allocated=*/true));
  }

  // Rows [first | second | ...] of matrices of one width as one device matrix:
  // bf16 when every part is bf16, else fp32 (bf16 parts widened exactly).
  absl::StatusOr<DeviceMatrix> Stacked(std::initializer_list<const WeightMatrix*> parts, const char* what) {
    const bool all_bf16 = std::all_of(parts.begin(), parts.end(), [](const WeightMatrix* m) { return m->is_bf16(); });
    DeviceMatrix out;
    if (all_bf16) {
      std::vector<uint16_t> rows;
      for (const WeightMatrix* m : parts) rows.insert(rows.end(), m->bf16.begin(), m->bf16.end());
      ASSIGN_OR_RETURN(out.bf16, Derived(rows, what));
    } else {
      std::vector<float> rows;
      for (const WeightMatrix* m : parts) {
        const std::vector<float> widened = m->ToFloat32();
        rows.insert(rows.end(), widened.begin(), widened.end());
      }
      ASSIGN_OR_RETURN(out.f32, Derived(rows, what));
    }
    return out;
  }

  absl::StatusOr<DeviceMamba2Weights> Mamba2(const Mamba2LayerWeights& w) {
    DeviceMamba2Weights m;
    ASSIGN_OR_RETURN(m.in_proj, Matrix(w.in_proj, "mamba2 in_proj"));
    ASSIGN_OR_RETURN(m.in_proj_bias, Constant(w.in_proj_bias, "mamba2 in_proj bias"));
    ASSIGN_OR_RETURN(m.conv1d_weight, Constant(w.conv1d_weight, "mamba2 conv1d"));
    ASSIGN_OR_RETURN(m.conv1d_bias, Constant(w.conv1d_bias, "mamba2 conv1d bias"));
    ASSIGN_OR_RETURN(m.dt_bias, Constant(w.dt_bias, "mamba2 dt_bias"));
    std::vector<float> a(w.A_log.size());
    for (size_t h = 0; h < a.size(); ++h) a[h] = -std::exp(w.A_log[h]);
    ASSIGN_OR_RETURN(m.A, Derived(a, "mamba2 A"));
    ASSIGN_OR_RETURN(m.D, Constant(w.D, "mamba2 D"));
    ASSIGN_OR_RETURN(m.norm, Constant(w.norm, "mamba2 norm"));
    ASSIGN_OR_RETURN(m.out_proj, Matrix(w.out_proj, "mamba2 out_proj"));
    ASSIGN_OR_RETURN(m.out_proj_bias, Constant(w.out_proj_bias, "mamba2 out_proj bias"));
    return m;
  }

  absl::StatusOr<DeviceAttentionWeights> Attention(const AttentionLayerWeights& w) {
    DeviceAttentionWeights a;
    if (w.gate_proj.empty()) {
      ASSIGN_OR_RETURN(a.qkv_proj, Stacked({&w.q_proj, &w.k_proj, &w.v_proj}, "attention qkv_proj"));
    } else {
      ASSIGN_OR_RETURN(a.qkv_proj, Stacked({&w.q_proj, &w.k_proj, &w.v_proj, &w.gate_proj}, "attention qkv_proj"));
    }
    if (!w.q_proj_bias.empty()) {
      std::vector<float> qkv_bias = w.q_proj_bias;
      qkv_bias.insert(qkv_bias.end(), w.k_proj_bias.begin(), w.k_proj_bias.end());
      qkv_bias.insert(qkv_bias.end(), w.v_proj_bias.begin(), w.v_proj_bias.end());
      qkv_bias.insert(qkv_bias.end(), w.gate_proj_bias.begin(), w.gate_proj_bias.end());
      ASSIGN_OR_RETURN(a.qkv_bias, Derived(qkv_bias, "attention qkv bias"));
    }
    ASSIGN_OR_RETURN(a.q_norm, Constant(w.q_norm, "attention q_norm"));
    ASSIGN_OR_RETURN(a.k_norm, Constant(w.k_norm, "attention k_norm"));
    ASSIGN_OR_RETURN(a.o_proj, Matrix(w.o_proj, "attention o_proj"));
    ASSIGN_OR_RETURN(a.o_proj_bias, Constant(w.o_proj_bias, "attention o_proj bias"));
    return a;
  }

  absl::StatusOr<DeviceGatedDeltaNetWeights> GatedDeltaNet(const GatedDeltaNetLayerWeights& w) {
    DeviceGatedDeltaNetWeights g;
    ASSIGN_OR_RETURN(g.in_proj, Matrix(w.in_proj, "gated deltanet in_proj"));
    ASSIGN_OR_RETURN(g.conv1d_weight, Constant(w.conv1d_weight, "gated deltanet conv1d"));
    ASSIGN_OR_RETURN(g.dt_bias, Constant(w.dt_bias, "gated deltanet dt_bias"));
    ASSIGN_OR_RETURN(g.a_log, Constant(w.A_log, "gated deltanet A_log"));
    ASSIGN_OR_RETURN(g.norm, Constant(w.norm, "gated deltanet norm"));
    ASSIGN_OR_RETURN(g.out_proj, Matrix(w.out_proj, "gated deltanet out_proj"));
    return g;
  }

  absl::StatusOr<DeviceGatedMlpWeights> GatedMlp(const GatedMlpLayerWeights& w) {
    DeviceGatedMlpWeights m;
    ASSIGN_OR_RETURN(m.gate_up, Matrix(w.gate_up, "gated mlp gate_up"));
    ASSIGN_OR_RETURN(m.gate_up_bias, Constant(w.gate_up_bias, "gated mlp gate_up bias"));
    ASSIGN_OR_RETURN(m.down_proj, Matrix(w.down_proj, "gated mlp down_proj"));
    ASSIGN_OR_RETURN(m.down_proj_bias, Constant(w.down_proj_bias, "gated mlp down_proj bias"));
    return m;
  }

 private:
  const void* Keep(kernels::DeviceBuffer buffer, bool allocated) {
    const void* p = buffer.data();
    if (allocated) out_.allocated_bytes_ += buffer.bytes();
    out_.buffers_.push_back(std::move(buffer));
    return p;
  }

  kernels::Backend& backend_;
  DeviceWeights& out_;
};

absl::StatusOr<std::unique_ptr<DeviceWeights>> DeviceWeights::Create(const ModelWeights& weights,
                                                                     kernels::Backend& backend) {
  std::unique_ptr<DeviceWeights> out(new DeviceWeights());
  Uploader up(backend, *out);
  ASSIGN_OR_RETURN(out->embeddings_, up.Matrix(weights.embeddings(), "embeddings"));
  ASSIGN_OR_RETURN(out->norm_f_, up.Constant(weights.norm_f(), "norm_f"));
  // A tied head is the embeddings object itself: the same device tensor.
  if (&weights.lm_head() == &weights.embeddings()) {
    out->lm_head_ = out->embeddings_;
  } else {
    ASSIGN_OR_RETURN(out->lm_head_, up.Matrix(weights.lm_head(), "lm_head"));
  }
  for (const LayerWeights& layer : weights.layers()) {
    DeviceLayerWeights d;
    ASSIGN_OR_RETURN(d.norm, up.Constant(layer.norm, "layer norm"));
    switch (layer.kind) {
      case LayerKind::kMamba2: {
        ASSIGN_OR_RETURN(d.mixer, up.Mamba2(layer.mamba2()));
        break;
      }
      case LayerKind::kAttention: {
        ASSIGN_OR_RETURN(d.mixer, up.Attention(layer.attention()));
        break;
      }
      case LayerKind::kGatedDeltaNet: {
        ASSIGN_OR_RETURN(d.mixer, up.GatedDeltaNet(layer.gated_deltanet()));
        break;
      }
      case LayerKind::kZambaHybrid: {
        const ZambaHybridLayerWeights& w = layer.zamba_hybrid();
        DeviceZambaHybridWeights z;
        z.block = w.block;
        if (!w.q_adapter.down.empty()) {
          ASSIGN_OR_RETURN(z.qkv_adapter_down,
                           up.Stacked({&w.q_adapter.down, &w.k_adapter.down, &w.v_adapter.down}, "zamba qkv adapters"));
          ASSIGN_OR_RETURN(z.q_adapter_up, up.Matrix(w.q_adapter.up, "zamba q adapter"));
          ASSIGN_OR_RETURN(z.k_adapter_up, up.Matrix(w.k_adapter.up, "zamba k adapter"));
          ASSIGN_OR_RETURN(z.v_adapter_up, up.Matrix(w.v_adapter.up, "zamba v adapter"));
        }
        ASSIGN_OR_RETURN(z.gate_up_adapter.down, up.Matrix(w.gate_up_adapter.down, "zamba gate_up adapter"));
        ASSIGN_OR_RETURN(z.gate_up_adapter.up, up.Matrix(w.gate_up_adapter.up, "zamba gate_up adapter"));
        ASSIGN_OR_RETURN(z.linear, up.Matrix(w.linear, "zamba linear"));
        ASSIGN_OR_RETURN(z.mamba_norm, up.Constant(w.mamba_norm, "zamba mamba norm"));
        ASSIGN_OR_RETURN(z.mamba, up.Mamba2(w.mamba));
        d.mixer = z;
        break;
      }
      case LayerKind::kParallel: {
        DeviceParallelWeights p;
        ASSIGN_OR_RETURN(p.mamba, up.Mamba2(layer.parallel().mamba));
        ASSIGN_OR_RETURN(p.attention, up.Attention(layer.parallel().attention));
        d.mixer = p;
        break;
      }
      case LayerKind::kMlp: {
        const MlpLayerWeights& w = layer.mlp();
        DeviceMlpWeights m;
        ASSIGN_OR_RETURN(m.up_proj, up.Matrix(w.up_proj, "mlp up_proj"));
        ASSIGN_OR_RETURN(m.up_proj_bias, up.Constant(w.up_proj_bias, "mlp up_proj bias"));
        ASSIGN_OR_RETURN(m.down_proj, up.Matrix(w.down_proj, "mlp down_proj"));
        ASSIGN_OR_RETURN(m.down_proj_bias, up.Constant(w.down_proj_bias, "mlp down_proj bias"));
        d.mixer = m;
        break;
      }
      case LayerKind::kGatedMlp: {
        ASSIGN_OR_RETURN(d.mixer, up.GatedMlp(layer.gated_mlp()));
        break;
      }
      case LayerKind::kMoe: {
        const MoeLayerWeights& w = layer.moe();
        DeviceMoeWeights m;
        ASSIGN_OR_RETURN(m.router, up.Matrix(w.router, "moe router"));
        ASSIGN_OR_RETURN(m.router_bias, up.Constant(w.router_bias, "moe router bias"));
        m.has_latent = !w.latent_in.empty();
        if (m.has_latent) {
          ASSIGN_OR_RETURN(m.latent_in, up.Matrix(w.latent_in, "moe fc1_latent_proj"));
          ASSIGN_OR_RETURN(m.latent_out, up.Matrix(w.latent_out, "moe fc2_latent_proj"));
        }
        ASSIGN_OR_RETURN(m.experts_up, up.Matrix(w.experts_up, "moe experts up"));
        ASSIGN_OR_RETURN(m.experts_down, up.Matrix(w.experts_down, "moe experts down"));
        m.has_shared = !w.shared_up.empty();
        if (m.has_shared) {
          ASSIGN_OR_RETURN(m.shared_up, up.Matrix(w.shared_up, "moe shared up"));
          ASSIGN_OR_RETURN(m.shared_down, up.Matrix(w.shared_down, "moe shared down"));
          ASSIGN_OR_RETURN(m.shared_up_bias, up.Constant(w.shared_up_bias, "moe shared up bias"));
          ASSIGN_OR_RETURN(m.shared_down_bias, up.Constant(w.shared_down_bias, "moe shared down bias"));
        }
        d.mixer = m;
        break;
      }
    }
    out->layers_.push_back(d);
  }
  for (const ZambaSharedBlockWeights& b : weights.shared_blocks()) {
    DeviceZambaSharedBlock block;
    ASSIGN_OR_RETURN(block.input_norm, up.Constant(b.input_norm, "zamba shared input norm"));
    ASSIGN_OR_RETURN(block.attention, up.Attention(b.attention));
    ASSIGN_OR_RETURN(block.pre_ff_norm, up.Constant(b.pre_ff_norm, "zamba shared pre_ff norm"));
    ASSIGN_OR_RETURN(block.mlp, up.GatedMlp(b.mlp));
    out->shared_blocks_.push_back(block);
  }
  return out;
}

}  // namespace hybridserve::engine
