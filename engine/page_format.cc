#include "engine/page_format.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace hybridserve::engine {

common::Hash128 PageFormatFingerprint(const StateLayout& layout) {
  const common::Hash128 fields = layout.Fingerprint();
  const uint32_t version = kPageFormatVersion;
  return common::HashChain(fields, &version, sizeof(version));
}

absl::Status CheckPageFormat(const StateLayout& receiver, const StateLayout& sender) {
  const std::string mismatch = StateLayout::Mismatch(receiver, sender);
  if (mismatch.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("page from another layout: ", mismatch));
}

}  // namespace hybridserve::engine
