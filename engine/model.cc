#include "engine/model.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/attention_layer.h"
#include "engine/layer_runner.h"
#include "engine/mamba2_layer.h"
#include "engine/mlp_layer.h"
#include "kernels/cpu/norm.h"
#include "kernels/norm_params.h"

namespace hybridserve::engine {
namespace {

// The grid unit of a model without Mamba2 layers (no chunk size of its own).
constexpr int64_t kDefaultGridUnit = 256;
constexpr int64_t kDefaultMaxSegmentTokens = 2048;
// Longest sequence: the kernels take positions and sequence lengths as int32.
constexpr int64_t kMaxPositions = std::numeric_limits<int32_t>::max();

bool IsPowerOfTwo(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

int64_t NextMultiple(int64_t pos, int64_t step) { return (pos / step + 1) * step; }

absl::StatusOr<ModelOptions> ResolveOptions(const ModelConfig& config, ModelOptions o) {
  const bool has_mamba = config.CountLayers(LayerKind::kMamba2) > 0;
  const int64_t chunk = has_mamba ? config.mamba.chunk_size : kDefaultGridUnit;
  if (o.page_size == 0) o.page_size = std::min<int64_t>(16, chunk);
  if (!IsPowerOfTwo(o.page_size) || chunk % o.page_size != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_size ", o.page_size, " must be a power of two dividing the chunk size ", chunk));
  }
  if (o.checkpoint_interval == 0) o.checkpoint_interval = 4 * chunk;
  if (o.checkpoint_interval < 0 || o.checkpoint_interval % chunk != 0) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint_interval ", o.checkpoint_interval,
                                                   " must be a positive multiple of the chunk size ", chunk));
  }
  if (o.max_segment_tokens == 0) o.max_segment_tokens = std::max(chunk, kDefaultMaxSegmentTokens / chunk * chunk);
  if (o.max_segment_tokens < 0 || o.max_segment_tokens % chunk != 0) {
    return absl::InvalidArgumentError(absl::StrCat("max_segment_tokens ", o.max_segment_tokens,
                                                   " must be a positive multiple of the chunk size ", chunk));
  }
  if (o.max_pages < 1) return absl::InvalidArgumentError(absl::StrCat("max_pages ", o.max_pages, " < 1"));
  if (o.max_sequences < 1) {
    return absl::InvalidArgumentError(absl::StrCat("max_sequences ", o.max_sequences, " < 1"));
  }
  if (o.num_threads < 1) return absl::InvalidArgumentError(absl::StrCat("num_threads ", o.num_threads, " < 1"));
  return o;
}

