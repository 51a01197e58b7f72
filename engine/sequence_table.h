#ifndef HYBRIDSERVE_ENGINE_SEQUENCE_TABLE_H_
#define HYBRIDSERVE_ENGINE_SEQUENCE_TABLE_H_

// The bookkeeping of the sequences of one model instance, apart from the
// forward pass (engine/model.h): ids, state slots, block tables of
// reference-counted KV pages, positions, last logits, import reservations,
// and the movement of a sequence's state in and out of the device pools
// (capture, restore, page export and import for the cache and the data plane).
//
// Pages are shared the way vLLM's and SGLang's block managers share them:
// Fork(parent) makes a sequence holding a reference to every full page of its
// parent (the SSM/conv state and the partial last page are copied), and a page
// returns to the pool when the last sequence holding it lets it go.
//
// A sequence is either live (usable by the forward pass) or importing
// (ReserveImport: its pages and state slot are reserved and filled by
// ImportPage / FinishImport, then it becomes live at the imported position).
// A data plane that moves pages device to device fills the reserved slots
// itself: ImportPageRegions names where page i lands, MarkPageImported
// records its arrival without a copy, and ImportedPageInto reads it back (a
// sampled check) before FinishImport makes the sequence live; on the sending
// side ExportPageRegions names a live page's bytes in the pool.
//
// Errors: every documented error leaves every sequence and both pools as they
// were. INTERNAL (a backend copy failed: a device fault) may leave the
// sequence it occurred in half-written; release that sequence.
//
// Byte formats: pages as engine/page_format.h defines them; states as
// SequenceState (engine/sequence_state.h) or the snapshot encoding
// (engine/snapshot_codec.h), both with this table's StateLayout.
//
// Not thread-safe: the owner (the Model, or a worker that owns the Model)
// serializes every call.

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/hash.h"
#include "engine/kv_page_pool.h"
#include "engine/sequence_state.h"
#include "engine/snapshot_codec.h"
#include "engine/state_layout.h"
#include "engine/state_slot_pool.h"
#include "kernels/backend.h"

namespace hybridserve::engine {

using SequenceId = int64_t;

// Longest sequence: the kernels take positions and sequence lengths as int32.
inline constexpr int64_t kMaxSequenceTokens = std::numeric_limits<int32_t>::max();

struct SequenceTableOptions {
  StateLayout layout;         // must pass Validate()
  int64_t max_pages = 1024;   // KV pages shared by all sequences
  int64_t max_sequences = 8;  // state slots: sequences alive (or importing) at once
};

// What an importing sequence reserved: what a transfer ticket carries
// (proto/prefill.proto TransferTicket).
struct ImportReservation {
  SequenceId id = 0;
  int64_t n_tokens = 0;  // the position the imported state must have
  // Physical KV page ids of pages [0, pages_for(n_tokens)), in page order:
  // full pages arrive by ImportPage, the partial last one with the state.
  std::vector<int32_t> page_slots;
  int32_t state_slot = -1;
  common::Hash128 page_format;  // PageFormatFingerprint of the table's layout
};

// Host views of one page inside the pools (PageViews), for backends whose
// memory the host can address: per attention layer, its K and V bytes.
struct PageView {
  std::vector<absl::Span<const char>> k;  // [attention_layers], page_kv_floats() * 4 bytes each
  std::vector<absl::Span<const char>> v;
};

// One contiguous run of a page's bytes in device memory of the table's
// backend (host memory on the CPU backend). A page's regions, in order, are
// the page wire format (engine/page_format.h): per attention layer its K
// then its V, 2 * attention_layers regions of page_kv_floats() * 4 bytes,
// region r holding page bytes [r * that, (r + 1) * that).
struct PageRegion {
  void* data = nullptr;  // device memory inside the KV pool
  int64_t bytes = 0;
};

class SequenceTable {
 public:
  // One sequence. The forward pass (Model) reads it and advances position and
  // last_logits; everything else changes only through the table.
  struct Sequence {
    int32_t slot = -1;
    // KV page ids of pages [0, block_table.size()): at least pages_for(position);
    // more when pages were reserved ahead (ReservePages).
    std::vector<int32_t> block_table;
    int64_t position = 0;
    std::vector<float> last_logits;  // [vocab] or empty
    // Importing: the reserved position, and which full pages have arrived.
    bool importing = false;
    int64_t import_tokens = 0;
    std::vector<bool> page_arrived;  // [pages the import expects]
    int64_t pages_arrived = 0;
    // Restoring in place (BeginRestoreInPlace): the state's position; -1 when not.
    int64_t restoring = -1;
  };

