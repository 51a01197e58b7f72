// SequenceTable against a naive reference model over thousands of random
// operations (STYLE.md: every new data structure gets one), plus the
// contracts of its individual calls.

#include "engine/sequence_table.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/backend_registry.h"
#include "engine/model_test_util.h"
#include "engine/snapshot_codec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hybridserve::engine {
namespace {

using ::testing::HasSubstr;

StateLayout SmallLayout() {
  StateLayout l;
  l.mamba_layers = 2;
  l.ssm_heads = 2;
  l.ssm_head_dim = 3;
  l.ssm_state = 4;
  l.conv_dim = 5;
  l.conv_kernel = 4;
  l.attention_layers = 2;
  l.kv_heads = 1;
  l.kv_head_dim = 2;
  l.page_size = 4;
  l.vocab = 7;
  return l;
}

// A state of `layout` at `position` whose every float is `seed` + its index.
SequenceState StateAt(const StateLayout& layout, int64_t position, float seed) {
  SequenceState s;
  s.position = position;
  float v = seed;
  auto fill = [&v](int64_t n) {
    std::vector<float> a(static_cast<size_t>(n));
    for (float& x : a) x = v++;
    return a;
  };
  for (int l = 0; l < layout.mamba_layers; ++l) s.ssm_states.push_back(fill(layout.ssm_state_floats()));
  for (int l = 0; l < layout.mamba_layers; ++l) s.conv_states.push_back(fill(layout.conv_state_floats()));
  for (int l = 0; l < layout.attention_layers; ++l) {
    s.tail_k.push_back(fill(layout.tail_kv_floats(position)));
    s.tail_v.push_back(fill(layout.tail_kv_floats(position)));
  }
  s.last_logits = fill(layout.vocab);
  return s;
}

// The snapshot encoding of live sequence `id` of `t` and its full pages: the
// bytes a resume reads from the cache.
struct Cached {
  std::string state;
  std::vector<std::string> pages;
};
Cached CacheOf(const SequenceTable& t, SequenceId id) {
  Cached c;
  EXPECT_TRUE(t.EncodeStateInto(id, true, common::Hash128{1, 2}, common::Hash128{3, 4}, &c.state).ok());
  const int64_t full = t.layout().full_pages(*t.Position(id));
  for (int64_t i = 0; i < full; ++i) c.pages.push_back(*t.ExportPage(id, i));
  return c;
}

// Every array of two captured states, bit for bit.
void ExpectSameState(const SequenceState& got, const SequenceState& want) {
  EXPECT_EQ(got.position, want.position);
  EXPECT_EQ(got.ssm_states, want.ssm_states);
  EXPECT_EQ(got.conv_states, want.conv_states);
  EXPECT_EQ(got.tail_k, want.tail_k);
  EXPECT_EQ(got.tail_v, want.tail_v);
  EXPECT_EQ(got.last_logits, want.last_logits);
}

class SequenceTableTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto backend = CreateBackend(BackendOptions());
    ASSERT_TRUE(backend.ok());
    backend_ = *std::move(backend);
  }

  std::unique_ptr<SequenceTable> NewTable(int64_t pages, int64_t slots) {
    SequenceTableOptions o;
    o.layout = SmallLayout();
    o.max_pages = pages;
    o.max_sequences = slots;
    auto t = SequenceTable::Create(o, *backend_);
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? *std::move(t) : nullptr;
  }

  // A live sequence at `position` with distinctive state and page bytes.
  absl::StatusOr<SequenceId> Imported(SequenceTable& t, int64_t position, float seed) {
    absl::StatusOr<ImportReservation> r = t.ReserveImport(position);
    if (!r.ok()) return r.status();
    const StateLayout& l = t.layout();
    for (int64_t i = 0; i < l.full_pages(position); ++i) {
      std::string page(static_cast<size_t>(l.page_bytes()), static_cast<char>(seed + i));
      absl::Status s = t.ImportPage(r->id, i, page);
      if (!s.ok()) return s;
    }
    absl::Status s = t.FinishImport(r->id, StateAt(l, position, seed));
    if (!s.ok()) return s;
    return r->id;
  }

  // What the cache holds of a sequence at `position` (bytes from `seed`) of
  // another table.
  Cached CachedSequence(int64_t position, float seed) {
    auto from = NewTable(16, 4);
    auto id = Imported(*from, position, seed);
    EXPECT_TRUE(id.ok()) << id.status();
    return id.ok() ? CacheOf(*from, *id) : Cached();
  }

  // SmallLayout without attention layers: a pure Mamba2 model's table.
  static SequenceTableOptions StateOnlyOptions() {
    SequenceTableOptions o;
    o.layout = SmallLayout();
    o.layout.attention_layers = 0;
    o.layout.kv_heads = 0;
    o.layout.kv_head_dim = 0;
    return o;
  }
  absl::StatusOr<std::unique_ptr<SequenceTable>> NewStateOnlyTable() {
    return SequenceTable::Create(StateOnlyOptions(), *backend_);
  }

  std::unique_ptr<kernels::Backend> backend_;
};

