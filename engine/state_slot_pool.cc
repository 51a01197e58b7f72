#include "engine/state_slot_pool.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace hybridserve::engine {
namespace {

constexpr double kMaxFloatsPerLayer = static_cast<double>(int64_t{1} << 40);

}  // namespace

absl::StatusOr<std::unique_ptr<StateSlotPool>> StateSlotPool::Create(const StateSlotPoolOptions& options) {
  if (options.num_layers < 0) {
    return absl::InvalidArgumentError(absl::StrCat("state slot pool: num_layers ", options.num_layers, " < 0"));
  }
  if (options.num_slots < 1 || options.num_slots > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("state slot pool: num_slots ", options.num_slots, " outside [1, 2^31 - 1]"));
  }
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
  }
  return std::unique_ptr<StateSlotPool>(new StateSlotPool(options));
}

StateSlotPool::StateSlotPool(const StateSlotPoolOptions& options)
    : options_(options), allocated_(static_cast<size_t>(options.num_slots), false) {
  const size_t n = static_cast<size_t>(options.num_layers);
  ssm_.assign(n, std::vector<float>(static_cast<size_t>(options.num_slots * ssm_floats()), 0.0f));
  conv_.assign(n, std::vector<float>(static_cast<size_t>(options.num_slots * conv_floats()), 0.0f));
  free_.reserve(static_cast<size_t>(options.num_slots));
  for (int64_t s = options.num_slots - 1; s >= 0; --s) free_.push_back(static_cast<int32_t>(s));
}

absl::StatusOr<int32_t> StateSlotPool::Allocate() {
  if (free_.empty()) {
    return absl::ResourceExhaustedError(absl::StrCat("out of sequence state slots: all ", num_slots(), " are in use"));
  }
  const int32_t slot = free_.back();
  free_.pop_back();
  allocated_[static_cast<size_t>(slot)] = true;
  for (int64_t l = 0; l < num_layers(); ++l) {
    std::fill_n(ssm(l, slot), ssm_floats(), 0.0f);
    std::fill_n(conv(l, slot), conv_floats(), 0.0f);
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
