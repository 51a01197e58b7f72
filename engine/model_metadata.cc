#include "engine/model_metadata.h"

#include <sys/stat.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"

namespace hybridserve::engine {
namespace {

using Json = nlohmann::json;

std::string LastComponent(absl::string_view path) {
  while (path.size() > 1 && absl::EndsWith(path, "/")) path.remove_suffix(1);
  const size_t slash = path.rfind('/');
  return std::string(slash == absl::string_view::npos ? path : path.substr(slash + 1));
}

// The parsed file, or nullopt when it does not exist.
absl::StatusOr<std::optional<Json>> ReadJsonIfPresent(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return std::optional<Json>();
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  if (in) text << in.rdbuf();
  if (!in || in.bad()) return absl::DataLossError(absl::StrCat("cannot read ", path));
  Json json = Json::parse(text.str(), /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(path, ": not valid JSON"));
  if (!json.is_object()) return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));
  return std::optional<Json>(std::move(json));
}

absl::StatusOr<int64_t> TokenId(const Json& v, absl::string_view where) {
  if (!v.is_number_integer()) return absl::InvalidArgumentError(absl::StrCat(where, " must be an integer id"));
  return v.get<int64_t>();
}

// generation_config.json's eos_token_id: an id, a list of ids, or absent/null.
absl::StatusOr<std::vector<int64_t>> GenerationEosIds(const Json& generation, absl::string_view file) {
  std::vector<int64_t> ids;
  auto it = generation.find("eos_token_id");
  if (it == generation.end() || it->is_null()) return ids;
  if (!it->is_array()) {
    ASSIGN_OR_RETURN(int64_t id, TokenId(*it, absl::StrCat(file, ": eos_token_id")));
    ids.push_back(id);
    return ids;
  }
  for (size_t i = 0; i < it->size(); ++i) {
    ASSIGN_OR_RETURN(int64_t id, TokenId((*it)[i], absl::StrCat(file, ": eos_token_id[", i, "]")));
    ids.push_back(id);
  }
  return ids;
}

// tokenizer_config.json's eos_token: a string, {"content": string}, or absent/null.
absl::StatusOr<std::optional<std::string>> EosTokenString(const Json& tokenizer_config, absl::string_view file) {
  auto it = tokenizer_config.find("eos_token");
  if (it == tokenizer_config.end() || it->is_null()) return std::optional<std::string>();
  if (it->is_string()) return std::optional<std::string>(it->get<std::string>());
  if (it->is_object() && it->contains("content") && it->at("content").is_string()) {
    return std::optional<std::string>(it->at("content").get<std::string>());
  }
  return absl::InvalidArgumentError(absl::StrCat(file, ": eos_token must be a string or {\"content\": string}"));
}

// Both directions between special token strings and ids, from whichever
// tables the model directory has.
class TokenTable {
 public:
  absl::Status AddTokenizerConfig(const Json& tokenizer_config, absl::string_view file) {
    auto it = tokenizer_config.find("added_tokens_decoder");
    if (it == tokenizer_config.end() || it->is_null()) return absl::OkStatus();
    if (!it->is_object())
      return absl::InvalidArgumentError(absl::StrCat(file, ": added_tokens_decoder must be an object"));
    for (const auto& [key, token] : it->items()) {
      int64_t id = 0;
      if (!absl::SimpleAtoi(key, &id) || !token.is_object() || !token.contains("content") ||
          !token.at("content").is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat(file, ": added_tokens_decoder[\"", key, "\"] must map an id to {\"content\": string}"));
      }
      Add(id, token.at("content").get<std::string>());
    }
    return absl::OkStatus();
  }

  absl::Status AddTokenizerJson(const Json& tokenizer, absl::string_view file) {
    if (auto it = tokenizer.find("added_tokens"); it != tokenizer.end() && !it->is_null()) {
      if (!it->is_array()) return absl::InvalidArgumentError(absl::StrCat(file, ": added_tokens must be a list"));
      for (size_t i = 0; i < it->size(); ++i) {
        const Json& token = (*it)[i];
        if (!token.is_object() || !token.contains("content") || !token.at("content").is_string() ||
            !token.contains("id")) {
          return absl::InvalidArgumentError(
              absl::StrCat(file, ": added_tokens[", i, "] must be {\"id\": int, \"content\": string}"));
        }
        ASSIGN_OR_RETURN(int64_t id, TokenId(token.at("id"), absl::StrCat(file, ": added_tokens[", i, "].id")));
        Add(id, token.at("content").get<std::string>());
      }
    }
    // A WordLevel, BPE or WordPiece vocabulary {"string": id}; Unigram's list
    // form names no special tokens that added_tokens does not.
    if (auto model = tokenizer.find("model"); model != tokenizer.end() && model->is_object()) {
      if (auto vocab = model->find("vocab"); vocab != model->end() && vocab->is_object()) {
        for (const auto& [text, id] : vocab->items()) {
          if (id.is_number_integer()) Add(id.get<int64_t>(), text);
        }
      }
    }
    return absl::OkStatus();
  }

  std::optional<int64_t> IdOf(const std::string& text) const {
    auto it = ids_.find(text);
    if (it == ids_.end()) return std::nullopt;
    return it->second;
  }

  std::string TextOf(int64_t id) const {
    auto it = texts_.find(id);
    return it == texts_.end() ? std::string() : it->second;
  }

 private:
  // The first table to name an id or a string wins (tokenizer_config.json is
  // read first: it is what transformers' tokenizer reports).
  void Add(int64_t id, const std::string& text) {
    texts_.try_emplace(id, text);
    ids_.try_emplace(text, id);
  }

  absl::flat_hash_map<int64_t, std::string> texts_;
  absl::flat_hash_map<std::string, int64_t> ids_;
};

