// Snapshot codec cost against memcpy of the same byte count, measured in the
// same run: a Nemotron-H-8B-sized state (~100 MB: 48 Mamba layers of
// 64 x 64 x 128 fp32 SSM state, their conv states, 4 attention layers with a
// 7-token tail, 131072 logits) and a ~1 MB one.
//
// Goal: encode and decode each cost at most 1.5x a memcpy of the encoded
// bytes, so (encode + decode) / (2 x memcpy) <= 1.5. The zero-copy reader
// (ParseSnapshot, checksum only) is also reported against one memcpy.
//
// Warm rows reuse their buffers (EncodeSnapshotInto, DecodeSnapshotInto), as a
// worker with a pool of staging buffers does; their baseline copies between
// two buffers that are already touched. Fresh rows allocate every time
// (EncodeSnapshot, DecodeSnapshot) and compare with malloc + memcpy + free.
// Every ratio is the median over rounds that alternate the baseline and the
// measured code (see Compare); times are medians too.
//
//   bazel run -c opt //bench/engine:snapshot_bench

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/hash.h"
#include "engine/snapshot_codec.h"

namespace hybridserve::bench {
namespace {

using engine::Snapshot;
using engine::StateLayout;

template <typename T>
void KeepAlive(const T& value) {
  asm volatile("" : : "r,m"(value) : "memory");
}

// Seconds per call of fn, averaged over `calls` back-to-back calls.
template <typename Fn>
double SecondsPerCall(Fn& fn, int calls) {
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < calls; ++i) fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / calls;
}

struct Timing {
  double seconds = 0;  // median seconds per call
  double ratio = 0;    // median over rounds of (seconds of fn) / (seconds of baseline) in the same round
};

// Times fn against baseline in `rounds` interleaved rounds (baseline, fn,
// baseline, fn, ...), each lasting about 20 ms or one call, after one untimed
// call of each. The ratio's median over rounds is robust to the load of a
// shared machine drifting during the run, which the ratio of two separately
// taken medians is not.
template <typename Base, typename Fn>
Timing Compare(Base&& baseline, Fn&& fn, int rounds = 15) {
  const double base_once = SecondsPerCall(baseline, 1);
  const double fn_once = SecondsPerCall(fn, 1);
  const int base_calls = std::max(1, static_cast<int>(0.02 / std::max(base_once, 1e-9)));
  const int fn_calls = std::max(1, static_cast<int>(0.02 / std::max(fn_once, 1e-9)));
  std::vector<double> seconds, ratios;
  for (int r = 0; r < rounds; ++r) {
    const double b = SecondsPerCall(baseline, base_calls);
    const double f = SecondsPerCall(fn, fn_calls);
    seconds.push_back(f);
    ratios.push_back(f / b);
  }
  std::sort(seconds.begin(), seconds.end());
  std::sort(ratios.begin(), ratios.end());
  return Timing{seconds[rounds / 2], ratios[rounds / 2]};
}

void Check(const absl::Status& status) {
  if (!status.ok()) {
    std::fprintf(stderr, "%s\n", status.ToString().c_str());
    std::exit(1);
  }
}

Snapshot MakeSnapshot(const StateLayout& layout, int64_t position) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  auto array = [&](int64_t n) {
    std::vector<float> a(n);
    for (float& x : a) x = uniform(rng);
    return a;
  };
  Snapshot s;
  s.model_fingerprint = common::HashBytes("bench-model");
  s.prefix_hash = common::HashBytes("bench-prefix");
  s.position = position;
  s.layout = layout;
  for (int l = 0; l < layout.mamba_layers; ++l) {
    s.ssm_states.push_back(array(layout.ssm_state_floats()));
    s.conv_states.push_back(array(layout.conv_state_floats()));
  }
  for (int l = 0; l < layout.attention_layers; ++l) {
    s.tail_k.push_back(array(layout.tail_kv_floats(position)));
    s.tail_v.push_back(array(layout.tail_kv_floats(position)));
  }
  s.last_logits = array(layout.vocab);
  return s;
}

void Row(const char* name, const Timing& t, size_t bytes, const char* baseline) {
  std::printf("  %-38s %9.3f ms %7.2f GB/s %6.2f x %s\n", name, t.seconds * 1e3, bytes / t.seconds / 1e9, t.ratio,
              baseline);
}

