// Contract 4 through the engine (docs/ARCHITECTURE.md section 6): a state captured from
// a live sequence, encoded, decoded and restored continues bit-identically;
// a corrupted byte is detected.

#include "engine/state_snapshot.h"

#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "engine/model_test_util.h"
#include "gtest/gtest.h"

namespace hybridserve::engine {
namespace {

using testing::BitEqual;
using testing::ExportPages;
using testing::LoadWeights;
using testing::MakeModel;
using testing::RandomTokens;

TEST(StateSnapshotTest, EncodedTurnEndStateResumesBitIdentically) {
  std::unique_ptr<ModelWeights> weights = LoadWeights(testing::kNemotronTiny);
  ASSERT_NE(weights, nullptr);
  ModelOptions options;
  options.page_size = 4;
  std::unique_ptr<Model> model = MakeModel(*weights, options);
  ASSERT_NE(model, nullptr);
  const int64_t vocab = model->config().vocab_size;

  // Turn 1: a prompt and three decode steps leave the sequence off the grid.
  auto live = model->sequences().New();
  ASSERT_TRUE(live.ok());
  ASSERT_TRUE(model->Prefill(*live, RandomTokens(1, 37, vocab)).ok());
  for (TokenId t : {3, 5, 7}) ASSERT_TRUE(model->DecodeStep({*live}, {t}).ok());
  auto captured = model->sequences().CaptureState(*live, /*with_logits=*/true);
  ASSERT_TRUE(captured.ok()) << captured.status();
  const int64_t position = captured->position;
  ASSERT_EQ(position, 40);

  const StateLayout layout = StateLayout::ForModel(model->config(), model->page_size());
  const common::Hash128 prefix = common::HashBytes("tokens of the conversation");
  auto snapshot = ToSnapshot(*captured, layout, weights->fingerprint(), prefix);
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  auto bytes = EncodeSnapshot(*snapshot);
  ASSERT_TRUE(bytes.ok()) << bytes.status();

  SnapshotExpectation expect;
  expect.model_fingerprint = weights->fingerprint();
  expect.layout = layout;
  expect.position = position;
  expect.prefix_hash = prefix;
  auto decoded = DecodeSnapshot(*bytes, expect);
  ASSERT_TRUE(decoded.ok()) << decoded.status();

  // Restore into a fresh sequence with the live one's full pages.
  std::vector<std::string> pages = ExportPages(*model, *live, position / model->page_size());
  std::vector<absl::string_view> views(pages.begin(), pages.end());
  auto restored = model->sequences().New();
  ASSERT_TRUE(restored.ok());
  ASSERT_TRUE(model->sequences().Restore(*restored, FromSnapshot(*std::move(decoded)), views).ok());

  // Turn 2 on both: identical bits.
  const std::vector<TokenId> suffix = RandomTokens(2, 23, vocab);
  auto a = model->Prefill(*live, suffix);
  auto b = model->Prefill(*restored, suffix);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_TRUE(BitEqual(a->logits, b->logits));
  auto da = model->DecodeStep({*live}, {9});
  auto db = model->DecodeStep({*restored}, {9});
  ASSERT_TRUE(da.ok() && db.ok());
  EXPECT_TRUE(BitEqual(*da, *db));

  // A flipped byte anywhere is detected, never restored.
  std::string corrupted = *bytes;
  corrupted[corrupted.size() / 2] ^= 0x10;
  EXPECT_EQ(DecodeSnapshot(corrupted, expect).status().code(), absl::StatusCode::kDataLoss);
  // Another model's snapshot is refused.
  expect.model_fingerprint = common::HashBytes("another model");
  EXPECT_EQ(DecodeSnapshot(*bytes, expect).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(StateSnapshotTest, ShapeMismatchIsRejected) {
  std::unique_ptr<ModelWeights> weights = LoadWeights(testing::kNemotronTiny);
  ASSERT_NE(weights, nullptr);
  const StateLayout layout = StateLayout::ForModel(weights->config(), 4);
  SequenceState empty;
  empty.position = 5;
  EXPECT_EQ(ToSnapshot(empty, layout, weights->fingerprint(), {}).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace hybridserve::engine
