#ifndef HYBRIDSERVE_ENGINE_CONFIG_FIELDS_H_
#define HYBRIDSERVE_ENGINE_CONFIG_FIELDS_H_

// Internal to the model_config library (its parsers): typed, field-naming reads of a
// config.json object, and the JSON dialect fix-up that real configs need.

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "engine/model_config.h"

namespace hybridserve::engine::config_internal {

using Json = nlohmann::json;

// Replaces the bare tokens Infinity, -Infinity and NaN (outside strings) with
// the tagged object {"__float__": "..."}, which nlohmann can parse.
std::string TagNonFiniteTokens(absl::string_view text);

// At most 40 characters of `value` as JSON, for messages.
std::string Excerpt(const Json& value);

// Typed, field-naming access to the top-level object of a config.json. Every
// getter treats a JSON null like an absent field (transformers writes null for
// unset optional fields).
class ConfigFields {
 public:
  explicit ConfigFields(const Json& root) : root_(root) {}

  bool Has(absl::string_view key) const {
    auto it = root_.find(std::string(key));
    return it != root_.end() && !it->is_null();
  }

  const Json& Get(absl::string_view key) const { return root_.at(std::string(key)); }

  // Which of `names` (the current name first, then legacy names) is present.
  // Two present names must hold equal values.
  absl::StatusOr<std::optional<std::string>> Resolve(std::initializer_list<absl::string_view> names) const {
    std::optional<std::string> found;
    for (absl::string_view name : names) {
      if (!Has(name)) continue;
      if (found.has_value() && Get(*found) != Get(name)) {
        return absl::InvalidArgumentError(absl::StrCat(*found, " (", Excerpt(Get(*found)), ") and its legacy name ",
                                                       name, " (", Excerpt(Get(name)), ") disagree"));
      }
      if (!found.has_value()) found = std::string(name);
    }
    return found;
  }

  absl::StatusOr<int64_t> Int(std::initializer_list<absl::string_view> names, std::optional<int64_t> fallback) const {
    ASSIGN_OR_RETURN(std::optional<std::string> key, Resolve(names));
    if (!key.has_value()) {
      if (fallback.has_value()) return *fallback;
      return absl::InvalidArgumentError(absl::StrCat(*names.begin(), " is required but missing"));
    }
    return ToInt(*key, Get(*key));
  }

  absl::StatusOr<double> Float(std::initializer_list<absl::string_view> names, double fallback) const {
    ASSIGN_OR_RETURN(std::optional<std::string> key, Resolve(names));
    if (!key.has_value()) return fallback;
    return ToFloat(*key, Get(*key));
  }

  absl::StatusOr<bool> Bool(std::initializer_list<absl::string_view> names, bool fallback) const {
    ASSIGN_OR_RETURN(std::optional<std::string> key, Resolve(names));
    if (!key.has_value()) return fallback;
    const Json& v = Get(*key);
    if (!v.is_boolean())
      return absl::InvalidArgumentError(absl::StrCat(*key, " must be true or false, got ", Excerpt(v)));
    return v.get<bool>();
  }

  absl::StatusOr<std::string> String(std::initializer_list<absl::string_view> names, absl::string_view fallback) const {
    ASSIGN_OR_RETURN(std::optional<std::string> key, Resolve(names));
    if (!key.has_value()) return std::string(fallback);
    const Json& v = Get(*key);
    if (!v.is_string()) return absl::InvalidArgumentError(absl::StrCat(*key, " must be a string, got ", Excerpt(v)));
    return v.get<std::string>();
  }

  // An int, a list of ints, or absent/null (empty).
  absl::StatusOr<std::vector<int64_t>> TokenIds(absl::string_view key) const {
    std::vector<int64_t> ids;
    if (!Has(key)) return ids;
    const Json& v = Get(key);
    if (v.is_array()) {
      for (size_t i = 0; i < v.size(); ++i) {
        ASSIGN_OR_RETURN(int64_t id, ToInt(absl::StrCat(key, "[", i, "]"), v[i]));
        ids.push_back(id);
      }
    } else {
      ASSIGN_OR_RETURN(int64_t id, ToInt(key, v));
      ids.push_back(id);
    }
    return ids;
  }

  // [low, high] as a two-element list of numbers (high may be infinite).
  absl::StatusOr<DtClamp> Range(std::initializer_list<absl::string_view> names, DtClamp fallback) const {
    ASSIGN_OR_RETURN(std::optional<std::string> key, Resolve(names));
    if (!key.has_value()) return fallback;
    const Json& v = Get(*key);
    if (!v.is_array() || v.size() != 2) {
      return absl::InvalidArgumentError(absl::StrCat(*key, " must be a list [low, high], got ", Excerpt(v)));
    }
    ASSIGN_OR_RETURN(double low, ToFloat(absl::StrCat(*key, "[0]"), v[0]));
    ASSIGN_OR_RETURN(double high, ToFloat(absl::StrCat(*key, "[1]"), v[1]));
    return DtClamp{static_cast<float>(low), static_cast<float>(high)};
  }

  static absl::StatusOr<int64_t> ToInt(absl::string_view key, const Json& v) {
    if (v.is_number_unsigned()) {
      const uint64_t u = v.get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return absl::InvalidArgumentError(absl::StrCat(key, " (", u, ") is out of range"));
      }
      return static_cast<int64_t>(u);
    }
    if (v.is_number_integer()) return v.get<int64_t>();
    return absl::InvalidArgumentError(absl::StrCat(key, " must be an integer, got ", Excerpt(v)));
  }

  // A JSON number, or a non-finite value tagged {"__float__": "Infinity"|"-Infinity"|"NaN"}.
  static absl::StatusOr<double> ToFloat(absl::string_view key, const Json& v) {
    if (v.is_number()) return v.get<double>();
    if (v.is_object() && v.size() == 1 && v.contains("__float__") && v.at("__float__").is_string()) {
      const std::string tag = absl::AsciiStrToLower(v.at("__float__").get<std::string>());
      if (tag == "infinity" || tag == "inf") return std::numeric_limits<double>::infinity();
      if (tag == "-infinity" || tag == "-inf") return -std::numeric_limits<double>::infinity();
      if (tag == "nan") return std::numeric_limits<double>::quiet_NaN();
    }
    return absl::InvalidArgumentError(absl::StrCat(key, " must be a number, got ", Excerpt(v)));
  }

 private:
  const Json& root_;
};

}  // namespace hybridserve::engine::config_internal

#endif  // HYBRIDSERVE_ENGINE_CONFIG_FIELDS_H_