void Run(const char* title, const StateLayout& layout, int64_t position) {
  const Snapshot snapshot = MakeSnapshot(layout, position);
  absl::StatusOr<std::string> encoded = engine::EncodeSnapshot(snapshot);
  Check(encoded.status());
  const size_t bytes = encoded->size();
  std::printf("%s: %.2f MB encoded\n", title, bytes / 1e6);
  std::printf("  %-38s %12s %12s %8s\n", "", "median", "", "ratio to");

  const std::string src = *encoded;
  std::string dst(bytes, '\0');
  auto memcpy_warm = [&] {
    std::memcpy(dst.data(), src.data(), bytes);
    KeepAlive(dst.data());
  };
  auto memcpy_fresh = [&] {
    std::unique_ptr<char[]> fresh(new char[bytes]);
    std::memcpy(fresh.get(), src.data(), bytes);
    KeepAlive(fresh.get());
  };
  std::string buffer;
  auto encode_warm = [&] { Check(engine::EncodeSnapshotInto(snapshot, &buffer)); };
  Snapshot decoded;
  auto decode_warm = [&] { Check(engine::DecodeSnapshotInto(*encoded, {}, &decoded)); };
  auto parse = [&] {
    absl::StatusOr<engine::SnapshotView> view = engine::ParseSnapshot(*encoded);
    Check(view.status());
    KeepAlive(view->last_logits.data());
  };
  auto encode_fresh = [&] {
    absl::StatusOr<std::string> out = engine::EncodeSnapshot(snapshot);
    Check(out.status());
    KeepAlive(out->data());
  };
  auto decode_fresh = [&] {
    absl::StatusOr<Snapshot> out = engine::DecodeSnapshot(*encoded);
    Check(out.status());
    KeepAlive(out->last_logits.data());
  };
  auto round_trip_warm = [&] {
    encode_warm();
    decode_warm();
  };
  auto two_memcpy_warm = [&] {
    memcpy_warm();
    memcpy_warm();
  };
  auto round_trip_fresh = [&] {
    encode_fresh();
    decode_fresh();
  };
  auto two_memcpy_fresh = [&] {
    memcpy_fresh();
    memcpy_fresh();
  };
  auto encode_parse = [&] {
    encode_warm();
    parse();
  };

  Row("memcpy (warm buffers)", Compare(memcpy_warm, memcpy_warm), bytes, "memcpy");
  Row("XXH3-64 of the bytes", Compare(memcpy_warm, [&] { KeepAlive(common::Checksum64(src.data(), bytes)); }), bytes,
      "memcpy");
  Row("EncodeSnapshotInto (reused buffer)", Compare(memcpy_warm, encode_warm), bytes, "memcpy");
  Row("DecodeSnapshotInto (reused snapshot)", Compare(memcpy_warm, decode_warm), bytes, "memcpy");
  Row("ParseSnapshot (verify, no copy)", Compare(memcpy_warm, parse), bytes, "memcpy");
  Row("EncodeSnapshot (fresh string)", Compare(memcpy_fresh, encode_fresh), bytes, "fresh memcpy");
  Row("DecodeSnapshot (fresh vectors)", Compare(memcpy_fresh, decode_fresh), bytes, "fresh memcpy");
  Row("encode + decode, warm  [goal <= 1.5]", Compare(two_memcpy_warm, round_trip_warm), 2 * bytes, "2 memcpy");
  Row("encode + decode, fresh", Compare(two_memcpy_fresh, round_trip_fresh), 2 * bytes, "2 fresh memcpy");
  Row("encode + ParseSnapshot, warm", Compare(memcpy_warm, encode_parse), bytes, "1 memcpy");
}

}  // namespace
}  // namespace hybridserve::bench

int main() {
  using hybridserve::engine::StateLayout;
  // conv_dim = heads * head_dim + 2 * n_groups * d_state (8 groups, as Nemotron-H).
  const StateLayout large{48, 64, 64, 128, 6144, 4, 4, 8, 128, 16, 131072};
  const StateLayout small{8, 8, 64, 64, 1536, 4, 2, 8, 64, 16, 32000};
  hybridserve::bench::Run("large state (48 Mamba layers x 64x64x128 fp32)", large, 1000007);
  hybridserve::bench::Run("small state (8 Mamba layers x 8x64x64 fp32)", small, 1000007);
  return 0;
}
