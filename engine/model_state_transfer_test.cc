// Moving a sequence's state between models and sequences (docs/ARCHITECTURE.md sections
// 1 and 5): forks sharing pages, export on one Model and import on another in
// any page order, restore from a snapshot decoded in place. Every path
// continues bit-identically to the sequence it came from.

#include <algorithm>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "engine/model.h"
#include "engine/model_test_util.h"
#include "engine/page_format.h"
#include "engine/snapshot_codec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hybridserve::engine {
namespace {

using testing::BitEqual;
using testing::ExportPages;
using ::testing::HasSubstr;
using testing::LoadWeights;
using testing::RandomTokens;
using testing::Views;

constexpr int64_t kPageSize = 16;

class StateTransferTest : public ::testing::Test {
 protected:
  void SetUp() override {
    weights_ = LoadWeights(testing::kNemotronTiny);
    ASSERT_NE(weights_, nullptr);
    vocab_ = weights_->config().vocab_size;
  }

  std::unique_ptr<Model> NewModel(int64_t max_pages = 512, int64_t max_sequences = 12) const {
    ModelOptions o;
    o.page_size = kPageSize;
    o.max_pages = max_pages;
    o.max_sequences = max_sequences;
    return testing::MakeModel(*weights_, o);
  }

  // Logits of `steps` decode steps of one sequence, feeding tokens 1, 2, ...
  static std::vector<float> Continue(Model& model, SequenceId id, int steps) {
    std::vector<float> all;
    for (int s = 0; s < steps; ++s) {
      auto logits = model.DecodeStep({id}, {static_cast<TokenId>(1 + s)});
      if (!logits.ok()) {
        ADD_FAILURE() << logits.status();
        return {};
      }
      all.insert(all.end(), logits->begin(), logits->end());
    }
    return all;
  }

