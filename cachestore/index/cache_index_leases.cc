// Leases: a leasing lookup pins the deepest page and the state it returns;
// Open reads through the lease, Release or expiry unpins. Members of
// CacheIndex (cache_index.h).

#include "absl/strings/str_cat.h"
#include "cachestore/index/cache_index.h"

namespace hybridserve::cachestore {

absl::StatusOr<ReadHandle> CacheIndex::Open(uint64_t lease_id, const Hash128& key, absl::Time now) {
  auto it = leases_.find(lease_id);
  if (it == leases_.end() || it->second.expiry < now) {
    return absl::NotFoundError(absl::StrCat("unknown or expired lease ", lease_id));
  }
  Lease& lease = it->second;
  const Held* held = nullptr;
  if (key == lease.state.key) {
    held = &lease.state;
  } else if (lease.deepest.has_value()) {
    // A page of the lease is the deepest page or one of its ancestors.
    const Entry* deepest = HeldEntry(EntryClass::kPage, lease.deepest->key, lease.deepest->serial);
    if (deepest == nullptr) {
      // Without a page list the lease cannot tell its own pages from others
      // now: any page read through it extends it, as a read of its pages would.
      SetLeaseExpiry(lease_id, lease, now + options_.lease_ttl);
      return absl::NotFoundError(absl::StrCat("lease ", lease_id, "'s pages were removed (failed verification)"));
    }
    const Node* last = pages_.at(lease.deepest->key).get();
    auto p = pages_.find(key);
    if (p != pages_.end() && p->second->root == last->root && p->second->depth <= last->depth &&
        LevelAncestor(last, p->second->depth) == p->second.get()) {
      held = &*lease.deepest;  // a page of the lease lives as long as its deepest page
    }
  }
  if (held == nullptr) {
    return absl::NotFoundError(absl::StrCat("lease ", lease_id, " does not hold entry ", key.ToHex()));
  }
  SetLeaseExpiry(lease_id, lease, now + options_.lease_ttl);
  if (HeldEntry(held->entry_class, held->key, held->serial) == nullptr) {
    return absl::NotFoundError("entry was removed (failed verification)");
  }
  ReadHandle h;
  if (held->entry_class == EntryClass::kPage) {
    const Node& n = *pages_.at(key);
    h.info = PageInfo(n, n.root->page_size);
    h.blob = n.entry.blob;
  } else {
    const State& st = *states_.at(key);
    h.info = StateInfo(st);
    h.blob = st.entry.blob;
  }
  return h;
}

absl::Status CacheIndex::Release(uint64_t lease_id) {
  auto it = leases_.find(lease_id);
  if (it == leases_.end()) return absl::NotFoundError(absl::StrCat("unknown or expired lease ", lease_id));
  ReleaseLeaseEntries(it->second);
  lease_expiry_.erase({it->second.expiry, lease_id});
  leases_.erase(it);
  return absl::OkStatus();
}

void CacheIndex::ReleaseLeaseEntries(const Lease& lease) { PinLease(lease, -1); }

CacheIndex::Entry* CacheIndex::HeldEntry(EntryClass c, const Hash128& key, uint64_t serial) {
  Entry* e = nullptr;
  if (c == EntryClass::kPage) {
    if (auto it = pages_.find(key); it != pages_.end()) e = &it->second->entry;
  } else {
    if (auto it = states_.find(key); it != states_.end()) e = &it->second->entry;
  }
  return e != nullptr && e->serial == serial ? e : nullptr;
}

void CacheIndex::PinLease(const Lease& lease, int delta) {
  if (lease.deepest.has_value()) Pin(lease.deepest->entry_class, lease.deepest->key, lease.deepest->serial, delta);
  Pin(lease.state.entry_class, lease.state.key, lease.state.serial, delta);
}

void CacheIndex::Pin(EntryClass c, const Hash128& key, uint64_t serial, int delta) {
  if (HeldEntry(c, key, serial) == nullptr) return;  // removed after failing verification
  if (c == EntryClass::kPage) {
    Node* n = pages_.at(key).get();
    n->entry.pins += delta;
    RefreshNode(n);
  } else {
    State* s = states_.at(key).get();
    const bool was_busy = IsBusy(*s);
    s->entry.pins += delta;
    const bool busy = IsBusy(*s);
    if (was_busy != busy) {
      s->node->busy_states += busy ? 1 : -1;
      RefreshNode(s->node);
    }
    RefreshState(s);
  }
}

const CacheIndex::Node* CacheIndex::LevelAncestor(const Node* node, int64_t depth) {
  while (node->depth > depth) node = node->jump->depth >= depth ? node->jump : node->parent;
  return node;
}

void CacheIndex::SetLeaseExpiry(uint64_t lease_id, Lease& lease, absl::Time expiry) {
  lease_expiry_.erase({lease.expiry, lease_id});
  lease.expiry = expiry;
  lease_expiry_.insert({expiry, lease_id});
}

}  // namespace hybridserve::cachestore
