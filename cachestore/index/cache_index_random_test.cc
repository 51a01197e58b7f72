// Randomized differential test of CacheIndex against ReferenceModel, a naive
// re-implementation of docs/ARCHITECTURE.md section 4 over a flat vector of entries with
// O(n) scans for everything.
//
// Each seed builds a small index (tokens 0..2, page size 2 or 4, two
// namespaces, budgets worth a handful of entries, short TTLs, leases and put
// timeouts) and drives thousands of random operations through the index and
// the model at the same `now`: Reserve (pages and states, fresh, repeated,
// re-put after removal, malformed), Commit, Abort, Touch, Lookup with and
// without a lease, Open, Release, RemoveCorrupt, and time advances with or
// without Expire, often landing exactly on a deadline or TTL boundary. After
// every operation the status codes, lookup results, reclaimed puts, every
// statistic, CheckInvariants(), the budgets and the presence of every stored
// and every leased entry must agree. The first disagreement of a seed fails
// the test with the seed, the operation index and the operations before it.
//
// Where the contract is silent the model decides: a lease holds the entries it
// pinned, not their keys (an entry removed as corrupt leaves the lease, and an
// entry stored again under the same key is not held); Expire reports the puts
// whose own deadline passed, including those that went with a timed-out
// parent page in the same call.
//
// A second run of the same seeds sets EvictionPolicy::kUtility (a random cost
// model and recency blend): the model learns the policy, choosing each victim
// by a from-scratch scan for the lowest GreedyDual priority over the same
// arithmetic (eviction_utility.h), so the index's eager re-keying, its clocks
// and its tie-breaks are checked, and CheckInvariants checks every key. With
// the model choosing by LRU instead, 25 of the 40 seeds disagree.
//
// Every run records evictions for a disk tier (spill_evictions): after each
// Reserve the record must be exactly the committed entries the model lost in
// it, with their fields and bytes, and no other operation may add to it.
//
// Puts carry a namespace model cost (PutSpec::model_cost) most of the time:
// each namespace's own (the two differ), another, none (the fallback), or
// rarely an invalid one (INVALID_ARGUMENT). The latest accepted one wins and
// an emptied namespace forgets it; entries are valued by their namespace's
// cost at their last use, so the utility victims depend on it.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "cachestore/index/cache_index.h"
#include "cachestore/index/cache_index_reference_model.h"
#include "cachestore/keys.h"
#include "cachestore/types.h"
#include "gtest/gtest.h"

namespace hybridserve::cachestore {
namespace {

using namespace reference;  // NOLINT: test file, the model's many names

constexpr int kSeeds = 40;
constexpr int kOpsPerSeed = 5000;

class RandomRun {
 public:
  // `utility`: the index evicts by EvictionPolicy::kUtility with a random
  // cost model and blend, and the model follows (ReferenceModel::Priority).
  RandomRun(uint32_t seed, bool utility) : seed_(seed), rng_(seed) {
    config_.default_page_size[0] = Chance(0.5) ? 2 : 4;
    config_.default_page_size[1] = Chance(0.5) ? 2 : 4;
    config_.page_budget = Uniform(120, 300);
    config_.state_budget = Uniform(100, 250);
    if (Chance(0.7)) config_.page_ttl = Uniform(300, 5000);
    if (Chance(0.7)) config_.state_ttl = Uniform(300, 5000);
    config_.lease_ttl = Uniform(200, 2000);
    config_.put_timeout = Uniform(200, 2000);
    config_.max_tokens = Chance(0.5) ? int64_t{1} << 20 : Uniform(8, kMaxPromptTokens);
    config_.entry_overhead = Chance(0.3) ? 0 : Uniform(1, 12);
    if (utility) {
      config_.utility = true;
      config_.utility_cost.flops_per_token = Chance(0.5) ? 1 : 2.5;
      config_.utility_cost.flops_per_token_context = Chance(0.5) ? 0 : 0.75;
      const double blends[] = {0, 0.3, 1};
      config_.utility_cost.recency_blend = blends[Pick(3)];
    }
    for (int i = 0; i < kNamespaces; ++i) {
      ns_keys_[i] = NamespaceKey("model", "", "", absl::StrCat("tenant-", i), config_.default_page_size[i]);
    }
    // Recording evictions for a disk tier changes nothing the model checks;
    // DoReserve checks the record against what the model evicted.
    CacheIndexOptions options = config_.ToOptions();
    options.spill_evictions = true;
    index_ = std::make_unique<CacheIndex>(options);
    model_ = std::make_unique<ReferenceModel>(config_, ns_keys_);
  }