  std::unique_ptr<ModelWeights> weights_;
  int64_t vocab_ = 0;
};

TEST_F(StateTransferTest, EightForksOfA4KPrefixHoldItsPagesOnceAndDecodeAsIfAlone) {
  std::unique_ptr<Model> model = NewModel(/*max_pages=*/512, /*max_sequences=*/10);
  ASSERT_NE(model, nullptr);
  const std::vector<TokenId> prefix = RandomTokens(7, 4096 + 5, vocab_);  // 256 full pages + a partial one
  auto parent = model->sequences().New();
  ASSERT_TRUE(parent.ok());
  ASSERT_TRUE(model->Prefill(*parent, prefix).ok());
  const int64_t prefix_pages = 257;
  EXPECT_EQ(model->sequences().num_free_pages(), 512 - prefix_pages);

  std::vector<SequenceId> forks;
  for (int i = 0; i < 8; ++i) {
    auto child = model->sequences().Fork(*parent);
    ASSERT_TRUE(child.ok()) << child.status();
    forks.push_back(*child);
  }
  // Each fork holds the 256 full pages by reference and one copied partial page.
  EXPECT_EQ(model->sequences().num_free_pages(), 512 - prefix_pages - 8);
  const SequenceTable& table = model->sequences();
  const int32_t first_page = (*table.Find(*parent))->block_table[0];
  EXPECT_EQ(table.page_refcount(first_page), 9);

  // Each fork decodes its own continuation; the reference prefilled the prefix alone.
  std::unique_ptr<Model> reference_model = NewModel(/*max_pages=*/300, /*max_sequences=*/1);
  ASSERT_NE(reference_model, nullptr);
  for (int i = 0; i < 8; ++i) {
    auto alone = reference_model->sequences().New();
    ASSERT_TRUE(alone.ok());
    ASSERT_TRUE(reference_model->Prefill(*alone, prefix).ok());
    std::vector<float> expected, actual;
    for (int s = 0; s < 4; ++s) {
      const TokenId t = static_cast<TokenId>((i * 7 + s) % vocab_);
      auto e = reference_model->DecodeStep({*alone}, {t});
      auto a = model->DecodeStep({forks[static_cast<size_t>(i)]}, {t});
      ASSERT_TRUE(e.ok() && a.ok());
      expected.insert(expected.end(), e->begin(), e->end());
      actual.insert(actual.end(), a->begin(), a->end());
    }
    EXPECT_TRUE(BitEqual(actual, expected)) << "fork " << i;
    ASSERT_TRUE(reference_model->sequences().Release(*alone).ok());
  }
  // The parent is untouched by its forks' decoding.
  auto parent_next = model->DecodeStep({*parent}, {3});
  auto ref = reference_model->sequences().New();
  ASSERT_TRUE(reference_model->Prefill(*ref, prefix).ok());
  auto ref_next = reference_model->DecodeStep({*ref}, {3});
  ASSERT_TRUE(parent_next.ok() && ref_next.ok());
  EXPECT_TRUE(BitEqual(*parent_next, *ref_next));

  // Pages return to the pool only when their last holder goes.
  ASSERT_TRUE(model->sequences().Release(*parent).ok());
  EXPECT_EQ(table.page_refcount(first_page), 8);
  for (SequenceId f : forks) ASSERT_TRUE(model->sequences().Release(f).ok());
  EXPECT_EQ(table.page_refcount(first_page), 0);
  EXPECT_EQ(model->sequences().num_free_pages(), 512);
  EXPECT_EQ(model->sequences().num_free_slots(), 10);
}

TEST_F(StateTransferTest, ExportedPagesImportedInRandomOrderContinueBitIdentically) {
  std::unique_ptr<Model> source = NewModel();
  std::unique_ptr<Model> target = NewModel();
  ASSERT_NE(source, nullptr);
  ASSERT_NE(target, nullptr);
  for (int64_t prompt_len : {int64_t{1}, int64_t{16}, int64_t{37}, int64_t{200}}) {
    SCOPED_TRACE(prompt_len);
    auto src = source->sequences().New();
    ASSERT_TRUE(src.ok());
    ASSERT_TRUE(source->Prefill(*src, RandomTokens(prompt_len, prompt_len, vocab_)).ok());

    const int64_t free_pages = target->sequences().num_free_pages();
    auto reservation = target->sequences().ReserveImport(prompt_len);
    ASSERT_TRUE(reservation.ok()) << reservation.status();
    EXPECT_EQ(static_cast<int64_t>(reservation->page_slots.size()), (prompt_len + kPageSize - 1) / kPageSize);
    EXPECT_EQ(reservation->page_format, PageFormatFingerprint(target->layout()));
    EXPECT_EQ(target->sequences().num_free_pages(), free_pages - static_cast<int64_t>(reservation->page_slots.size()));
    // Not usable until finished.
    EXPECT_EQ(target->DecodeStep({reservation->id}, {1}).status().code(), absl::StatusCode::kFailedPrecondition);

    const int64_t full = prompt_len / kPageSize;
    std::vector<int64_t> order(static_cast<size_t>(full));
    for (int64_t i = 0; i < full; ++i) order[static_cast<size_t>(i)] = i;
    std::shuffle(order.begin(), order.end(), std::mt19937(static_cast<uint32_t>(prompt_len)));
    std::string buffer(static_cast<size_t>(source->page_bytes()), '\0');
    for (int64_t i : order) {
      ASSERT_TRUE(source->sequences().ExportPageInto(*src, i, absl::MakeSpan(buffer)).ok());
      ASSERT_TRUE(target->sequences().ImportPage(reservation->id, i, buffer).ok());
    }
    std::string state;
    ASSERT_TRUE(source->sequences()
                    .EncodeStateInto(*src, /*with_logits=*/true, weights_->fingerprint(), common::Hash128{}, &state)
                    .ok());
    auto view = ParseSnapshot(state);
    ASSERT_TRUE(view.ok()) << view.status();
    ASSERT_TRUE(target->sequences().FinishImport(reservation->id, *view).ok());
    EXPECT_EQ(*target->sequences().Position(reservation->id), prompt_len);

    EXPECT_TRUE(BitEqual(Continue(*target, reservation->id, 5), Continue(*source, *src, 5)));
    ASSERT_TRUE(source->sequences().Release(*src).ok());
    ASSERT_TRUE(target->sequences().Release(reservation->id).ok());
    EXPECT_EQ(target->sequences().num_free_pages(), free_pages);
  }
}

TEST_F(StateTransferTest, AnImportAbortedHalfwayLeavesPagesAndSlotsExactlyAsBefore) {
  std::unique_ptr<Model> source = NewModel();
  std::unique_ptr<Model> target = NewModel(/*max_pages=*/64, /*max_sequences=*/2);
  auto src = source->sequences().New();
  ASSERT_TRUE(source->Prefill(*src, RandomTokens(9, 100, vocab_)).ok());
  auto other = target->sequences().New();  // a live sequence the abort must not touch
  ASSERT_TRUE(target->Prefill(*other, RandomTokens(10, 30, vocab_)).ok());
  const int64_t free_pages = target->sequences().num_free_pages();
  const int64_t free_slots = target->sequences().num_free_slots();

  auto r = target->sequences().ReserveImport(100);
  ASSERT_TRUE(r.ok());
  for (int64_t i : {int64_t{3}, int64_t{0}, int64_t{5}}) {
    auto page = source->sequences().ExportPage(*src, i);
    ASSERT_TRUE(page.ok());
    ASSERT_TRUE(target->sequences().ImportPage(r->id, i, *page).ok());
  }
  // Unfinished: FinishImport refuses and changes nothing.
  auto state = source->sequences().CaptureState(*src, true);
  ASSERT_TRUE(state.ok());
  absl::Status early = target->sequences().FinishImport(r->id, *state);
  EXPECT_EQ(early.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(early.message(), HasSubstr("3 of 6 pages have arrived"));
  // A second reservation does not fit: the slots are taken.
  EXPECT_EQ(target->sequences().ReserveImport(10).status().code(), absl::StatusCode::kResourceExhausted);

  ASSERT_TRUE(target->sequences().AbortImport(r->id).ok());
  EXPECT_EQ(target->sequences().num_free_pages(), free_pages);
  EXPECT_EQ(target->sequences().num_free_slots(), free_slots);
  EXPECT_EQ(target->sequences().AbortImport(r->id).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(target->sequences().AbortImport(*other).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(target->DecodeStep({*other}, {2}).ok());
}

TEST_F(StateTransferTest, BadPagesAndStatesAreRefusedAndChangeNothing) {
  std::unique_ptr<Model> source = NewModel();
  std::unique_ptr<Model> target = NewModel();
  auto src = source->sequences().New();
  ASSERT_TRUE(source->Prefill(*src, RandomTokens(11, 40, vocab_)).ok());  // 2 full pages + 8 tokens
  auto r = target->sequences().ReserveImport(40);
  ASSERT_TRUE(r.ok());
  SequenceTable& t = target->sequences();
  auto page0 = source->sequences().ExportPage(*src, 0);
  ASSERT_TRUE(page0.ok());

  EXPECT_THAT(t.ImportPage(r->id, 2, *page0).message(), HasSubstr("page index 2 outside [0, 2)"));
  EXPECT_EQ(t.ImportPage(r->id, -1, *page0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(t.ImportPage(r->id, 0, absl::string_view(*page0).substr(1)).message(), HasSubstr("bytes, expected"));
  ASSERT_TRUE(t.ImportPage(r->id, 0, *page0).ok());
  EXPECT_THAT(t.ImportPage(r->id, 0, *page0).message(), HasSubstr("sent twice"));
  EXPECT_EQ(t.ImportPage(*src + 1000, 0, *page0).code(), absl::StatusCode::kNotFound);
  auto page1 = source->sequences().ExportPage(*src, 1);
  ASSERT_TRUE(t.ImportPage(r->id, 1, *page1).ok());

  // A state of the wrong position, or of another layout, is refused naming why.
  auto other = source->sequences().New();
  ASSERT_TRUE(source->Prefill(*other, RandomTokens(12, 41, vocab_)).ok());
  auto wrong_position = source->sequences().CaptureState(*other, true);
  ASSERT_TRUE(wrong_position.ok());
  EXPECT_THAT(t.FinishImport(r->id, *wrong_position).message(), HasSubstr("state at position 41"));
  Snapshot foreign;
  foreign.layout = target->layout();
  foreign.layout.page_size = 8;
  foreign.position = 40;
  static_cast<SequenceState&>(foreign) = *source->sequences().CaptureState(*src, false);
  foreign.tail_k.assign(foreign.tail_k.size(), std::vector<float>(0));
  foreign.tail_v.assign(foreign.tail_v.size(), std::vector<float>(0));
  auto foreign_bytes = EncodeSnapshot(foreign);
  ASSERT_TRUE(foreign_bytes.ok()) << foreign_bytes.status();
  auto foreign_view = ParseSnapshot(*foreign_bytes);
  ASSERT_TRUE(foreign_view.ok());
  absl::Status s = t.FinishImport(r->id, *foreign_view);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("page_size 8 (expected 16)"));
  EXPECT_THAT(CheckPageFormat(target->layout(), foreign.layout).message(),
              HasSubstr("page from another layout: page_size 8 (expected 16)"));
  EXPECT_NE(PageFormatFingerprint(target->layout()), PageFormatFingerprint(foreign.layout));

  // Still importing after every refusal; the right state finishes it.
  EXPECT_EQ(target->sequences().Position(r->id).status().code(), absl::StatusCode::kFailedPrecondition);
  auto good = source->sequences().CaptureState(*src, true);
  ASSERT_TRUE(t.FinishImport(r->id, *good).ok());
  EXPECT_EQ(t.FinishImport(r->id, *good).code(), absl::StatusCode::kFailedPrecondition);  // already live
  EXPECT_TRUE(BitEqual(Continue(*target, r->id, 3), Continue(*source, *src, 3)));
}

TEST_F(StateTransferTest, FuzzedPagesAndSizesNeverCrashOrLeaveAHalfImportedSequenceLive) {
  std::unique_ptr<Model> target = NewModel(/*max_pages=*/64, /*max_sequences=*/2);
  const int64_t free_pages = target->sequences().num_free_pages();
  SequenceTable& t = target->sequences();
  std::mt19937_64 rng(42);
  for (int round = 0; round < 200; ++round) {
    const int64_t n_tokens = static_cast<int64_t>(rng() % 300) - 10;
    auto r = t.ReserveImport(n_tokens);
    if (!r.ok()) {
      EXPECT_TRUE(n_tokens < 1 || n_tokens > 64 * kPageSize) << n_tokens << " " << r.status();
      continue;
    }
    const int ops = static_cast<int>(rng() % 20);
    for (int op = 0; op < ops; ++op) {
      const int64_t index = static_cast<int64_t>(rng() % 24) - 2;
      const bool right_size = rng() % 3 != 0;
      std::string bytes(right_size ? static_cast<size_t>(target->page_bytes()) : static_cast<size_t>(rng() % 9000),
                        '\0');
      for (char& c : bytes) c = static_cast<char>(rng());
      (void)t.ImportPage(r->id, index, bytes);
    }
    SequenceState junk;
    junk.position = n_tokens;
    if (rng() % 2 == 0) {
      auto maybe = t.FinishImport(r->id, junk);  // wrong shapes: always refused
      EXPECT_EQ(maybe.code(), absl::StatusCode::kInvalidArgument);
    }
    // Never live unless FinishImport succeeded.
    EXPECT_EQ(target->DecodeStep({r->id}, {1}).status().code(), absl::StatusCode::kFailedPrecondition);
    ASSERT_TRUE(t.AbortImport(r->id).ok());
    ASSERT_EQ(target->sequences().num_free_pages(), free_pages);
  }
  EXPECT_EQ(target->sequences().num_free_slots(), 2);
}

TEST_F(StateTransferTest, RestoreFromASnapshotViewWithPageViewsContinuesBitIdentically) {
  std::unique_ptr<Model> model = NewModel();
  auto live = model->sequences().New();
  ASSERT_TRUE(model->Prefill(*live, RandomTokens(13, 75, vocab_)).ok());
  ASSERT_TRUE(model->DecodeStep({*live}, {4}).ok());  // 76 tokens: 4 full pages + 12

  // The bytes as the cachestore would hold them: pages and an encoded state.
  std::vector<std::string> pages = ExportPages(*model, *live, 4);
  for (int64_t i = 0; i < 4; ++i) {
    auto view = model->sequences().PageViews(*live, i);
    ASSERT_TRUE(view.ok()) << view.status();
    std::string joined;
    for (size_t l = 0; l < view->k.size(); ++l) {
      joined.append(view->k[l].data(), view->k[l].size());
      joined.append(view->v[l].data(), view->v[l].size());
    }
    EXPECT_EQ(joined, pages[static_cast<size_t>(i)]) << "page " << i;
  }
  EXPECT_EQ(model->sequences().PageViews(*live, 4).status().code(), absl::StatusCode::kOutOfRange);
  std::string state;
  const common::Hash128 prefix = common::HashBytes("prefix");
  ASSERT_TRUE(model->sequences().EncodeStateInto(*live, true, weights_->fingerprint(), prefix, &state).ok());
  // The same bytes as encoding the captured vectors.
  auto captured = model->sequences().CaptureState(*live, true);
  ASSERT_TRUE(captured.ok());
  Snapshot snapshot;
  static_cast<SequenceState&>(snapshot) = *captured;
  snapshot.model_fingerprint = weights_->fingerprint();
  snapshot.prefix_hash = prefix;
  snapshot.layout = model->layout();
  EXPECT_EQ(*EncodeSnapshot(snapshot), state);
  // Into a caller's buffer of the announced size: the same bytes.
  auto size = model->sequences().EncodedStateSize(*live, true);
  ASSERT_TRUE(size.ok());
  ASSERT_EQ(*size, state.size());
  std::string buffer(*size, '\0');
  ASSERT_TRUE(
      model->sequences().EncodeStateInto(*live, true, weights_->fingerprint(), prefix, absl::MakeSpan(buffer)).ok());
  EXPECT_EQ(buffer, state);
  EXPECT_EQ(model->sequences()
                .EncodeStateInto(*live, true, weights_->fingerprint(), prefix, absl::MakeSpan(buffer).subspan(1))
                .code(),
            absl::StatusCode::kInvalidArgument);
  // The views are the pools' own memory, holding the captured values.
  auto views = model->sequences().StateViews(*live, true);
  ASSERT_TRUE(views.ok()) << views.status();
  ASSERT_EQ(views->ssm_states.size(), captured->ssm_states.size());
  for (size_t l = 0; l < views->ssm_states.size(); ++l) {
    EXPECT_TRUE(BitEqual(views->ssm_states[l], captured->ssm_states[l])) << l;
  }
  EXPECT_TRUE(BitEqual(views->tail_v.back(), captured->tail_v.back()));

  SnapshotExpectation expect;
  expect.layout = model->layout();
  expect.prefix_hash = prefix;
  auto view = ParseSnapshot(state, expect);
  ASSERT_TRUE(view.ok());
  auto restored = model->sequences().New();
  ASSERT_TRUE(model->sequences().Restore(*restored, *view, Views(pages)).ok());
  EXPECT_TRUE(BitEqual(Continue(*model, *restored, 4), Continue(*model, *live, 4)));

  // A view of another layout is refused by name.
  auto other_layout = model->layout();
  other_layout.kv_heads += 1;
  SnapshotView bad = *view;
  bad.layout = other_layout;
  auto fresh = model->sequences().New();
  EXPECT_THAT(model->sequences().Restore(*fresh, bad, Views(pages)).message(),
              HasSubstr("snapshot of another layout: kv_heads"));
  EXPECT_EQ(*model->sequences().Position(*fresh), 0);
}

}  // namespace
}  // namespace hybridserve::engine
