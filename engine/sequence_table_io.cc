// SequenceTable: the movement of state bytes between host memory and the
// device pools (capture, restore, page export and import writes, state
// encoding). Bookkeeping is in sequence_table.cc.

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/backend_registry.h"
#include "engine/page_format.h"
#include "engine/sequence_table.h"

namespace hybridserve::engine {
namespace {

constexpr int64_t kFloatBytes = static_cast<int64_t>(sizeof(float));

absl::Span<const uint8_t> Bytes(absl::Span<const float> v) {
  return absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(float));
}

}  // namespace

SequenceTable::StateBytes SequenceTable::BytesOf(const SequenceState& state) {
  StateBytes b;
  b.position = state.position;
  for (const auto& a : state.ssm_states) b.ssm_states.push_back(Bytes(a));
  for (const auto& a : state.conv_states) b.conv_states.push_back(Bytes(a));
  for (const auto& a : state.tail_k) b.tail_k.push_back(Bytes(a));
  for (const auto& a : state.tail_v) b.tail_v.push_back(Bytes(a));
  b.last_logits = Bytes(state.last_logits);
  return b;
}

SequenceTable::StateBytes SequenceTable::BytesOf(const SnapshotView& view) {
  StateBytes b;
  b.position = view.position;
  b.ssm_states = view.ssm_states;
  b.conv_states = view.conv_states;
  b.tail_k = view.tail_k;
  b.tail_v = view.tail_v;
  b.last_logits = view.last_logits;
  return b;
}

absl::Status SequenceTable::CopyToHost(void* dst, const void* src, int64_t bytes) const {
  return KernelStatusToStatus(backend_.CopyToHost(dst, src, bytes), "copying state to the host");
}

absl::Status SequenceTable::WritePage(int32_t page, absl::string_view bytes) {
  const int64_t half = layout_.page_kv_floats() * kFloatBytes;
  for (int64_t l = 0; l < layout_.attention_layers; ++l) {
    RETURN_IF_ERROR(KernelStatusToStatus(
        backend_.CopyToDevice(kv_pages_->k_page(l, page), bytes.data() + PageKOffset(layout_, l), half), "page K"));
    RETURN_IF_ERROR(KernelStatusToStatus(
        backend_.CopyToDevice(kv_pages_->v_page(l, page), bytes.data() + PageVOffset(layout_, l), half), "page V"));
  }
  return absl::OkStatus();
}

absl::Status SequenceTable::WriteState(Sequence& seq, const StateBytes& state) {
  for (int64_t l = 0; l < layout_.mamba_layers; ++l) {
    const auto& ssm = state.ssm_states[static_cast<size_t>(l)];
    const auto& conv = state.conv_states[static_cast<size_t>(l)];
    RETURN_IF_ERROR(KernelStatusToStatus(
        backend_.CopyToDevice(state_slots_->ssm(l, seq.slot), ssm.data(), static_cast<int64_t>(ssm.size())),
        "SSM state"));
    RETURN_IF_ERROR(KernelStatusToStatus(
        backend_.CopyToDevice(state_slots_->conv(l, seq.slot), conv.data(), static_cast<int64_t>(conv.size())),
        "conv state"));
  }
  if (layout_.tail_tokens(state.position) > 0 && layout_.attention_layers > 0) {
    const int32_t page = seq.block_table[static_cast<size_t>(layout_.full_pages(state.position))];
    for (int64_t l = 0; l < layout_.attention_layers; ++l) {
      const auto& k = state.tail_k[static_cast<size_t>(l)];
      const auto& v = state.tail_v[static_cast<size_t>(l)];
      RETURN_IF_ERROR(KernelStatusToStatus(
          backend_.CopyToDevice(kv_pages_->k_page(l, page), k.data(), static_cast<int64_t>(k.size())), "tail K"));
      RETURN_IF_ERROR(KernelStatusToStatus(
          backend_.CopyToDevice(kv_pages_->v_page(l, page), v.data(), static_cast<int64_t>(v.size())), "tail V"));
    }
  }
  seq.last_logits.resize(state.last_logits.size() / sizeof(float));
  if (!state.last_logits.empty())
    std::memcpy(seq.last_logits.data(), state.last_logits.data(), state.last_logits.size());
  seq.position = state.position;
  return absl::OkStatus();
}

absl::Status SequenceTable::CheckView(const SnapshotView& view) const {
  if (view.layout != layout_) {
    return absl::InvalidArgumentError(
        absl::StrCat("snapshot of another layout: ", StateLayout::Mismatch(layout_, view.layout)));
  }
  return absl::OkStatus();
}