  // Runs `ops` random operations; false after the first disagreement.
  bool Run(int ops) {
    for (op_ = 0; op_ < ops && !failed_; ++op_) {
      Step();
      if (!failed_) Verify();
    }
    if (!failed_) Drain();
    return !failed_;
  }

 private:
  // --- Randomness ---------------------------------------------------------

  int64_t Uniform(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng_); }
  bool Chance(double p) { return std::uniform_real_distribution<double>(0, 1)(rng_) < p; }
  size_t Pick(size_t n) { return static_cast<size_t>(Uniform(0, static_cast<int64_t>(n) - 1)); }
  Tokens RandomTokens(size_t n) {
    Tokens t(n);
    for (TokenId& x : t) x = static_cast<TokenId>(Uniform(0, kAlphabet - 1));
    return t;
  }

  int32_t PageSizeOf(int ns) const { return model_->NamespacePageSize(ns).value_or(config_.default_page_size[ns]); }

  std::vector<const ModelEntry*> EntriesOf(int ns, std::optional<EntryClass> c) const {
    std::vector<const ModelEntry*> v;
    for (const ModelEntry& e : model_->entries()) {
      if (e.ns == ns && (!c.has_value() || e.cls == *c)) v.push_back(&e);
    }
    return v;
  }

  // Recently removed entries of `ns` stored with the page size it has now.
  std::vector<const ModelEntry*> Removed(int ns, EntryClass c, int32_t page_size) const {
    std::vector<const ModelEntry*> v;
    for (const ModelEntry& e : model_->graveyard()) {
      if (e.ns == ns && e.cls == c && e.page_size == page_size) v.push_back(&e);
    }
    return v;
  }

  int64_t RandomSize(EntryClass c) {
    const int64_t budget = model_->Budget(c);
    const int r = static_cast<int>(Uniform(0, 99));
    if (r < 3) return Uniform(budget + 1, budget + 20);  // can never fit
    if (r < 5) return budget;                            // needs the whole class
    if (r < 6) return Uniform(-5, 0);                    // malformed
    return Uniform(1, 40);
  }

  uint64_t RandomStaleId() {
    if (!issued_ids_.empty() && Chance(0.8)) return issued_ids_[Pick(issued_ids_.size())];
    return Chance(0.5) ? 0 : static_cast<uint64_t>(Uniform(1, 1 << 30));
  }

  // A reserved entry's id (mostly), or any id at all.
  uint64_t RandomReservationId() {
    std::vector<uint64_t> pending;
    for (const ModelEntry& e : model_->entries()) {
      if (!e.committed) pending.push_back(e.reservation_id);
    }
    if (!pending.empty() && Chance(0.85)) return pending[Pick(pending.size())];
    return RandomStaleId();
  }

  // The parent of a new entry in `ns`: the root, a stored page (any state),
  // or, now and then, a page that is not stored or belongs to the other
  // namespace. Sets `req.parent`, `req.parent_desc`; returns its token count.
  size_t ChooseParent(PutRequest& req) {
    const std::vector<const ModelEntry*> pages = EntriesOf(req.ns, EntryClass::kPage);
    const double r = std::uniform_real_distribution<double>(0, 1)(rng_);
    if (r < 0.25 || pages.empty()) return 0;
    if (r < 0.95) {
      const ModelEntry* p = pages[Pick(pages.size())];
      req.parent = p->key;
      req.parent_desc = absl::StrCat("page", Str(p->prefix));
      return p->prefix.size();
    }
    if (r < 0.975) {
      const int32_t ps = PageSizeOf(req.ns);
      const Tokens t = RandomTokens(ps * Uniform(1, 3));
      req.parent = PageKeyOf(ns_keys_[req.ns], t, ps);
      req.parent_desc = absl::StrCat("maybe-absent", Str(t));
      return t.size();
    }
    const std::vector<const ModelEntry*> other = EntriesOf(1 - req.ns, EntryClass::kPage);
    if (other.empty()) return 0;
    const ModelEntry* p = other[Pick(other.size())];
    req.parent = p->key;
    req.parent_desc = absl::StrCat("other-ns-page", Str(p->prefix));
    return p->prefix.size();
  }

  // Sets the parent of a request that re-puts the stored `prefix`.
  void ParentOfStored(PutRequest& req, const Tokens& prefix, size_t parent_tokens) {
    if (parent_tokens == 0) return;
    req.parent = PageKeyOf(ns_keys_[req.ns], Head(prefix, parent_tokens), req.page_size);
    req.parent_desc = absl::StrCat("page", Str(Head(prefix, parent_tokens)));
  }

  int32_t OtherValidPageSize(int32_t ps) {
    const int32_t options[] = {2, 4, 8};
    int32_t other = ps;
    while (other == ps) other = options[Pick(3)];
    return other;
  }