// out[r] = RMSNorm(in[r]) * weight for rows r < n.
absl::Status RmsNormRows(absl::Span<const float> weight, const float* in, float* out, int64_t n, int64_t dim, float eps,
                         kernels::cpu::ThreadPool* pool) {
  kernels::RmsNormParams p;
  p.x = in;
  p.weight = weight.data();
  p.out = out;
  p.n_rows = n;
  p.dim = dim;
  p.eps = eps;
  return KernelStatusToStatus(kernels::cpu::RmsNorm(p, pool), "RmsNorm");
}

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> Model::Create(const ModelConfig& config, const ModelWeights& weights,
                                                     const ModelOptions& options) {
  RETURN_IF_ERROR(config.Validate());
  if (config.CanonicalString() != weights.config().CanonicalString()) {
    return absl::InvalidArgumentError("model config does not describe the weights given (another architecture)");
  }
  ASSIGN_OR_RETURN(ModelOptions resolved, ResolveOptions(config, options));
  std::unique_ptr<Model> model(new Model(config, weights, resolved));

  KvPagePoolOptions kv;
  kv.num_layers = config.CountLayers(LayerKind::kAttention);
  kv.num_pages = resolved.max_pages;
  kv.page_size = resolved.page_size;
  kv.n_kv_heads = config.attention.num_kv_heads;
  kv.head_dim = config.attention.head_dim;
  ASSIGN_OR_RETURN(model->kv_pages_, KvPagePool::Create(kv));

  StateSlotPoolOptions ss;
  ss.num_layers = config.CountLayers(LayerKind::kMamba2);
  ss.num_slots = resolved.max_sequences;
  ss.n_heads = config.mamba.num_heads;
  ss.head_dim = config.mamba.head_dim;
  ss.d_state = config.mamba.state_size;
  ss.conv_dim = config.mamba.conv_dim();
  ss.d_conv = config.mamba.conv_kernel;
  ASSIGN_OR_RETURN(model->state_slots_, StateSlotPool::Create(ss));

  LayerEnv env;
  env.pool = model->pool_.get();
  env.matmul_mode = resolved.matmul_mode;
  env.kv_pages = model->kv_pages_.get();
  env.state_slots = model->state_slots_.get();
  env.workspace = model->workspace_.get();

  // The one place that maps layer kinds to runners.
  int64_t mamba_index = 0;
  int64_t attention_index = 0;
  for (int64_t i = 0; i < config.num_layers(); ++i) {
    const LayerWeights& w = weights.layer(i);
    switch (config.layers[static_cast<size_t>(i)]) {
      case LayerKind::kMamba2:
        model->runners_.push_back(NewMamba2LayerRunner(model->config_, w.mamba2(), mamba_index++, env));
        break;
      case LayerKind::kAttention: {
        ASSIGN_OR_RETURN(std::unique_ptr<LayerRunner> runner,
                         NewAttentionLayerRunner(model->config_, w.attention(), attention_index++, env));
        model->runners_.push_back(std::move(runner));
        break;
      }
      case LayerKind::kMlp:
        model->runners_.push_back(NewMlpLayerRunner(model->config_, w.mlp(), env));
        break;
    }
  }
  return model;
}

Model::Model(const ModelConfig& config, const ModelWeights& weights, const ModelOptions& options)
    : config_(config),
      weights_(weights),
      options_(options),
      pool_(std::make_unique<kernels::cpu::ThreadPool>(options.num_threads)),
      workspace_(std::make_unique<Workspace>()) {}

Model::~Model() = default;

int64_t Model::page_bytes() const {
  return num_attention_layers() * 2 * kv_pages_->page_floats() * static_cast<int64_t>(sizeof(float));
}

absl::StatusOr<Model::Sequence*> Model::Find(SequenceId id) {
  auto it = sequences_.find(id);
  if (it == sequences_.end()) return absl::NotFoundError(absl::StrCat("unknown sequence id ", id));
  return &it->second;
}

absl::StatusOr<const Model::Sequence*> Model::Find(SequenceId id) const {
  auto it = sequences_.find(id);
  if (it == sequences_.end()) return absl::NotFoundError(absl::StrCat("unknown sequence id ", id));
  return &it->second;
}

absl::StatusOr<int64_t> Model::Position(SequenceId id) const {
  ASSIGN_OR_RETURN(const Sequence* seq, Find(id));
  return seq->position;
}

absl::Status Model::CheckTokens(absl::Span<const TokenId> tokens) const {
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= config_.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("token id ", tokens[i], " at index ", i, " outside [0, vocab ", config_.vocab_size, ")"));
    }
  }
  return absl::OkStatus();
}

int64_t Model::PagesFor(int64_t positions) const {
  if (num_attention_layers() == 0) return 0;
  return (positions + options_.page_size - 1) / options_.page_size;
}

