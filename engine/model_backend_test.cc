// The backend seam: the Model reaches every kernel through kernels::Backend,
// hands kernels only device memory of that backend, and chooses its backend
// by ModelOptions.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/backend_registry.h"
#include "engine/model.h"
#include "engine/model_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/counting_backend.h"

namespace hybridserve::engine {
namespace {

using testing::BitEqual;
using ::testing::HasSubstr;
using testing::LoadWeights;
using testing::RandomTokens;

class ModelBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    weights_ = LoadWeights(testing::kNemotronTiny);
    ASSERT_NE(weights_, nullptr);
    auto cpu = CreateBackend(BackendOptions());
    ASSERT_TRUE(cpu.ok()) << cpu.status();
    cpu_ = *std::move(cpu);
    counting_ = std::make_unique<kernels::CountingBackend>(*cpu_);
  }

  ModelOptions Options(kernels::Backend* backend) const {
    ModelOptions o;
    o.page_size = 4;
    o.max_pages = 128;
    o.max_sequences = 4;
    o.backend = backend;
    return o;
  }

  std::unique_ptr<ModelWeights> weights_;
  std::unique_ptr<kernels::Backend> cpu_;
  std::unique_ptr<kernels::CountingBackend> counting_;
};

TEST_F(ModelBackendTest, EveryRunnerReachesKernelsThroughTheBackendWithDeviceMemoryOnly) {
  auto model = Model::Create(weights_->config(), *weights_, Options(counting_.get()));
  ASSERT_TRUE(model.ok()) << model.status();
  Model& m = **model;
  const ModelConfig& c = m.config();
  const int64_t mamba = c.CountLayers(LayerKind::kMamba2);
  const int64_t attention = c.CountLayers(LayerKind::kAttention);
  const int64_t mlp = c.CountLayers(LayerKind::kMlp);
  ASSERT_GT(mamba, 0);
  ASSERT_GT(attention, 0);
  ASSERT_GT(mlp, 0);
  EXPECT_TRUE(counting_->foreign_pointers().empty());
  counting_->ResetCounts();

  // A prefill of 100 tokens crosses one grid checkpoint (interval 4 * 16): two segments.
  auto a = m.sequences().New();
  auto b = m.sequences().New();
  ASSERT_TRUE(a.ok() && b.ok());
  const int64_t vocab = c.vocab_size;
  ASSERT_TRUE(m.Prefill(*a, RandomTokens(1, 100, vocab)).ok());
  const int64_t segments = 2;
  EXPECT_EQ(counting_->calls("Embedding"), segments);
  EXPECT_EQ(counting_->calls("RmsNorm"), segments * c.num_layers() + 1);                // + norm_f of the last token
  EXPECT_EQ(counting_->calls("Matmul"), segments * 2 * (mamba + attention + mlp) + 1);  // + lm_head
  EXPECT_EQ(counting_->calls("CausalConv1d"), segments * mamba);
  EXPECT_EQ(counting_->calls("DtSoftplus"), segments * mamba);
  EXPECT_EQ(counting_->calls("SsdChunkScan"), segments * mamba);
  EXPECT_EQ(counting_->calls("GatedRmsNorm"), segments * mamba);
  EXPECT_EQ(counting_->calls("KvAppend"), segments * attention);
  EXPECT_EQ(counting_->calls("AttentionPrefill"), segments * attention);
  EXPECT_EQ(counting_->calls("Activation"), segments * mlp);
  EXPECT_EQ(counting_->calls("CausalConv1dUpdate"), 0);

  ASSERT_TRUE(m.Prefill(*b, RandomTokens(2, 7, vocab)).ok());
  counting_->ResetCounts();
  const int steps = 3;
  for (int s = 0; s < steps; ++s) ASSERT_TRUE(m.DecodeStep({*a, *b}, {5, 9}).ok());
  EXPECT_EQ(counting_->calls("Embedding"), steps);
  EXPECT_EQ(counting_->calls("RmsNorm"), steps * (c.num_layers() + 1));
  EXPECT_EQ(counting_->calls("Matmul"), steps * (2 * (mamba + attention + mlp) + 1));
  EXPECT_EQ(counting_->calls("CausalConv1dUpdate"), steps * mamba);
  EXPECT_EQ(counting_->calls("SelectiveStateUpdate"), steps * mamba);
  EXPECT_EQ(counting_->calls("DtSoftplus"), steps * mamba);
  EXPECT_EQ(counting_->calls("GatedRmsNorm"), steps * mamba);
  EXPECT_EQ(counting_->calls("KvAppendDecode"), steps * attention);
  EXPECT_EQ(counting_->calls("AttentionDecode"), steps * attention);
  EXPECT_EQ(counting_->calls("Activation"), steps * mlp);
  EXPECT_EQ(counting_->calls("SsdChunkScan"), 0);

  // Capture, export and restore move bytes only through the copy calls.
  counting_->ResetCounts();
  auto state = m.sequences().CaptureState(*a, true);
  ASSERT_TRUE(state.ok());
  auto page = m.sequences().ExportPage(*a, 0);
  ASSERT_TRUE(page.ok());
  EXPECT_GT(counting_->calls("CopyToHost"), 0);
  EXPECT_EQ(counting_->kernel_calls(), 0);
  EXPECT_TRUE(counting_->foreign_pointers().empty()) << ::testing::PrintToString(counting_->foreign_pointers());
}