  // INVALID_ARGUMENT for a bad layout or size; RESOURCE_EXHAUSTED when the
  // backend cannot hold the pools. `backend` must outlive the table.
  static absl::StatusOr<std::unique_ptr<SequenceTable>> Create(const SequenceTableOptions& options,
                                                               kernels::Backend& backend);

  SequenceTable(const SequenceTable&) = delete;
  SequenceTable& operator=(const SequenceTable&) = delete;
  ~SequenceTable();

  const StateLayout& layout() const { return layout_; }

  // ---- Lifecycle ----

  // A new empty live sequence (position 0) holding one zeroed state slot;
  // RESOURCE_EXHAUSTED when every slot is taken.
  absl::StatusOr<SequenceId> New();
  // Frees the sequence's slot and its references to pages (live or
  // importing); NOT_FOUND for an unknown id.
  absl::Status Release(SequenceId id);
  // A new live sequence at the parent's position that shares every full page
  // of the parent (one more reference each), with a copy of its SSM/conv
  // state, of its partial last page (a new page) and of its last logits.
  // NOT_FOUND, FAILED_PRECONDITION (parent importing), RESOURCE_EXHAUSTED (no
  // slot, or no page for the partial last page).
  absl::StatusOr<SequenceId> Fork(SequenceId parent);

  // ---- Lookup ----

  // Any sequence; NOT_FOUND for an unknown id.
  absl::StatusOr<const Sequence*> Find(SequenceId id) const;
  // A live sequence for the forward pass; NOT_FOUND, or FAILED_PRECONDITION
  // while it is importing.
  absl::StatusOr<Sequence*> FindLive(SequenceId id);
  // Tokens processed by a live sequence; NOT_FOUND / FAILED_PRECONDITION.
  absl::StatusOr<int64_t> Position(SequenceId id) const;

  // ---- Pages ----

  // Physical KV pages that hold `positions` tokens (0 without attention layers).
  int64_t PagesFor(int64_t positions) const { return layout_.pages_for(positions); }
  // Grows the sequence's block table so that it holds `positions` tokens (a
  // reservation ahead of decoding, for admission). NOT_FOUND;
  // RESOURCE_EXHAUSTED, nothing taken, when the pages are not free.
  absl::Status ReservePages(SequenceId id, int64_t positions);
  // Same, on a sequence the caller already holds (the forward pass).
  absl::Status EnsurePages(Sequence& seq, int64_t positions);

  // ---- Import (the receiving end of the data plane) ----

  // A new importing sequence for a state at position `n_tokens`, with the
  // physical pages and the state slot it must land in. INVALID_ARGUMENT for
  // n_tokens < 1 or beyond 2^31 - 1; RESOURCE_EXHAUSTED when the slot or the
  // pages are not free.
  absl::StatusOr<ImportReservation> ReserveImport(int64_t n_tokens);
  // Writes full page `page_index` (< n_tokens / page_size) of an importing
  // sequence, in any order. INVALID_ARGUMENT, nothing changed, for an index
  // out of range, a page sent twice, or a size other than page_bytes();
  // NOT_FOUND; FAILED_PRECONDITION for a live sequence.
  absl::Status ImportPage(SequenceId id, int64_t page_index, absl::string_view bytes);
  // Checks that every full page arrived and that `state` has the table's
  // layout at position n_tokens, then writes the state (SSM/conv states, the
  // partial last page's K/V, last logits) and makes the sequence live.
  // FAILED_PRECONDITION (still importing, nothing changed) when pages are
  // missing; INVALID_ARGUMENT, naming the array or the layout fields that
  // differ, for a state of another shape or position.
  absl::Status FinishImport(SequenceId id, const SequenceState& state);
  // Same, from a snapshot decoded in place (no intermediate copy).
  absl::Status FinishImport(SequenceId id, const SnapshotView& state);
  // Releases an importing sequence and everything it reserved.
  // NOT_FOUND; FAILED_PRECONDITION for a live sequence. Pages written in
  // place and never completed are harmless: their slots return to the pool,
  // whose pages hold whatever they held before until written again.
  absl::Status AbortImport(SequenceId id);