absl::Status Model::EnsurePages(Sequence& seq, int64_t positions) {
  const int64_t need = PagesFor(positions) - static_cast<int64_t>(seq.block_table.size());
  if (need <= 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(std::vector<int32_t> pages, kv_pages_->Allocate(need));
  seq.block_table.insert(seq.block_table.end(), pages.begin(), pages.end());
  return absl::OkStatus();
}

absl::StatusOr<SequenceId> Model::NewSequence() {
  ASSIGN_OR_RETURN(int32_t slot, state_slots_->Allocate());
  const SequenceId id = next_id_++;
  sequences_[id].slot = slot;
  return id;
}

absl::Status Model::ReleaseSequence(SequenceId id) {
  ASSIGN_OR_RETURN(Sequence * seq, Find(id));
  // Both frees succeed by construction (the model allocated what it frees).
  const absl::Status pages = kv_pages_->Free(seq->block_table);
  const absl::Status slot = state_slots_->Free(seq->slot);
  sequences_.erase(id);
  RETURN_IF_ERROR(pages);
  return slot;
}

void Model::Embed(const TokenId* tokens, int64_t n) {
  const int64_t hidden = config_.hidden_size;
  if (static_cast<int64_t>(hidden_.size()) < n * hidden) hidden_.resize(static_cast<size_t>(n * hidden));
  if (static_cast<int64_t>(normed_.size()) < n * hidden) normed_.resize(static_cast<size_t>(n * hidden));
  const float* table = weights_.embeddings().data();
  for (int64_t t = 0; t < n; ++t) {
    std::memcpy(hidden_.data() + t * hidden, table + static_cast<int64_t>(tokens[t]) * hidden,
                static_cast<size_t>(hidden) * sizeof(float));
  }
}

absl::Status Model::RunSegment(Sequence& seq, const TokenId* tokens, int64_t start, int64_t n) {
  Embed(tokens, n);
  PrefillSegment segment;
  segment.start_pos = start;
  segment.n_tokens = n;
  segment.state_slot = seq.slot;
  segment.block_table = seq.block_table.data();
  for (size_t i = 0; i < runners_.size(); ++i) {
    RETURN_IF_ERROR(RmsNormRows(weights_.layers()[i].norm, hidden_.data(), normed_.data(), n, config_.hidden_size,
                                config_.norm_eps, pool_.get()));
    RETURN_IF_ERROR(runners_[i]->Prefill(segment, normed_.data(), hidden_.data()));
  }
  return absl::OkStatus();
}

absl::Status Model::Logits(int64_t first_row, int64_t n_rows, float* logits) {
  const int64_t hidden = config_.hidden_size;
  RETURN_IF_ERROR(RmsNormRows(weights_.norm_f(), hidden_.data() + first_row * hidden, normed_.data(), n_rows, hidden,
                              config_.norm_eps, pool_.get()));
  LayerEnv env;
  env.pool = pool_.get();
  env.matmul_mode = options_.matmul_mode;
  return Linear(env, normed_.data(), n_rows, hidden, weights_.lm_head(), config_.vocab_size, /*bias=*/{}, logits,
                /*accumulate=*/false, "lm_head");
}

std::vector<int64_t> Model::SegmentEnds(int64_t begin, int64_t end) const {
  std::vector<int64_t> ends;
  for (int64_t s = begin; s < end;) {
    s = std::min({end, NextMultiple(s, options_.checkpoint_interval), NextMultiple(s, options_.max_segment_tokens)});
    ends.push_back(s);
  }
  return ends;
}

SequenceState Model::CaptureSsm(const Sequence& seq, int64_t position) const {
  SequenceState state;
  state.position = position;
  const int64_t n = num_mamba_layers();
  state.ssm_states.resize(static_cast<size_t>(n));
  state.conv_states.resize(static_cast<size_t>(n));
  for (int64_t l = 0; l < n; ++l) {
    const float* ssm = state_slots_->ssm(l, seq.slot);
    const float* conv = state_slots_->conv(l, seq.slot);
    state.ssm_states[static_cast<size_t>(l)].assign(ssm, ssm + state_slots_->ssm_floats());
    state.conv_states[static_cast<size_t>(l)].assign(conv, conv + state_slots_->conv_floats());
  }
  state.tail_k.resize(static_cast<size_t>(num_attention_layers()));
  state.tail_v.resize(static_cast<size_t>(num_attention_layers()));
  return state;
}

absl::StatusOr<PrefillResult> Model::Prefill(SequenceId id, absl::Span<const TokenId> tokens,
                                             const PrefillOptions& options) {
  ASSIGN_OR_RETURN(Sequence * seq, Find(id));
  if (tokens.empty()) return absl::InvalidArgumentError(absl::StrCat("prefill of sequence ", id, " with no tokens"));
  RETURN_IF_ERROR(CheckTokens(tokens));
  const int64_t begin = seq->position;
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t vocab = config_.vocab_size;
  if (n > kMaxPositions - begin) {
    return absl::InvalidArgumentError(absl::StrCat("sequence ", id, " would exceed ", kMaxPositions, " tokens"));
  }
  RETURN_IF_ERROR(EnsurePages(*seq, begin + n));

  PrefillResult result;
  if (options.all_logits) result.logits.resize(static_cast<size_t>(n * vocab));
  int64_t start = begin;
  for (int64_t end : SegmentEnds(begin, begin + n)) {
    const int64_t len = end - start;
    RETURN_IF_ERROR(RunSegment(*seq, tokens.data() + (start - begin), start, len));
    if (options.all_logits) RETURN_IF_ERROR(Logits(0, len, result.logits.data() + (start - begin) * vocab));
    seq->position = end;
    if (options.emit_checkpoints && end % options_.checkpoint_interval == 0) {
      result.checkpoints.push_back(CaptureSsm(*seq, end));
    }
    if (end == begin + n && !options.all_logits) {
      result.logits.resize(static_cast<size_t>(vocab));
      RETURN_IF_ERROR(Logits(len - 1, 1, result.logits.data()));
    }
    start = end;
  }
  seq->last_logits.assign(result.logits.end() - vocab, result.logits.end());
  return result;
}

absl::StatusOr<std::vector<float>> Model::DecodeStep(absl::Span<const SequenceId> ids,
                                                     absl::Span<const TokenId> tokens) {
  if (ids.empty()) return absl::InvalidArgumentError("decode step with an empty batch");
  if (ids.size() != tokens.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("decode step with ", ids.size(), " sequences but ", tokens.size(), " tokens"));
  }
  RETURN_IF_ERROR(CheckTokens(tokens));
  const int64_t batch = static_cast<int64_t>(ids.size());
  std::vector<Sequence*> seqs;
  seqs.reserve(ids.size());
  absl::flat_hash_set<SequenceId> seen;
  int64_t new_pages = 0;
  for (SequenceId id : ids) {
    ASSIGN_OR_RETURN(Sequence * seq, Find(id));
    if (!seen.insert(id).second) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", id, " appears twice in one decode step"));
    }
    if (seq->position >= kMaxPositions) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", id, " would exceed ", kMaxPositions, " tokens"));
    }
    new_pages += PagesFor(seq->position + 1) - static_cast<int64_t>(seq->block_table.size());
    seqs.push_back(seq);
  }
  if (new_pages > kv_pages_->num_free()) {
    return absl::ResourceExhaustedError(absl::StrCat("out of KV pages: the decode step needs ", new_pages, ", ",
                                                     kv_pages_->num_free(), " free of ", kv_pages_->num_pages()));
  }
  for (Sequence* seq : seqs) RETURN_IF_ERROR(EnsurePages(*seq, seq->position + 1));

  size_t stride = 1;
  for (const Sequence* seq : seqs) stride = std::max(stride, seq->block_table.size());
  std::vector<int32_t> slots(static_cast<size_t>(batch));
  std::vector<int32_t> seq_lens(static_cast<size_t>(batch));
  std::vector<int32_t> tables(static_cast<size_t>(batch) * stride, 0);  // padding entries are never read
  for (int64_t b = 0; b < batch; ++b) {
    const Sequence& seq = *seqs[static_cast<size_t>(b)];
    slots[static_cast<size_t>(b)] = seq.slot;
    seq_lens[static_cast<size_t>(b)] = static_cast<int32_t>(seq.position + 1);
    std::copy(seq.block_table.begin(), seq.block_table.end(), tables.begin() + static_cast<std::ptrdiff_t>(b * stride));
  }
  DecodeBatch step;
  step.batch = batch;
  step.state_slots = slots.data();
  step.block_tables = tables.data();
  step.block_table_stride = static_cast<int64_t>(stride);
  step.seq_lens = seq_lens.data();

  Embed(tokens.data(), batch);
  for (size_t i = 0; i < runners_.size(); ++i) {
    RETURN_IF_ERROR(RmsNormRows(weights_.layers()[i].norm, hidden_.data(), normed_.data(), batch, config_.hidden_size,
                                config_.norm_eps, pool_.get()));
    RETURN_IF_ERROR(runners_[i]->Decode(step, normed_.data(), hidden_.data()));
  }
  const int64_t vocab = config_.vocab_size;
  std::vector<float> logits(static_cast<size_t>(batch * vocab));
  RETURN_IF_ERROR(Logits(0, batch, logits.data()));
  for (int64_t b = 0; b < batch; ++b) {
    Sequence& seq = *seqs[static_cast<size_t>(b)];
    seq.position += 1;
    seq.last_logits.assign(logits.begin() + b * vocab, logits.begin() + (b + 1) * vocab);
  }
  return logits;
}

