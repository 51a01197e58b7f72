// The disk tier's side of CacheStore (cache_store.h): planning and doing a
// lookup's promotion from disk, and the spill at shutdown. Members of
// CacheStore; every call into the disk tier is outside mu_.

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "cachestore/index/cache_store.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace hybridserve::cachestore {

std::optional<CacheStore::Promotion> CacheStore::PlanPromotion(const Hash128& ns, int32_t page_size,
                                                               absl::Span<const Hash128> keys,
                                                               absl::Span<const TokenId> tokens,
                                                               const LookupResult& memory) const {
  // The chain: the memory's committed pages, then those on disk below them.
  const int64_t in_memory = memory.kv_match_tokens / page_size;
  int64_t deepest = in_memory;
  while (deepest < static_cast<int64_t>(keys.size()) && disk_->Contains(keys[deepest])) ++deepest;
  // The deepest state on disk at a node of that chain, past the memory's
  // resume point.
  const int64_t resume_depth = memory.resume_position / page_size;
  for (int64_t depth = deepest; depth >= resume_depth; --depth) {
    const Hash128& parent = depth == 0 ? ns : keys[depth - 1];
    for (const auto& [length, key] :
         disk_->StateCandidates(parent, tokens.subspan(static_cast<size_t>(depth * page_size)))) {
      if (depth * page_size + length <= memory.resume_position) break;  // longest first: none deeper here
      if (!disk_->Contains(key)) continue;
      return Promotion{std::min(in_memory, depth), depth, length, key};
    }
  }
  return std::nullopt;
}

std::pair<int64_t, bool> CacheStore::Promote(const Promotion& plan, const Hash128& ns, int32_t page_size,
                                             absl::Span<const Hash128> keys, absl::Span<const TokenId> tokens) {
  // Every entry is read first, in parallel (a file each); then they go into
  // memory in chain order, up to the first that cannot.
  std::vector<Hash128> wanted(keys.begin() + plan.first_page_depth, keys.begin() + plan.state_depth);
  wanted.push_back(plan.state_key);
  std::vector<absl::StatusOr<DiskTierRead>> reads = disk_->ReadMany(wanted);
  auto parent_at = [&](int64_t depth) { return depth == 0 ? std::nullopt : std::optional<Hash128>(keys[depth - 1]); };
  // The record must be the one the prompt names (the key decides; the
  // fields are compared too, as the memory index compares a state's tail);
  // one that is not is erased.
  auto usable = [&](const absl::StatusOr<DiskTierRead>& r, const Hash128& key, EntryClass cls, int64_t position,
                    int64_t depth) {
    if (!r.ok()) return false;
    const SpillRecord& rec = r->record;
    if (rec.entry_class == cls && rec.ns == ns && rec.page_size == page_size && rec.position == position &&
        rec.parent == parent_at(depth)) {
      return true;
    }
    LOG(WARNING) << "disk tier entry " << key.ToHex() << " is not the entry its key names here; erased";
    disk_->EraseBad(key);
    return false;
  };
  int64_t pages_in = 0;
  int64_t entries = 0;
  int64_t bytes = 0;
  bool state_in = false;
  bool chain_whole = true;
  for (int64_t depth = plan.first_page_depth + 1; depth <= plan.state_depth && chain_whole; ++depth) {
    const Hash128& key = keys[depth - 1];
    const absl::StatusOr<DiskTierRead>& page = reads[depth - 1 - plan.first_page_depth];
    chain_whole = usable(page, key, EntryClass::kPage, depth * page_size, depth - 1);
    if (!chain_whole) break;
    PutSpec spec;
    spec.ns = ns;
    spec.tenant = page->record.tenant;
    spec.page_size = page_size;
    spec.entry_class = EntryClass::kPage;
    spec.parent = parent_at(depth - 1);
    const auto first = tokens.begin() + (depth - 1) * page_size;
    spec.tokens.assign(first, first + page_size);
    spec.size_bytes = page->record.size_bytes;
    spec.model_cost = page->record.model_cost;
    chain_whole = PutBack(spec, key, *page).ok();
    if (!chain_whole) break;
    ++pages_in;
    ++entries;
    bytes += spec.size_bytes;
  }
  const int64_t tail_begin = plan.state_depth * page_size;
  const absl::StatusOr<DiskTierRead>& state = reads.back();
  if (chain_whole &&
      usable(state, plan.state_key, EntryClass::kState, tail_begin + plan.tail_length, plan.state_depth)) {
    const auto first = tokens.begin() + tail_begin;
    if (!std::equal(state->record.tail.begin(), state->record.tail.end(), first, first + plan.tail_length)) {
      // A 128-bit collision, or a forged record: never another prompt's state.
      disk_->EraseBad(plan.state_key);
    } else {
      PutSpec spec;
      spec.ns = ns;
      spec.tenant = state->record.tenant;
      spec.page_size = page_size;
      spec.entry_class = EntryClass::kState;
      spec.parent = parent_at(plan.state_depth);
      spec.tokens = state->record.tail;
      spec.state_kind = state->record.state_kind;
      spec.position = state->record.position;
      spec.size_bytes = state->record.size_bytes;
      spec.ttl = std::min(state->record.ttl, options_.max_session_ttl);
      spec.model_cost = state->record.model_cost;
      state_in = PutBack(spec, plan.state_key, *state).ok();
      if (state_in) {
        ++entries;
        bytes += spec.size_bytes;
      }
    }
  }
  disk_->CountPromotion(entries, bytes);
  return {pages_in, state_in};
}

absl::Status CacheStore::PutBack(const PutSpec& spec, const Hash128& key, const DiskTierRead& read) {
  ASSIGN_OR_RETURN(std::unique_ptr<PutSession> session, BeginPut(spec));
  if (session->key() != key) {
    // The record's fields do not hash to its key: not this entry. The
    // session's destruction aborts the reservation.
    disk_->EraseBad(key);
    return absl::DataLossError(absl::StrCat("disk tier entry ", key.ToHex(), " derives key ", session->key().ToHex()));
  }
  if (session->already_present()) return absl::OkStatus();
  RETURN_IF_ERROR(session->Write(0, read.payload));
  absl::Status committed = session->Commit(read.record.checksum);
  if (committed.code() == absl::StatusCode::kDataLoss) disk_->EraseBad(key);
  return committed;
}

int64_t CacheStore::SpillToDisk() {
  if (disk_ == nullptr) return 0;
  const absl::Time deadline = clock_.Now() + disk_->options().shutdown_spill_timeout;
  std::vector<SpilledEntry> entries;
  {
    absl::MutexLock lock(&mu_);
    entries = index_.CommittedEntries();
  }
  const int64_t written = disk_->WriteAll(entries, [&] { return clock_.Now() >= deadline; });
  LOG(INFO) << "disk tier: wrote " << written << " of " << entries.size()
            << " entries in memory at shutdown (the others were on disk, past the disk budget or the "
            << disk_->options().shutdown_spill_timeout << " timeout)";
  return written;
}

void CacheStore::FlushDiskWrites() {
  if (disk_ != nullptr) disk_->Flush();
}

}  // namespace hybridserve::cachestore
