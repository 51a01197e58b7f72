#ifndef HYBRIDSERVE_ENGINE_PAGE_FORMAT_H_
#define HYBRIDSERVE_ENGINE_PAGE_FORMAT_H_

// The page wire format: the bytes of one full KV page as the cachestore keeps
// them and the data plane moves them (SequenceTable::ExportPageInto writes
// them, ImportPage and Restore read them).
//
// Version 1. For each attention layer in model order, K then V of the page's
// page_size tokens, each [page_size, kv_heads, kv_head_dim] fp32 (IEEE-754
// binary32, little-endian, row-major), back to back with no header or
// padding:
//
//   offset of layer l's K = l * 2 * page_kv_bytes
//   offset of layer l's V = (l * 2 + 1) * page_kv_bytes
//   page_kv_bytes = page_size * kv_heads * kv_head_dim * 4
//   page bytes    = attention_layers * 2 * page_kv_bytes  (StateLayout::page_bytes)
//
// A page carries no header: what it is is named where it travels. In the
// cachestore its key's namespace covers the model fingerprint and the page
// size; on the data plane the transfer ticket carries PageFormatFingerprint
// of the receiver's layout, and the sender refuses to send into another
// layout (CheckPageFormat names the fields that differ). The state that
// completes a transfer (a snapshot, engine/snapshot_codec.h) carries the full
// layout and is checked field by field on import.

#include <cstdint>

#include "absl/status/status.h"
#include "common/hash.h"
#include "engine/state_layout.h"

namespace hybridserve::engine {

inline constexpr uint32_t kPageFormatVersion = 1;

// Byte offsets of layer `layer`'s K and V inside a page of `layout`.
inline int64_t PageKOffset(const StateLayout& layout, int64_t layer) {
  return layer * 2 * layout.page_kv_floats() * static_cast<int64_t>(sizeof(float));
}
inline int64_t PageVOffset(const StateLayout& layout, int64_t layer) {
  return PageKOffset(layout, layer) + layout.page_kv_floats() * static_cast<int64_t>(sizeof(float));
}

// Identifies the page format of a layout: kPageFormatVersion and every layout
// field (StateLayout::Fingerprint covers them). Equal fingerprints, the same
// page bytes mean the same thing.
common::Hash128 PageFormatFingerprint(const StateLayout& layout);

// OK when pages of `sender` can be imported by `receiver`; INVALID_ARGUMENT
// naming every field that differs otherwise ("page from another layout:
// page_size 32 (expected 16)").
absl::Status CheckPageFormat(const StateLayout& receiver, const StateLayout& sender);

}  // namespace hybridserve::engine

#endif  // HYBRIDSERVE_ENGINE_PAGE_FORMAT_H_
