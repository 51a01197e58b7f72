// SequenceTable: lifecycle, page reservation, fork and import bookkeeping.
// The movement of state bytes (capture, restore, export, import writes) is in
// sequence_table_io.cc.

#include "engine/sequence_table.h"

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "engine/backend_registry.h"
#include "engine/page_format.h"

namespace hybridserve::engine {

absl::StatusOr<std::unique_ptr<SequenceTable>> SequenceTable::Create(const SequenceTableOptions& options,
                                                                     kernels::Backend& backend) {
  const StateLayout& l = options.layout;
  RETURN_IF_ERROR(l.Validate());
  if (options.max_pages < 1) return absl::InvalidArgumentError(absl::StrCat("max_pages ", options.max_pages, " < 1"));
  if (options.max_sequences < 1) {
    return absl::InvalidArgumentError(absl::StrCat("max_sequences ", options.max_sequences, " < 1"));
  }
  KvPagePoolOptions kv;
  kv.num_layers = l.attention_layers;
  kv.num_pages = options.max_pages;
  kv.page_size = l.page_size;
  kv.n_kv_heads = l.kv_heads;
  kv.head_dim = l.kv_head_dim;
  ASSIGN_OR_RETURN(std::unique_ptr<KvPagePool> kv_pages, KvPagePool::Create(kv, backend));

  StateSlotPoolOptions ss;
  ss.num_layers = l.mamba_layers;
  ss.num_slots = options.max_sequences;
  ss.n_heads = l.ssm_heads;
  ss.head_dim = l.ssm_head_dim;
  ss.d_state = l.ssm_state;
  ss.conv_dim = l.conv_dim;
  ss.d_conv = l.conv_kernel;
  ASSIGN_OR_RETURN(std::unique_ptr<StateSlotPool> state_slots, StateSlotPool::Create(ss, backend));
  return std::unique_ptr<SequenceTable>(new SequenceTable(l, backend, std::move(kv_pages), std::move(state_slots)));
}

SequenceTable::SequenceTable(const StateLayout& layout, kernels::Backend& backend, std::unique_ptr<KvPagePool> kv_pages,
                             std::unique_ptr<StateSlotPool> state_slots)
    : layout_(layout), backend_(backend), kv_pages_(std::move(kv_pages)), state_slots_(std::move(state_slots)) {}

SequenceTable::~SequenceTable() = default;

absl::StatusOr<SequenceTable::Sequence*> SequenceTable::FindAny(SequenceId id) {
  auto it = sequences_.find(id);
  if (it == sequences_.end()) return absl::NotFoundError(absl::StrCat("unknown sequence id ", id));
  return &it->second;
}

absl::StatusOr<const SequenceTable::Sequence*> SequenceTable::Find(SequenceId id) const {
  auto it = sequences_.find(id);
  if (it == sequences_.end()) return absl::NotFoundError(absl::StrCat("unknown sequence id ", id));
  return &it->second;
}

absl::StatusOr<const SequenceTable::Sequence*> SequenceTable::FindLiveConst(SequenceId id) const {
  ASSIGN_OR_RETURN(const Sequence* seq, Find(id));
  if (seq->importing) {
    return absl::FailedPreconditionError(absl::StrCat("sequence ", id, " is still importing its state"));
  }
  if (seq->restoring >= 0) {
    return absl::FailedPreconditionError(absl::StrCat("sequence ", id, " is still restoring its pages in place"));
  }
  return seq;
}

absl::StatusOr<SequenceTable::Sequence*> SequenceTable::FindLive(SequenceId id) {
  ASSIGN_OR_RETURN(const Sequence* seq, FindLiveConst(id));
  return const_cast<Sequence*>(seq);
}

absl::StatusOr<int64_t> SequenceTable::Position(SequenceId id) const {
  ASSIGN_OR_RETURN(const Sequence* seq, FindLiveConst(id));
  return seq->position;
}

absl::StatusOr<SequenceId> SequenceTable::New() {
  ASSIGN_OR_RETURN(int32_t slot, state_slots_->Allocate());
  const SequenceId id = next_id_++;
  sequences_[id].slot = slot;
  return id;
}

void SequenceTable::FreeResources(const Sequence& seq) {
  // The table allocated what it frees: these cannot fail.
  const absl::Status pages = kv_pages_->Free(seq.block_table);
  const absl::Status slot = state_slots_->Free(seq.slot);
  DCHECK(pages.ok() && slot.ok()) << pages << " " << slot;
}

void SequenceTable::DropPages(Sequence& seq) {
  const absl::Status pages = kv_pages_->Free(seq.block_table);
  DCHECK(pages.ok()) << pages;
  seq.block_table.clear();
}

absl::Status SequenceTable::Release(SequenceId id) {
  ASSIGN_OR_RETURN(Sequence * seq, FindAny(id));
  FreeResources(*seq);
  sequences_.erase(id);
  return absl::OkStatus();
}

absl::Status SequenceTable::EnsurePages(Sequence& seq, int64_t positions) {
  const int64_t need = PagesFor(positions) - static_cast<int64_t>(seq.block_table.size());
  if (need <= 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(std::vector<int32_t> pages, kv_pages_->Allocate(need));
  seq.block_table.insert(seq.block_table.end(), pages.begin(), pages.end());
  return absl::OkStatus();
}

absl::Status SequenceTable::ReservePages(SequenceId id, int64_t positions) {
  ASSIGN_OR_RETURN(Sequence * seq, FindAny(id));
  if (positions < 0 || positions > kMaxSequenceTokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot reserve pages for ", positions, " tokens: outside [0, ", kMaxSequenceTokens, "]"));
  }
  return EnsurePages(*seq, positions);
}

absl::StatusOr<SequenceId> SequenceTable::Fork(SequenceId parent_id) {
  ASSIGN_OR_RETURN(const Sequence* parent, FindLiveConst(parent_id));
  const int64_t full = layout_.attention_layers > 0 ? layout_.full_pages(parent->position) : 0;
  const bool partial = PagesFor(parent->position) > full;
  // Take the new slot and the partial page's copy first: both can fail.
  ASSIGN_OR_RETURN(int32_t slot, state_slots_->AllocateCopyOf(parent->slot));
  std::vector<int32_t> tail_page;
  if (partial) {
    absl::StatusOr<std::vector<int32_t>> page = kv_pages_->Allocate(1);
    if (!page.ok()) {
      const absl::Status freed = state_slots_->Free(slot);
      DCHECK(freed.ok()) << freed;
      return page.status();
    }
    tail_page = *std::move(page);
  }
  const absl::Span<const int32_t> shared(parent->block_table.data(), static_cast<size_t>(full));
  const absl::Status retained = kv_pages_->Retain(shared);
  DCHECK(retained.ok()) << retained;  // the parent holds them

  Sequence child;
  child.slot = slot;
  child.block_table.assign(shared.begin(), shared.end());
  child.position = parent->position;
  child.last_logits = parent->last_logits;
  if (partial) {
    const int32_t src = parent->block_table[static_cast<size_t>(full)];
    const int64_t bytes = layout_.tail_kv_floats(parent->position) * static_cast<int64_t>(sizeof(float));
    for (int64_t l = 0; l < layout_.attention_layers; ++l) {
      absl::Status s = KernelStatusToStatus(
          backend_.CopyOnDevice(kv_pages_->k_page(l, tail_page[0]), kv_pages_->k_page(l, src), bytes), "fork: K copy");
      if (s.ok()) {
        s = KernelStatusToStatus(
            backend_.CopyOnDevice(kv_pages_->v_page(l, tail_page[0]), kv_pages_->v_page(l, src), bytes),
            "fork: V copy");
      }
      if (!s.ok()) {
        child.block_table.push_back(tail_page[0]);
        FreeResources(child);
        return s;
      }
    }
    child.block_table.push_back(tail_page[0]);
  }
  const SequenceId id = next_id_++;
  sequences_.emplace(id, std::move(child));
  return id;
}

absl::StatusOr<ImportReservation> SequenceTable::ReserveImport(int64_t n_tokens) {
  if (n_tokens < 1 || n_tokens > kMaxSequenceTokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("import of ", n_tokens, " tokens: outside [1, ", kMaxSequenceTokens, "]"));
  }
  const int64_t pages = PagesFor(n_tokens);
  if (pages > kv_pages_->num_free()) {
    return absl::ResourceExhaustedError(absl::StrCat("out of KV pages: an import of ", n_tokens, " tokens needs ",
                                                     pages, ", ", kv_pages_->num_free(), " free of ",
                                                     kv_pages_->num_pages()));
  }
  ASSIGN_OR_RETURN(int32_t slot, state_slots_->Allocate());
  absl::StatusOr<std::vector<int32_t>> page_ids = kv_pages_->Allocate(pages);
  DCHECK(page_ids.ok()) << page_ids.status();  // checked above

  Sequence seq;
  seq.slot = slot;
  seq.block_table = *std::move(page_ids);
  seq.importing = true;
  seq.import_tokens = n_tokens;
  seq.page_arrived.assign(static_cast<size_t>(layout_.attention_layers > 0 ? layout_.full_pages(n_tokens) : 0), false);

  ImportReservation r;
  r.id = next_id_++;
  r.n_tokens = n_tokens;
  r.page_slots = seq.block_table;
  r.state_slot = slot;
  r.page_format = PageFormatFingerprint(layout_);
  sequences_.emplace(r.id, std::move(seq));
  return r;
}

absl::StatusOr<int32_t> SequenceTable::ImportingPage(SequenceId id, int64_t page_index, bool must_be_new) const {
  ASSIGN_OR_RETURN(const Sequence* seq, Find(id));
  if (!seq->importing) {
    return absl::FailedPreconditionError(absl::StrCat("sequence ", id, " is not importing: page ", page_index));
  }
  const int64_t expected = static_cast<int64_t>(seq->page_arrived.size());
  if (layout_.attention_layers == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("page ", page_index, " for sequence ", id, ": the model has no attention layers, no pages"));
  }
  if (page_index < 0 || page_index >= expected) {
    return absl::InvalidArgumentError(absl::StrCat("page index ", page_index, " outside [0, ", expected,
                                                   ") for an import of ", seq->import_tokens, " tokens"));
  }
  const bool arrived = seq->page_arrived[static_cast<size_t>(page_index)];
  if (must_be_new && arrived) {
    return absl::InvalidArgumentError(absl::StrCat("page ", page_index, " of sequence ", id, " sent twice"));
  }
  if (!must_be_new && !arrived) {
    return absl::FailedPreconditionError(absl::StrCat("page ", page_index, " of sequence ", id, " has not arrived"));
  }
  return seq->block_table[static_cast<size_t>(page_index)];
}

