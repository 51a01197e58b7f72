#include "engine/config_fields.h"

#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace hybridserve::engine::config_internal {

std::string TagNonFiniteTokens(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      out.push_back(c);
      if (c == '\\' && i + 1 < text.size()) {
        out.push_back(text[++i]);
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
      out.push_back(c);
      continue;
    }
    const bool boundary = i == 0 || !absl::ascii_isalnum(static_cast<unsigned char>(text[i - 1]));
    bool replaced = false;
    if (boundary) {
      for (absl::string_view token : {"-Infinity", "Infinity", "NaN"}) {
        if (text.substr(i, token.size()) != token) continue;
        const size_t end = i + token.size();
        if (end < text.size() && absl::ascii_isalnum(static_cast<unsigned char>(text[end]))) continue;
        absl::StrAppend(&out, "{\"__float__\":\"", token, "\"}");
        i = end - 1;
        replaced = true;
        break;
      }
    }
    if (!replaced) out.push_back(c);
  }
  return out;
}

std::string Excerpt(const Json& value) {
  std::string text = value.dump();
  if (text.size() > 40) text = absl::StrCat(text.substr(0, 37), "...");
  return text;
}

}  // namespace hybridserve::engine::config_internal
