#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/runfiles.h"
#include "engine/model.h"
#include "engine/model_config.h"
#include "engine/model_test_util.h"
#include "engine/model_weights.h"
#include "engine/model_weights_test_util.h"
#include "engine/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/bf16.h"

// ModelWeights on Zamba2's shared transformer blocks as transformers runs them
// (issue 46): copies under later uses, untied blocks, what is refused.

namespace hybridserve::engine {
namespace {

using common::Runfile;
using ::testing::HasSubstr;
using weights_testing::Config;
using weights_testing::ExpectInvalid;
using weights_testing::Floats;
using weights_testing::LoadStatus;
using weights_testing::MustLoad;
using weights_testing::OwnedTensor;
using weights_testing::ReadTensors;
using weights_testing::Serialize;
using weights_testing::TempDir;
using weights_testing::TensorMap;
using weights_testing::TotalElements;
using weights_testing::WriteFile;
using weights_testing::WriteModel;

// Zamba2 checkpoints that store the shared block under every hybrid layer using
// it (issue 46): zamba2_per_use_tiny has one block at layers 0, 3 and 5, its
// tensors under all three.
constexpr absl::string_view kZambaPerUse = testing::kZambaPerUseTiny;

std::string SharedPrefix(int layer) { return absl::StrCat("model.layers.", layer, ".shared_transformer."); }

// `tensors` without any model.layers.{L}.shared_transformer.* for L in `layers`.
TensorMap WithoutShared(TensorMap tensors, std::vector<int> layers) {
  for (int layer : layers) {
    for (auto it = tensors.begin(); it != tensors.end();) {
      it = absl::StartsWith(it->first, SharedPrefix(layer)) ? tensors.erase(it) : std::next(it);
    }
  }
  return tensors;
}

// `tensors` with every model.layers.{from}.shared_transformer.X copied to layer `to`.
TensorMap WithSharedCopied(TensorMap tensors, int from, int to) {
  TensorMap copies;
  for (const auto& [name, t] : tensors) {
    if (absl::StartsWith(name, SharedPrefix(from))) {
      copies[SharedPrefix(to) + name.substr(SharedPrefix(from).size())] = t;
    }
  }
  tensors.insert(copies.begin(), copies.end());
  return tensors;
}

// Logits of a 9-token prefill and 4 greedy decode steps on the CPU.
std::vector<std::vector<float>> RunGreedy(const ModelWeights& weights) {
  ModelOptions options;
  options.max_pages = 16;
  std::unique_ptr<Model> model = testing::MakeModel(weights, options);
  std::vector<std::vector<float>> rows;
  if (model == nullptr) return rows;
  auto id = model->sequences().New();
  EXPECT_TRUE(id.ok()) << id.status();
  if (!id.ok()) return rows;
  auto prefill = model->Prefill(*id, testing::RandomTokens(46, 9, weights.config().vocab_size));
  EXPECT_TRUE(prefill.ok()) << prefill.status();
  if (!prefill.ok()) return rows;
  rows.push_back(prefill->logits);
  for (int step = 0; step < 4; ++step) {
    const SequenceId ids[] = {*id};
    const TokenId tokens[] = {static_cast<TokenId>(testing::ArgMax(rows.back()))};
    auto logits = model->DecodeStep(ids, tokens);
    EXPECT_TRUE(logits.ok()) << logits.status();
    if (!logits.ok()) break;
    rows.push_back(*logits);
  }
  return rows;
}

TEST(ModelWeightsTest, Zamba2SharedBlockCopiedUnderEveryUseLoadsOnceAndAnswersAsTheSingleCopy) {
  const ModelConfig config = Config(kZambaPerUse);
  const TensorMap per_use = ReadTensors(kZambaPerUse);
  const TensorMap single = WithoutShared(per_use, {3, 5});
  ASSERT_EQ(per_use.size(), single.size() + 2 * 14);  // 8 block tensors + 3 uses' 2 MLP adapter matrices
  auto copied = ModelWeights::Load(config, WriteModel("zamba_per_use", per_use));
  ASSERT_TRUE(copied.ok()) << copied.status();
  auto once = ModelWeights::Load(config, WriteModel("zamba_single", single));
  ASSERT_TRUE(once.ok()) << once.status();
  // Read once: no copy is loaded, counted or fingerprinted.
  EXPECT_EQ((*copied)->shared_blocks().size(), 1u);
  EXPECT_EQ((*copied)->fingerprint(), (*once)->fingerprint());
  EXPECT_EQ((*copied)->num_parameters(), TotalElements(single));
  EXPECT_EQ((*copied)->resident_bytes(), (*once)->resident_bytes());
  const std::vector<std::vector<float>> a = RunGreedy(**copied);
  const std::vector<std::vector<float>> b = RunGreedy(**once);
  ASSERT_EQ(a.size(), 5u);
  ASSERT_EQ(b.size(), a.size());
  for (size_t r = 0; r < a.size(); ++r) EXPECT_TRUE(testing::BitEqual(a[r], b[r])) << "row " << r;

  // Two blocks (zamba2_tiny2: block 0 at layers 0 and 5, block 1 at layer 2):
  // block 0 copied under layer 5.
  const TensorMap tiny2 = WithSharedCopied(ReadTensors(testing::kZambaTiny2), 0, 5);
  auto two = ModelWeights::Load(Config(testing::kZambaTiny2), WriteModel("zamba_tiny2_copy", tiny2));
  ASSERT_TRUE(two.ok()) << two.status();
  std::unique_ptr<ModelWeights> two_base = MustLoad(Runfile(testing::kZambaTiny2));
  ASSERT_NE(two_base, nullptr);
  EXPECT_EQ((*two)->fingerprint(), two_base->fingerprint());
  EXPECT_EQ((*two)->num_parameters(), two_base->num_parameters());
}

// The bytes of the shared block stored under `layer`, its adapters left out.
int64_t SharedBlockBytes(const TensorMap& tensors, int layer) {
  int64_t n = 0;
  for (const auto& [name, t] : tensors) {
    if (absl::StartsWith(name, SharedPrefix(layer)) && !absl::StrContains(name, "adapter_list")) {
      n += static_cast<int64_t>(t.bytes.size());
    }
  }
  return n;
}

// Prefill of the prompt RunGreedy decodes from, followed by the tokens it chose,
// agrees at every position with RunGreedy's prefill and decode rows. Tolerance
// 1e-2: Zamba2 clamps dt in the chunked (prefill) path only, as transformers does,
// whose own cached and uncached logits differ by up to 2.4e-3 on these models
// (golden.json max_abs_diff_cached_vs_uncached_logits); a layer running another
// block in one path than in the other moves them by O(1).
void ExpectPrefillMatchesDecode(const ModelWeights& weights, const std::vector<std::vector<float>>& rows) {
  ASSERT_EQ(rows.size(), 5u);
  std::vector<TokenId> tokens = testing::RandomTokens(46, 9, weights.config().vocab_size);
  for (size_t r = 0; r + 1 < rows.size(); ++r) tokens.push_back(static_cast<TokenId>(testing::ArgMax(rows[r])));
  ModelOptions options;
  options.max_pages = 16;
  std::unique_ptr<Model> model = testing::MakeModel(weights, options);
  ASSERT_NE(model, nullptr);
  auto id = model->sequences().New();
  ASSERT_TRUE(id.ok()) << id.status();
  PrefillOptions all;
  all.all_logits = true;
  auto prefill = model->Prefill(*id, tokens, all);
  ASSERT_TRUE(prefill.ok()) << prefill.status();
  const size_t vocab = static_cast<size_t>(weights.config().vocab_size);
  for (size_t r = 0; r < rows.size(); ++r) {
    const absl::Span<const float> row = absl::MakeConstSpan(prefill->logits).subspan((8 + r) * vocab, vocab);
    EXPECT_LE(testing::MaxAbsDiff(row, rows[r]), 1e-2f) << "row " << r;
  }
}

TEST(ModelWeightsTest, Zamba2SharedBlockCopyThatDiffersIsThatLayersOwnBlock) {
  const ModelConfig config = Config(kZambaPerUse);
  const TensorMap per_use = ReadTensors(kZambaPerUse);
  const TensorMap single = WithoutShared(per_use, {3, 5});
  auto tied = ModelWeights::Load(config, WriteModel("zamba_tied", per_use));
  ASSERT_TRUE(tied.ok()) << tied.status();
  const std::vector<std::vector<float>> tied_rows = RunGreedy(**tied);
  ASSERT_EQ(tied_rows.size(), 5u);

  // Layer 5's o_proj negated (every sign bit flipped): as transformers does (the
  // tie of that tensor dropped), layer 5 runs a block of its own, the others the first use's.
  TensorMap t = per_use;
  OwnedTensor& o = t.at(SharedPrefix(5) + "self_attn.o_proj.weight");
  for (size_t k = 3; k < o.bytes.size(); k += 4) o.bytes[k] ^= 0x80;
  auto w = ModelWeights::Load(config, WriteModel("zamba_o_differs", t));
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_EQ((*w)->shared_blocks().size(), 2u);
  const int64_t blocks[] = {0, -1, -1, 0, -1, 1};
  for (int layer : {0, 3, 5}) {
    EXPECT_EQ((*w)->layer(layer).zamba_hybrid().block, blocks[layer]) << "layer " << layer;
    EXPECT_EQ((*w)->layer(layer).zamba_hybrid().mem_block, 0) << "layer " << layer;
  }
  EXPECT_EQ((*w)->shared_blocks()[1].attention.o_proj.ToFloat32(), Floats(o));
  EXPECT_EQ((*w)->shared_blocks()[0].attention.o_proj.ToFloat32(),
            Floats(per_use.at(SharedPrefix(0) + "self_attn.o_proj.weight")));
  EXPECT_EQ((*w)->shared_blocks()[1].attention.q_proj.ToFloat32(),
            Floats(per_use.at(SharedPrefix(0) + "self_attn.q_proj.weight")));
  // Counted: the one tensor that differs; resident: the whole second block.
  EXPECT_EQ((*w)->num_parameters(), TotalElements(single) + static_cast<int64_t>(o.bytes.size() / 4));
  EXPECT_EQ((*w)->resident_bytes(), (*tied)->resident_bytes() + SharedBlockBytes(per_use, 0));
  EXPECT_NE((*w)->fingerprint(), (*tied)->fingerprint());
  const std::vector<std::vector<float>> rows = RunGreedy(**w);
  ASSERT_EQ(rows.size(), 5u);
  EXPECT_GT(testing::MaxAbsDiff(rows[0], tied_rows[0]), 1e-3f);
  ExpectPrefillMatchesDecode(**w, rows);

  // Equal copies change nothing: with only the differing tensor under layer 5, the same model.
  TensorMap only_o = single;
  only_o[SharedPrefix(5) + "self_attn.o_proj.weight"] = o;
  auto same = ModelWeights::Load(config, WriteModel("zamba_only_o", only_o));
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_EQ((*same)->fingerprint(), (*w)->fingerprint());
  EXPECT_EQ((*same)->num_parameters(), (*w)->num_parameters());
  const std::vector<std::vector<float>> same_rows = RunGreedy(**same);
  ASSERT_EQ(same_rows.size(), rows.size());
  for (size_t r = 0; r < rows.size(); ++r) EXPECT_TRUE(testing::BitEqual(same_rows[r], rows[r])) << "row " << r;

  // A layer runs its own use's adapter from its own copy: layer 3 (use 1) runs
  // adapter_list.1 under layer 3, and not adapter_list.2, which layer 5 runs from its own.
  t = per_use;
  t.at(SharedPrefix(3) + "feed_forward.gate_up_proj_adapter_list.1.1.weight").bytes[3] ^= 0x80;
  w = ModelWeights::Load(config, WriteModel("zamba_own_adapter_differs", t));
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ((*w)->shared_blocks().size(), 1u);
  EXPECT_EQ((*w)->num_parameters(), TotalElements(single));
  EXPECT_NE((*w)->fingerprint(), (*tied)->fingerprint());
  EXPECT_FALSE(testing::BitEqual(RunGreedy(**w)[0], tied_rows[0]));
  t = per_use;
  t.at(SharedPrefix(3) + "feed_forward.gate_up_proj_adapter_list.2.1.weight").bytes[3] ^= 0x80;
  w = ModelWeights::Load(config, WriteModel("zamba_unused_adapter_differs", t));
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ((*w)->fingerprint(), (*tied)->fingerprint());
  const std::vector<std::vector<float>> unused_rows = RunGreedy(**w);
  ASSERT_EQ(unused_rows.size(), tied_rows.size());
  for (size_t r = 0; r < rows.size(); ++r) EXPECT_TRUE(testing::BitEqual(unused_rows[r], tied_rows[r])) << "row " << r;

  // The same values in bf16 are another tensor (transformers widens it, finds it
  // differs from the fp32 first use's and does not tie it): a block of its own.
  t = per_use;
  OwnedTensor& norm = t.at(SharedPrefix(3) + "input_layernorm.weight");
  std::vector<uint8_t> bf16;
  for (float x : Floats(norm)) {
    const uint16_t b = kernels::FloatToBf16(x);
    bf16.push_back(static_cast<uint8_t>(b & 0xff));
    bf16.push_back(static_cast<uint8_t>(b >> 8));
  }
  norm = OwnedTensor{DType::kBF16, norm.shape, bf16};
  w = ModelWeights::Load(config, WriteModel("zamba_bf16_copy", t));
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_EQ((*w)->shared_blocks().size(), 2u);
  EXPECT_EQ((*w)->layer(3).zamba_hybrid().block, 1);
  EXPECT_EQ((*w)->layer(5).zamba_hybrid().block, 0);
  std::vector<float> widened;
  for (size_t k = 0; k < bf16.size(); k += 2) widened.push_back(kernels::Bf16ToFloat(bf16[k] | bf16[k + 1] << 8));
  EXPECT_EQ((*w)->shared_blocks()[1].input_norm, widened);
}

TEST(ModelWeightsTest, Zamba2UntiedFileRunsEveryHybridLayersOwnBlock) {
  // zamba2_untied_tiny: tie_word_embeddings false, one block used by layers 0, 3
  // and 5, each storing its own draw with the adapters of all three uses.
  const ModelConfig config = Config(testing::kZambaUntiedTiny);
  ASSERT_FALSE(config.tie_word_embeddings);
  const TensorMap file = ReadTensors(testing::kZambaUntiedTiny);
  std::unique_ptr<ModelWeights> w = MustLoad(Runfile(testing::kZambaUntiedTiny));
  ASSERT_NE(w, nullptr);
  ASSERT_EQ(w->shared_blocks().size(), 3u);
  int64_t unused = 0;  // each layer's adapters of the other two uses
  const int uses[][2] = {{0, 0}, {3, 1}, {5, 2}};
  for (const auto& [layer, use] : uses) {
    const ZambaHybridLayerWeights& z = w->layer(layer).zamba_hybrid();
    EXPECT_EQ(z.use, use);
    EXPECT_EQ(z.block, use);
    EXPECT_EQ(w->shared_blocks()[static_cast<size_t>(use)].attention.q_proj.ToFloat32(),
              Floats(file.at(SharedPrefix(layer) + "self_attn.q_proj.weight")));
    EXPECT_EQ(z.q_adapter.up.ToFloat32(),
              Floats(file.at(absl::StrCat(SharedPrefix(layer), "self_attn.linear_q_adapter_list.", use, ".1.weight"))));
    for (const auto& [name, t] : file) {
      if (absl::StartsWith(name, SharedPrefix(layer)) && absl::StrContains(name, "adapter_list.") &&
          !absl::StrContains(name, absl::StrCat("adapter_list.", use, "."))) {
        unused += static_cast<int64_t>(t.bytes.size() / 4);
      }
    }
  }
  EXPECT_EQ(unused, 3 * 2 * (3 * (4 * 64 + 64 * 4) + (4 * 32 + 96 * 4)));
  EXPECT_EQ(w->num_parameters(), TotalElements(file) - unused);

  // An unused adapter may be missing (transformers initialises it at random and
  // never runs it): the same model.
  TensorMap t = file;
  t.erase(SharedPrefix(3) + "self_attn.linear_q_adapter_list.0.0.weight");
  auto same = ModelWeights::Load(config, WriteModel("zamba_untied_no_unused_adapter", t));
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_EQ((*same)->fingerprint(), w->fingerprint());
  // A tensor a layer runs may not: untied, nothing stands in for it.
  t = file;
  t.erase(SharedPrefix(3) + "self_attn.q_proj.weight");
  ExpectInvalid(LoadStatus(config, t, "zamba_untied_no_q"),
                absl::StrCat("missing tensor ", SharedPrefix(3),
                             "self_attn.q_proj.weight (expected shape [64, 64]): with tie_word_embeddings false each "
                             "hybrid layer runs its own shared block (transformers would initialise this one at "
                             "random)"));
  ExpectInvalid(LoadStatus(config, WithoutShared(file, {5}), "zamba_untied_no_copy"),
                absl::StrCat("missing tensor ", SharedPrefix(5), "input_layernorm.weight (expected shape [64])"));
  // An unused tensor of the wrong shape fails transformers' load too.
  t = file;
  t.at(SharedPrefix(3) + "feed_forward.gate_up_proj_adapter_list.0.1.weight").shape = {48, 8};
  ExpectInvalid(LoadStatus(config, t, "zamba_untied_unused_shape"),
                absl::StrCat("tensor ", SharedPrefix(3),
                             "feed_forward.gate_up_proj_adapter_list.0.1.weight has shape [48, 8], expected [96, 4]"));

  // The same file under a config that ties: transformers finds every copy (and the
  // head) different from the first use's and ties none of them; so do we.
  ModelConfig tied_config = config;
  tied_config.tie_word_embeddings = true;
  auto tied = ModelWeights::Load(tied_config, Runfile(testing::kZambaUntiedTiny));
  ASSERT_TRUE(tied.ok()) << tied.status();
  EXPECT_EQ((*tied)->shared_blocks().size(), 3u);
  const std::vector<std::vector<float>> a = RunGreedy(*w);
  const std::vector<std::vector<float>> b = RunGreedy(**tied);
  ASSERT_EQ(a.size(), 5u);
  ASSERT_EQ(b.size(), a.size());
  for (size_t r = 0; r < a.size(); ++r) EXPECT_TRUE(testing::BitEqual(a[r], b[r])) << "row " << r;
  ExpectPrefillMatchesDecode(*w, a);
}

TEST(ModelWeightsTest, Zamba2SharedBlockTensorsTransformersCannotLoadAreRefused) {
  const ModelConfig config = Config(kZambaPerUse);
  // A copy of the wrong shape (transformers' load fails on it).
  TensorMap t = ReadTensors(kZambaPerUse);
  std::vector<int64_t>& shape = t.at(SharedPrefix(5) + "self_attn.o_proj.weight").shape;
  shape = {shape[1], shape[0]};
  ExpectInvalid(
      LoadStatus(config, t, "zamba_shape_differs"),
      absl::StrCat("tensor ", SharedPrefix(5), "self_attn.o_proj.weight has shape [64, 32], expected [32, 64]"));

  // A layer holding another block's tensors: zamba2_tiny2's block 1 (use 1) under
  // layer 5 (use 2 of block 0), whose module has no adapter_list.1.
  const TensorMap wrong_block = WithSharedCopied(ReadTensors(testing::kZambaTiny2), 2, 5);
  ExpectInvalid(LoadStatus(Config(testing::kZambaTiny2), wrong_block, "zamba_wrong_block"),
                absl::StrCat("8 unexpected tensor(s) for a zamba2 model with pattern \"ZMZMMZ\": ", SharedPrefix(5),
                             "feed_forward.gate_up_proj_adapter_list.1.0.weight"));

  // A tensor no module has is unexpected.
  t = ReadTensors(kZambaPerUse);
  t[SharedPrefix(3) + "self_attn.linear_q_adapter_list.1.0.weight"] = t.at(SharedPrefix(3) + "input_layernorm.weight");
  ExpectInvalid(LoadStatus(config, t, "zamba_extra_copy"),
                absl::StrCat("1 unexpected tensor(s) for a zamba2 model with pattern \"ZMMZMZ\": ", SharedPrefix(3),
                             "self_attn.linear_q_adapter_list.1.0.weight"));
}

TEST(ModelWeightsTest, Zamba2TiedSharedBlockTensorsMayBeUnderAnyOfItsUses) {
  const ModelConfig config = Config(kZambaPerUse);
  auto single =
      ModelWeights::Load(config, WriteModel("zamba_only_first", WithoutShared(ReadTensors(kZambaPerUse), {3, 5})));
  ASSERT_TRUE(single.ok()) << single.status();

  auto w = ModelWeights::Load(config, WriteModel("zamba_no_copy_at_5", WithoutShared(ReadTensors(kZambaPerUse), {5})));
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ((*w)->fingerprint(), (*single)->fingerprint());

  TensorMap partial = ReadTensors(kZambaPerUse);
  partial.erase(SharedPrefix(3) + "self_attn.q_proj.weight");
  partial.erase(SharedPrefix(5) + "feed_forward.gate_up_proj_adapter_list.0.1.weight");
  w = ModelWeights::Load(config, WriteModel("zamba_partial_copies", partial));
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ((*w)->fingerprint(), (*single)->fingerprint());

  // Only under a later use: transformers' tie_weights, finding the first use's
  // tensor missing, ties it to the later use's instead; the same model.
  w = ModelWeights::Load(config, WriteModel("zamba_only_later", WithoutShared(ReadTensors(kZambaPerUse), {0, 5})));
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ((*w)->shared_blocks().size(), 1u);
  EXPECT_EQ((*w)->fingerprint(), (*single)->fingerprint());
  EXPECT_EQ((*w)->num_parameters(), (*single)->num_parameters());
  const std::vector<std::vector<float>> a = RunGreedy(**w);
  const std::vector<std::vector<float>> b = RunGreedy(**single);
  ASSERT_EQ(a.size(), 5u);
  ASSERT_EQ(b.size(), a.size());
  for (size_t r = 0; r < a.size(); ++r) EXPECT_TRUE(testing::BitEqual(a[r], b[r])) << "row " << r;

  // Under none of them.
  ExpectInvalid(LoadStatus(config, WithoutShared(ReadTensors(kZambaPerUse), {0, 3, 5}), "zamba_nowhere"),
                absl::StrCat("missing tensor ", SharedPrefix(0),
                             "input_layernorm.weight (expected shape [64]), nor under any other hybrid layer using "
                             "shared block 0"));
}

}  // namespace
}  // namespace hybridserve::engine