TEST_F(SequenceTableTest, ForkSharesFullPagesCopiesThePartialOneAndTheState) {
  auto t = NewTable(16, 4);
  auto parent = Imported(*t, 10, 1.0f);  // pages 0, 1 full; page 2 holds 2 tokens
  ASSERT_TRUE(parent.ok()) << parent.status();
  EXPECT_EQ(t->num_free_pages(), 13);
  auto child = t->Fork(*parent);
  ASSERT_TRUE(child.ok()) << child.status();
  EXPECT_EQ(t->num_free_pages(), 12);  // one new page: the partial one
  const auto& pt = (*t->Find(*parent))->block_table;
  const auto& ct = (*t->Find(*child))->block_table;
  ASSERT_EQ(ct.size(), 3u);
  EXPECT_EQ(ct[0], pt[0]);
  EXPECT_EQ(ct[1], pt[1]);
  EXPECT_NE(ct[2], pt[2]);
  EXPECT_EQ(t->page_refcount(pt[0]), 2);
  EXPECT_EQ(t->page_refcount(pt[2]), 1);
  auto ps = t->CaptureState(*parent, true);
  auto cs = t->CaptureState(*child, true);
  ASSERT_TRUE(ps.ok() && cs.ok());
  std::string what;
  EXPECT_TRUE(testing::StatesBitEqual(*cs, *ps, &what)) << what;
  EXPECT_EQ(*t->ExportPage(*child, 1), *t->ExportPage(*parent, 1));

  ASSERT_TRUE(t->Release(*parent).ok());
  EXPECT_EQ(t->page_refcount(ct[0]), 1);
  EXPECT_EQ(t->num_free_pages(), 13);
  ASSERT_TRUE(t->Release(*child).ok());
  EXPECT_EQ(t->num_free_pages(), 16);
  EXPECT_EQ(t->num_free_slots(), 4);
}

