// Decode's proto edge (generation_proto.h): the usage a client is told.

#include "decode/generation_proto.h"

#include <utility>

#include "decode/generation.h"
#include "gtest/gtest.h"
#include "prefill/prefill_client.h"
#include "proto/generation.pb.h"

namespace hybridserve::decode {
namespace {

TEST(GenerationProtoTest, UsageCarriesItsCountsAndEachResumeKindAsItsProtoValue) {
  for (const auto& [kind, expected] : {std::pair{prefill::ResumeKind::kCold, v1::RESUME_KIND_COLD},
                                       std::pair{prefill::ResumeKind::kGridCheckpoint, v1::RESUME_KIND_GRID_CHECKPOINT},
                                       std::pair{prefill::ResumeKind::kExactPrefix, v1::RESUME_KIND_EXACT_PREFIX}}) {
    SCOPED_TRACE(v1::ResumeKind_Name(expected));
    Usage u;
    u.prompt_tokens = 70;
    u.completion_tokens = 9;
    u.cached_tokens = 64;
    u.recomputed_tokens = 6;
    u.resume_kind = kind;
    v1::Usage p;
    ToProto(u, &p);
    EXPECT_EQ(p.resume_kind(), expected);
    EXPECT_EQ(p.prompt_tokens(), 70u);
    EXPECT_EQ(p.completion_tokens(), 9u);
    EXPECT_EQ(p.cached_tokens(), 64u);
    EXPECT_EQ(p.recomputed_tokens(), 6u);
    EXPECT_FALSE(p.has_session());
  }
}

}  // namespace
}  // namespace hybridserve::decode