absl::Status SequenceTable::ImportPage(SequenceId id, int64_t page_index, absl::string_view bytes) {
  ASSIGN_OR_RETURN(const int32_t page, ImportingPage(id, page_index, /*must_be_new=*/true));
  if (static_cast<int64_t>(bytes.size()) != layout_.page_bytes()) {
    return absl::InvalidArgumentError(
        absl::StrCat("page ", page_index, " has ", bytes.size(), " bytes, expected ", layout_.page_bytes()));
  }
  RETURN_IF_ERROR(WritePage(page, bytes));
  return MarkPageImported(id, page_index);
}

absl::StatusOr<std::vector<PageRegion>> SequenceTable::ImportPageRegions(SequenceId id, int64_t page_index) const {
  ASSIGN_OR_RETURN(const int32_t page, ImportingPage(id, page_index, /*must_be_new=*/true));
  // The transport writes these slots apart from the backend's stream
  // (kernels/peer_memory.h): work still queued on them (the pool's zero fill,
  // a released sequence's last writes) must be done first, or it lands after
  // the pages and overwrites them.
  RETURN_IF_ERROR(KernelStatusToStatus(backend_.Synchronize(), "synchronize"));
  return RegionsOf(page);
}

absl::Status SequenceTable::MarkPageImported(SequenceId id, int64_t page_index) {
  RETURN_IF_ERROR(ImportingPage(id, page_index, /*must_be_new=*/true).status());
  Sequence& seq = sequences_.at(id);
  seq.page_arrived[static_cast<size_t>(page_index)] = true;
  ++seq.pages_arrived;
  return absl::OkStatus();
}