  PutRequest PageRequest() {
    PutRequest req;
    req.cls = EntryClass::kPage;
    req.ns = static_cast<int>(Pick(kNamespaces));
    req.page_size = PageSizeOf(req.ns);
    req.size = RandomSize(req.cls);
    std::vector<const ModelEntry*> pages = EntriesOf(req.ns, EntryClass::kPage);
    if (Chance(0.3)) pages = Removed(req.ns, EntryClass::kPage, req.page_size);
    if (!pages.empty() && Chance(0.15)) {  // a page stored (or removed) before, again
      const ModelEntry* p = pages[Pick(pages.size())];
      ParentOfStored(req, p->prefix, p->prefix.size() - req.page_size);
      req.tokens.assign(p->prefix.end() - req.page_size, p->prefix.end());
    } else {
      ChooseParent(req);
      req.tokens = RandomTokens(req.page_size);
    }
    const int defect = static_cast<int>(Uniform(0, 199));
    if (defect < 2) {
      const int32_t bad[] = {0, 3, 1 << 17};
      req.page_size = bad[Pick(3)];
    } else if (defect < 4) {
      req.page_size = OtherValidPageSize(req.page_size);
      req.tokens = RandomTokens(req.page_size);
    } else if (defect < 6) {
      if (Chance(0.5)) {
        req.tokens.push_back(0);
      } else {
        req.tokens.pop_back();
      }
    } else if (defect < 7) {
      req.tokens[Pick(req.tokens.size())] = -1;
    }
    req.model_cost = RandomModelCost(req.ns);
    return req;
  }

  PutRequest StateRequest() {
    PutRequest req;
    req.cls = EntryClass::kState;
    req.ns = static_cast<int>(Pick(kNamespaces));
    req.page_size = PageSizeOf(req.ns);
    req.size = RandomSize(req.cls);
    req.kind = Chance(0.5) ? StateKind::kGridCheckpoint : StateKind::kExactPrefix;
    std::vector<const ModelEntry*> states = EntriesOf(req.ns, EntryClass::kState);
    if (Chance(0.3)) states = Removed(req.ns, EntryClass::kState, req.page_size);
    if (!states.empty() && Chance(0.15)) {  // a state stored (or removed) before, again
      const ModelEntry* s = states[Pick(states.size())];
      const size_t base = s->NodeDepth() * req.page_size;
      ParentOfStored(req, s->prefix, base);
      req.tokens.assign(s->prefix.begin() + base, s->prefix.end());
      req.position = static_cast<int64_t>(s->prefix.size());
    } else {
      const size_t base = ChooseParent(req);
      const int64_t min_tail = base == 0 && Chance(0.97) ? 1 : 0;  // p = 0 is malformed
      req.tokens = RandomTokens(Uniform(min_tail, req.page_size - 1));
      req.position = static_cast<int64_t>(base + req.tokens.size());
    }
    const int defect = static_cast<int>(Uniform(0, 199));
    if (defect < 3) {
      req.position += Chance(0.5) ? 1 : -1;
    } else if (defect < 4) {
      req.tokens = RandomTokens(req.page_size);
      req.position = static_cast<int64_t>(req.tokens.size());
    } else if (defect < 6) {
      const int32_t bad[] = {0, 3, 1 << 17};
      req.page_size = bad[Pick(3)];
    } else if (defect < 8) {
      req.page_size = OtherValidPageSize(req.page_size);
    } else if (defect < 9 && !req.tokens.empty()) {
      req.tokens[Pick(req.tokens.size())] = -7;
    }
    req.model_cost = RandomModelCost(req.ns);
    return req;
  }

  // Mostly the namespace's own cost; sometimes another, none, or an invalid one.
  std::optional<PrefillCost> RandomModelCost(int ns) {
    const int r = static_cast<int>(Uniform(0, 99));
    if (r < 30) return std::nullopt;
    if (r < 75) return ns == 0 ? PrefillCost{4, 0.5} : PrefillCost{0.25, 0};
    if (r < 98) {
      const PrefillCost others[] = {{1, 0}, {2.5, 0.75}, {0, 0}};
      return others[Pick(3)];
    }
    const PrefillCost invalid[] = {{-1, 0}, {std::nan(""), 0}, {1, 1e31}, {0, -0.5}};
    return invalid[Pick(4)];
  }

  PutSpec ToSpec(const PutRequest& req) const {
    PutSpec s;
    s.ns = ns_keys_[req.ns];
    s.page_size = req.page_size;
    s.entry_class = req.cls;
    s.parent = req.parent;
    s.tokens = req.tokens;
    s.state_kind = req.kind;
    s.position = req.position;
    s.size_bytes = req.size;
    s.model_cost = req.model_cost;
    return s;
  }

  // --- Operations ---------------------------------------------------------

