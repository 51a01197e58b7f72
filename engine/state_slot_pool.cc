#include "engine/state_slot_pool.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace hybridserve::engine {
namespace {

constexpr double kMaxFloatsPerLayer = static_cast<double>(int64_t{1} << 40);

}  // namespace

absl::StatusOr<std::unique_ptr<StateSlotPool>> StateSlotPool::Create(const StateSlotPoolOptions& options,
                                                                     kernels::Backend& backend) {
  if (options.num_layers < 0) {
    return absl::InvalidArgumentError(absl::StrCat("state slot pool: num_layers ", options.num_layers, " < 0"));
  }
  if (options.num_slots < 1 || options.num_slots > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("state slot pool: num_slots ", options.num_slots, " outside [1, 2^31 - 1]"));
  }
  kernels::DeviceBuffer storage;
  if (options.num_layers > 0) {
    if (options.n_heads < 1 || options.head_dim < 1 || options.d_state < 1 || options.conv_dim < 1 ||
        options.d_conv < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "state slot pool: n_heads ", options.n_heads, ", head_dim ", options.head_dim, ", d_state ", options.d_state,
          ", conv_dim ", options.conv_dim, " and d_conv ", options.d_conv, " must be >= 1"));
    }
    const double slots = static_cast<double>(options.num_slots);
    const double ssm = slots * static_cast<double>(options.n_heads) * static_cast<double>(options.head_dim) *
                       static_cast<double>(options.d_state);
    const double conv = slots * static_cast<double>(options.conv_dim) * static_cast<double>(options.d_conv);
    if (ssm > kMaxFloatsPerLayer || conv > kMaxFloatsPerLayer) {
      return absl::InvalidArgumentError(
          absl::StrCat("state slot pool: ", options.num_slots, " slots exceed 2^40 floats per layer"));
    }
    const int64_t floats =
        options.num_layers * options.num_slots *
        (options.n_heads * options.head_dim * options.d_state + options.conv_dim * (options.d_conv - 1));
    const int64_t bytes = floats * static_cast<int64_t>(sizeof(float));
    const int status = bytes > 0 ? backend.Allocate(bytes, &storage) : kernels::kKernelOk;
    if (status != kernels::kKernelOk) {
      return absl::ResourceExhaustedError(
          absl::StrCat("state slot pool: the ", backend.name(), " backend cannot allocate ", bytes, " bytes for ",
                       options.num_slots, " slots (", kernels::KernelStatusName(status), ")"));
    }
  }
  return std::unique_ptr<StateSlotPool>(new StateSlotPool(options, backend, std::move(storage)));
}

StateSlotPool::StateSlotPool(const StateSlotPoolOptions& options, kernels::Backend& backend,
                             kernels::DeviceBuffer storage)
    : options_(options),
      backend_(backend),
      storage_(std::move(storage)),
      allocated_(static_cast<size_t>(options.num_slots), false) {
  free_.reserve(static_cast<size_t>(options.num_slots));
  for (int64_t s = options.num_slots - 1; s >= 0; --s) free_.push_back(static_cast<int32_t>(s));
}

int32_t StateSlotPool::Take() {
  const int32_t slot = free_.back();
  free_.pop_back();
  allocated_[static_cast<size_t>(slot)] = true;
  return slot;
}

absl::StatusOr<int32_t> StateSlotPool::Allocate() {
  if (free_.empty()) {
    return absl::ResourceExhaustedError(absl::StrCat("out of sequence state slots: all ", num_slots(), " are in use"));
  }
  const int32_t slot = Take();
  const auto float_bytes = static_cast<int64_t>(sizeof(float));
  for (int64_t l = 0; l < num_layers(); ++l) {
    // Fills of memory this pool allocated, with valid sizes: they cannot fail.
    backend_.Fill(ssm(l, slot), 0, ssm_floats() * float_bytes);
    if (conv_floats() > 0) backend_.Fill(conv(l, slot), 0, conv_floats() * float_bytes);
  }
  return slot;
}

absl::StatusOr<int32_t> StateSlotPool::AllocateCopyOf(int32_t source) {
  if (!IsAllocated(source)) {
    return absl::InvalidArgumentError(
        absl::StrCat("state slot pool: slot ", source, " is not allocated (", num_slots(), " slots)"));
  }
  if (free_.empty()) {
    return absl::ResourceExhaustedError(absl::StrCat("out of sequence state slots: all ", num_slots(), " are in use"));
  }
  const int32_t slot = Take();
  const auto float_bytes = static_cast<int64_t>(sizeof(float));
  for (int64_t l = 0; l < num_layers(); ++l) {
    backend_.CopyOnDevice(ssm(l, slot), ssm(l, source), ssm_floats() * float_bytes);
    if (conv_floats() > 0) backend_.CopyOnDevice(conv(l, slot), conv(l, source), conv_floats() * float_bytes);
  }
  return slot;
}

absl::Status StateSlotPool::Free(int32_t slot) {
  if (!IsAllocated(slot)) {
    return absl::InvalidArgumentError(
        absl::StrCat("state slot pool: slot ", slot, " is not allocated (", num_slots(), " slots)"));
  }
  allocated_[static_cast<size_t>(slot)] = false;
  free_.push_back(slot);
  return absl::OkStatus();
}

bool StateSlotPool::IsAllocated(int32_t slot) const {
  return slot >= 0 && slot < num_slots() && allocated_[static_cast<size_t>(slot)];
}

}  // namespace hybridserve::engine
