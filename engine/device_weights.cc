#include "engine/device_weights.h"

#include <cmath>
#include <cstdint>
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
    return Keep(std::move(buffer), /*allocated=*/false);
  }

  // A device tensor made from a temporary host vector (a derived tensor).
  absl::StatusOr<const float*> Derived(const std::vector<float>& host, const char* what) {
    const auto bytes = static_cast<int64_t>(host.size() * sizeof(float));
    kernels::DeviceBuffer buffer;
    RETURN_IF_ERROR(KernelStatusToStatus(backend_.Allocate(bytes, &buffer), absl::StrCat("allocating ", what)));
    RETURN_IF_ERROR(KernelStatusToStatus(backend_.CopyToDevice(buffer.data(), host.data(), bytes),
                                         absl::StrCat("uploading ", what)));
    return Keep(std::move(buffer), /*allocated=*/true);
  }

 private:
  const float* Keep(kernels::DeviceBuffer buffer, bool allocated) {
    const float* p = buffer.as<float>();
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
  ASSIGN_OR_RETURN(out->embeddings_, up.Constant(weights.embeddings(), "embeddings"));
  ASSIGN_OR_RETURN(out->norm_f_, up.Constant(weights.norm_f(), "norm_f"));
  // A tied head is the embeddings object itself: the same device tensor.
  if (&weights.lm_head() == &weights.embeddings()) {
    out->lm_head_ = out->embeddings_;
  } else {
    ASSIGN_OR_RETURN(out->lm_head_, up.Constant(weights.lm_head(), "lm_head"));
  }
  for (const LayerWeights& layer : weights.layers()) {
    DeviceLayerWeights d;
    ASSIGN_OR_RETURN(d.norm, up.Constant(layer.norm, "layer norm"));
    switch (layer.kind) {
      case LayerKind::kMamba2: {
        const Mamba2LayerWeights& w = layer.mamba2();
        DeviceMamba2Weights m;
        ASSIGN_OR_RETURN(m.in_proj, up.Constant(w.in_proj, "mamba2 in_proj"));
        ASSIGN_OR_RETURN(m.in_proj_bias, up.Constant(w.in_proj_bias, "mamba2 in_proj bias"));
        ASSIGN_OR_RETURN(m.conv1d_weight, up.Constant(w.conv1d_weight, "mamba2 conv1d"));
        ASSIGN_OR_RETURN(m.conv1d_bias, up.Constant(w.conv1d_bias, "mamba2 conv1d bias"));
        ASSIGN_OR_RETURN(m.dt_bias, up.Constant(w.dt_bias, "mamba2 dt_bias"));
        std::vector<float> a(w.A_log.size());
        for (size_t h = 0; h < a.size(); ++h) a[h] = -std::exp(w.A_log[h]);
        ASSIGN_OR_RETURN(m.A, up.Derived(a, "mamba2 A"));
        ASSIGN_OR_RETURN(m.D, up.Constant(w.D, "mamba2 D"));
        ASSIGN_OR_RETURN(m.norm, up.Constant(w.norm, "mamba2 norm"));
        ASSIGN_OR_RETURN(m.out_proj, up.Constant(w.out_proj, "mamba2 out_proj"));
        ASSIGN_OR_RETURN(m.out_proj_bias, up.Constant(w.out_proj_bias, "mamba2 out_proj bias"));
        d.mixer = m;
        break;
      }
      case LayerKind::kAttention: {
        const AttentionLayerWeights& w = layer.attention();
        std::vector<float> qkv;
        qkv.reserve(w.q_proj.size() + w.k_proj.size() + w.v_proj.size());
        qkv.insert(qkv.end(), w.q_proj.begin(), w.q_proj.end());
        qkv.insert(qkv.end(), w.k_proj.begin(), w.k_proj.end());
        qkv.insert(qkv.end(), w.v_proj.begin(), w.v_proj.end());
        DeviceAttentionWeights a;
        ASSIGN_OR_RETURN(a.qkv_proj, up.Derived(qkv, "attention qkv_proj"));
        ASSIGN_OR_RETURN(a.o_proj, up.Constant(w.o_proj, "attention o_proj"));
        d.mixer = a;
        break;
      }
      case LayerKind::kMlp: {
        const MlpLayerWeights& w = layer.mlp();
        DeviceMlpWeights m;
        ASSIGN_OR_RETURN(m.up_proj, up.Constant(w.up_proj, "mlp up_proj"));
        ASSIGN_OR_RETURN(m.up_proj_bias, up.Constant(w.up_proj_bias, "mlp up_proj bias"));
        ASSIGN_OR_RETURN(m.down_proj, up.Constant(w.down_proj, "mlp down_proj"));
        ASSIGN_OR_RETURN(m.down_proj_bias, up.Constant(w.down_proj_bias, "mlp down_proj bias"));
        d.mixer = m;
        break;
      }
    }
    out->layers_.push_back(d);
  }
  return out;
}

}  // namespace hybridserve::engine