  void Step() {
    const int r = static_cast<int>(Uniform(0, 99));
    if (r < 18) {
      DoReserve(PageRequest());
    } else if (r < 32) {
      DoReserve(StateRequest());
    } else if (r < 54) {
      DoCommit();
    } else if (r < 56) {
      DoRemoveCorrupt();
    } else if (r < 57) {
      DoAbort();
    } else if (r < 60) {
      DoTouch();
    } else if (r < 80) {
      DoLookup();
    } else if (r < 86) {
      DoRelease();
    } else if (r < 90) {
      DoOpen();
    } else if (r < 98) {
      DoAdvance(/*expire=*/true);
    } else {
      DoAdvance(/*expire=*/false);
    }
  }

  void Begin(std::string what) {
    what = absl::StrCat("#", op_, " t=", now_, " ", what);
    history_.push_back(what);
    if (history_.size() > kHistory) history_.pop_front();
  }

  void Fail(const std::string& what) {
    if (failed_) return;
    failed_ = true;
    ADD_FAILURE() << "seed " << seed_ << ", op " << op_ << ": " << what << "\nconfig: " << config_.Describe()
                  << "\nlast operations:\n  " << absl::StrJoin(history_, "\n  ");
  }

  bool CodeIs(absl::StatusCode want, const absl::Status& got, const char* op) {
    if (got.code() == want) return true;
    Fail(absl::StrCat(op, ": index says ", got.ToString(), ", model expects ", absl::StatusCodeToString(want)));
    return false;
  }

  // The committed entries of the model by (class, key), for what a Reserve evicted.
  std::map<std::pair<int, Hash128>, ModelEntry> CommittedInModel() const {
    std::map<std::pair<int, Hash128>, ModelEntry> out;
    for (const ModelEntry& e : model_->entries()) {
      if (e.committed) out.emplace(std::make_pair(static_cast<int>(e.cls), e.key), e);
    }
    return out;
  }

  // The index's spill record of the Reserve just made is exactly the
  // committed entries the model lost in it, each with its fields and bytes.
  void CheckSpilled(const std::map<std::pair<int, Hash128>, ModelEntry>& before) {
    const std::map<std::pair<int, Hash128>, ModelEntry> after = CommittedInModel();
    std::map<std::pair<int, Hash128>, ModelEntry> lost;
    for (const auto& [id, e] : before) {
      if (after.count(id) == 0) lost.emplace(id, e);
    }
    const std::vector<SpilledEntry> spilled = index_->TakeSpilled();
    if (spilled.size() != lost.size()) {
      Fail(absl::StrCat("Reserve: index spilled ", spilled.size(), " entries, the model evicted ", lost.size()));
      return;
    }
    for (const SpilledEntry& s : spilled) {
      auto it = lost.find({static_cast<int>(s.record.entry_class), s.record.key});
      if (it == lost.end()) {
        Fail(absl::StrCat("Reserve: index spilled ", s.record.key.ToHex(), ", which the model did not evict"));
        return;
      }
      const ModelEntry& e = it->second;
      const bool state = e.cls == EntryClass::kState;
      const size_t tail_begin = state ? e.NodeDepth() * e.page_size : e.prefix.size();
      const std::vector<TokenId> tail(e.prefix.begin() + tail_begin, e.prefix.end());
      if (s.record.ns != ns_keys_[e.ns] || s.record.page_size != e.page_size || s.record.size_bytes != e.size ||
          s.record.checksum != e.checksum || s.record.position != static_cast<int64_t>(e.prefix.size()) ||
          (state && (s.record.tail != tail || s.record.state_kind != e.kind)) || s.blob == nullptr ||
          static_cast<int64_t>(s.blob->size) != e.size) {
        Fail(absl::StrCat("Reserve: the spill record of ", s.record.key.ToHex(), " disagrees with the entry"));
        return;
      }
      lost.erase(it);
    }
  }

