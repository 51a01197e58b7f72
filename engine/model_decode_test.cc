// Batched decode (batch independence in deterministic mode, sequences joining
// and leaving) and the Model's error handling: every rejected call leaves
// every sequence as it was.

#include <algorithm>
#include <cstdint>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "engine/model.h"
#include "engine/model_test_util.h"
#include "engine/sequence_state.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/counting_backend.h"

namespace hybridserve::engine {
namespace {

using testing::BitEqual;
using ::testing::HasSubstr;
using testing::RandomTokens;

std::vector<float> Row(absl::Span<const float> logits, int64_t row, int64_t vocab) {
  return std::vector<float>(logits.begin() + row * vocab, logits.begin() + (row + 1) * vocab);
}

// ---- Batched decode ----

struct DecodeParam {
  std::string model_dir;
  testing::TestTarget target = testing::TestTarget::kCpu;
};

class BatchedDecodeTest : public ::testing::TestWithParam<DecodeParam> {
 protected:
  void SetUp() override {
    weights_ = testing::LoadWeights(GetParam().model_dir);
    ASSERT_NE(weights_, nullptr);
    vocab_ = weights_->config().vocab_size;
    bool skipped = false;
    backend_ = testing::MakeTargetBackend(GetParam().target, &skipped);
  }

  std::unique_ptr<Model> NewModel(int64_t max_sequences = 6, int64_t max_pages = 256) {
    ModelOptions options;
    options.page_size = 4;
    options.max_pages = max_pages;
    options.max_sequences = max_sequences;
    options.matmul_mode = kernels::MatmulMode::kDeterministic;
    options.backend = backend_.get();
    return testing::MakeModel(*weights_, options);
  }

