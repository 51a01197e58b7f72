// libFuzzer target for DecodeSnapshot: whatever the bytes, decoding returns a
// documented error or a snapshot, never crashes or reads out of bounds (built
// with AddressSanitizer), and a snapshot it accepts re-encodes to exactly the
// input (the format is canonical).
//
// Each input is decoded twice: as given, and with its trailing checksum
// recomputed, so that mutations reach the header and shape checks behind the
// checksum instead of stopping at it.
//
// When started without a corpus directory, it writes a few valid encodings to
// a fresh directory (under $TEST_TMPDIR when set) and fuzzes from those. Open
// ended:   bazel run //engine:snapshot_codec_fuzzer -- -max_total_time=600
// Bounded: bazel test //engine:snapshot_codec_fuzz_test

#include <stdlib.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/hash.h"
#include "engine/snapshot_codec.h"

namespace hybridserve::engine {
namespace {

[[noreturn]] void Fail(const char* what, const absl::Status& status) {
  std::fprintf(stderr, "%s: %s\n", what, status.ToString().c_str());
  abort();
}

bool SameBytes(absl::Span<const uint8_t> view, const std::vector<float>& a) {
  return view.size() == a.size() * sizeof(float) && (a.empty() || std::memcmp(view.data(), a.data(), view.size()) == 0);
}

void Check(absl::string_view bytes) {
  absl::StatusOr<Snapshot> snapshot = DecodeSnapshot(bytes);
  absl::StatusOr<SnapshotView> view = ParseSnapshot(bytes);
  if (snapshot.status().code() != view.status().code())
    Fail("DecodeSnapshot and ParseSnapshot disagree", view.status());
  if (!snapshot.ok()) {
    switch (snapshot.status().code()) {
      case absl::StatusCode::kDataLoss:
      case absl::StatusCode::kInvalidArgument:
      case absl::StatusCode::kUnimplemented:
        return;
      default:
        Fail("undocumented error", snapshot.status());
    }
  }
  absl::StatusOr<std::string> again = EncodeSnapshot(*snapshot);
  if (!again.ok() || *again != bytes) Fail("accepted snapshot does not re-encode to its input", again.status());
  const bool views_match = view->ssm_states.size() == snapshot->ssm_states.size() &&
                           view->tail_k.size() == snapshot->tail_k.size() &&
                           SameBytes(view->last_logits, snapshot->last_logits) &&
                           (snapshot->ssm_states.empty() || SameBytes(view->ssm_states[0], snapshot->ssm_states[0])) &&
                           (snapshot->tail_v.empty() || SameBytes(view->tail_v.back(), snapshot->tail_v.back()));
  if (!views_match) Fail("ParseSnapshot's views differ from DecodeSnapshot's arrays", absl::OkStatus());
}

Snapshot SeedSnapshot(const StateLayout& layout, int64_t position, bool with_logits) {
  Snapshot s;
  s.model_fingerprint = common::HashBytes("fuzz-model");
  s.prefix_hash = common::HashBytes(absl::StrCat("prefix-", position));
  s.position = position;
  s.layout = layout;
  float value = 0.5f;
  auto array = [&](int64_t n) {
    std::vector<float> a(n);
    for (float& x : a) x = (value += 0.25f);
    return a;
  };
  for (int l = 0; l < layout.mamba_layers; ++l) {
    s.ssm_states.push_back(array(layout.ssm_state_floats()));
    s.conv_states.push_back(array(layout.conv_state_floats()));
  }
  for (int l = 0; l < layout.attention_layers; ++l) {
    s.tail_k.push_back(array(layout.tail_kv_floats(position)));
    s.tail_v.push_back(array(layout.tail_kv_floats(position)));
  }
  if (with_logits) s.last_logits = array(layout.vocab);
  return s;
}

// Writes valid encodings of small layouts of every kind into `dir`.
void WriteSeeds(const std::string& dir) {
  const StateLayout hybrid{2, 2, 2, 4, 4, 4, 1, 1, 4, 4, 8};
  const StateLayout pure_mamba{1, 2, 2, 2, 3, 4, 0, 0, 0, 16, 5};
  const StateLayout attention_only{0, 0, 0, 0, 0, 0, 2, 2, 2, 8, 6};
  const Snapshot seeds[] = {
      SeedSnapshot(hybrid, 7, true),      SeedSnapshot(hybrid, 8, false),          SeedSnapshot(hybrid, 0, false),
      SeedSnapshot(pure_mamba, 33, true), SeedSnapshot(attention_only, 13, false),
  };
  int i = 0;
  for (const Snapshot& s : seeds) {
    absl::StatusOr<std::string> bytes = EncodeSnapshot(s);
    if (!bytes.ok()) {
      std::fprintf(stderr, "cannot encode seed %d: %s\n", i, bytes.status().ToString().c_str());
      abort();
    }
    const std::string path = absl::StrCat(dir, "/seed_", i++);
    FILE* f = std::fopen(path.c_str(), "wb");
    if (f == nullptr || std::fwrite(bytes->data(), 1, bytes->size(), f) != bytes->size() || std::fclose(f) != 0) {
      std::fprintf(stderr, "cannot write %s\n", path.c_str());
      abort();
    }
  }
}

}  // namespace
}  // namespace hybridserve::engine

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  hybridserve::engine::Check(bytes);
  if (size >= hybridserve::engine::kSnapshotTrailerBytes) {
    std::string resealed(bytes);
    const size_t body = size - hybridserve::engine::kSnapshotTrailerBytes;
    const uint64_t sum = hybridserve::common::Checksum64(resealed.data(), body);
    std::memcpy(resealed.data() + body, &sum, sizeof(sum));
    hybridserve::engine::Check(resealed);
  }
  return 0;
}

// libFuzzer calls this before it parses argv: without a corpus directory (an
// argument not starting with '-'), append a fresh one holding the seeds.
extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  for (int i = 1; i < *argc; ++i) {
    if ((*argv)[i][0] != '-') return 0;
  }
  const char* tmp = getenv("TEST_TMPDIR");
  static std::string dir = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/snapshot_corpus_XXXXXX");
  if (mkdtemp(dir.data()) == nullptr) {
    std::perror("mkdtemp");
    abort();
  }
  hybridserve::engine::WriteSeeds(dir);
  static std::vector<char*> args;
  args.assign(*argv, *argv + *argc);
  args.push_back(dir.data());
  args.push_back(nullptr);
  *argc = static_cast<int>(args.size()) - 1;
  *argv = args.data();
  return 0;
}