TEST_F(ModelBackendTest, AWrappedBackendGivesTheBitsOfTheModelsOwnBackend) {
  auto own = testing::MakeModel(*weights_, Options(nullptr));
  auto wrapped = Model::Create(weights_->config(), *weights_, Options(counting_.get()));
  ASSERT_NE(own, nullptr);
  ASSERT_TRUE(wrapped.ok());
  const std::vector<TokenId> prompt = RandomTokens(3, 45, own->config().vocab_size);
  auto x = own->sequences().New();
  auto y = (*wrapped)->sequences().New();
  auto px = own->Prefill(*x, prompt);
  auto py = (*wrapped)->Prefill(*y, prompt);
  ASSERT_TRUE(px.ok() && py.ok());
  EXPECT_TRUE(BitEqual(px->logits, py->logits));
  auto dx = own->DecodeStep({*x}, {11});
  auto dy = (*wrapped)->DecodeStep({*y}, {11});
  ASSERT_TRUE(dx.ok() && dy.ok());
  EXPECT_TRUE(BitEqual(*dx, *dy));
}

// A MoE block routes on the device (one MoeRoute, one MoeCombine) and issues
// its experts' projections, routed and shared, as two ExpertMatmul calls (up,
// down) per forward, whatever the rows chose, with no copy to the host; the
// CPU backend's batched path gives the logits of the same items issued one
// by one (each expert's rows a Matmul of their own), for every MoE family, in
// fp32 and bf16, in prefill segments and batched decode steps.
TEST(ModelMoeBatchTest, ExpertsRunAsTwoExpertMatmulsWithTheBitsOfSingleCalls) {
  for (absl::string_view dir :
       {testing::kGraniteMoeTiny, testing::kNemotronMoeTiny, testing::kNemotronLatentMoeTiny,
        testing::kNemotronMoeBiasTiny, testing::kQwen3NextSparseTiny, testing::kQwen35MoeTiny}) {
    for (bool bf16 : {false, true}) {
      SCOPED_TRACE(std::string(dir) + (bf16 ? " bf16" : " fp32"));
      auto weights = testing::LoadWeightsCutToBf16(dir, bf16);
      ASSERT_NE(weights, nullptr);
      auto cpu = CreateBackend(BackendOptions());
      ASSERT_TRUE(cpu.ok()) << cpu.status();
      kernels::CountingBackend batched(**cpu), single(**cpu);
      single.set_matmul_batch_item_by_item(true);
      ModelOptions o;
      o.page_size = 4;
      o.max_pages = 256;
      o.max_sequences = 4;
      o.backend = &batched;
      auto a = Model::Create(weights->config(), *weights, o);
      o.backend = &single;
      auto b = Model::Create(weights->config(), *weights, o);
      ASSERT_TRUE(a.ok() && b.ok());
      const int64_t moe = weights->config().CountLayers(LayerKind::kMoe);
      ASSERT_GT(moe, 0);
      const int64_t vocab = weights->config().vocab_size;
      std::vector<SequenceId> ia, ib;
      for (int s = 0; s < 3; ++s) {
        auto x = (*a)->sequences().New();
        auto y = (*b)->sequences().New();
        ASSERT_TRUE(x.ok() && y.ok());
        ia.push_back(*x);
        ib.push_back(*y);
        const std::vector<TokenId> prompt = RandomTokens(20 + s, 37 + 11 * s, vocab);
        auto px = (*a)->Prefill(*x, prompt);
        auto py = (*b)->Prefill(*y, prompt);
        ASSERT_TRUE(px.ok() && py.ok());
        EXPECT_TRUE(BitEqual(px->logits, py->logits)) << "prefill " << s;
      }
      for (int step = 0; step < 4; ++step) {
        batched.ResetCounts();
        single.ResetCounts();
        const std::vector<TokenId> tokens = {TokenId(step + 1), TokenId(step + 7), TokenId(step + 3)};
        auto dx = (*a)->DecodeStep(ia, tokens);
        auto dy = (*b)->DecodeStep(ib, tokens);
        ASSERT_TRUE(dx.ok() && dy.ok());
        EXPECT_TRUE(BitEqual(*dx, *dy)) << "decode step " << step;
        EXPECT_EQ(batched.calls("ExpertMatmul"), 2 * moe);
        EXPECT_EQ(batched.calls("MoeRoute"), moe);
        EXPECT_EQ(batched.calls("MoeCombine"), moe);
        EXPECT_EQ(single.calls("ExpertMatmul"), 0);
        EXPECT_GT(single.calls("Matmul"), batched.calls("Matmul"));
        // Only the item-by-item path reads the offsets back (once per call).
        EXPECT_EQ(single.calls("CopyToHost"), batched.calls("CopyToHost") + 2 * moe);
      }
      EXPECT_TRUE(batched.foreign_pointers().empty()) << ::testing::PrintToString(batched.foreign_pointers());
    }
  }
}