  std::unique_ptr<ModelWeights> weights_;
  std::unique_ptr<kernels::Backend> backend_;  // null on the CPU; outlives the models
  int64_t vocab_ = 0;
};

// Four sequences of different lengths; two start together, one joins at step
// 2, one leaves after 5 steps and a fourth joins after it left (reusing its
// slot and pages); the batch order rotates every step. Each sequence's logits
// equal, bit for bit, those of the same sequence decoded alone.
TEST_P(BatchedDecodeTest, EachSequenceGetsTheBitsItGetsAloneWhateverTheBatch) {
  constexpr int kSteps = 10;
  const std::vector<int64_t> prompt_lengths = {3, 17, 32, 45};
  const std::vector<int> join_step = {0, 0, 2, 6};
  const std::vector<int> num_steps = {kSteps, 5, kSteps, kSteps};
  std::vector<std::vector<TokenId>> prompts, inputs;
  for (size_t i = 0; i < prompt_lengths.size(); ++i) {
    prompts.push_back(RandomTokens(100 + i, prompt_lengths[i], vocab_));
    inputs.push_back(RandomTokens(200 + i, kSteps, vocab_));
  }

  // Alone: one sequence at a time, batch of one.
  std::vector<std::vector<std::vector<float>>> alone(prompts.size());
  {
    auto model = NewModel();
    ASSERT_NE(model, nullptr);
    for (size_t i = 0; i < prompts.size(); ++i) {
      auto id = model->sequences().New();
      ASSERT_TRUE(id.ok());
      ASSERT_TRUE(model->Prefill(*id, prompts[i]).ok());
      for (int s = 0; s < num_steps[i]; ++s) {
        const SequenceId ids[] = {*id};
        const TokenId tokens[] = {inputs[i][static_cast<size_t>(s)]};
        auto logits = model->DecodeStep(ids, tokens);
        ASSERT_TRUE(logits.ok()) << logits.status();
        alone[i].push_back(*logits);
      }
      ASSERT_TRUE(model->sequences().Release(*id).ok());
    }
  }

  auto model = NewModel();
  ASSERT_NE(model, nullptr);
  std::map<size_t, SequenceId> active;  // sequence index -> id
  std::vector<int> done(prompts.size(), 0);
  int compared = 0;
  for (int step = 0; step < 2 * kSteps; ++step) {
    for (size_t i = 0; i < prompts.size(); ++i) {
      if (join_step[i] == step) {
        auto id = model->sequences().New();
        ASSERT_TRUE(id.ok()) << id.status();
        ASSERT_TRUE(model->Prefill(*id, prompts[i]).ok());
        active[i] = *id;
      }
    }
    std::vector<size_t> order;
    for (const auto& [i, id] : active) order.push_back(i);
    if (order.empty()) continue;
    std::rotate(order.begin(), order.begin() + step % order.size(), order.end());
    std::vector<SequenceId> ids;
    std::vector<TokenId> tokens;
    for (size_t i : order) {
      ids.push_back(active[i]);
      tokens.push_back(inputs[i][static_cast<size_t>(done[i])]);
    }
    auto logits = model->DecodeStep(ids, tokens);
    ASSERT_TRUE(logits.ok()) << logits.status();
    for (size_t b = 0; b < order.size(); ++b) {
      const size_t i = order[b];
      EXPECT_TRUE(BitEqual(Row(*logits, static_cast<int64_t>(b), vocab_), alone[i][static_cast<size_t>(done[i])]))
          << "sequence " << i << ", its step " << done[i] << ", global step " << step << ", batch " << order.size();
      ++compared;
      if (++done[i] == num_steps[i]) {
        ASSERT_TRUE(model->sequences().Release(active[i]).ok());
        active.erase(i);
      }
    }
  }
  EXPECT_EQ(compared, 3 * kSteps + 5);
  EXPECT_EQ(model->sequences().num_free_slots(), 6);
  EXPECT_EQ(model->sequences().num_free_pages(), 256);
}

// Batches of 1, 2, 8 and 32 sequences, each at its own position (prompts of
// 1 to 66 tokens: inside a page, on page boundaries, past a chunk), decoded
// together for kSteps steps in an order that rotates every step: every row has
// the bits of the same sequence decoded alone (a batch of one on a model
// holding only that sequence). On the CPU, the emulated CUDA backend and a GPU.
class LargeBatchDecodeTest : public BatchedDecodeTest {};

TEST_P(LargeBatchDecodeTest, BatchesOf1To32AtMixedPositionsGiveEachSequenceItsAloneBits) {
  constexpr int kMaxBatch = 32;
  constexpr int kSteps = 3;
  std::vector<std::vector<TokenId>> prompts, inputs;
  std::vector<int64_t> lengths;
  for (int i = 0; i < kMaxBatch; ++i) {
    // 32 distinct lengths from 1 to 66: every remainder mod the page size
    // (4), whole pages (8, 20, 48, 60) and past a 64-token chunk.
    const int64_t length = 1 + (static_cast<int64_t>(i) * 37 + (i % 3)) % 70;
    lengths.push_back(length);
    prompts.push_back(RandomTokens(300 + static_cast<uint64_t>(i), length, vocab_));
    inputs.push_back(RandomTokens(400 + static_cast<uint64_t>(i), kSteps, vocab_));
  }
  ASSERT_GT(*std::max_element(lengths.begin(), lengths.end()), 64);

  std::vector<std::vector<std::vector<float>>> alone(kMaxBatch);
  {
    auto model = NewModel(1, 64);
    ASSERT_NE(model, nullptr);
    for (int i = 0; i < kMaxBatch; ++i) {
      auto id = model->sequences().New();
      ASSERT_TRUE(id.ok()) << id.status();
      ASSERT_TRUE(model->Prefill(*id, prompts[static_cast<size_t>(i)]).ok());
      for (int s = 0; s < kSteps; ++s) {
        const SequenceId ids[] = {*id};
        const TokenId tokens[] = {inputs[static_cast<size_t>(i)][static_cast<size_t>(s)]};
        auto logits = model->DecodeStep(ids, tokens);
        ASSERT_TRUE(logits.ok()) << logits.status();
        alone[static_cast<size_t>(i)].push_back(*logits);
      }
      ASSERT_TRUE(model->sequences().Release(*id).ok());
    }
  }

  for (int batch : {1, 2, 8, 32}) {
    auto model = NewModel(kMaxBatch, 1024);
    ASSERT_NE(model, nullptr);
    // Sequences spread over the 32 prompts, so small batches mix positions too.
    std::vector<size_t> members;
    std::vector<SequenceId> ids;
    for (int b = 0; b < batch; ++b) {
      const size_t i = static_cast<size_t>(b * (kMaxBatch / batch) + (batch == 1 ? 7 : 0));
      auto id = model->sequences().New();
      ASSERT_TRUE(id.ok()) << id.status();
      ASSERT_TRUE(model->Prefill(*id, prompts[i]).ok());
      members.push_back(i);
      ids.push_back(*id);
    }
    for (int s = 0; s < kSteps; ++s) {
      std::vector<size_t> order(members.size());
      for (size_t b = 0; b < order.size(); ++b) order[b] = (b + static_cast<size_t>(s) * 3) % order.size();
      std::vector<SequenceId> step_ids;
      std::vector<TokenId> tokens;
      for (size_t b : order) {
        step_ids.push_back(ids[b]);
        tokens.push_back(inputs[members[b]][static_cast<size_t>(s)]);
      }
      auto logits = model->DecodeStep(step_ids, tokens);
      ASSERT_TRUE(logits.ok()) << logits.status();
      ASSERT_EQ(logits->size(), order.size() * static_cast<size_t>(vocab_));
      for (size_t row = 0; row < order.size(); ++row) {
        const size_t i = members[order[row]];
        EXPECT_TRUE(BitEqual(Row(*logits, static_cast<int64_t>(row), vocab_), alone[i][static_cast<size_t>(s)]))
            << "batch " << batch << ", row " << row << ", sequence " << i << " at position " << lengths[i] + s
            << ", step " << s;
      }
    }
  }
}

// ModelOptions::decode_graphs on a backend with graphs (the CUDA backend on
// its emulator here; on the GPU where one is present): every step's logits
// are the bits of the same step issued kernel by kernel, through batches that
// change bucket (1, 2, 3 -> 4, 5 -> 8), padding rows, a sequence leaving and
// a prefill in between that grows the workspace (the graphs must be dropped
// and recorded again), and the graphs are really replayed.
class DecodeGraphTest : public ::testing::TestWithParam<testing::TestTarget> {
 protected:
  // Loads `model_dir` and makes the two models a case compares, with the same
  // options but decode_graphs: with_ (graphs on, its kernels counted by
  // counted_) and without_ (kernel by kernel on device_). Returns with
  // skipped_ set where the target is absent, or after a fatal failure.
  void MakeModels(absl::string_view model_dir, int64_t max_pages, int64_t max_sequences) {
    weights_ = testing::LoadWeights(model_dir);
    ASSERT_NE(weights_, nullptr);
    device_ = testing::MakeTargetBackend(GetParam(), &skipped_);
    if (skipped_) return;
    ASSERT_NE(device_, nullptr);
    counted_ = std::make_unique<kernels::CountingBackend>(*device_);
    ModelOptions options;
    options.page_size = 4;
    options.max_pages = max_pages;
    options.max_sequences = max_sequences;
    options.decode_graphs = true;
    options.backend = counted_.get();
    with_ = testing::MakeModel(*weights_, options);
    options.decode_graphs = false;
    options.backend = device_.get();
    without_ = testing::MakeModel(*weights_, options);
    ASSERT_NE(with_, nullptr);
    ASSERT_NE(without_, nullptr);
  }