absl::StatusOr<SequenceState> Model::CaptureState(SequenceId id, bool with_logits) const {
  ASSIGN_OR_RETURN(const Sequence* seq, Find(id));
  SequenceState state = CaptureSsm(*seq, seq->position);
  const int64_t tail = seq->position % options_.page_size;
  if (tail > 0 && num_attention_layers() > 0) {
    const int32_t page = seq->block_table[static_cast<size_t>(seq->position / options_.page_size)];
    const int64_t floats = tail * kv_pages_->token_floats();
    for (int64_t l = 0; l < num_attention_layers(); ++l) {
      const float* k = kv_pages_->k_page(l, page);
      const float* v = kv_pages_->v_page(l, page);
      state.tail_k[static_cast<size_t>(l)].assign(k, k + floats);
      state.tail_v[static_cast<size_t>(l)].assign(v, v + floats);
    }
  }
  if (with_logits) state.last_logits = seq->last_logits;
  return state;
}

namespace {

absl::Status CheckArrays(const std::vector<std::vector<float>>& arrays, int64_t layers, int64_t floats,
                         absl::string_view name) {
  if (static_cast<int64_t>(arrays.size()) != layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("sequence state: ", name, " has ", arrays.size(), " layers, the model ", layers));
  }
  for (size_t l = 0; l < arrays.size(); ++l) {
    if (static_cast<int64_t>(arrays[l].size()) != floats) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence state: ", name, "[", l, "] has ", arrays[l].size(), " floats, expected ", floats));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Model::RestoreState(SequenceId id, const SequenceState& state, absl::Span<const absl::string_view> pages) {
  ASSIGN_OR_RETURN(Sequence * seq, Find(id));
  if (seq->position != 0 || !seq->block_table.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("restore into sequence ", id, " at position ", seq->position, ": only an empty sequence"));
  }
  const int64_t p = state.position;
  if (p < 0 || p > kMaxPositions) {
    return absl::InvalidArgumentError(
        absl::StrCat("sequence state: position ", p, " outside [0, ", kMaxPositions, "]"));
  }
  const int64_t ps = options_.page_size;
  const int64_t tail = p % ps;
  const int64_t full = p / ps;
  RETURN_IF_ERROR(CheckArrays(state.ssm_states, num_mamba_layers(), state_slots_->ssm_floats(), "ssm_states"));
  RETURN_IF_ERROR(CheckArrays(state.conv_states, num_mamba_layers(), state_slots_->conv_floats(), "conv_states"));
  const int64_t tail_floats = tail * kv_pages_->token_floats();
  RETURN_IF_ERROR(CheckArrays(state.tail_k, num_attention_layers(), tail_floats, "tail_k"));
  RETURN_IF_ERROR(CheckArrays(state.tail_v, num_attention_layers(), tail_floats, "tail_v"));
  if (!state.last_logits.empty() && static_cast<int64_t>(state.last_logits.size()) != config_.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat("sequence state: last_logits has ", state.last_logits.size(),
                                                   " floats, vocab is ", config_.vocab_size));
  }
  const bool pageless = num_attention_layers() == 0 && pages.empty();
  if (!pageless && static_cast<int64_t>(pages.size()) != full) {
    return absl::InvalidArgumentError(
        absl::StrCat("restore at position ", p, " needs ", full, " full pages, got ", pages.size()));
  }
  for (size_t i = 0; i < pages.size(); ++i) {
    if (static_cast<int64_t>(pages[i].size()) != page_bytes()) {
      return absl::InvalidArgumentError(
          absl::StrCat("page ", i, " has ", pages[i].size(), " bytes, expected ", page_bytes()));
    }
  }
  RETURN_IF_ERROR(EnsurePages(*seq, p));

  const int64_t page_floats = kv_pages_->page_floats();
  const size_t page_half = static_cast<size_t>(page_floats) * sizeof(float);
  for (size_t i = 0; i < pages.size() && num_attention_layers() > 0; ++i) {
    const int32_t page = seq->block_table[i];
    const char* src = pages[i].data();
    for (int64_t l = 0; l < num_attention_layers(); ++l) {
      std::memcpy(kv_pages_->k_page(l, page), src, page_half);
      std::memcpy(kv_pages_->v_page(l, page), src + page_half, page_half);
      src += 2 * page_half;
    }
  }
  if (tail > 0 && num_attention_layers() > 0) {
    const int32_t page = seq->block_table[static_cast<size_t>(full)];
    for (int64_t l = 0; l < num_attention_layers(); ++l) {
      std::copy(state.tail_k[static_cast<size_t>(l)].begin(), state.tail_k[static_cast<size_t>(l)].end(),
                kv_pages_->k_page(l, page));
      std::copy(state.tail_v[static_cast<size_t>(l)].begin(), state.tail_v[static_cast<size_t>(l)].end(),
                kv_pages_->v_page(l, page));
    }
  }
  for (int64_t l = 0; l < num_mamba_layers(); ++l) {
    std::copy(state.ssm_states[static_cast<size_t>(l)].begin(), state.ssm_states[static_cast<size_t>(l)].end(),
              state_slots_->ssm(l, seq->slot));
    std::copy(state.conv_states[static_cast<size_t>(l)].begin(), state.conv_states[static_cast<size_t>(l)].end(),
              state_slots_->conv(l, seq->slot));
  }
  seq->position = p;
  seq->last_logits = state.last_logits;
  return absl::OkStatus();
}

absl::StatusOr<std::string> Model::ExportPage(SequenceId id, int64_t page_index) const {
  ASSIGN_OR_RETURN(const Sequence* seq, Find(id));
  const int64_t full = seq->position / options_.page_size;
  if (page_index < 0 || page_index >= full) {
    return absl::OutOfRangeError(absl::StrCat("page ", page_index, " of sequence ", id, " is not full (position ",
                                              seq->position, ", page_size ", options_.page_size, ")"));
  }
  std::string out(static_cast<size_t>(page_bytes()), '\0');
  if (num_attention_layers() == 0) return out;
  const int32_t page = seq->block_table[static_cast<size_t>(page_index)];
  const size_t page_half = static_cast<size_t>(kv_pages_->page_floats()) * sizeof(float);
  char* dst = out.data();
  for (int64_t l = 0; l < num_attention_layers(); ++l) {
    std::memcpy(dst, kv_pages_->k_page(l, page), page_half);
    std::memcpy(dst + page_half, kv_pages_->v_page(l, page), page_half);
    dst += 2 * page_half;
  }
  return out;
}

}  // namespace hybridserve::engine