  // ---- Import in place (a device-to-device data plane) ----

  // The device regions of full page `page_index` of an importing sequence,
  // in wire order (PageRegion): where a transport writes that page's bytes
  // itself. Synchronizes the backend first (as ExportPageRegions does), so
  // no work issued before (the pool's zero fill, a freed page's last
  // writes) lands in the slots after the transport's writes.
  // Valid until the import is finished or aborted; the caller must have
  // stopped writing into them before AbortImport or Release. Errors as
  // ImportPage (INVALID_ARGUMENT for an index out of range, a page already
  // arrived or a model without attention layers; NOT_FOUND;
  // FAILED_PRECONDITION for a live sequence), or INTERNAL when the wait
  // fails; nothing changes.
  absl::StatusOr<std::vector<PageRegion>> ImportPageRegions(SequenceId id, int64_t page_index) const;
  // The first `pages` full pages of an importing sequence as writable host
  // memory, each in wire order (engine/page_format.h: the bytes the cache
  // and the data plane carry): where a reader on the host writes pages
  // itself, before MarkPageImported (decode reading a prompt's cached pages,
  // transport/transfer.h "Held pages"). Synchronizes the backend as
  // ImportPageRegions does; the same lifetime and errors (INVALID_ARGUMENT
  // also for `pages` outside [0, the import's full pages]), and
  // UNIMPLEMENTED on a backend whose memory the host cannot address.
  absl::StatusOr<std::vector<std::vector<absl::Span<char>>>> ImportPageHostViews(SequenceId id, int64_t pages) const;
  // Records that full page `page_index` arrived in its regions (every write
  // into them has completed), without copying: FinishImport's "every page
  // arrived" check counts it as ImportPage would. Errors as
  // ImportPageRegions; nothing changes.
  absl::Status MarkPageImported(SequenceId id, int64_t page_index);
  // The bytes of page `page_index` of an importing sequence, which must have
  // arrived (ImportPage or MarkPageImported), written into `out` (exactly
  // page_bytes()): a read-back that checks what landed. NOT_FOUND;
  // FAILED_PRECONDITION for a live sequence or a page not yet arrived;
  // INVALID_ARGUMENT for an index out of range or a wrong buffer size.
  absl::Status ImportedPageInto(SequenceId id, int64_t page_index, absl::Span<char> out) const;

  // ---- Export ----

  // The bytes of full page `page_index` (< position / page_size) of a live
  // sequence, written into `out` (exactly page_bytes()). NOT_FOUND,
  // FAILED_PRECONDITION (importing), OUT_OF_RANGE (not a full page),
  // INVALID_ARGUMENT (wrong buffer size).
  absl::Status ExportPageInto(SequenceId id, int64_t page_index, absl::Span<char> out) const;
  // Same, into a new string.
  absl::StatusOr<std::string> ExportPage(SequenceId id, int64_t page_index) const;
  // The device regions of that page in wire order (PageRegion), for a
  // transport that sends straight from the pool. Synchronizes the backend
  // first, so the bytes there are complete. Valid until the page is freed;
  // the sequence must not change while they are read. Errors of
  // ExportPageInto (no buffer); an empty list without attention layers.
  absl::StatusOr<std::vector<PageRegion>> ExportPageRegions(SequenceId id, int64_t page_index) const;
  // Host views of a full page inside the pools, without copying: valid until
  // the page is freed or the sequence is changed. UNIMPLEMENTED when the
  // backend's memory is not host-addressable (use ExportPageInto); otherwise
  // the errors of ExportPageInto.
  absl::StatusOr<PageView> PageViews(SequenceId id, int64_t page_index) const;

