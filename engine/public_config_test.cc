// What the engine does today with the config.json of each published checkpoint
// in tests/fixtures/public_configs, and with the copies of such configs that
// other projects' tests hold (SOURCES.md there names each file's source).
//
// kCorpus is the one table of expectations: per config, either the exact
// message the engine refuses it with, or (when it loads) its config fingerprint
// and, where known, its published parameter count. When a fix makes a refused
// config load, its row flips from the message to the fingerprint: one line.
//
// For a config that loads, the shapes are derived here from the JSON fields
// themselves (per family, as transformers reads them), never from the engine's
// parse, and compared to what the engine parsed: the layer pattern, the count
// of each layer kind, the Mamba2 and attention dimensions, the vocabulary, the
// recurrent state bytes of a sequence (engine/state_layout.h) and the KV bytes
// per token. The same derivation runs over the golden fixtures' configs
// (kDerivationSelfCheck), so it is exercised on every family, also those no
// corpus config of which loads yet. Distinct configs that load must have
// distinct fingerprints.
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/hash.h"
#include "common/runfiles.h"
#include "engine/model_config.h"
#include "engine/state_layout.h"
#include "gtest/gtest.h"

namespace hybridserve::engine {
namespace {

using common::Runfile;
using Json = nlohmann::json;

struct CorpusRow {
  const char* file;  // under tests/fixtures/public_configs/
  // Refused today: the exact status message. Empty: the config loads.
  const char* refusal;
  // When it loads: 32 hex digits of XXH3-128(CanonicalString()), the config's
  // part of the model fingerprint (stable: a change here changes every cache key).
  const char* fingerprint;
  // The parameter count its publisher states (0: not stated or not derived
  // here), compared to the count derived from the JSON within
  // kPublishedParamsTolerance (publishers round to 3 significant figures).
  double published_params = 0;
};

constexpr double kPublishedParamsTolerance = 0.005;

// One row per corpus config. Flip a refusal to "" and fill in the fingerprint
// when a fix makes the config load.
constexpr CorpusRow kCorpus[] = {
    // Revision 4f8e85c predates transformers' Zamba2: its layers_block_type
    // uses "m"/"g" letters, which transformers 5.23 refuses as well.
    {"zamba2/Zamba2-1.2B.json", "layers_block_type[0] (\"m\") must be mamba, linear_attention or hybrid", ""},
    // Published as "Bamba 9B (9.78B)" (transformers' Bamba documentation).
    {"bamba/Bamba-9B.json", "", "7eb4f09be7ae9f837df08547eb90fe78", 9.78e9},
    // mamba_ssm's own format (d_model, n_layer, ssm_cfg), not transformers':
    // transformers' AutoConfig cannot read it either.
    {"mamba2/mamba2-2.7b.json", "model_type is required but missing", ""},
    {"mamba2/mamba2-130m.json", "model_type is required but missing", ""},

    // Qwen3-Next / Qwen3.5 (issue 50): third-party tiny test checkpoints (SOURCES.md).
    {"qwen3_next/qwen3_next_tiny_test.json", "", "aeb61c10cddbdba16ff81adab095ce2c"},
    {"qwen3_next/tiny-random-qwen3-next.json", "", "d7c607cd5e44e568d9dcbf595dcdebe6"},
    // Its eos_token_id is Qwen's real one, outside this random model's 4096-token vocabulary.
    {"qwen3_5/qwen3.5-tiny-random.json", "eos_token_id (151645) is outside the vocabulary [0, 4096)", ""},

    // Copies in other projects' tests and test data (SOURCES.md, "Copies in
    // other projects' tests").
    //
    // Megatron-Bridge's copy has no mamba_d_ssm, so d_inner is taken as
    // mamba_expand * hidden_size (2048), not 24 * 64; transformers 5.23 refuses
    // the copy as well ("mamba_n_heads must divide mamba_expand * hidden_size").
    {"falcon_h1/Falcon-H1-0.5B.json",
     "mamba_n_heads (24) * mamba_d_head (64) must equal d_inner (2048: mamba_d_ssm, else mamba_expand * hidden_size)",
     ""},
    // No count compared: every Falcon-H1 block runs attention and Mamba2 in
    // parallel, which Parameters() does not count.
    {"falcon_h1/Falcon-H1-34B-Instruct.json", "", "602c5421791d7c08214e732586ff488d"},
    // Rapid-LLM's trimmed copies (architecture fields only): they load, with
    // transformers' defaults standing in for the fields left out (the μP
    // multipliers among them), so these fingerprints are the copies', not the
    // checkpoints'. No count compared: Parameters() counts neither Falcon-H1's
    // parallel blocks nor MoE, and no published count of the 1B is at hand.
    {"falcon_h1/Falcon-H1-3B.json", "", "f9a7caa06afe1801ed331f75e6a8ab9b"},
    {"falcon_h1/Falcon-H1-7B.json", "", "7ff143924425346eed5632849a8fbd5c"},
    {"granitemoehybrid/granite-4.0-h-1b.json", "", "bcaf8e518e918955e847428072e63249"},
    {"granitemoehybrid/granite-4.0-h-tiny.json", "", "ed1403611f172a66993a9a5f70712b9c"},
    // 7,285,403,648 parameters, the size Mistral states and its safetensors
    // index gives; the derived count is the same number exactly.
    {"mamba2/Mamba-Codestral-7B-v0.1.json", "", "1e0ed2170b33dcc06a4b13d42b3cafe1", 7285403648.0},
    // A trimmed copy without head_dim and intermediate_size: transformers 5.23
    // loads it with its defaults (128 and 21504, the published values); the
    // engine requires both (with head_dim given it refuses intermediate_size).
    {"nemotron_h/Nemotron-H-8B-Base-8K.json", "head_dim is required but missing", ""},
    // Megatron-Bridge's nearly whole copy (44 keys; hidden_act and a null
    // n_routed_experts are the test's own additions, says its comments): loads;
    // 8,100,852,736 derived parameters against the 8.101B of its safetensors index.
    {"nemotron_h/Nemotron-H-8B-Base-8K.megatron-bridge.json", "", "b2b70ed85623fe538a0ec9f8090dc6eb", 8.101e9},
    // No count compared: Parameters() does not count MoE blocks.
    {"nemotron_h/NVIDIA-Nemotron-3-Nano-30B-A3B.json", "", "b8df8a74329e94bc11b8019de03d2fcb"},
};

// Configs written by transformers save_pretrained for the golden fixtures:
// they load, so they exercise the independent derivation on every family.
constexpr const char* kDerivationSelfCheck[] = {
    "tests/fixtures/golden/nemotron_h_tiny/config.json",      "tests/fixtures/golden/nemotron_h_moe_tiny/config.json",
    "tests/fixtures/golden/nemotron_h_moe_tiny2/config.json", "tests/fixtures/golden/mamba2_tiny/config.json",
    "tests/fixtures/golden/bamba_tiny/config.json",           "tests/fixtures/golden/bamba_tiny2/config.json",
    "tests/fixtures/golden/granite_moe_tiny/config.json",     "tests/fixtures/golden/granite_dense_tiny/config.json",
    "tests/fixtures/golden/falcon_h1_tiny/config.json",       "tests/fixtures/golden/falcon_h1_tiny2/config.json",
    "tests/fixtures/golden/public_bamba_9b/config.json",      "tests/fixtures/golden/zamba2_tiny/config.json",
    "tests/fixtures/golden/zamba2_tiny2/config.json",
};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// Parses a config for the derivation. transformers writes non-finite floats as
// the bare tokens Infinity, -Infinity and NaN (time_step_limit), which are not
// JSON; the derivation reads no such field, so outside strings they become null.
Json ParseForDerivation(const std::string& text) {
  std::string json;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      json += c;
      if (c == '\\' && i + 1 < text.size()) {
        json += text[++i];
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') in_string = true;
    bool replaced = false;
    for (const std::string token : {"-Infinity", "Infinity", "NaN"}) {
      if (text.compare(i, token.size(), token) == 0) {
        json += "null";
        i += token.size() - 1;
        replaced = true;
        break;
      }
    }
    if (!replaced) json += c;
  }
  return Json::parse(json);
}

int64_t IntOr(const Json& j, const char* key, int64_t fallback) {
  auto it = j.find(key);
  return it == j.end() || it->is_null() ? fallback : it->get<int64_t>();
}

// The shapes of a checkpoint, derived from its JSON alone.
struct Derived {
  std::string pattern;  // hybrid_override_pattern notation, one char per block
  int64_t vocab = 0;
  int64_t ssm_heads = 0, ssm_head_dim = 0, ssm_state = 0, n_groups = 0, conv_kernel = 0;
  int64_t heads = 0, kv_heads = 0, head_dim = 0;
  // For the parameter count.
  int64_t hidden = 0, intermediate = 0;
  bool tied = false, ssm_bias = false, conv_bias = true, attention_bias = false, mlp_bias = false;
  // Gated DeltaNet ('D' blocks): ssm_heads value heads of a [k_head_dim, ssm_state] state,
  // k_heads key heads; the conv runs over q, k (k_heads * k_head_dim each) and v.
  int64_t k_heads = 0, k_head_dim = 0;