  // Prefills `sequences` prompts (lengths first_length + i * length_step) in
  // both models, then decodes `steps` steps of the whole batch in both, each
  // step's logits bit-identical.
  void DecodeSideBySide(int64_t sequences, uint64_t seed, int64_t first_length, int64_t length_step, int steps) {
    const int64_t vocab = weights_->config().vocab_size;
    std::vector<SequenceId> a, b;
    for (int64_t i = 0; i < sequences; ++i) {
      const std::vector<TokenId> prompt = RandomTokens(seed + i, first_length + length_step * i, vocab);
      auto x = with_->sequences().New();
      auto y = without_->sequences().New();
      ASSERT_TRUE(x.ok() && y.ok());
      ASSERT_TRUE(with_->Prefill(*x, prompt).ok());
      ASSERT_TRUE(without_->Prefill(*y, prompt).ok());
      a.push_back(*x);
      b.push_back(*y);
    }
    for (int s = 0; s < steps; ++s) {
      const std::vector<TokenId> tokens = RandomTokens(seed + 100 + s, sequences, vocab);
      auto lx = with_->DecodeStep(a, tokens);
      auto ly = without_->DecodeStep(b, tokens);
      ASSERT_TRUE(lx.ok()) << lx.status();
      ASSERT_TRUE(ly.ok()) << ly.status();
      EXPECT_TRUE(BitEqual(*lx, *ly)) << "step " << s;
    }
  }