  void DoReserve(const PutRequest& req) {
    Begin(req.Describe());
    const std::map<std::pair<int, Hash128>, ModelEntry> before = CommittedInModel();
    absl::StatusOr<Reservation> got = index_->Reserve(ToSpec(req), At(now_));
    const ReserveOutcome want = model_->Reserve(req, now_);
    CheckSpilled(before);
    if (!CodeIs(want.code, got.status(), "Reserve") || !got.ok()) return;
    if (got->already_present != want.already_present || got->key != want.key ||
        got->model_cost_registered != want.model_cost_registered) {
      Fail(absl::StrCat("Reserve: index says already_present=", got->already_present, " key=", got->key.ToHex(),
                        " model_cost_registered=", got->model_cost_registered,
                        ", model expects already_present=", want.already_present, " key=", want.key.ToHex(),
                        " model_cost_registered=", want.model_cost_registered));
      return;
    }
    if (want.already_present) {
      if (got->id != 0 || got->blob != nullptr) Fail("Reserve: an already-present entry came with a reservation");
      return;
    }
    if (got->id == 0 || std::count(issued_ids_.begin(), issued_ids_.end(), got->id) != 0) {
      Fail(absl::StrCat("Reserve: reservation id ", got->id, " is zero or was issued before"));
      return;
    }
    if (got->blob == nullptr || static_cast<int64_t>(got->blob->size) != req.size) {
      Fail("Reserve: the blob is missing or of the wrong size");
      return;
    }
    issued_ids_.push_back(got->id);
    model_->SetReservationId(want.created, got->id);
    history_.back() += absl::StrCat(" -> id ", got->id);
  }

  void DoCommit() {
    const uint64_t id = RandomReservationId();
    const uint64_t checksum = rng_();
    Begin(absl::StrCat("Commit id=", id));
    const absl::Status got = index_->Commit(id, checksum, At(now_));
    CodeIs(model_->Commit(id, checksum, now_), got, "Commit");
  }

  void DoAbort() {
    const uint64_t id = RandomReservationId();
    Begin(absl::StrCat("Abort id=", id));
    index_->Abort(id);
    model_->Abort(id);
  }

  // Mostly an entry some lease holds, to remove it from under the reader.
  void DoRemoveCorrupt() {
    EntryClass c = EntryClass::kPage;
    Hash128 key = ns_keys_[0];
    const auto& leases = model_->leases();
    if (!leases.empty() && Chance(0.5)) {
      const ModelLease& l = std::next(leases.begin(), Pick(leases.size()))->second;
      const HeldEntry& h = l.entries[Pick(l.entries.size())];
      c = h.cls;
      key = h.key;
    } else if (!model_->entries().empty() && Chance(0.9)) {
      const ModelEntry& e = model_->entries()[Pick(model_->entries().size())];
      c = e.cls;
      key = e.key;
    } else if (!model_->graveyard().empty()) {
      const ModelEntry& e = model_->graveyard()[Pick(model_->graveyard().size())];
      c = e.cls;
      key = e.key;
    }
    if (Chance(0.05)) c = c == EntryClass::kPage ? EntryClass::kState : EntryClass::kPage;
    const int i = model_->FindByKey(c, key);
    Begin(absl::StrCat("RemoveCorrupt ", ClassName(c), " ",
                       i >= 0 ? absl::StrCat("ns=", model_->entries()[i].ns, " ", Str(model_->entries()[i].prefix))
                              : absl::StrCat("absent ", key.ToHex())));
    index_->RemoveCorrupt(c, key);
    model_->RemoveCorrupt(c, key);
  }

  void DoTouch() {
    const uint64_t id = RandomReservationId();
    Begin(absl::StrCat("Touch id=", id));
    const absl::Status got = index_->Touch(id, At(now_));
    CodeIs(model_->Touch(id, now_), got, "Touch");
  }

  // A prompt: mostly a stored prefix, cut or extended, sometimes mutated.
  Tokens RandomPrompt(int ns) {
    std::vector<const ModelEntry*> stored = EntriesOf(Chance(0.9) ? ns : 1 - ns, std::nullopt);
    if (Chance(0.5)) {  // mostly continue a committed state, so that lookups hit
      stored.erase(std::remove_if(stored.begin(), stored.end(),
                                  [](const ModelEntry* e) { return e->cls == EntryClass::kPage || !e->committed; }),
                   stored.end());
    }
    Tokens base;
    if (!stored.empty() && Chance(0.8)) base = stored[Pick(stored.size())]->prefix;
    const size_t len = Chance(0.3) ? base.size() : static_cast<size_t>(Uniform(0, kMaxPromptTokens));
    Tokens t = Head(base, len);
    const Tokens more = RandomTokens(len - t.size());
    t.insert(t.end(), more.begin(), more.end());
    if (!t.empty() && Chance(0.2)) t[Pick(t.size())] = static_cast<TokenId>(Uniform(0, kAlphabet - 1));
    return t;
  }