  int64_t Count(char kind) const {
    int64_t n = 0;
    for (char c : pattern) n += c == kind ? 1 : 0;
    return n;
  }
  int64_t SsmBlocks() const { return Count('M') + Count('P') + Count('Z') + Count('D'); }
  int64_t KvBlocks() const { return Count('*') + Count('P') + Count('Z'); }
  // fp32 SSM state [heads, head_dim, state] and conv state [conv_dim, kernel - 1] per SSM block.
  int64_t RecurrentStateBytes() const {
    if (Count('D') > 0) {
      const int64_t conv_dim = 2 * k_heads * k_head_dim + ssm_heads * ssm_state;
      return SsmBlocks() * 4 * (ssm_heads * k_head_dim * ssm_state + conv_dim * (conv_kernel - 1));
    }
    const int64_t conv_dim = ssm_heads * ssm_head_dim + 2 * n_groups * ssm_state;
    return SsmBlocks() * 4 * (ssm_heads * ssm_head_dim * ssm_state + conv_dim * (conv_kernel - 1));
  }
  // fp32 K and V of one token in every attending block.
  int64_t KvBytesPerToken() const { return KvBlocks() * 2 * 4 * kv_heads * head_dim; }
  // Parameters of a model of Mamba2, attention, MLP and gated-MLP blocks, as
  // transformers allocates them: embeddings (and an untied head), one RMSNorm
  // per block and a final one; Mamba2: in_proj [z|x|B|C|dt], the depthwise
  // conv, dt_bias, A_log, D, the gated norm, out_proj. 0 when the model has
  // another kind of block (not derived here).
  int64_t Parameters() const {
    const int64_t d_inner = ssm_heads * ssm_head_dim;
    const int64_t conv_dim = d_inner + 2 * n_groups * ssm_state;
    const int64_t mamba = hidden * (2 * d_inner + 2 * n_groups * ssm_state + ssm_heads) +
                          (ssm_bias ? 2 * d_inner + 2 * n_groups * ssm_state + ssm_heads : 0) + conv_dim * conv_kernel +
                          (conv_bias ? conv_dim : 0) + 3 * ssm_heads + d_inner + d_inner * hidden +
                          (ssm_bias ? hidden : 0);
    const int64_t q = heads * head_dim, kv = kv_heads * head_dim;
    const int64_t attention = hidden * (q + 2 * kv) + q * hidden + (attention_bias ? q + 2 * kv + hidden : 0);
    const int64_t mlp = 2 * hidden * intermediate + (mlp_bias ? intermediate + hidden : 0);
    const int64_t gated = 3 * hidden * intermediate + (mlp_bias ? 2 * intermediate + hidden : 0);
    int64_t n = vocab * hidden * (tied ? 1 : 2) + hidden;
    for (char c : pattern) {
      n += hidden;
      switch (c) {
        case 'M':
          n += mamba;
          break;
        case '*':
          n += attention;
          break;
        case '-':
          n += mlp;
          break;
        case 'G':
          n += gated;
          break;
        default:
          return 0;
      }
    }
    return n;
  }
};

// Mixer letter of a layer-type name as transformers' configs spell it.
char MixerLetter(const std::string& type) {
  if (type == "mamba" || type == "linear_attention" || type == "M") return 'M';
  if (type == "attention" || type == "full_attention" || type == "*") return '*';
  if (type == "mlp" || type == "-") return '-';
  if (type == "moe" || type == "E") return 'E';
  if (type == "hybrid") return 'Z';
  return '?';
}

absl::StatusOr<Derived> Derive(const Json& j) {
  Derived d;
  const std::string type = j.at("model_type").get<std::string>();
  const int64_t hidden = j.at("hidden_size").get<int64_t>();
  const int64_t layers = IntOr(j, "num_hidden_layers", 0);
  d.vocab = j.at("vocab_size").get<int64_t>();
  d.hidden = hidden;
  d.intermediate = IntOr(j, "intermediate_size", 0);
  d.tied = j.contains("tie_word_embeddings") && j["tie_word_embeddings"].is_boolean()
               ? j["tie_word_embeddings"].get<bool>()
               : type == "zamba2";
  d.attention_bias =
      j.contains("attention_bias") && j["attention_bias"].is_boolean() && j["attention_bias"].get<bool>();
  d.mlp_bias = j.contains("mlp_bias") && j["mlp_bias"].is_boolean() && j["mlp_bias"].get<bool>();
  for (const char* key : {"mamba_proj_bias", "use_bias"}) {
    if (j.contains(key) && j[key].is_boolean()) d.ssm_bias = j[key].get<bool>();
  }
  for (const char* key : {"mamba_conv_bias", "use_conv_bias"}) {
    if (j.contains(key) && j[key].is_boolean()) d.conv_bias = j[key].get<bool>();
  }
  d.heads = IntOr(j, "num_attention_heads", 0);
  d.kv_heads = IntOr(j, "num_key_value_heads", d.heads);
  if (type == "nemotron_h") {
    if (j.contains("hybrid_override_pattern") && j["hybrid_override_pattern"].is_string()) {
      d.pattern = j["hybrid_override_pattern"].get<std::string>();
    } else {
      for (const Json& t : j.at("layers_block_type")) d.pattern += MixerLetter(t.get<std::string>());
    }
    d.ssm_heads = j.at("mamba_num_heads").get<int64_t>();
    d.ssm_head_dim = j.at("mamba_head_dim").get<int64_t>();
    d.ssm_state = j.at("ssm_state_size").get<int64_t>();
    d.n_groups = j.at("n_groups").get<int64_t>();
    d.conv_kernel = IntOr(j, "conv_kernel", 4);
    d.head_dim = IntOr(j, "head_dim", IntOr(j, "attention_head_dim", hidden / d.heads));
  } else if (type == "mamba2") {
    d.pattern = std::string(static_cast<size_t>(layers), 'M');
    d.ssm_heads = j.at("num_heads").get<int64_t>();
    d.ssm_head_dim = j.at("head_dim").get<int64_t>();
    d.ssm_state = j.at("state_size").get<int64_t>();
    d.n_groups = j.at("n_groups").get<int64_t>();
    d.conv_kernel = IntOr(j, "conv_kernel", 4);
  } else if (type == "bamba" || type == "granitemoehybrid" || type == "falcon_h1") {
    std::vector<char> mixers(static_cast<size_t>(layers), 'M');
    if (type == "bamba") {
      for (const Json& i : j.at("attn_layer_indices")) mixers[i.get<size_t>()] = '*';
    } else if (type == "granitemoehybrid") {
      for (size_t i = 0; i < mixers.size(); ++i) mixers[i] = MixerLetter(j.at("layer_types")[i].get<std::string>());
    } else {
      mixers.assign(mixers.size(), 'P');
    }
    const char ff = type == "granitemoehybrid" && IntOr(j, "num_local_experts", 0) > 0 ? 'E' : 'G';
    for (char m : mixers) d.pattern += std::string{m, ff};
    d.ssm_heads = j.at("mamba_n_heads").get<int64_t>();
    d.ssm_head_dim = j.at("mamba_d_head").get<int64_t>();
    d.ssm_state = j.at("mamba_d_state").get<int64_t>();
    d.n_groups = j.at("mamba_n_groups").get<int64_t>();
    d.conv_kernel = IntOr(j, "mamba_d_conv", 4);
    d.head_dim = type == "falcon_h1" ? IntOr(j, "head_dim", hidden / d.heads) : hidden / d.heads;
  } else if (type == "zamba2") {
    for (const Json& t : j.at("layers_block_type")) d.pattern += MixerLetter(t.get<std::string>());
    d.ssm_heads = IntOr(j, "n_mamba_heads", 8);
    d.ssm_head_dim = j.at("mamba_headdim").get<int64_t>();
    d.ssm_state = IntOr(j, "mamba_d_state", 64);
    d.n_groups = IntOr(j, "mamba_ngroups", 1);
    d.conv_kernel = IntOr(j, "mamba_d_conv", 4);
    d.head_dim = 2 * hidden / d.heads;  // the shared block attends over [hidden | embeddings]
  } else if (type == "qwen3_next" || type == "qwen3_5_text" || type == "qwen3_5_moe_text") {
    // Layer i: its mixer ('D' for linear_attention), then an MoE block ('E')
    // unless the model is dense (qwen3_5_text) or the layer is in mlp_only_layers.
    std::vector<std::string> types;
    if (j.contains("layer_types")) {
      for (const Json& t : j.at("layer_types")) types.push_back(t.get<std::string>());
    } else {
      const int64_t every = IntOr(j, "full_attention_interval", 4);
      for (int64_t i = 0; i < layers; ++i) types.push_back((i + 1) % every == 0 ? "full_attention" : "linear");
    }
    std::vector<int64_t> dense;
    if (j.contains("mlp_only_layers")) dense = j.at("mlp_only_layers").get<std::vector<int64_t>>();
    const int64_t step = IntOr(j, "decoder_sparse_step", 1);
    for (int64_t i = 0; i < layers; ++i) {
      d.pattern += types[static_cast<size_t>(i)] == "full_attention" ? '*' : 'D';
      const bool moe = type != "qwen3_5_text" && IntOr(j, "num_experts", 1) > 0 &&
                       std::find(dense.begin(), dense.end(), i) == dense.end() && (i + 1) % step == 0;
      d.pattern += moe ? 'E' : 'G';
    }
    d.ssm_heads = j.at("linear_num_value_heads").get<int64_t>();
    d.ssm_state = j.at("linear_value_head_dim").get<int64_t>();
    d.k_heads = j.at("linear_num_key_heads").get<int64_t>();
    d.k_head_dim = j.at("linear_key_head_dim").get<int64_t>();
    d.conv_kernel = IntOr(j, "linear_conv_kernel_dim", 4);
    d.head_dim = j.at("head_dim").get<int64_t>();
  } else {
    return absl::InvalidArgumentError(absl::StrCat("no derivation for model_type ", type));
  }
  if (d.KvBlocks() == 0) d.heads = d.kv_heads = d.head_dim = 0;
  return d;
}

// Compares what the engine parsed with the derivation; `what` names the config.
void ExpectMatchesDerivation(const ModelConfig& c, const Derived& d, const std::string& what) {
  SCOPED_TRACE(what);
  EXPECT_EQ(c.LayerPattern(), d.pattern);
  EXPECT_EQ(c.vocab_size, d.vocab);
  EXPECT_EQ(c.RecurrentLayers(), d.SsmBlocks());
  EXPECT_EQ(c.KvLayers(), d.KvBlocks());
  EXPECT_EQ(c.CountLayers(LayerKind::kMoe), d.Count('E'));
  EXPECT_EQ(c.CountLayers(LayerKind::kMlp), d.Count('-'));
  EXPECT_EQ(c.CountLayers(LayerKind::kGatedMlp), d.Count('G'));
  if (d.Count('D') > 0) {
    EXPECT_EQ(c.gdn.num_v_heads, d.ssm_heads);
    EXPECT_EQ(c.gdn.v_head_dim, d.ssm_state);
    EXPECT_EQ(c.gdn.num_k_heads, d.k_heads);
    EXPECT_EQ(c.gdn.k_head_dim, d.k_head_dim);
    EXPECT_EQ(c.gdn.conv_kernel, d.conv_kernel);
  } else if (d.SsmBlocks() > 0) {
    EXPECT_EQ(c.mamba.num_heads, d.ssm_heads);
    EXPECT_EQ(c.mamba.head_dim, d.ssm_head_dim);
    EXPECT_EQ(c.mamba.state_size, d.ssm_state);
    EXPECT_EQ(c.mamba.n_groups, d.n_groups);
    EXPECT_EQ(c.mamba.conv_kernel, d.conv_kernel);
  }
  if (d.KvBlocks() > 0) {
    EXPECT_EQ(c.attention.num_heads, d.heads);
    EXPECT_EQ(c.attention.num_kv_heads, d.kv_heads);
    EXPECT_EQ(c.attention.head_dim, d.head_dim);
  }
  const StateLayout layout = StateLayout::ForModel(c, /*page_size=*/16);
  EXPECT_EQ(layout.recurrent_state_bytes(), d.RecurrentStateBytes());
  EXPECT_EQ(layout.attention_layers * 2 * layout.kv_token_floats() * 4, d.KvBytesPerToken());
}

std::string ConfigFingerprint(const ModelConfig& c) { return common::HashBytes(c.CanonicalString()).ToHex(); }

// Checks one row; returns the config fingerprint when the config loads ("" otherwise).
std::string CheckRow(const CorpusRow& row) {
  SCOPED_TRACE(row.file);
  const std::string path = Runfile(absl::StrCat("tests/fixtures/public_configs/", row.file));
  const std::string text = ReadFile(path);
  EXPECT_FALSE(text.empty()) << "cannot read " << path;
  const absl::StatusOr<ModelConfig> config = ParseModelConfig(text);
  if (*row.refusal != '\0') {
    EXPECT_FALSE(config.ok()) << "loads now: flip its row to \"\" with fingerprint " << ConfigFingerprint(*config);
    if (!config.ok()) EXPECT_EQ(std::string(config.status().message()), std::string(row.refusal));
    return "";
  }
  if (!config.ok()) {
    ADD_FAILURE() << "refused: " << config.status();
    return "";
  }
  const Json json = ParseForDerivation(text);
  const absl::StatusOr<Derived> derived = Derive(json);
  if (!derived.ok()) {
    ADD_FAILURE() << derived.status();
    return "";
  }
  ExpectMatchesDerivation(*config, *derived, row.file);
  if (row.published_params > 0) {
    const double params = static_cast<double>(derived->Parameters());
    EXPECT_NEAR(params / row.published_params, 1.0, kPublishedParamsTolerance)
        << "derived " << params << " parameters, published " << row.published_params;
  }
  const std::string fingerprint = ConfigFingerprint(*config);
  EXPECT_EQ(fingerprint, row.fingerprint);
  return fingerprint;
}

TEST(PublicConfigTest, EachCorpusConfigLoadsOrIsRefusedAsRecorded) {
  std::map<std::string, std::string> fingerprints;  // fingerprint -> file
  for (const CorpusRow& row : kCorpus) {
    const std::string fingerprint = CheckRow(row);
    if (fingerprint.empty()) continue;
    EXPECT_TRUE(fingerprints.emplace(fingerprint, row.file).second)
        << row.file << " has the same fingerprint as " << fingerprints[fingerprint];
  }
}

TEST(PublicConfigTest, TheDerivationAgreesWithTheEngineOnEveryFamily) {
  std::set<std::string> families;
  for (const char* file : kDerivationSelfCheck) {
    const std::string text = ReadFile(Runfile(file));
    ASSERT_FALSE(text.empty()) << "cannot read " << file;
    const absl::StatusOr<ModelConfig> config = ParseModelConfig(text);
    ASSERT_TRUE(config.ok()) << file << ": " << config.status();
    const Json json = Json::parse(text);
    const absl::StatusOr<Derived> derived = Derive(json);
    ASSERT_TRUE(derived.ok()) << file << ": " << derived.status();
    ExpectMatchesDerivation(*config, *derived, file);
    families.insert(json.at("model_type").get<std::string>());
  }
  EXPECT_EQ(families.size(), 6u);
}

// Every corpus file has a row (a config added without an expectation fails)
// and every row a source in SOURCES.md.
TEST(PublicConfigTest, EveryCorpusFileHasARowAndASource) {
  const std::string root = Runfile("tests/fixtures/public_configs");
  std::set<std::string> rows;
  for (const CorpusRow& row : kCorpus) rows.insert(row.file);
  int64_t files = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(root)) {
    if (entry.path().extension() != ".json") continue;
    ++files;
    const std::string relative = entry.path().lexically_relative(root).string();
    EXPECT_EQ(rows.count(relative), 1u) << relative << " has no row in kCorpus";
  }
  EXPECT_EQ(files, static_cast<int64_t>(rows.size()));
  const std::string sources = ReadFile(absl::StrCat(root, "/SOURCES.md"));
  ASSERT_FALSE(sources.empty());
  for (const CorpusRow& row : kCorpus) {
    EXPECT_NE(sources.find(absl::StrCat("| ", row.file, " |")), std::string::npos)
        << row.file << " has no source in SOURCES.md";
  }
}

}  // namespace
}  // namespace hybridserve::engine
