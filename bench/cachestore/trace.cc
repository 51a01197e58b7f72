#include "bench/cachestore/trace.h"

#include <cmath>
#include <fstream>
#include <sstream>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"

namespace hybridserve::bench {
namespace {

uint64_t Mix(uint64_t x) {  // SplitMix64's finalizer
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

absl::StatusOr<Trace> ParseTrace(absl::string_view text) {
  Trace trace;
  struct Last {
    int64_t turn;
    double arrival_s;
  };
  absl::flat_hash_map<int64_t, Last> last;
  int64_t line_no = 0;
  bool header = true;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipWhitespace())) {
    ++line_no;
    nlohmann::json j = nlohmann::json::parse(line.begin(), line.end(), nullptr, /*allow_exceptions=*/false);
    if (!j.is_object())
      return absl::InvalidArgumentError(absl::StrCat("trace line ", line_no, " is not a JSON object"));
    if (header) {
      header = false;
      if (j.value("format", "") != "hybridserve-trace/1") {
        return absl::InvalidArgumentError("trace line 1 is not a hybridserve-trace/1 header");
      }
      trace.name = j.value("name", "");
      continue;
    }
    TraceTurn t;
    try {
      t.conv = j.at("conv").get<int64_t>();
      t.turn = j.at("turn").get<int64_t>();
      t.arrival_s = j.at("t").get<double>();
      t.user_units = j.at("user").get<int64_t>();
      t.reply_units = j.at("reply").get<int64_t>();
      t.shared = j.value("shared", int64_t{-1});
      t.shared_units = j.value("shared_units", int64_t{0});
    } catch (const nlohmann::json::exception& e) {
      return absl::InvalidArgumentError(absl::StrCat("trace line ", line_no, ": ", e.what()));
    }
    if (t.user_units < 0 || t.reply_units < 0 || t.shared_units < 0) {
      return absl::InvalidArgumentError(absl::StrCat("trace line ", line_no, ": negative length"));
    }
    if (t.turn > 0 && t.shared >= 0) {
      return absl::InvalidArgumentError(absl::StrCat("trace line ", line_no, ": only turn 0 carries a shared prefix"));
    }
    auto it = last.find(t.conv);
    const int64_t expected = it == last.end() ? 0 : it->second.turn + 1;
    if (t.turn != expected || (it != last.end() && t.arrival_s < it->second.arrival_s)) {
      return absl::InvalidArgumentError(absl::StrCat("trace line ", line_no, ": conversation ", t.conv, " turn ",
                                                     t.turn, " out of order (expected turn ", expected, ")"));
    }
    last[t.conv] = Last{t.turn, t.arrival_s};
    trace.turns.push_back(t);
  }
  if (header) return absl::InvalidArgumentError("empty trace");
  return trace;
}

absl::StatusOr<Trace> LoadTrace(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read trace ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ParseTrace(ss.str());
}

int64_t TokenRule::Tokens(int64_t units) const {
  if (units <= 0) return 0;
  return std::max<int64_t>(1, static_cast<int64_t>(std::ceil(static_cast<double>(units) / units_per_token)));
}

void TokenRule::Append(int64_t owner, int64_t turn, int segment, int64_t units, std::vector<TokenId>* out) const {
  const int64_t n = Tokens(units);
  const uint64_t base =
      Mix(Mix(Mix(static_cast<uint64_t>(owner)) ^ static_cast<uint64_t>(turn)) ^ static_cast<uint64_t>(segment));
  for (int64_t i = 0; i < n; ++i) {
    out->push_back(static_cast<TokenId>(Mix(base ^ static_cast<uint64_t>(i)) % static_cast<uint64_t>(vocab)));
  }
}

}  // namespace hybridserve::bench