  // Declared in the order of their lifetimes: the models go first, the
  // backends they run on after them.
  std::unique_ptr<ModelWeights> weights_;
  bool skipped_ = false;
  std::unique_ptr<kernels::Backend> device_;
  std::unique_ptr<kernels::CountingBackend> counted_;
  std::unique_ptr<Model> with_;
  std::unique_ptr<Model> without_;
};

TEST_P(DecodeGraphTest, GraphReplayGivesTheBitsOfKernelByKernelSteps) {
  MakeModels(testing::kNemotronTiny, /*max_pages=*/128, /*max_sequences=*/8);
  if (skipped_ || HasFatalFailure()) return;
  ASSERT_TRUE(device_->supports_graphs());
  Model* with = with_.get();
  Model* without = without_.get();
  const kernels::CountingBackend& counted = *counted_;
  const int64_t vocab = weights_->config().vocab_size;
  EXPECT_EQ(with->sequences().num_free_pages(), 128) << "the scratch page comes on top of max_pages";

  std::vector<SequenceId> a, b;  // the same sequences in both models
  auto join = [&](uint64_t seed, int64_t length) {
    const std::vector<TokenId> prompt = RandomTokens(seed, length, vocab);
    auto x = with->sequences().New();
    auto y = without->sequences().New();
    ASSERT_TRUE(x.ok() && y.ok());
    auto px = with->Prefill(*x, prompt);
    auto py = without->Prefill(*y, prompt);
    ASSERT_TRUE(px.ok() && py.ok());
    EXPECT_TRUE(BitEqual(px->logits, py->logits));
    a.push_back(*x);
    b.push_back(*y);
  };
  const std::vector<int> batch_at_step = {1, 1, 1, 2, 2, 2, 3, 3, 3, 5, 5, 5, 4, 4, 4};
  int64_t steps = 0;
  for (size_t s = 0; s < batch_at_step.size(); ++s) {
    while (static_cast<int>(a.size()) < batch_at_step[s]) join(300 + a.size(), 5 + 11 * static_cast<int64_t>(a.size()));
    if (static_cast<int>(a.size()) > batch_at_step[s]) {  // the second sequence leaves
      ASSERT_TRUE(with->sequences().Release(a[1]).ok());
      ASSERT_TRUE(without->sequences().Release(b[1]).ok());
      a.erase(a.begin() + 1);
      b.erase(b.begin() + 1);
    }
    if (s == 8) {  // a long prefill grows the workspace: every graph so far is stale
      join(999, 150);
      ASSERT_TRUE(with->sequences().Release(a.back()).ok());
      ASSERT_TRUE(without->sequences().Release(b.back()).ok());
      a.pop_back();
      b.pop_back();
    }
    const std::vector<TokenId> tokens = RandomTokens(400 + s, static_cast<int64_t>(a.size()), vocab);
    auto lx = with->DecodeStep(a, tokens);
    auto ly = without->DecodeStep(b, tokens);
    ASSERT_TRUE(lx.ok()) << lx.status();
    ASSERT_TRUE(ly.ok()) << ly.status();
    EXPECT_TRUE(BitEqual(*lx, *ly)) << "step " << s << ", batch " << a.size();
    ++steps;
  }
  // Buckets 1, 2, 4 (x2: before and after the workspace grew) and 8: each
  // recorded once per workspace generation, replayed on its later steps.
  EXPECT_GE(counted.calls("EndCapture"), 4);
  EXPECT_GE(counted.calls("Replay"), steps / 2);
  std::cout << "[decode graphs] " << steps << " steps: " << counted.calls("EndCapture") << " graphs recorded, "
            << counted.calls("Replay") << " replays\n";
}

// A dense Gated DeltaNet hybrid (Qwen3.5) decodes under graphs: the conv
// update, the gates and the recurrent step read their slots from device
// memory, so replays give the bits of kernel-by-kernel steps.
TEST_P(DecodeGraphTest, GatedDeltaNetStepsReplayWithTheBitsOfKernelByKernelSteps) {
  MakeModels(testing::kQwen35Tiny, /*max_pages=*/64, /*max_sequences=*/4);
  if (skipped_ || HasFatalFailure()) return;
  DecodeSideBySide(/*sequences=*/3, /*seed=*/700, /*first_length=*/9, /*length_step=*/30, /*steps=*/6);
  EXPECT_GE(counted_->calls("EndCapture"), 1);
  EXPECT_GE(counted_->calls("Replay"), 3);
}

// Mixture-of-experts blocks route on the device (MoeRoute, ExpertMatmul,
// MoeCombine), so models with them decode under graphs too, with the bits of
// kernel-by-kernel steps: every router kind (softmax top-k, sigmoid groups
// with a correction bias, softmax then top-k with a gated shared expert),
// latent projections and a shared expert with biases.
TEST_P(DecodeGraphTest, ExpertBlocksReplayWithTheBitsOfKernelByKernelSteps) {
  for (absl::string_view model_dir :
       {testing::kGraniteMoeTiny, testing::kNemotronMoeTiny, testing::kNemotronMoeTiny2,
        testing::kNemotronLatentMoeTiny, testing::kQwen3NextTiny, testing::kQwen35MoeTiny}) {
    SCOPED_TRACE(model_dir);
    with_.reset();
    without_.reset();
    counted_.reset();
    device_.reset();
    MakeModels(model_dir, /*max_pages=*/64, /*max_sequences=*/4);
    if (skipped_ || HasFatalFailure()) return;
    DecodeSideBySide(/*sequences=*/3, /*seed=*/500, /*first_length=*/7, /*length_step=*/9, /*steps=*/6);
    EXPECT_GE(counted_->calls("EndCapture"), 1);
    EXPECT_GE(counted_->calls("Replay"), 3);
    EXPECT_GT(counted_->calls("MoeRoute"), 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Cuda, DecodeGraphTest,
                         ::testing::Values(testing::TestTarget::kCudaEmulated, testing::TestTarget::kCudaGpu),
                         [](const ::testing::TestParamInfo<testing::TestTarget>& info) {
                           return testing::TestTargetName(info.param);
                         });

std::string DecodeParamName(const ::testing::TestParamInfo<DecodeParam>& info) {
  return testing::FixtureTestName(info.param.model_dir) + testing::TestTargetName(info.param.target);
}

INSTANTIATE_TEST_SUITE_P(
    Models, BatchedDecodeTest,
    ::testing::Values(
        DecodeParam{std::string(testing::kNemotronTiny)}, DecodeParam{std::string(testing::kMamba2Tiny)},
        DecodeParam{std::string(testing::kDefaultModel)}, DecodeParam{std::string(testing::kBambaTiny)},
        DecodeParam{std::string(testing::kGraniteMoeTiny)}, DecodeParam{std::string(testing::kGraniteDenseTiny)},
        DecodeParam{std::string(testing::kFalconTiny2)}, DecodeParam{std::string(testing::kNemotronMoeTiny)},
        DecodeParam{std::string(testing::kNemotronLatentMoeTiny)}, DecodeParam{std::string(testing::kZambaTiny2)},
        DecodeParam{std::string(testing::kQwen3NextTiny)}, DecodeParam{std::string(testing::kQwen35Tiny)},
        DecodeParam{std::string(testing::kQwen35MoeTiny), testing::TestTarget::kCudaEmulated},
        DecodeParam{std::string(testing::kZambaTiny), testing::TestTarget::kCudaEmulated},
        DecodeParam{std::string(testing::kNemotronMoeTiny2), testing::TestTarget::kCudaEmulated},
        DecodeParam{std::string(testing::kNemotronLatentMoeTiny), testing::TestTarget::kCudaEmulated},
        DecodeParam{std::string(testing::kNemotronTiny), testing::TestTarget::kCudaEmulated},
        DecodeParam{std::string(testing::kGraniteMoeTiny), testing::TestTarget::kCudaEmulated},
        DecodeParam{std::string(testing::kNemotronTiny), testing::TestTarget::kCudaGpu},
        DecodeParam{std::string(testing::kMamba2Tiny), testing::TestTarget::kCudaGpu},
        DecodeParam{std::string(testing::kDefaultModel), testing::TestTarget::kCudaGpu}),
    DecodeParamName);

INSTANTIATE_TEST_SUITE_P(
    Models, LargeBatchDecodeTest,
    ::testing::Values(DecodeParam{std::string(testing::kNemotronTiny)}, DecodeParam{std::string(testing::kMamba2Tiny)},
                      DecodeParam{std::string(testing::kDefaultModel)}, DecodeParam{std::string(testing::kBambaTiny2)},
                      DecodeParam{std::string(testing::kGraniteMoeTiny)},
                      DecodeParam{std::string(testing::kFalconTiny)},
                      DecodeParam{std::string(testing::kNemotronMoeTiny2)},
                      DecodeParam{std::string(testing::kZambaTiny)}, DecodeParam{std::string(testing::kQwen35MoeTiny)},
                      DecodeParam{std::string(testing::kFalconTiny2), testing::TestTarget::kCudaEmulated},
                      DecodeParam{std::string(testing::kNemotronTiny), testing::TestTarget::kCudaEmulated},
                      DecodeParam{std::string(testing::kNemotronTiny), testing::TestTarget::kCudaGpu},
                      DecodeParam{std::string(testing::kDefaultModel), testing::TestTarget::kCudaGpu}),
    DecodeParamName);

// ---- Errors ----

// Nemotron-H tiny, pages of 4 tokens. Each test runs its scenario on `model_`
// with the failing calls and on `reference_` without them, and checks that the
// results that follow are bit-identical.
class ModelErrorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    weights_ = testing::LoadWeights(testing::kNemotronTiny);
    ASSERT_NE(weights_, nullptr);
    vocab_ = weights_->config().vocab_size;
  }

  std::unique_ptr<Model> NewModel(int64_t max_pages = 64, int64_t max_sequences = 4) {
    ModelOptions options;
    options.page_size = 4;
    options.max_pages = max_pages;
    options.max_sequences = max_sequences;
    return testing::MakeModel(*weights_, options);
  }

  static SequenceId NewSeq(Model& model) {
    auto id = model.sequences().New();
    EXPECT_TRUE(id.ok()) << id.status();
    return id.ok() ? *id : -1;
  }

  static std::vector<float> Decode(Model& model, std::vector<SequenceId> ids, std::vector<TokenId> tokens) {
    auto logits = model.DecodeStep(ids, tokens);
    EXPECT_TRUE(logits.ok()) << logits.status();
    return logits.ok() ? *logits : std::vector<float>();
  }

  std::unique_ptr<ModelWeights> weights_;
  int64_t vocab_ = 0;
};

TEST_F(ModelErrorTest, TokenOutsideVocabIsInvalidArgumentAndChangesNothing) {
  auto model = NewModel();
  auto reference = NewModel();
  const std::vector<TokenId> prompt_a = RandomTokens(1, 10, vocab_);
  const std::vector<TokenId> prompt_b = RandomTokens(2, 7, vocab_);
  for (Model* m : {model.get(), reference.get()}) {
    const SequenceId a = NewSeq(*m);
    const SequenceId b = NewSeq(*m);
    ASSERT_TRUE(m->Prefill(a, prompt_a).ok());
    ASSERT_TRUE(m->Prefill(b, prompt_b).ok());
  }
  const SequenceId a = 1, b = 2;
  const std::vector<TokenId> too_big = {3, static_cast<TokenId>(vocab_)};
  auto bad = model->Prefill(a, too_big);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr(absl::StrCat("token id ", vocab_, " at index 1")));
  const std::vector<TokenId> negative = {-1};
  EXPECT_EQ(model->Prefill(b, negative).status().code(), absl::StatusCode::kInvalidArgument);
  const std::vector<SequenceId> ids = {a, b};
  const std::vector<TokenId> bad_decode = {5, static_cast<TokenId>(vocab_ + 7)};
  EXPECT_EQ(model->DecodeStep(ids, bad_decode).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*model->sequences().Position(a), 10);
  EXPECT_EQ(*model->sequences().Position(b), 7);

