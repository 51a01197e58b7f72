#include "bench/cachestore/cache_sim.h"

#include <algorithm>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "cachestore/keys.h"

namespace hybridserve::bench {
namespace {

using cachestore::CacheIndex;
using cachestore::EntryClass;
using cachestore::Hash128;
using cachestore::PutSpec;
using cachestore::StateKind;

class Publisher {
 public:
  Publisher(CacheIndex& index, const ModelCost& model, const Hash128& ns, CacheSimResult& result)
      : index_(index), model_(model), ns_(ns), result_(result) {}

  // Pages [first, last) of `tokens`, in order, up to the first that fails (the
  // pages after it would have no parent).
  void Pages(const std::vector<TokenId>& tokens, const std::vector<Hash128>& keys, int64_t first, int64_t last,
             absl::Time now) {
    const int64_t ps = model_.page_size();
    for (int64_t i = first; i < last; ++i) {
      PutSpec spec = Spec(EntryClass::kPage, keys, i);
      spec.tokens.assign(tokens.begin() + i * ps, tokens.begin() + (i + 1) * ps);
      spec.size_bytes = model_.page_bytes();
      if (!Put(spec, now, &result_.page_bytes_written, &result_.pages_written)) return;
    }
  }

  void State(const std::vector<TokenId>& tokens, const std::vector<Hash128>& keys, int64_t position, StateKind kind,
             absl::Time now) {
    const int64_t ps = model_.page_size();
    const int64_t n = position / ps;
    PutSpec spec = Spec(EntryClass::kState, keys, n);
    spec.tokens.assign(tokens.begin() + n * ps, tokens.begin() + position);
    spec.state_kind = kind;
    spec.position = position;
    spec.size_bytes = model_.StateBytes(position, /*with_logits=*/kind == StateKind::kExactPrefix);
    Put(spec, now, &result_.state_bytes_written, &result_.states_written);
  }

 private:
  // The entry below page `below` (its parent is page below - 1, or the root).
  PutSpec Spec(EntryClass c, const std::vector<Hash128>& keys, int64_t below) const {
    PutSpec spec;
    spec.ns = ns_;
    spec.page_size = model_.page_size();
    spec.entry_class = c;
    if (below > 0) spec.parent = keys[below - 1];
    return spec;
  }

  bool Put(const PutSpec& spec, absl::Time now, int64_t* bytes, int64_t* entries) {
    absl::StatusOr<cachestore::Reservation> r = index_.Reserve(spec, now);
    if (!r.ok()) {
      ++result_.put_failures;
      return false;
    }
    if (r->already_present) return true;
    if (!index_.Commit(r->id, /*checksum=*/0, now).ok()) {
      ++result_.put_failures;
      return false;
    }
    *bytes += spec.size_bytes;
    ++*entries;
    return true;
  }

  CacheIndex& index_;
  const ModelCost& model_;
  const Hash128 ns_;
  CacheSimResult& result_;
};

}  // namespace

absl::StatusOr<CacheSimResult> RunCacheSim(const Trace& trace, const ModelCost& model, const CacheSimOptions& options) {
  if (options.tokens.units_per_token <= 0 || options.tokens.vocab <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("token rule: units_per_token ", options.tokens.units_per_token,
                                                   ", vocab ", options.tokens.vocab, " must be > 0"));
  }
  CacheIndex index(options.index);
  const int32_t ps = model.page_size();
  const Hash128 ns = cachestore::NamespaceKey("cache_sim", "", "tenant", "", ps);
  CacheSimResult result;
  Publisher publisher(index, model, ns, result);
  // Each conversation's context: every token so far (its last prompt and reply).
  absl::flat_hash_map<int64_t, std::vector<TokenId>> context;
  const absl::Time start = absl::UnixEpoch();

  for (const TraceTurn& turn : trace.turns) {
    const absl::Time now = start + absl::Seconds(turn.arrival_s);
    std::vector<TokenId>& tokens = context[turn.conv];
    if (turn.turn == 0 && turn.shared >= 0) {
      options.tokens.Append(turn.shared, 0, /*segment=*/0, turn.shared_units, &tokens);
    }
    options.tokens.Append(turn.conv, turn.turn, /*segment=*/1, turn.user_units, &tokens);
    const int64_t n = static_cast<int64_t>(tokens.size());
    if (n == 0) continue;  // nothing to look up or prefill

    // 1. The lookup.
    const std::vector<Hash128> prompt_keys = cachestore::PageKeys(ns, tokens, ps);
    absl::StatusOr<cachestore::LookupResult> hit = index.Lookup(ns, ps, prompt_keys, tokens, /*lease=*/false, now);
    if (!hit.ok()) return absl::InternalError(absl::StrCat("lookup: ", hit.status().message()));
    const int64_t p = std::min(hit->resume_position, n);
    ++result.turns;
    result.prompt_tokens += n;
    result.hit_tokens += p;
    result.hits.push_back(p);
    result.prompt_flops += model.PrefixFlops(n);
    result.saved_flops += model.PrefixFlops(p);

    // 2. Prefill's publication.
    publisher.Pages(tokens, prompt_keys, std::min(hit->kv_match_tokens, p) / ps, n / ps, now);
    const int64_t interval = model.checkpoint_interval();
    for (int64_t q = (p / interval + 1) * interval; q <= n; q += interval) {
      publisher.State(tokens, prompt_keys, q, StateKind::kGridCheckpoint, now);
    }
    publisher.State(tokens, prompt_keys, n, StateKind::kExactPrefix, now);

    // 3. Decode's publication of the turn end.
    const int64_t prompt_pages = n / ps;
    options.tokens.Append(turn.conv, turn.turn, /*segment=*/2, turn.reply_units, &tokens);
    const int64_t m = static_cast<int64_t>(tokens.size()) - 1;  // the last reply token is not fed
    if (m < n) continue;                                        // no reply
    const std::vector<Hash128> fed_keys =
        cachestore::PageKeys(ns, absl::MakeConstSpan(tokens).subspan(0, static_cast<size_t>(m)), ps);
    publisher.Pages(tokens, fed_keys, prompt_pages, m / ps, now);
    publisher.State(tokens, fed_keys, m, StateKind::kExactPrefix, now);
  }
  result.end = index.Stats();
  return result;
}

}  // namespace hybridserve::bench