  // The exact-prefix state of a live sequence at its position (SSM and conv
  // states, K/V of the partial last page and, when `with_logits`, its last
  // logits if it has them). NOT_FOUND / FAILED_PRECONDITION.
  absl::StatusOr<SequenceState> CaptureState(SequenceId id, bool with_logits) const;
  // Host views of that state inside the pools, without copying (valid until
  // the sequence changes). UNIMPLEMENTED when the backend's memory is not
  // host-addressable (use CaptureState); NOT_FOUND / FAILED_PRECONDITION.
  absl::StatusOr<StateArrays> StateViews(SequenceId id, bool with_logits) const;
  // The snapshot encoding of that state, stamped with `model_fingerprint` and
  // `prefix_hash`, straight from the pools when the backend's memory is
  // host-addressable (through host vectors otherwise): into `*out` (resized),
  // or into a caller buffer of exactly EncodedStateSize bytes.
  absl::Status EncodeStateInto(SequenceId id, bool with_logits, const common::Hash128& model_fingerprint,
                               const common::Hash128& prefix_hash, std::string* out) const;
  absl::Status EncodeStateInto(SequenceId id, bool with_logits, const common::Hash128& model_fingerprint,
                               const common::Hash128& prefix_hash, absl::Span<char> out) const;
  absl::StatusOr<size_t> EncodedStateSize(SequenceId id, bool with_logits) const;

  // ---- Restore (a resume from the cache) ----

  // Restores an empty live sequence (position 0, no pages: fresh from New) to
  // `state`; `pages` are the bytes of its full pages [0, position /
  // page_size) in order (a model without attention layers may pass none).
  // All or nothing: NOT_FOUND; FAILED_PRECONDITION if the sequence is not
  // empty; INVALID_ARGUMENT, naming the array, for any shape or size that does
  // not match the layout; RESOURCE_EXHAUSTED when the pages are not free.
  absl::Status Restore(SequenceId id, const SequenceState& state, absl::Span<const absl::string_view> pages);
  // Same, from a snapshot decoded in place over the cache's bytes, with pages
  // as views: no intermediate copy. INVALID_ARGUMENT naming the layout fields
  // when the snapshot has another layout.
  absl::Status Restore(SequenceId id, const SnapshotView& state, absl::Span<const absl::string_view> pages);

  // Restore without the pages' bytes passing through the caller: gives an
  // empty live sequence the pages of a state at `position` and returns
  // writable host views of its full pages [0, position / page_size), each in
  // wire order (PageRegion: K then V of each attention layer), for a reader
  // that writes the cached bytes there itself. The sequence is not live
  // until FinishRestoreInPlace (AbortRestoreInPlace gives the pages back).
  // UNIMPLEMENTED when the backend's memory is not host-addressable (use
  // Restore); NOT_FOUND; FAILED_PRECONDITION if the sequence is not empty;
  // INVALID_ARGUMENT for a position outside [0, kMaxSequenceTokens];
  // RESOURCE_EXHAUSTED when the pages are not free. Nothing changes on error.
  absl::StatusOr<std::vector<std::vector<absl::Span<char>>>> BeginRestoreInPlace(SequenceId id, int64_t position);
  // Completes it with the rest of the state (SSM and conv states, the tail
  // K/V, the last logits), which must be at that position; the sequence is
  // then live at it, as Restore would leave it. FAILED_PRECONDITION when the
  // sequence is not restoring in place; INVALID_ARGUMENT for another
  // position or layout (the sequence stays restoring: abort it); a failure
  // writing the state gives the pages back (the sequence is empty again).
  absl::Status FinishRestoreInPlace(SequenceId id, const SnapshotView& state);
  // Gives the pages back: the sequence is empty and live again.
  // NOT_FOUND; FAILED_PRECONDITION when it is not restoring in place.
  absl::Status AbortRestoreInPlace(SequenceId id);

  // ---- Counters ----

  int64_t num_sequences() const { return static_cast<int64_t>(sequences_.size()); }
  int64_t num_free_pages() const { return kv_pages_->num_free(); }
  int64_t num_pages() const { return kv_pages_->num_pages(); }
  int64_t num_free_slots() const { return state_slots_->num_free(); }
  int32_t page_refcount(int32_t page) const { return kv_pages_->refcount(page); }

  // The pools, for the forward pass.
  KvPagePool& kv_pages() { return *kv_pages_; }
  StateSlotPool& state_slots() { return *state_slots_; }
  kernels::Backend& backend() const { return backend_; }

