#ifndef HYBRIDSERVE_BENCH_CACHESTORE_TRACE_H_
#define HYBRIDSERVE_BENCH_CACHESTORE_TRACE_H_

// A multi-turn trace as bench/cachestore/build_traces.py writes it
// (hybridserve-trace/1: a header line, then one JSON object per turn in
// arrival order), and the deterministic rule that turns its text lengths into
// token ids. Value types and pure functions; thread-safe.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/tokens.h"

namespace hybridserve::bench {

struct TraceTurn {
  int64_t conv = 0;  // conversation id
  int64_t turn = 0;  // 0, 1, ... within the conversation, in arrival order
  double arrival_s = 0;
  // Lengths in the trace's unit (UTF-8 bytes): the new user text of this
  // turn, and the reply to it.
  int64_t user_units = 0;
  int64_t reply_units = 0;
  // Turn 0 only: a prefix shared by every conversation naming the same id
  // (a system prompt), before the user text; -1 when none.
  int64_t shared = -1;
  int64_t shared_units = 0;
};

struct Trace {
  std::string name;
  std::vector<TraceTurn> turns;  // by arrival
};

// INVALID_ARGUMENT naming the line for a malformed header or turn, a turn of a
// conversation out of order (turn k+1 before turn k, or arriving earlier), or
// a negative length.
absl::StatusOr<Trace> ParseTrace(absl::string_view text);
// NOT_FOUND when `path` cannot be read; otherwise ParseTrace.
absl::StatusOr<Trace> LoadTrace(const std::string& path);

// How a trace's units become tokens: ceil(units / units_per_token) tokens per
// segment (a segment of at least one unit is at least one token), each id a
// hash of (segment owner, segment, index) modulo `vocab`. A shared prefix is
// owned by its shared id, so every conversation naming it gets the same
// tokens; user text and replies are owned by their conversation.
struct TokenRule {
  double units_per_token = 1.0;  // the default model: 1 byte, 1 token
  int64_t vocab = 256;

  int64_t Tokens(int64_t units) const;
  // Appends the tokens of segment `segment` (0: shared prefix, 1: user text,
  // 2: reply) of turn `turn` of owner `owner`.
  void Append(int64_t owner, int64_t turn, int segment, int64_t units, std::vector<TokenId>* out) const;
};

}  // namespace hybridserve::bench

#endif  // HYBRIDSERVE_BENCH_CACHESTORE_TRACE_H_