absl::Status SequenceTable::CheckPages(int64_t position, absl::Span<const absl::string_view> pages) const {
  const int64_t full = layout_.full_pages(position);
  const bool pageless = layout_.attention_layers == 0 && pages.empty();
  if (!pageless && static_cast<int64_t>(pages.size()) != full) {
    return absl::InvalidArgumentError(
        absl::StrCat("restore at position ", position, " needs ", full, " full pages, got ", pages.size()));
  }
  for (size_t i = 0; i < pages.size(); ++i) {
    if (static_cast<int64_t>(pages[i].size()) != layout_.page_bytes()) {
      return absl::InvalidArgumentError(
          absl::StrCat("page ", i, " has ", pages[i].size(), " bytes, expected ", layout_.page_bytes()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<SequenceTable::Sequence*> SequenceTable::FindRestoreTarget(SequenceId id, int64_t position) {
  ASSIGN_OR_RETURN(Sequence * seq, FindLive(id));
  if (seq->position != 0 || !seq->block_table.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("restore into sequence ", id, " at position ", seq->position, ": only an empty sequence"));
  }
  if (position < 0 || position > kMaxSequenceTokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("sequence state: position ", position, " outside [0, ", kMaxSequenceTokens, "]"));
  }
  return seq;
}

absl::Status SequenceTable::RestoreImpl(SequenceId id, const StateBytes& state,
                                        absl::Span<const absl::string_view> pages) {
  ASSIGN_OR_RETURN(Sequence * seq, FindRestoreTarget(id, state.position));
  const int64_t p = state.position;
  RETURN_IF_ERROR(CheckPages(p, pages));
  RETURN_IF_ERROR(EnsurePages(*seq, p));
  if (layout_.attention_layers > 0) {
    for (size_t i = 0; i < pages.size(); ++i) RETURN_IF_ERROR(WritePage(seq->block_table[i], pages[i]));
  }
  return WriteState(*seq, state);
}

absl::Status SequenceTable::Restore(SequenceId id, const SequenceState& state,
                                    absl::Span<const absl::string_view> pages) {
  RETURN_IF_ERROR(FindLive(id).status());
  RETURN_IF_ERROR(layout_.CheckState(state));
  return RestoreImpl(id, BytesOf(state), pages);
}

absl::Status SequenceTable::Restore(SequenceId id, const SnapshotView& state,
                                    absl::Span<const absl::string_view> pages) {
  RETURN_IF_ERROR(FindLive(id).status());
  RETURN_IF_ERROR(CheckView(state));
  return RestoreImpl(id, BytesOf(state), pages);
}

absl::StatusOr<std::vector<std::vector<absl::Span<char>>>> SequenceTable::BeginRestoreInPlace(SequenceId id,
                                                                                              int64_t position) {
  ASSIGN_OR_RETURN(Sequence * seq, FindRestoreTarget(id, position));
  RETURN_IF_ERROR(EnsurePages(*seq, position));
  const int64_t full = layout_.attention_layers > 0 ? layout_.full_pages(position) : 0;
  std::vector<std::vector<absl::Span<char>>> pages(static_cast<size_t>(full));
  for (int64_t i = 0; i < full; ++i) {
    absl::StatusOr<std::vector<absl::Span<char>>> spans =
        HostSpansOf(seq->block_table[static_cast<size_t>(i)], "use Restore");
    if (!spans.ok()) {
      DropPages(*seq);
      return spans.status();
    }
    pages[static_cast<size_t>(i)] = *std::move(spans);
  }
  seq->restoring = position;
  return pages;
}

absl::StatusOr<std::vector<std::vector<absl::Span<char>>>> SequenceTable::ImportPageHostViews(SequenceId id,
                                                                                              int64_t pages) const {
  ASSIGN_OR_RETURN(const Sequence* seq, Find(id));
  if (!seq->importing) return absl::FailedPreconditionError(absl::StrCat("sequence ", id, " is not importing"));
  const int64_t full = static_cast<int64_t>(seq->page_arrived.size());
  if (pages < 0 || pages > full) {
    return absl::InvalidArgumentError(
        absl::StrCat("sequence ", id, " imports ", full, " full pages, ", pages, " asked for"));
  }
  // As ImportPageRegions: work queued on the slots lands before the reader's writes.
  RETURN_IF_ERROR(KernelStatusToStatus(backend_.Synchronize(), "synchronize"));
  std::vector<std::vector<absl::Span<char>>> views(static_cast<size_t>(pages));
  for (int64_t i = 0; i < pages; ++i) {
    ASSIGN_OR_RETURN(const int32_t page, ImportingPage(id, i, /*must_be_new=*/true));
    ASSIGN_OR_RETURN(views[static_cast<size_t>(i)],
                     HostSpansOf(page, "import its pages with ImportPage or ImportPageRegions"));
  }
  return views;
}

absl::StatusOr<SequenceTable::Sequence*> SequenceTable::FindRestoring(SequenceId id) {
  ASSIGN_OR_RETURN(Sequence * seq, FindAny(id));
  if (seq->restoring < 0) {
    return absl::FailedPreconditionError(absl::StrCat("sequence ", id, " is not restoring in place"));
  }
  return seq;
}

absl::Status SequenceTable::FinishRestoreInPlace(SequenceId id, const SnapshotView& state) {
  ASSIGN_OR_RETURN(Sequence * seq, FindRestoring(id));
  RETURN_IF_ERROR(CheckView(state));
  if (state.position != seq->restoring) {
    return absl::InvalidArgumentError(absl::StrCat("sequence ", id, " is restoring pages of position ", seq->restoring,
                                                   ", not a state at ", state.position));
  }
  seq->restoring = -1;
  absl::Status written = WriteState(*seq, BytesOf(state));
  if (!written.ok()) DropPages(*seq);  // empty again, as AbortRestoreInPlace leaves it
  return written;
}

absl::Status SequenceTable::AbortRestoreInPlace(SequenceId id) {
  ASSIGN_OR_RETURN(Sequence * seq, FindRestoring(id));
  DropPages(*seq);
  seq->restoring = -1;
  return absl::OkStatus();
}

absl::Status SequenceTable::FinishImport(SequenceId id, const SequenceState& state) {
  RETURN_IF_ERROR(FindAny(id).status());
  RETURN_IF_ERROR(layout_.CheckState(state));
  return FinishImportImpl(id, BytesOf(state));
}

absl::Status SequenceTable::FinishImport(SequenceId id, const SnapshotView& state) {
  RETURN_IF_ERROR(FindAny(id).status());
  RETURN_IF_ERROR(CheckView(state));
  return FinishImportImpl(id, BytesOf(state));
}

absl::Status SequenceTable::ExportPageInto(SequenceId id, int64_t page_index, absl::Span<char> out) const {
  ASSIGN_OR_RETURN(const Sequence* seq, FindLiveConst(id));
  const int64_t full = layout_.full_pages(seq->position);
  if (page_index < 0 || page_index >= full) {
    return absl::OutOfRangeError(absl::StrCat("page ", page_index, " of sequence ", id, " is not full (position ",
                                              seq->position, ", page_size ", layout_.page_size, ")"));
  }
  if (layout_.attention_layers == 0) {
    if (!out.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("page buffer has ", out.size(), " bytes, a page has 0"));
    }
    return absl::OkStatus();
  }
  return ReadPage(seq->block_table[static_cast<size_t>(page_index)], out);
}

absl::Status SequenceTable::ReadPage(int32_t page, absl::Span<char> out) const {
  if (static_cast<int64_t>(out.size()) != layout_.page_bytes()) {
    return absl::InvalidArgumentError(
        absl::StrCat("page buffer has ", out.size(), " bytes, a page has ", layout_.page_bytes()));
  }
  const int64_t half = layout_.page_kv_floats() * kFloatBytes;
  for (int64_t l = 0; l < layout_.attention_layers; ++l) {
    RETURN_IF_ERROR(CopyToHost(out.data() + PageKOffset(layout_, l), kv_pages_->k_page(l, page), half));
    RETURN_IF_ERROR(CopyToHost(out.data() + PageVOffset(layout_, l), kv_pages_->v_page(l, page), half));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<absl::Span<char>>> SequenceTable::HostSpansOf(int32_t page,
                                                                         absl::string_view instead) const {
  std::vector<absl::Span<char>> spans;
  for (const PageRegion& r : RegionsOf(page)) {
    void* host = backend_.HostAddress(r.data);
    if (host == nullptr) {
      return absl::UnimplementedError(
          absl::StrCat("the ", backend_.name(), " backend's memory is not host-addressable: ", instead));
    }
    spans.emplace_back(static_cast<char*>(host), static_cast<size_t>(r.bytes));
  }
  return spans;
}

std::vector<PageRegion> SequenceTable::RegionsOf(int32_t page) const {
  const int64_t half = layout_.page_kv_floats() * kFloatBytes;
  std::vector<PageRegion> regions;
  regions.reserve(static_cast<size_t>(2 * layout_.attention_layers));
  for (int64_t l = 0; l < layout_.attention_layers; ++l) {
    // The wire order of engine/page_format.h: K at PageKOffset, V at PageVOffset.
    regions.push_back(PageRegion{const_cast<float*>(kv_pages_->k_page(l, page)), half});
    regions.push_back(PageRegion{const_cast<float*>(kv_pages_->v_page(l, page)), half});
  }
  return regions;
}

absl::StatusOr<std::vector<PageRegion>> SequenceTable::ExportPageRegions(SequenceId id, int64_t page_index) const {
  ASSIGN_OR_RETURN(const Sequence* seq, FindLiveConst(id));
  const int64_t full = layout_.full_pages(seq->position);
  if (page_index < 0 || page_index >= full) {
    return absl::OutOfRangeError(absl::StrCat("page ", page_index, " of sequence ", id, " is not full (position ",
                                              seq->position, ", page_size ", layout_.page_size, ")"));
  }
  if (layout_.attention_layers == 0) return std::vector<PageRegion>();
  RETURN_IF_ERROR(KernelStatusToStatus(backend_.Synchronize(), "synchronize"));
  return RegionsOf(seq->block_table[static_cast<size_t>(page_index)]);
}

absl::StatusOr<std::string> SequenceTable::ExportPage(SequenceId id, int64_t page_index) const {
  std::string out(static_cast<size_t>(layout_.page_bytes()), '\0');
  RETURN_IF_ERROR(ExportPageInto(id, page_index, absl::MakeSpan(out)));
  return out;
}

absl::StatusOr<PageView> SequenceTable::PageViews(SequenceId id, int64_t page_index) const {
  ASSIGN_OR_RETURN(const Sequence* seq, FindLiveConst(id));
  const int64_t full = layout_.full_pages(seq->position);
  if (page_index < 0 || page_index >= full) {
    return absl::OutOfRangeError(absl::StrCat("page ", page_index, " of sequence ", id, " is not full (position ",
                                              seq->position, ", page_size ", layout_.page_size, ")"));
  }
  PageView view;
  if (layout_.attention_layers == 0) return view;
  RETURN_IF_ERROR(KernelStatusToStatus(backend_.Synchronize(), "synchronize"));
  const int32_t page = seq->block_table[static_cast<size_t>(page_index)];
  const size_t half = static_cast<size_t>(layout_.page_kv_floats() * kFloatBytes);
  for (int64_t l = 0; l < layout_.attention_layers; ++l) {
    const void* k = backend_.HostAddress(const_cast<float*>(kv_pages_->k_page(l, page)));
    const void* v = backend_.HostAddress(const_cast<float*>(kv_pages_->v_page(l, page)));
    if (k == nullptr || v == nullptr) {
      return absl::UnimplementedError(
          absl::StrCat("the ", backend_.name(), " backend's memory is not host-addressable: use ExportPageInto"));
    }
    view.k.emplace_back(static_cast<const char*>(k), half);
    view.v.emplace_back(static_cast<const char*>(v), half);
  }
  return view;
}

absl::StatusOr<SequenceState> SequenceTable::CaptureState(SequenceId id, bool with_logits) const {
  ASSIGN_OR_RETURN(const Sequence* seq, FindLiveConst(id));
  SequenceState state;
  state.position = seq->position;
  const int64_t n = layout_.mamba_layers;
  state.ssm_states.resize(static_cast<size_t>(n));
  state.conv_states.resize(static_cast<size_t>(n));
  for (int64_t l = 0; l < n; ++l) {
    auto& ssm = state.ssm_states[static_cast<size_t>(l)];
    auto& conv = state.conv_states[static_cast<size_t>(l)];
    ssm.resize(static_cast<size_t>(layout_.ssm_state_floats()));
    conv.resize(static_cast<size_t>(layout_.conv_state_floats()));
    RETURN_IF_ERROR(CopyToHost(ssm.data(), state_slots_->ssm(l, seq->slot), layout_.ssm_state_floats() * kFloatBytes));
    RETURN_IF_ERROR(
        CopyToHost(conv.data(), state_slots_->conv(l, seq->slot), layout_.conv_state_floats() * kFloatBytes));
  }
  state.tail_k.resize(static_cast<size_t>(layout_.attention_layers));
  state.tail_v.resize(static_cast<size_t>(layout_.attention_layers));
  const int64_t tail_floats = layout_.tail_kv_floats(seq->position);
  if (tail_floats > 0) {
    const int32_t page = seq->block_table[static_cast<size_t>(layout_.full_pages(seq->position))];
    for (int64_t l = 0; l < layout_.attention_layers; ++l) {
      auto& k = state.tail_k[static_cast<size_t>(l)];
      auto& v = state.tail_v[static_cast<size_t>(l)];
      k.resize(static_cast<size_t>(tail_floats));
      v.resize(static_cast<size_t>(tail_floats));
      RETURN_IF_ERROR(CopyToHost(k.data(), kv_pages_->k_page(l, page), tail_floats * kFloatBytes));
      RETURN_IF_ERROR(CopyToHost(v.data(), kv_pages_->v_page(l, page), tail_floats * kFloatBytes));
    }
  }
  if (with_logits) state.last_logits = seq->last_logits;
  return state;
}

absl::StatusOr<StateArrays> SequenceTable::StateViews(SequenceId id, bool with_logits) const {
  ASSIGN_OR_RETURN(const Sequence* seq, FindLiveConst(id));
  RETURN_IF_ERROR(KernelStatusToStatus(backend_.Synchronize(), "synchronize"));
  StateArrays a;
  a.position = seq->position;
  if (with_logits) a.last_logits = seq->last_logits;
  bool addressable = true;
  auto host = [&](const float* device, int64_t floats) -> absl::Span<const float> {
    if (floats == 0) return {};
    const void* p = backend_.HostAddress(const_cast<float*>(device));
    if (p == nullptr) addressable = false;
    return absl::Span<const float>(static_cast<const float*>(p), static_cast<size_t>(floats));
  };
  for (int64_t l = 0; l < layout_.mamba_layers; ++l) {
    a.ssm_states.push_back(host(state_slots_->ssm(l, seq->slot), layout_.ssm_state_floats()));
    a.conv_states.push_back(host(state_slots_->conv(l, seq->slot), layout_.conv_state_floats()));
  }
  const int64_t tail_floats = layout_.tail_kv_floats(seq->position);
  for (int64_t l = 0; l < layout_.attention_layers; ++l) {
    if (tail_floats == 0) {
      a.tail_k.emplace_back();
      a.tail_v.emplace_back();
      continue;
    }
    const int32_t page = seq->block_table[static_cast<size_t>(layout_.full_pages(seq->position))];
    a.tail_k.push_back(host(kv_pages_->k_page(l, page), tail_floats));
    a.tail_v.push_back(host(kv_pages_->v_page(l, page), tail_floats));
  }
  if (!addressable) {
    return absl::UnimplementedError(
        absl::StrCat("the ", backend_.name(), " backend's memory is not host-addressable: use CaptureState"));
  }
  return a;
}

absl::StatusOr<SnapshotSource> SequenceTable::EncodingSource(SequenceId id, bool with_logits,
                                                             const common::Hash128& fingerprint,
                                                             const common::Hash128& prefix_hash,
                                                             SequenceState* staging) const {
  SnapshotSource source;
  source.model_fingerprint = fingerprint;
  source.prefix_hash = prefix_hash;
  source.layout = layout_;
  absl::StatusOr<StateArrays> views = StateViews(id, with_logits);
  if (views.ok()) {
    source.arrays = *std::move(views);
    return source;
  }
  if (views.status().code() != absl::StatusCode::kUnimplemented) return views.status();
  ASSIGN_OR_RETURN(*staging, CaptureState(id, with_logits));
  source.arrays = StateArrays::Of(*staging);
  return source;
}

absl::Status SequenceTable::EncodeStateInto(SequenceId id, bool with_logits, const common::Hash128& model_fingerprint,
                                            const common::Hash128& prefix_hash, std::string* out) const {
  SequenceState staging;
  ASSIGN_OR_RETURN(const SnapshotSource source,
                   EncodingSource(id, with_logits, model_fingerprint, prefix_hash, &staging));
  return EncodeSnapshotInto(source, out);
}

absl::Status SequenceTable::EncodeStateInto(SequenceId id, bool with_logits, const common::Hash128& model_fingerprint,
                                            const common::Hash128& prefix_hash, absl::Span<char> out) const {
  SequenceState staging;
  ASSIGN_OR_RETURN(const SnapshotSource source,
                   EncodingSource(id, with_logits, model_fingerprint, prefix_hash, &staging));
  return EncodeSnapshotToBuffer(source, out);
}

absl::StatusOr<size_t> SequenceTable::EncodedStateSize(SequenceId id, bool with_logits) const {
  ASSIGN_OR_RETURN(const Sequence* seq, FindLiveConst(id));
  return EncodedSnapshotSize(layout_, seq->position, with_logits && !seq->last_logits.empty());
}

}  // namespace hybridserve::engine