TEST_F(SequenceTableTest, ForkFailsWholeWhenNoSlotOrNoPageIsFree) {
  auto t = NewTable(3, 2);
  auto parent = Imported(*t, 10, 1.0f);  // all 3 pages
  ASSERT_TRUE(parent.ok());
  auto child = t->Fork(*parent);  // needs a page for the partial one
  EXPECT_EQ(child.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(t->num_free_slots(), 1);
  EXPECT_EQ(t->page_refcount((*t->Find(*parent))->block_table[0]), 1);
  auto full = NewTable(8, 1);
  auto only = Imported(*full, 8, 2.0f);  // on a page boundary: a fork needs no page, but no slot is free
  ASSERT_TRUE(only.ok());
  EXPECT_EQ(full->Fork(*only).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(full->num_free_pages(), 6);
  EXPECT_EQ(full->Fork(*only + 99).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(SequenceTableTest, ReservePagesHoldsPagesAheadAllOrNothing) {
  auto t = NewTable(8, 2);
  auto id = t->New();
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(t->ReservePages(*id, 17).ok());  // 5 pages
  EXPECT_EQ(t->num_free_pages(), 3);
  EXPECT_EQ(t->ReservePages(*id, 10).code(), absl::StatusCode::kOk);  // already held
  EXPECT_EQ(t->ReservePages(*id, 33).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(t->num_free_pages(), 3);
  EXPECT_EQ(t->ReservePages(*id, -1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(t->ReservePages(12345, 1).code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(t->Release(*id).ok());
  EXPECT_EQ(t->num_free_pages(), 8);
}

// The reference: which pages each sequence holds, and its slot.
struct RefSequence {
  std::vector<int32_t> pages;
  int64_t position = 0;
  bool importing = false;
};

TEST_F(SequenceTableTest, AgreesWithANaiveReferenceOverRandomOperations) {
  constexpr int64_t kPages = 24;
  constexpr int64_t kSlots = 6;
  auto t = NewTable(kPages, kSlots);
  const StateLayout l = t->layout();
  std::map<SequenceId, RefSequence> ref;
  std::mt19937_64 rng(7);
  auto held = [&]() {
    std::map<int32_t, int32_t> count;
    for (const auto& [id, s] : ref) {
      for (int32_t p : s.pages) ++count[p];
    }
    return count;
  };
  auto pick = [&]() -> SequenceId {
    if (ref.empty()) return 987654;
    auto it = ref.begin();
    std::advance(it, static_cast<long>(rng() % ref.size()));
    return it->first;
  };
  for (int op = 0; op < 5000; ++op) {
    const int64_t free_pages = kPages - static_cast<int64_t>(held().size());
    const bool slot_free = static_cast<int64_t>(ref.size()) < kSlots;
    switch (rng() % 7) {
      case 0: {  // New
        auto id = t->New();
        ASSERT_EQ(id.ok(), slot_free);
        if (id.ok()) ref[*id] = RefSequence();
        break;
      }
      case 1: {  // Release
        const SequenceId id = pick();
        ASSERT_EQ(t->Release(id).ok(), ref.count(id) == 1);
        ref.erase(id);
        break;
      }
      case 2: {  // Fork
        const SequenceId id = pick();
        auto child = t->Fork(id);
        if (ref.count(id) == 0 || ref[id].importing) {
          ASSERT_FALSE(child.ok());
          break;
        }
        const RefSequence& p = ref[id];
        const int64_t full = l.full_pages(p.position);
        const bool partial = l.pages_for(p.position) > full;
        ASSERT_EQ(child.ok(), slot_free && (!partial || free_pages >= 1)) << child.status();
        if (!child.ok()) break;
        RefSequence c;
        c.position = p.position;
        c.pages.assign(p.pages.begin(), p.pages.begin() + full);
        const auto& table = (*t->Find(*child))->block_table;
        ASSERT_EQ(static_cast<int64_t>(table.size()), full + (partial ? 1 : 0));
        ASSERT_TRUE(std::equal(c.pages.begin(), c.pages.end(), table.begin()));
        if (partial) c.pages.push_back(table.back());
        std::string what;
        ASSERT_TRUE(testing::StatesBitEqual(*t->CaptureState(*child, true), *t->CaptureState(id, true), &what)) << what;
        ref[*child] = c;
        break;
      }
      case 3: {  // ReservePages
        const SequenceId id = pick();
        const int64_t positions = static_cast<int64_t>(rng() % 40);
        const absl::Status s = t->ReservePages(id, positions);
        if (ref.count(id) == 0) {
          ASSERT_EQ(s.code(), absl::StatusCode::kNotFound);
          break;
        }
        const int64_t need = std::max<int64_t>(0, l.pages_for(positions) - static_cast<int64_t>(ref[id].pages.size()));
        ASSERT_EQ(s.ok(), need <= free_pages) << s;
        if (s.ok()) ref[id].pages = (*t->Find(id))->block_table;
        break;
      }
      case 4: {  // Import (reserve, pages, finish) or leave it importing
        const int64_t n = 1 + static_cast<int64_t>(rng() % 30);
        auto r = t->ReserveImport(n);
        ASSERT_EQ(r.ok(), slot_free && l.pages_for(n) <= free_pages) << r.status();
        if (!r.ok()) break;
        RefSequence s;
        s.pages = r->page_slots;
        s.position = n;
        s.importing = true;
        if (rng() % 2 == 0) {
          for (int64_t i = 0; i < l.full_pages(n); ++i) {
            ASSERT_TRUE(t->ImportPage(r->id, i, std::string(static_cast<size_t>(l.page_bytes()), 'x')).ok());
          }
          ASSERT_TRUE(t->FinishImport(r->id, StateAt(l, n, static_cast<float>(op))).ok());
          s.importing = false;
        }
        ref[r->id] = s;
        break;
      }
      case 5: {  // AbortImport
        const SequenceId id = pick();
        const absl::Status s = t->AbortImport(id);
        const bool importing = ref.count(id) == 1 && ref[id].importing;
        ASSERT_EQ(s.ok(), importing) << s;
        if (importing) ref.erase(id);
        break;
      }
      case 6: {  // Position
        const SequenceId id = pick();
        auto p = t->Position(id);
        if (ref.count(id) == 1 && !ref[id].importing) {
          ASSERT_TRUE(p.ok());
          ASSERT_EQ(*p, ref[id].position);
        } else {
          ASSERT_FALSE(p.ok());
        }
        break;
      }
    }
    // Invariants: refcounts are the number of holders; free counts add up.
    const auto count = held();
    ASSERT_EQ(t->num_free_pages(), kPages - static_cast<int64_t>(count.size())) << "op " << op;
    ASSERT_EQ(t->num_free_slots(), kSlots - static_cast<int64_t>(ref.size()));
    ASSERT_EQ(t->num_sequences(), static_cast<int64_t>(ref.size()));
    for (int32_t p = 0; p < kPages; ++p) {
      auto it = count.find(p);
      ASSERT_EQ(t->page_refcount(p), it == count.end() ? 0 : it->second) << "page " << p << " op " << op;
    }
  }
}

// The bytes of `regions` back to back, read through the backend.
std::string RegionBytes(kernels::Backend& backend, const std::vector<PageRegion>& regions) {
  std::string out;
  for (const PageRegion& r : regions) {
    std::string part(static_cast<size_t>(r.bytes), '\0');
    EXPECT_EQ(backend.CopyToHost(part.data(), r.data, r.bytes), 0);
    out += part;
  }
  return out;
}

TEST_F(SequenceTableTest, PageRegionsAreTheWireFormatInOrder) {
  auto t = NewTable(16, 4);
  auto id = Imported(*t, 9, 3.0f);  // 2 full pages
  ASSERT_TRUE(id.ok()) << id.status();
  const StateLayout& l = t->layout();
  for (int64_t i = 0; i < 2; ++i) {
    auto regions = t->ExportPageRegions(*id, i);
    ASSERT_TRUE(regions.ok()) << regions.status();
    ASSERT_EQ(regions->size(), static_cast<size_t>(2 * l.attention_layers));
    for (const PageRegion& r : *regions) EXPECT_EQ(r.bytes, l.page_kv_floats() * 4);
    EXPECT_EQ(RegionBytes(*backend_, *regions), *t->ExportPage(*id, i)) << "page " << i;
  }
  EXPECT_EQ(t->ExportPageRegions(*id, 2).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(t->ExportPageRegions(999, 0).status().code(), absl::StatusCode::kNotFound);
  auto r = t->ReserveImport(9);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(t->ExportPageRegions(r->id, 0).status().code(), absl::StatusCode::kFailedPrecondition);
}

// A sequence moved page by page from one table's pool into another's
// reserved slots, device to device, ends with the sender's bytes.
TEST_F(SequenceTableTest, PagesWrittenInPlaceAndMarkedImportLikeImportPage) {
  auto a = NewTable(16, 4);
  auto b = NewTable(16, 4);
  auto src = Imported(*a, 13, 5.0f);  // 3 full pages and a partial one
  ASSERT_TRUE(src.ok());
  auto r = b->ReserveImport(13);
  ASSERT_TRUE(r.ok());
  for (int64_t i = 0; i < 3; ++i) {
    auto from = a->ExportPageRegions(*src, i);
    auto to = b->ImportPageRegions(r->id, i);
    ASSERT_TRUE(from.ok() && to.ok()) << from.status() << to.status();
    ASSERT_EQ(from->size(), to->size());
    for (size_t k = 0; k < from->size(); ++k) {
      ASSERT_EQ((*from)[k].bytes, (*to)[k].bytes);
      ASSERT_EQ(backend_->CopyOnDevice((*to)[k].data, (*from)[k].data, (*to)[k].bytes), 0);
    }
    // Not arrived until marked: no read-back, and FinishImport still waits for it.
    std::string back(static_cast<size_t>(b->layout().page_bytes()), '\0');
    EXPECT_EQ(b->ImportedPageInto(r->id, i, absl::MakeSpan(back)).code(), absl::StatusCode::kFailedPrecondition);
    ASSERT_TRUE(b->MarkPageImported(r->id, i).ok());
    ASSERT_TRUE(b->ImportedPageInto(r->id, i, absl::MakeSpan(back)).ok());
    EXPECT_EQ(back, *a->ExportPage(*src, i));
    // Twice is refused, as ImportPage refuses a page sent twice.
    EXPECT_THAT(b->MarkPageImported(r->id, i).message(), HasSubstr("sent twice"));
    EXPECT_EQ(b->ImportPageRegions(r->id, i).status().code(), absl::StatusCode::kInvalidArgument);
    if (i == 1) {
      EXPECT_EQ(b->FinishImport(r->id, StateAt(b->layout(), 13, 5.0f)).code(), absl::StatusCode::kFailedPrecondition);
    }
  }
  ASSERT_TRUE(b->FinishImport(r->id, *a->CaptureState(*src, true)).ok());
  for (int64_t i = 0; i < 3; ++i) EXPECT_EQ(*b->ExportPage(r->id, i), *a->ExportPage(*src, i));
  ExpectSameState(*b->CaptureState(r->id, true), *a->CaptureState(*src, true));
  // Live now: the import calls are refused.
  EXPECT_EQ(b->ImportPageRegions(r->id, 0).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(b->MarkPageImported(r->id, 0).code(), absl::StatusCode::kFailedPrecondition);
}

// Pages a host reader writes through ImportPageHostViews (decode reading a
// prompt's cached pages) and marks arrived import like ImportPage: the same
// bytes, and the rest may still arrive by ImportPage.
TEST_F(SequenceTableTest, PagesWrittenThroughHostViewsImportLikeImportPage) {
  auto a = NewTable(16, 4);
  auto b = NewTable(16, 4);
  auto src = Imported(*a, 13, 5.0f);  // 3 full pages and a partial one
  ASSERT_TRUE(src.ok());
  auto r = b->ReserveImport(13);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(b->ImportPageHostViews(r->id, 4).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(b->ImportPageHostViews(r->id, -1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(b->ImportPageHostViews(999, 1).status().code(), absl::StatusCode::kNotFound);
  auto live = b->New();
  ASSERT_TRUE(live.ok());
  EXPECT_EQ(b->ImportPageHostViews(*live, 0).status().code(), absl::StatusCode::kFailedPrecondition);
  auto views = b->ImportPageHostViews(r->id, 2);
  ASSERT_TRUE(views.ok()) << views.status();
  ASSERT_EQ(views->size(), 2u);
  for (int64_t i = 0; i < 2; ++i) {
    const std::string bytes = *a->ExportPage(*src, i);
    size_t at = 0;
    for (absl::Span<char> segment : (*views)[static_cast<size_t>(i)]) {
      ASSERT_LE(at + segment.size(), bytes.size());
      std::memcpy(segment.data(), bytes.data() + at, segment.size());
      at += segment.size();
    }
    ASSERT_EQ(at, bytes.size()) << "page " << i << ": the views are the whole page";
    ASSERT_TRUE(b->MarkPageImported(r->id, i).ok());
  }
  // A page already arrived has no views to give.
  EXPECT_EQ(b->ImportPageHostViews(r->id, 1).status().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(b->ImportPage(r->id, 2, *a->ExportPage(*src, 2)).ok());
  ASSERT_TRUE(b->FinishImport(r->id, *a->CaptureState(*src, true)).ok());
  for (int64_t i = 0; i < 3; ++i) EXPECT_EQ(*b->ExportPage(r->id, i), *a->ExportPage(*src, i)) << "page " << i;
  ExpectSameState(*b->CaptureState(r->id, true), *a->CaptureState(*src, true));
}

TEST_F(SequenceTableTest, InPlaceImportCallsValidateAndAnAbortedHalfWrittenImportFreesEverything) {
  auto t = NewTable(16, 4);
  const int64_t free_pages = t->num_free_pages();
  const int64_t free_slots = t->num_free_slots();
  auto r = t->ReserveImport(10);  // 2 full pages
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(t->ImportPageRegions(999, 0).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(t->MarkPageImported(999, 0).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(t->ImportPageRegions(r->id, 2).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(t->ImportPageRegions(r->id, -1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(t->MarkPageImported(r->id, 2).code(), absl::StatusCode::kInvalidArgument);
  std::string small(3, '\0');
  ASSERT_TRUE(t->MarkPageImported(r->id, 0).ok());
  EXPECT_EQ(t->ImportedPageInto(r->id, 0, absl::MakeSpan(small)).code(), absl::StatusCode::kInvalidArgument);
  // Page 1 half written, never marked: the import aborts whole.
  auto regions = t->ImportPageRegions(r->id, 1);
  ASSERT_TRUE(regions.ok());
  ASSERT_EQ(backend_->Fill((*regions)[0].data, 0x5a, (*regions)[0].bytes), 0);
  ASSERT_TRUE(t->AbortImport(r->id).ok());
  EXPECT_EQ(t->num_free_pages(), free_pages);
  EXPECT_EQ(t->num_free_slots(), free_slots);
  EXPECT_EQ(t->ImportPageRegions(r->id, 1).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(SequenceTableTest, ImportOfAStateOnlyModelHasNoPages) {
  auto t = NewStateOnlyTable();
  ASSERT_TRUE(t.ok());
  const SequenceTableOptions o = StateOnlyOptions();
  auto r = (*t)->ReserveImport(50);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->page_slots.empty());
  EXPECT_THAT((*t)->ImportPage(r->id, 0, "").message(), HasSubstr("no attention layers"));
  EXPECT_THAT((*t)->ImportPageRegions(r->id, 0).status().message(), HasSubstr("no attention layers"));
  EXPECT_THAT((*t)->MarkPageImported(r->id, 0).message(), HasSubstr("no attention layers"));
  ASSERT_TRUE((*t)->FinishImport(r->id, StateAt(o.layout, 50, 3.0f)).ok());
  EXPECT_EQ(*(*t)->Position(r->id), 50);
}

// A resume that reads the cached pages straight into the pool ends where
// Restore of the same bytes ends, bit for bit.
TEST_F(SequenceTableTest, RestoreInPlaceEndsAsRestoreOfTheSameBytes) {
  const Cached cached = CachedSequence(13, 5.0f);  // 3 full pages and a partial one
  auto view = ParseSnapshot(cached.state);
  ASSERT_TRUE(view.ok()) << view.status();

  auto t = NewTable(16, 4);
  auto restored = t->New();
  ASSERT_TRUE(restored.ok());
  std::vector<absl::string_view> page_views(cached.pages.begin(), cached.pages.end());
  ASSERT_TRUE(t->Restore(*restored, *view, page_views).ok());

  auto in_place = t->New();
  ASSERT_TRUE(in_place.ok());
  auto regions = t->BeginRestoreInPlace(*in_place, 13);
  ASSERT_TRUE(regions.ok()) << regions.status();
  ASSERT_EQ(regions->size(), 3u);
  for (size_t i = 0; i < regions->size(); ++i) {
    const std::vector<absl::Span<char>>& page = (*regions)[i];
    ASSERT_EQ(page.size(), static_cast<size_t>(2 * t->layout().attention_layers));
    size_t at = 0;
    for (const absl::Span<char>& r : page) {
      std::memcpy(r.data(), cached.pages[i].data() + at, r.size());
      at += r.size();
    }
    EXPECT_EQ(at, cached.pages[i].size());
  }
  // Not live while its pages are being written.
  EXPECT_EQ(t->Position(*in_place).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(t->ExportPage(*in_place, 0).status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(t->FinishRestoreInPlace(*in_place, *view).ok());

  EXPECT_EQ(*t->Position(*in_place), 13);
  for (int64_t i = 0; i < 3; ++i) EXPECT_EQ(*t->ExportPage(*in_place, i), *t->ExportPage(*restored, i));
  ExpectSameState(*t->CaptureState(*in_place, true), *t->CaptureState(*restored, true));
  EXPECT_EQ(CacheOf(*t, *in_place).state, cached.state);
}

TEST_F(SequenceTableTest, RestoreInPlaceRefusesWhatRestoreRefusesAndAnAbortGivesThePagesBack) {
  const Cached cached = CachedSequence(9, 2.0f);  // 2 full pages and a partial one
  auto view = ParseSnapshot(cached.state);
  ASSERT_TRUE(view.ok());

  auto t = NewTable(4, 4);
  const int64_t free_pages = t->num_free_pages();
  auto id = t->New();
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(t->BeginRestoreInPlace(999, 9).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(t->BeginRestoreInPlace(*id, -1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(t->BeginRestoreInPlace(*id, 17).status().code(), absl::StatusCode::kResourceExhausted);  // 5 pages
  EXPECT_EQ(t->num_free_pages(), free_pages);
  EXPECT_EQ(t->FinishRestoreInPlace(*id, *view).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(t->AbortRestoreInPlace(*id).code(), absl::StatusCode::kFailedPrecondition);

  // A state of another position: refused, still restoring, then aborted.
  auto regions = t->BeginRestoreInPlace(*id, 8);
  ASSERT_TRUE(regions.ok());
  EXPECT_EQ(regions->size(), 2u);
  EXPECT_EQ(t->num_free_pages(), free_pages - 2);
  EXPECT_EQ(t->BeginRestoreInPlace(*id, 8).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(t->FinishRestoreInPlace(*id, *view).message(), HasSubstr("not a state at 9"));
  ASSERT_TRUE(t->AbortRestoreInPlace(*id).ok());
  EXPECT_EQ(t->num_free_pages(), free_pages);
  EXPECT_EQ(*t->Position(*id), 0);

  // Live again and empty: a restore in place works now, and a live sequence
  // is not empty.
  regions = t->BeginRestoreInPlace(*id, 9);
  ASSERT_TRUE(regions.ok());
  EXPECT_EQ(t->num_free_pages(), free_pages - 3);  // the partial page too
  ASSERT_TRUE(t->FinishRestoreInPlace(*id, *view).ok());
  EXPECT_EQ(t->BeginRestoreInPlace(*id, 9).status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(t->Release(*id).ok());
  EXPECT_EQ(t->num_free_pages(), free_pages);
}

TEST_F(SequenceTableTest, RestoreInPlaceOfAStateOnlyModelHasNoPages) {
  auto t = NewStateOnlyTable();
  ASSERT_TRUE(t.ok());
  const SequenceTableOptions o = StateOnlyOptions();
  auto r = (*t)->ReserveImport(50);
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE((*t)->FinishImport(r->id, StateAt(o.layout, 50, 3.0f)).ok());
  const Cached cached = CacheOf(**t, r->id);
  auto view = ParseSnapshot(cached.state);
  ASSERT_TRUE(view.ok());
  auto id = (*t)->New();
  ASSERT_TRUE(id.ok());
  auto regions = (*t)->BeginRestoreInPlace(*id, 50);
  ASSERT_TRUE(regions.ok());
  EXPECT_TRUE(regions->empty());
  ASSERT_TRUE((*t)->FinishRestoreInPlace(*id, *view).ok());
  EXPECT_EQ((*t)->CaptureState(*id, true)->ssm_states, (*t)->CaptureState(r->id, true)->ssm_states);
}

}  // namespace
}  // namespace hybridserve::engine