  void DoLookup() {
    const int ns = static_cast<int>(Pick(kNamespaces));
    int32_t ps = PageSizeOf(ns);
    const Tokens tokens = RandomPrompt(ns);
    const bool lease = Chance(0.5);
    std::vector<Hash128> keys;
    const int defect = static_cast<int>(Uniform(0, 99));
    if (defect < 1) {
      const int32_t bad[] = {0, 3, -4, 1 << 17};
      ps = bad[Pick(4)];
    } else if (defect < 2) {
      ps = OtherValidPageSize(ps);
      keys = PageKeys(ns_keys_[ns], tokens, ps);
    } else {
      keys = PageKeys(ns_keys_[ns], tokens, ps);
      if (defect < 3) {
        if (keys.empty() || Chance(0.5)) {
          keys.push_back(ns_keys_[ns]);
        } else {
          keys.pop_back();
        }
      }
    }
    Begin(absl::StrCat("Lookup ns=", ns, " ps=", ps, " keys=", keys.size(), " tokens=", Str(tokens),
                       lease ? " lease" : ""));
    absl::StatusOr<LookupResult> got = index_->Lookup(ns_keys_[ns], ps, keys, tokens, lease, At(now_));
    const LookupOutcome want = model_->Lookup(ns, ps, keys.size(), tokens, lease, now_);
    if (!CodeIs(want.code, got.status(), "Lookup") || !got.ok()) return;
    const LookupResult& r = *got;
    if (r.resume_position != want.resume_position || r.kv_match_tokens != want.kv_match_tokens ||
        r.pages.size() != want.pages.size() || r.state.has_value() != want.state.has_value()) {
      Fail(absl::StrCat("Lookup: index says resume=", r.resume_position, " kv=", r.kv_match_tokens, " pages=",
                        r.pages.size(), " state=", r.state.has_value(), "; model expects resume=", want.resume_position,
                        " kv=", want.kv_match_tokens, " pages=", want.pages.size(), " state=", want.state.has_value()));
      return;
    }
    for (size_t i = 0; i < r.pages.size(); ++i) {
      if (!SameInfo(r.pages[i], want.pages[i], absl::StrCat("Lookup page ", i))) return;
    }
    if (r.state.has_value() && !SameInfo(*r.state, *want.state, "Lookup state")) return;
    if (want.lease_entries.empty()) {
      if (r.lease_id != 0) Fail(absl::StrCat("Lookup: unexpected lease ", r.lease_id));
      return;
    }
    if (r.lease_id == 0 || std::count(issued_ids_.begin(), issued_ids_.end(), r.lease_id) != 0) {
      Fail(absl::StrCat("Lookup: lease id ", r.lease_id, " is zero or was issued before"));
      return;
    }
    if (r.lease_expiry != At(now_ + config_.lease_ttl)) {
      Fail(absl::StrCat("Lookup: lease expiry ", absl::FormatTime(r.lease_expiry)));
      return;
    }
    issued_ids_.push_back(r.lease_id);
    model_->AddLease(r.lease_id, now_, want.lease_entries);
    history_.back() += absl::StrCat(" -> resume ", r.resume_position, " lease ", r.lease_id);
  }

  bool SameInfo(const EntryInfo& got, const EntryInfo& want, const std::string& what) {
    if (got.key == want.key && got.entry_class == want.entry_class && got.size_bytes == want.size_bytes &&
        got.checksum == want.checksum && got.location == want.location && got.state_kind == want.state_kind &&
        got.position == want.position) {
      return true;
    }
    Fail(absl::StrCat(what, ": index says key=", got.key.ToHex(), " size=", got.size_bytes, " checksum=", got.checksum,
                      " position=", got.position, " kind=", static_cast<int>(got.state_kind),
                      "; model expects key=", want.key.ToHex(), " size=", want.size_bytes, " checksum=", want.checksum,
                      " position=", want.position, " kind=", static_cast<int>(want.state_kind)));
    return false;
  }

  uint64_t RandomLeaseId() {
    const auto& leases = model_->leases();
    if (!leases.empty() && Chance(0.8)) return std::next(leases.begin(), Pick(leases.size()))->first;
    return RandomStaleId();
  }

  void DoRelease() {
    const uint64_t id = RandomLeaseId();
    Begin(absl::StrCat("Release lease=", id));
    const absl::Status got = index_->Release(id);
    CodeIs(model_->Release(id), got, "Release");
  }

  void DoOpen() {
    const uint64_t id = RandomLeaseId();
    Hash128 key = ns_keys_[0];
    auto it = model_->leases().find(id);
    if (it != model_->leases().end() && Chance(0.85)) {
      key = it->second.entries[Pick(it->second.entries.size())].key;
    } else if (!model_->entries().empty()) {
      key = model_->entries()[Pick(model_->entries().size())].key;
    }
    Begin(absl::StrCat("Open lease=", id, " key=", key.ToHex()));
    absl::StatusOr<ReadHandle> got = index_->Open(id, key, At(now_));
    EntryInfo want;
    if (!CodeIs(model_->Open(id, key, now_, &want), got.status(), "Open") || !got.ok()) return;
    if (!SameInfo(got->info, want, "Open")) return;
    if (got->blob == nullptr || static_cast<int64_t>(got->blob->size) != want.size_bytes) {
      Fail("Open: the blob is missing or of the wrong size");
    }
  }