absl::Status SequenceTable::ImportedPageInto(SequenceId id, int64_t page_index, absl::Span<char> out) const {
  ASSIGN_OR_RETURN(const int32_t page, ImportingPage(id, page_index, /*must_be_new=*/false));
  return ReadPage(page, out);
}

absl::Status SequenceTable::AbortImport(SequenceId id) {
  ASSIGN_OR_RETURN(Sequence * seq, FindAny(id));
  if (!seq->importing) return absl::FailedPreconditionError(absl::StrCat("sequence ", id, " is not importing"));
  FreeResources(*seq);
  sequences_.erase(id);
  return absl::OkStatus();
}

absl::Status SequenceTable::FinishImportImpl(SequenceId id, const StateBytes& state) {
  ASSIGN_OR_RETURN(Sequence * seq, FindAny(id));
  if (!seq->importing) return absl::FailedPreconditionError(absl::StrCat("sequence ", id, " is not importing"));
  const int64_t expected = static_cast<int64_t>(seq->page_arrived.size());
  if (seq->pages_arrived != expected) {
    return absl::FailedPreconditionError(
        absl::StrCat("sequence ", id, ": ", seq->pages_arrived, " of ", expected, " pages have arrived"));
  }
  if (state.position != seq->import_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("state at position ", state.position, " for an import of ", seq->import_tokens, " tokens"));
  }
  RETURN_IF_ERROR(WriteState(*seq, state));
  seq->importing = false;
  seq->page_arrived.clear();
  seq->pages_arrived = 0;
  return absl::OkStatus();
}

}  // namespace hybridserve::engine