 private:
  // A state as byte spans in host memory (from a SequenceState or a
  // SnapshotView, possibly unaligned), in the layout's shapes, already checked.
  struct StateBytes {
    int64_t position = 0;
    std::vector<absl::Span<const uint8_t>> ssm_states;   // per Mamba2 layer
    std::vector<absl::Span<const uint8_t>> conv_states;  // per Mamba2 layer
    std::vector<absl::Span<const uint8_t>> tail_k;       // per attention layer
    std::vector<absl::Span<const uint8_t>> tail_v;
    absl::Span<const uint8_t> last_logits;  // [vocab] floats or empty
  };
  static StateBytes BytesOf(const SequenceState& state);
  static StateBytes BytesOf(const SnapshotView& view);

  SequenceTable(const StateLayout& layout, kernels::Backend& backend, std::unique_ptr<KvPagePool> kv_pages,
                std::unique_ptr<StateSlotPool> state_slots);

  absl::StatusOr<Sequence*> FindAny(SequenceId id);
  absl::StatusOr<const Sequence*> FindLiveConst(SequenceId id) const;
  // The importing sequence `id` and its physical page `page_index` (< the
  // full pages it expects), checking what ImportPage checks; with
  // `must_be_new` a page already arrived is INVALID_ARGUMENT, without it a
  // page not yet arrived is FAILED_PRECONDITION.
  absl::StatusOr<int32_t> ImportingPage(SequenceId id, int64_t page_index, bool must_be_new) const;
  // The regions of physical page `page` in wire order.
  std::vector<PageRegion> RegionsOf(int32_t page) const;
  // The same as writable host memory; UNIMPLEMENTED, ending with `instead`,
  // on a backend the host cannot address.
  absl::StatusOr<std::vector<absl::Span<char>>> HostSpansOf(int32_t page, absl::string_view instead) const;
  // Copies physical page `page` into `out` (page_bytes()).
  absl::Status ReadPage(int32_t page, absl::Span<char> out) const;
  // Frees everything `seq` holds (both frees succeed by construction).
  void FreeResources(const Sequence& seq);
  // Frees `seq`'s pages and empties its block table.
  void DropPages(Sequence& seq);
  // The empty live sequence `id` that a state at `position` may be restored
  // into (Restore, BeginRestoreInPlace): FAILED_PRECONDITION when it is not
  // empty, INVALID_ARGUMENT for a position outside [0, kMaxSequenceTokens].
  absl::StatusOr<Sequence*> FindRestoreTarget(SequenceId id, int64_t position);
  // The restoring-in-place sequence `id`.
  absl::StatusOr<Sequence*> FindRestoring(SequenceId id);
  // Checks page count and sizes against a state at `position`.
  absl::Status CheckPages(int64_t position, absl::Span<const absl::string_view> pages) const;
  absl::Status CheckView(const SnapshotView& view) const;
  // Copies page bytes into physical page `page`.
  absl::Status WritePage(int32_t page, absl::string_view bytes);
  // Writes the SSM/conv states, the tail K/V and the last logits of `state`
  // into `seq`'s slot and pages (which exist) and sets its position.
  absl::Status WriteState(Sequence& seq, const StateBytes& state);
  absl::Status RestoreImpl(SequenceId id, const StateBytes& state, absl::Span<const absl::string_view> pages);
  absl::Status FinishImportImpl(SequenceId id, const StateBytes& state);
  absl::Status CopyToHost(void* dst, const void* src, int64_t bytes) const;
  // The state to encode: views over the pools, or (a device the host cannot
  // read) over `*staging`, filled by CaptureState.
  absl::StatusOr<SnapshotSource> EncodingSource(SequenceId id, bool with_logits, const common::Hash128& fingerprint,
                                                const common::Hash128& prefix_hash, SequenceState* staging) const;

  const StateLayout layout_;
  kernels::Backend& backend_;
  std::unique_ptr<KvPagePool> kv_pages_;
  std::unique_ptr<StateSlotPool> state_slots_;
  absl::flat_hash_map<SequenceId, Sequence> sequences_;
  SequenceId next_id_ = 1;
};

}  // namespace hybridserve::engine

#endif  // HYBRIDSERVE_ENGINE_SEQUENCE_TABLE_H_