  // Moves time forward: a random step, or exactly onto (or just past) a
  // deadline, a lease expiry or a TTL boundary.
  void DoAdvance(bool expire) {
    std::vector<int64_t> marks;
    for (const ModelEntry& e : model_->entries()) {
      const std::optional<int64_t>& ttl = e.cls == EntryClass::kPage ? config_.page_ttl : config_.state_ttl;
      if (e.committed && ttl.has_value()) marks.push_back(e.last_use + *ttl);
      if (!e.committed) marks.insert(marks.end(), {e.deadline, e.deadline + 1});
    }
    for (const auto& [id, lease] : model_->leases()) marks.insert(marks.end(), {lease.expiry, lease.expiry + 1});
    marks.erase(std::remove_if(marks.begin(), marks.end(), [&](int64_t m) { return m <= now_; }), marks.end());
    if (!marks.empty() && Chance(0.3)) {
      now_ = marks[Pick(marks.size())];
    } else {
      now_ += Uniform(0, 300);
    }
    Begin(absl::StrCat(expire ? "Expire" : "Advance"));
    if (!expire) return;
    const int64_t expired_puts_before = index_->Stats().expired_puts;
    std::vector<uint64_t> got = index_->Expire(At(now_));
    std::sort(got.begin(), got.end());
    const ExpireOutcome want = model_->Expire(now_);
    if (got != want.reclaimed) {
      Fail(absl::StrCat("Expire: index reclaimed {", absl::StrJoin(got, ","), "}, model expects {",
                        absl::StrJoin(want.reclaimed, ","), "}"));
      return;
    }
    const int64_t expired_puts = index_->Stats().expired_puts - expired_puts_before;
    if (expired_puts < want.min_expired_puts || expired_puts > want.max_expired_puts) {
      Fail(absl::StrCat("Expire: expired_puts grew by ", expired_puts, ", model expects [", want.min_expired_puts, ", ",
                        want.max_expired_puts, "]"));
      return;
    }
    expected_expired_puts_ += expired_puts;
    if (!got.empty()) history_.back() += absl::StrCat(" -> reclaimed {", absl::StrJoin(got, ","), "}");
  }

  // --- Checks after every operation -----------------------------------------

  bool SameClassStats(const ClassStats& got, EntryClass c) {
    const ModelClassCounters& m = model_->counters(c);
    ClassStats want;
    want.entries = model_->Count(c, true);
    want.resident_bytes = model_->Bytes(c, true);
    want.reserved_bytes = model_->Bytes(c, false);
    want.metadata_bytes = model_->Metadata(c);
    want.budget_bytes = model_->Budget(c);
    want.evicted_lru = m.evicted_lru;
    want.evicted_ttl = m.evicted_ttl;
    want.dropped_with_pages = m.dropped_with_pages;
    auto text = [](const ClassStats& s) {
      return absl::StrCat("entries=", s.entries, " resident=", s.resident_bytes, " reserved=", s.reserved_bytes,
                          " metadata=", s.metadata_bytes, " budget=", s.budget_bytes, " lru=", s.evicted_lru,
                          " ttl=", s.evicted_ttl, " dropped=", s.dropped_with_pages);
    };
    if (text(got) == text(want)) return true;
    Fail(absl::StrCat(ClassName(c), " stats: index says ", text(got), "; model expects ", text(want)));
    return false;
  }