std::string ModelName(const std::string& model_dir, const ModelConfig& config, absl::string_view served_model_name) {
  if (!served_model_name.empty()) return std::string(served_model_name);
  absl::string_view recorded = config.name_or_path;
  if (!recorded.empty()) {
    const bool is_path =
        absl::StartsWith(recorded, "/") || absl::StartsWith(recorded, ".") || absl::StartsWith(recorded, "~");
    std::string name = is_path ? LastComponent(recorded) : std::string(recorded);
    if (!name.empty() && name != "." && name != ".." && name != "/") return name;
  }
  return LastComponent(model_dir);
}

}  // namespace

absl::StatusOr<ModelMetadata> LoadModelMetadata(const std::string& model_dir, const ModelConfig& config,
                                                absl::string_view served_model_name) {
  ModelMetadata metadata;
  metadata.name = ModelName(model_dir, config, served_model_name);

  const std::string generation_path = absl::StrCat(model_dir, "/generation_config.json");
  const std::string tokenizer_config_path = absl::StrCat(model_dir, "/tokenizer_config.json");
  const std::string tokenizer_path = absl::StrCat(model_dir, "/tokenizer.json");
  ASSIGN_OR_RETURN(std::optional<Json> generation, ReadJsonIfPresent(generation_path));
  ASSIGN_OR_RETURN(std::optional<Json> tokenizer_config, ReadJsonIfPresent(tokenizer_config_path));

  std::vector<int64_t> ids;
  if (generation.has_value()) {
    ASSIGN_OR_RETURN(ids, GenerationEosIds(*generation, generation_path));
  }
  std::optional<std::string> eos_string;
  TokenTable table;
  if (tokenizer_config.has_value()) {
    ASSIGN_OR_RETURN(eos_string, EosTokenString(*tokenizer_config, tokenizer_config_path));
    RETURN_IF_ERROR(table.AddTokenizerConfig(*tokenizer_config, tokenizer_config_path));
  }
  // tokenizer.json (megabytes for a real vocabulary) only when a string or an
  // id is still unnamed.
  bool tokenizer_read = false;
  auto read_tokenizer = [&]() -> absl::Status {
    if (tokenizer_read) return absl::OkStatus();
    tokenizer_read = true;
    ASSIGN_OR_RETURN(std::optional<Json> tokenizer, ReadJsonIfPresent(tokenizer_path));
    if (tokenizer.has_value()) RETURN_IF_ERROR(table.AddTokenizerJson(*tokenizer, tokenizer_path));
    return absl::OkStatus();
  };
  if (eos_string.has_value()) {
    if (!table.IdOf(*eos_string).has_value()) RETURN_IF_ERROR(read_tokenizer());
    if (std::optional<int64_t> id = table.IdOf(*eos_string); id.has_value()) ids.push_back(*id);
  }
  if (ids.empty()) ids.assign(config.eos_token_ids.begin(), config.eos_token_ids.end());
  for (int64_t id : ids) {
    if (table.TextOf(id).empty()) RETURN_IF_ERROR(read_tokenizer());
  }

  for (int64_t id : ids) {
    if (id < 0 || id >= config.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(model_dir, ": end-of-turn token id ", id,
                                                     " is outside the vocabulary [0, ", config.vocab_size, ")"));
    }
    bool seen = false;
    for (const SpecialToken& t : metadata.end_of_turn_tokens) seen = seen || t.id == id;
    if (!seen) metadata.end_of_turn_tokens.push_back(SpecialToken{id, table.TextOf(id)});
  }
  return metadata;
}

}  // namespace hybridserve::engine