  EXPECT_TRUE(BitEqual(Decode(*model, {a, b}, {5, 6}), Decode(*reference, {a, b}, {5, 6})));
  auto after = model->Prefill(b, prompt_a);
  auto expected = reference->Prefill(b, prompt_a);
  ASSERT_TRUE(after.ok() && expected.ok());
  EXPECT_TRUE(BitEqual(after->logits, expected->logits));
}

TEST_F(ModelErrorTest, OutOfPagesIsResourceExhaustedAndChangesNothing) {
  auto model = NewModel(/*max_pages=*/6);
  auto reference = NewModel(/*max_pages=*/64);
  const std::vector<TokenId> prompt_a = RandomTokens(3, 18, vocab_);  // 5 pages, 2 tokens of room
  const std::vector<TokenId> prompt_b = RandomTokens(4, 4, vocab_);   // 1 page, full
  for (Model* m : {model.get(), reference.get()}) {
    const SequenceId a = NewSeq(*m);
    ASSERT_TRUE(m->Prefill(a, prompt_a).ok());
    NewSeq(*m);
  }
  const SequenceId a = 1, b = 2;
  const std::vector<TokenId> eight = RandomTokens(5, 8, vocab_);
  auto bad = model->Prefill(b, eight);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(bad.status().message(), HasSubstr("out of KV pages: need 2, 1 free of 6"));
  EXPECT_EQ(*model->sequences().Position(b), 0);
  EXPECT_EQ(model->sequences().num_free_pages(), 1);
  for (Model* m : {model.get(), reference.get()}) ASSERT_TRUE(m->Prefill(b, prompt_b).ok());
  EXPECT_EQ(model->sequences().num_free_pages(), 0);

  // a fills its last page; then both a and b need a new page.
  EXPECT_TRUE(BitEqual(Decode(*model, {a}, {7}), Decode(*reference, {a}, {7})));
  EXPECT_TRUE(BitEqual(Decode(*model, {a}, {8}), Decode(*reference, {a}, {8})));
  const std::vector<SequenceId> ids = {b, a};
  const std::vector<TokenId> tokens = {9, 10};
  auto step = model->DecodeStep(ids, tokens);
  EXPECT_EQ(step.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(step.status().message(), HasSubstr("needs 2, 0 free of 6"));
  EXPECT_EQ(*model->sequences().Position(a), 20);
  EXPECT_EQ(*model->sequences().Position(b), 4);

  // A restore that needs pages fails the same way and leaves the sequence empty.
  auto snapshot = model->sequences().CaptureState(b, true);
  ASSERT_TRUE(snapshot.ok());
  auto pages = testing::ExportPages(*model, b, 1);
  ASSERT_TRUE(model->sequences().Release(a).ok());
  ASSERT_TRUE(reference->sequences().Release(a).ok());
  const SequenceId c = NewSeq(*model);
  auto hog = model->Prefill(c, RandomTokens(6, 20, vocab_));  // takes every free page
  ASSERT_TRUE(hog.ok()) << hog.status();
  const SequenceId d = NewSeq(*model);
  EXPECT_EQ(model->sequences().Restore(d, *snapshot, testing::Views(pages)).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(*model->sequences().Position(d), 0);
  ASSERT_TRUE(model->sequences().Release(c).ok());
  ASSERT_TRUE(model->sequences().Restore(d, *snapshot, testing::Views(pages)).ok());

  // d is b restored: both decode like the reference's b.
  const std::vector<float> expected = Decode(*reference, {b}, {9});
  const std::vector<float> both = Decode(*model, {b, d}, {9, 9});
  EXPECT_TRUE(BitEqual(Row(both, 0, vocab_), expected));
  EXPECT_TRUE(BitEqual(Row(both, 1, vocab_), expected));
}

TEST_F(ModelErrorTest, OutOfSlotsIsResourceExhaustedUntilASequenceIsReleased) {
  auto model = NewModel(/*max_pages=*/64, /*max_sequences=*/2);
  const SequenceId a = NewSeq(*model);
  NewSeq(*model);
  auto third = model->sequences().New();
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(third.status().message(), HasSubstr("all 2 are in use"));
  ASSERT_TRUE(model->sequences().Release(a).ok());
  auto again = model->sequences().New();
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*model->sequences().Position(*again), 0);
}

TEST_F(ModelErrorTest, UnknownSequenceIdIsNotFoundAndChangesNothing) {
  auto model = NewModel();
  auto reference = NewModel();
  const std::vector<TokenId> prompt = RandomTokens(7, 9, vocab_);
  for (Model* m : {model.get(), reference.get()}) ASSERT_TRUE(m->Prefill(NewSeq(*m), prompt).ok());
  const SequenceId a = 1;
  const SequenceId unknown = 12345;
  const std::vector<TokenId> tokens = {1, 2};
  EXPECT_EQ(model->Prefill(unknown, tokens).status().code(), absl::StatusCode::kNotFound);
  const std::vector<SequenceId> ids = {a, unknown};
  auto step = model->DecodeStep(ids, tokens);
  EXPECT_EQ(step.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(step.status().message(), HasSubstr("unknown sequence id 12345"));
  EXPECT_EQ(model->sequences().CaptureState(unknown, true).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(model->sequences().Restore(unknown, SequenceState(), {}).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(model->sequences().ExportPage(unknown, 0).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(model->sequences().Position(unknown).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(model->sequences().Release(unknown).code(), absl::StatusCode::kNotFound);
  const SequenceId released = NewSeq(*model);
  ASSERT_TRUE(model->sequences().Release(released).ok());
  EXPECT_EQ(model->sequences().Release(released).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(*model->sequences().Position(a), 9);
  EXPECT_TRUE(BitEqual(Decode(*model, {a}, {4}), Decode(*reference, {a}, {4})));
}

TEST_F(ModelErrorTest, MalformedRequestsAreInvalidArgumentAndChangeNothing) {
  auto model = NewModel();
  const SequenceId a = NewSeq(*model);
  const SequenceId b = NewSeq(*model);
  EXPECT_EQ(model->Prefill(a, {}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(model->DecodeStep({}, {}).status().code(), absl::StatusCode::kInvalidArgument);
  const std::vector<SequenceId> two = {a, b};
  const std::vector<TokenId> one = {1};
  EXPECT_EQ(model->DecodeStep(two, one).status().code(), absl::StatusCode::kInvalidArgument);
  const std::vector<SequenceId> repeated = {a, a};
  const std::vector<TokenId> tokens = {1, 2};
  auto step = model->DecodeStep(repeated, tokens);
  EXPECT_EQ(step.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(step.status().message(), HasSubstr("appears twice"));
  EXPECT_EQ(*model->sequences().Position(a), 0);
  EXPECT_EQ(model->sequences().num_free_pages(), 64);
}

TEST_F(ModelErrorTest, RestoreRejectsMismatchedStateAndLeavesTheSequenceEmpty) {
  auto model = NewModel();
  const SequenceId src = NewSeq(*model);
  auto prefill = model->Prefill(src, RandomTokens(8, 10, vocab_));  // 2 full pages + 2 tail tokens
  ASSERT_TRUE(prefill.ok());
  auto snapshot = model->sequences().CaptureState(src, true);
  ASSERT_TRUE(snapshot.ok());
  const std::vector<std::string> pages = testing::ExportPages(*model, src, 2);
  ASSERT_EQ(pages.size(), 2u);
  EXPECT_EQ(static_cast<int64_t>(pages[0].size()), model->page_bytes());
  const SequenceId dst = NewSeq(*model);
  const int64_t free_pages = model->sequences().num_free_pages();

  SequenceState bad = *snapshot;
  bad.ssm_states[1].pop_back();
  absl::Status s = model->sequences().Restore(dst, bad, testing::Views(pages));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("ssm_states[1]"));
  bad = *snapshot;
  bad.tail_v[0].push_back(0.0f);
  EXPECT_THAT(model->sequences().Restore(dst, bad, testing::Views(pages)).message(), HasSubstr("tail_v[0]"));
  bad = *snapshot;
  bad.conv_states.pop_back();
  EXPECT_THAT(model->sequences().Restore(dst, bad, testing::Views(pages)).message(), HasSubstr("conv_states has"));
  bad = *snapshot;
  bad.last_logits.resize(3);
  EXPECT_EQ(model->sequences().Restore(dst, bad, testing::Views(pages)).code(), absl::StatusCode::kInvalidArgument);
  std::vector<absl::string_view> one_page = {pages[0]};
  EXPECT_THAT(model->sequences().Restore(dst, *snapshot, one_page).message(), HasSubstr("needs 2 full pages, got 1"));
  std::vector<absl::string_view> short_page = {pages[0], absl::string_view(pages[1]).substr(1)};
  EXPECT_EQ(model->sequences().Restore(dst, *snapshot, short_page).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*model->sequences().Position(dst), 0);
  EXPECT_EQ(model->sequences().num_free_pages(), free_pages);

  ASSERT_TRUE(model->sequences().Restore(dst, *snapshot, testing::Views(pages)).ok());
  EXPECT_EQ(model->sequences().Restore(dst, *snapshot, testing::Views(pages)).code(),
            absl::StatusCode::kFailedPrecondition);
  auto restored = model->sequences().CaptureState(dst, true);
  ASSERT_TRUE(restored.ok());
  std::string what;
  EXPECT_TRUE(testing::StatesBitEqual(*restored, *snapshot, &what)) << what;
  EXPECT_TRUE(BitEqual(Decode(*model, {dst}, {3}), Decode(*model, {src}, {3})));
}

TEST_F(ModelErrorTest, ExportOfAPageThatIsNotFullIsOutOfRange) {
  auto model = NewModel();
  const SequenceId a = NewSeq(*model);
  ASSERT_TRUE(model->Prefill(a, RandomTokens(9, 6, vocab_)).ok());
  EXPECT_TRUE(model->sequences().ExportPage(a, 0).ok());
  EXPECT_EQ(model->sequences().ExportPage(a, 1).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(model->sequences().ExportPage(a, -1).status().code(), absl::StatusCode::kOutOfRange);
}

TEST_F(ModelErrorTest, CreateRejectsOptionsOffTheGrid) {
  const ModelConfig& config = weights_->config();  // chunk size 16
  auto create = [&](auto edit) {
    ModelOptions options;
    edit(options);
    return Model::Create(config, *weights_, options).status();
  };
  EXPECT_TRUE(create([](ModelOptions&) {}).ok());
  EXPECT_THAT(create([](ModelOptions& o) { o.page_size = 3; }).message(), HasSubstr("power of two"));
  // A page may span chunks (32 of 16); one past the largest page is refused.
  EXPECT_TRUE(create([](ModelOptions& o) { o.page_size = 32; }).ok());
  EXPECT_THAT(create([](ModelOptions& o) { o.page_size = int64_t{1} << 20; }).message(), HasSubstr("maximum"));
  EXPECT_THAT(create([](ModelOptions& o) { o.checkpoint_interval = 24; }).message(),
              HasSubstr("checkpoint_interval 24"));
  EXPECT_EQ(create([](ModelOptions& o) { o.max_segment_tokens = 8; }).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(create([](ModelOptions& o) { o.max_pages = 0; }).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(create([](ModelOptions& o) { o.max_sequences = 0; }).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(create([](ModelOptions& o) { o.num_threads = 0; }).code(), absl::StatusCode::kInvalidArgument);

  auto mamba = testing::LoadWeights(testing::kMamba2Tiny);
  ASSERT_NE(mamba, nullptr);
  EXPECT_EQ(Model::Create(mamba->config(), *weights_, ModelOptions()).status().code(),
            absl::StatusCode::kInvalidArgument);

  auto model = Model::Create(config, *weights_, ModelOptions());
  ASSERT_TRUE(model.ok());
  EXPECT_EQ((*model)->options().page_size, 16);
  EXPECT_EQ((*model)->options().checkpoint_interval, 64);
  EXPECT_EQ((*model)->options().max_segment_tokens, 2048);
}

}  // namespace
}  // namespace hybridserve::engine
