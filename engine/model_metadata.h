#ifndef HYBRIDSERVE_ENGINE_MODEL_METADATA_H_
#define HYBRIDSERVE_ENGINE_MODEL_METADATA_H_

// What a client needs to talk to a model beyond its architecture: the name it
// is served under and the tokens that end a turn, read from the files a
// Hugging Face checkpoint carries beside config.json:
//
//   generation_config.json  `eos_token_id`: an id or a list of ids (what
//                           transformers' generate() stops at).
//   tokenizer_config.json   `eos_token`: a string, or an AddedToken object
//                           {"content": "..."}; `added_tokens_decoder`
//                           {"<id>": {"content": "..."}} maps ids to strings.
//   tokenizer.json          `added_tokens` [{"id": n, "content": "..."}] and
//                           `model.vocab` {"<string>": id}: read only when
//                           tokenizer_config.json's table does not resolve a
//                           string or an id.
//
// None of these files is required. Stateless functions, thread-compatible.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/model_config.h"

namespace hybridserve::engine {

struct SpecialToken {
  int64_t id = 0;
  std::string text;  // e.g. "<|im_end|>"; "" when no tokenizer file names the id
};

struct ModelMetadata {
  // Never a full directory path: see LoadModelMetadata.
  std::string name;
  // The ids that end a turn, each once, in the order found: generation_config's
  // eos_token_id, then tokenizer_config's eos_token; when these give no id,
  // config.json's eos_token_id.
  std::vector<SpecialToken> end_of_turn_tokens;
};

// Reads the files above from `model_dir` (`config` is its parsed config.json).
//
// name: `served_model_name` when non-empty; else config.json's `_name_or_path`
// (a hub id "org/model" as is, a filesystem path, absolute or starting with
// "." or "~", reduced to its last component); else model_dir's last component.
//
// An eos_token string that no table resolves contributes no id (a tokenizer
// without tokenizer.json, e.g. sentencepiece's tokenizer.model, cannot be read
// here); every end-of-turn id must be < config.vocab_size.
//
// Errors: INVALID_ARGUMENT naming the file and field for malformed JSON, a
// field of the wrong type, or an id outside the vocabulary; DATA_LOSS when a
// present file cannot be read.
absl::StatusOr<ModelMetadata> LoadModelMetadata(const std::string& model_dir, const ModelConfig& config,
                                                absl::string_view served_model_name);

}  // namespace hybridserve::engine

#endif  // HYBRIDSERVE_ENGINE_MODEL_METADATA_H_