  void Verify() {
    if (!model_->error().empty()) return Fail(absl::StrCat("reference model: ", model_->error()));
    const absl::Status invariants = index_->CheckInvariants();
    if (!invariants.ok()) return Fail(absl::StrCat("CheckInvariants: ", invariants.ToString()));
    // Only a Reserve's eviction spills (DoReserve takes its record): never
    // expiry, an abort, a corrupt entry or a lookup.
    if (!index_->TakeSpilled().empty()) return Fail("entries were spilled outside a Reserve's eviction");

    const IndexStats s = index_->Stats();
    if (!SameClassStats(s.pages, EntryClass::kPage) || !SameClassStats(s.states, EntryClass::kState)) return;
    if (s.pages.resident_bytes + s.pages.reserved_bytes + s.pages.metadata_bytes > s.pages.budget_bytes ||
        s.states.resident_bytes + s.states.reserved_bytes + s.states.metadata_bytes > s.states.budget_bytes) {
      return Fail("a budget is exceeded");
    }
    const std::vector<std::pair<int64_t, int64_t>> totals = {
        {s.namespaces, model_->Namespaces()},
        {s.active_leases, static_cast<int64_t>(model_->leases().size())},
        {s.active_puts, model_->Reserved()},
        {s.lookups, model_->lookups()},
        {s.lookup_hits, model_->lookup_hits()},
        {s.hits_grid_checkpoint, model_->hits_grid()},
        {s.hits_exact_prefix, model_->hits_exact()},
        {s.checksum_failures, model_->checksum_failures()},
        {s.expired_leases, model_->expired_leases()},
        {s.expired_puts, expected_expired_puts_},
        {s.namespaces_with_model_cost, model_->NamespacesWithModelCost()},
    };
    const char* names[] = {"namespaces",
                           "active_leases",
                           "active_puts",
                           "lookups",
                           "lookup_hits",
                           "hits_grid",
                           "hits_exact",
                           "checksum_failures",
                           "expired_leases",
                           "expired_puts",
                           "namespaces_with_model_cost"};
    for (size_t i = 0; i < totals.size(); ++i) {
      if (totals[i].first != totals[i].second) {
        return Fail(
            absl::StrCat("stats.", names[i], ": index says ", totals[i].first, ", model expects ", totals[i].second));
      }
    }

    for (int ns = 0; ns < kNamespaces; ++ns) {
      if (index_->ModelCostOf(ns_keys_[ns]) != model_->ModelCostOf(ns)) {
        return Fail(absl::StrCat("namespace ", ns, ": the index and the model disagree on its model cost"));
      }
    }
    for (const ModelEntry& e : model_->entries()) {
      if (!index_->Contains(e.cls, e.key)) {
        return Fail(absl::StrCat("the index lost the ", e.committed ? "committed " : "reserved ", ClassName(e.cls),
                                 " ns=", e.ns, " ", Str(e.prefix)));
      }
    }
    for (const auto& [id, lease] : model_->leases()) {
      for (const HeldEntry& h : lease.entries) {
        if (h.cls == EntryClass::kPage && lease.pages_void) continue;
        if (model_->FindHeld(h) >= 0 && !index_->Contains(h.cls, h.key)) {
          return Fail(absl::StrCat("the ", ClassName(h.cls), " ", h.key.ToHex(), " leased by ", id, " is gone"));
        }
      }
    }
    const std::deque<ModelEntry>& gone = model_->graveyard();
    for (int probe = 0; probe < 3 && !gone.empty(); ++probe) {
      const ModelEntry& g = gone[Pick(gone.size())];
      if (model_->FindByKey(g.cls, g.key) < 0 && index_->Contains(g.cls, g.key)) {
        return Fail(
            absl::StrCat("the index still holds the removed ", ClassName(g.cls), " ns=", g.ns, " ", Str(g.prefix)));
      }
    }
  }

  // Ends every lease and put; nothing may stay reserved or pinned.
  void Drain() {
    op_ = -1;
    Begin("Drain");
    std::vector<uint64_t> leases;
    for (const auto& [id, lease] : model_->leases()) leases.push_back(id);
    for (uint64_t id : leases) {
      if (!CodeIs(model_->Release(id), index_->Release(id), "Release")) return;
    }
    for (uint64_t id : issued_ids_) {
      index_->Abort(id);
      model_->Abort(id);
    }
    Verify();
    const IndexStats s = index_->Stats();
    if (s.active_leases != 0 || s.active_puts != 0 || s.pages.reserved_bytes != 0 || s.states.reserved_bytes != 0) {
      Fail("leases or puts left after draining");
    }
  }

  const uint32_t seed_;
  std::mt19937 rng_;
  Config config_;
  Hash128 ns_keys_[kNamespaces];
  std::unique_ptr<CacheIndex> index_;
  std::unique_ptr<ReferenceModel> model_;
  int64_t now_ = 0;
  int op_ = 0;
  bool failed_ = false;
  std::deque<std::string> history_;
  std::vector<uint64_t> issued_ids_;  // every reservation and lease id the index handed out
  int64_t expected_expired_puts_ = 0;
};

TEST(CacheIndexRandomTest, AgreesWithReferenceModelOnRandomOperations) {
  int failed_seeds = 0;
  for (uint32_t seed = 1; seed <= kSeeds; ++seed) {
    RandomRun run(seed, /*utility=*/false);
    if (!run.Run(kOpsPerSeed)) failed_seeds++;
  }
  EXPECT_EQ(failed_seeds, 0);
}

TEST(CacheIndexRandomTest, UtilityEvictionAgreesWithReferenceModelOnRandomOperations) {
  int failed_seeds = 0;
  for (uint32_t seed = 1; seed <= kSeeds; ++seed) {
    RandomRun run(seed, /*utility=*/true);
    if (!run.Run(kOpsPerSeed)) failed_seeds++;
  }
  EXPECT_EQ(failed_seeds, 0);
}

}  // namespace
}  // namespace hybridserve::cachestore