TEST_F(ModelBackendTest, ReleasingTheModelReleasesEveryDeviceBuffer) {
  {
    auto model = Model::Create(weights_->config(), *weights_, Options(counting_.get()));
    ASSERT_TRUE(model.ok());
    auto id = (*model)->sequences().New();
    ASSERT_TRUE((*model)->Prefill(*id, RandomTokens(4, 20, (*model)->config().vocab_size)).ok());
    EXPECT_GT(counting_->live_buffers(), 0);
  }
  EXPECT_EQ(counting_->live_buffers(), 0);
  EXPECT_EQ(counting_->live_bytes(), 0);
}

TEST_F(ModelBackendTest, ADeviceThatCannotHoldThePoolsIsResourceExhausted) {
  counting_->set_memory_limit(int64_t{1} << 20);  // the weights fit, 100000 pages do not
  ModelOptions o = Options(counting_.get());
  o.max_pages = 100000;
  auto model = Model::Create(weights_->config(), *weights_, o);
  EXPECT_EQ(model.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(model.status().message(), HasSubstr("cannot allocate"));
  EXPECT_EQ(counting_->live_buffers(), 0);  // nothing left behind
}

TEST_F(ModelBackendTest, AMissingDeviceIsUnimplementedWithAClearMessage) {
  ModelOptions o = Options(nullptr);
  o.device = Device::kCuda;
  BackendOptions past_the_last;
  past_the_last.device = Device::kCuda;
  past_the_last.device_index = 64;
  auto none = CreateBackend(past_the_last);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(none.status().message(), HasSubstr("the cuda backend cannot start"));
  past_the_last.device_index = -1;
  EXPECT_EQ(CreateBackend(past_the_last).status().code(), absl::StatusCode::kInvalidArgument);
  auto model = Model::Create(weights_->config(), *weights_, o);
  if (model.ok()) {
    // A machine with a GPU: the model runs there (engine/model_cuda_test.cc tests what it computes).
    EXPECT_STREQ((*model)->backend().name(), "cuda");
  } else {
    EXPECT_EQ(model.status().code(), absl::StatusCode::kUnimplemented);
    EXPECT_THAT(model.status().message(), HasSubstr("the cuda backend cannot start"));
  }
  EXPECT_EQ(ParseDevice("cuda").value(), Device::kCuda);
  EXPECT_EQ(ParseDevice("cpu").value(), Device::kCpu);
  EXPECT_EQ(ParseDevice("tpu").status().code(), absl::StatusCode::kInvalidArgument);
  BackendOptions bad;
  bad.num_threads = 0;
  EXPECT_EQ(CreateBackend(bad).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace hybridserve::engine
