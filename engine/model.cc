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
#include "common/logging.h"
#include "common/status_macros.h"
#include "common/tokens.h"
#include "engine/attention_layer.h"
#include "engine/device_weights.h"
#include "engine/gated_deltanet_layer.h"
#include "engine/gated_mlp_layer.h"
#include "engine/layer_runner.h"
#include "engine/mamba2_layer.h"
#include "engine/mlp_layer.h"
#include "engine/moe_layer.h"
#include "engine/parallel_layer.h"
#include "engine/zamba_layer.h"
#include "kernels/activation_params.h"
#include "kernels/embedding_params.h"
#include "kernels/norm_params.h"

namespace hybridserve::engine {
namespace {

// The grid unit of a model without Mamba2 layers (no chunk size of its own).
constexpr int64_t kDefaultGridUnit = 256;
constexpr int64_t kDefaultMaxSegmentTokens = 2048;
constexpr int64_t kMaxPositions = kMaxSequenceTokens;

int64_t NextMultiple(int64_t pos, int64_t step) { return (pos / step + 1) * step; }

// Largest decode batch that runs through a graph (ModelOptions::decode_graphs).
constexpr int64_t kMaxGraphBatch = 256;

int64_t NextPowerOfTwo(int64_t n) {
  int64_t p = 1;
  while (p < n) p *= 2;
  return p;
}

absl::StatusOr<ModelOptions> ResolveOptions(const ModelConfig& config, ModelOptions o) {
  const int64_t chunk = config.RecurrentLayers() > 0 ? config.chunk_size() : kDefaultGridUnit;
  if (o.page_size == 0) o.page_size = std::min<int64_t>(16, chunk);
  // Pages and chunks are independent grids: a page may be smaller than a
  // chunk or span several (then segments and checkpoints end mid-page and the
  // partial page travels in the state, as at any exact-prefix position).
  if (!IsValidPageSize(o.page_size)) return absl::InvalidArgumentError(PageSizeProblem(o.page_size));
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

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> Model::Create(const ModelConfig& config, const ModelWeights& weights,
                                                     const ModelOptions& options) {
  RETURN_IF_ERROR(config.Validate());
  if (config.CanonicalString() != weights.config().CanonicalString()) {
    return absl::InvalidArgumentError("model config does not describe the weights given (another architecture)");
  }
  ASSIGN_OR_RETURN(ModelOptions resolved, ResolveOptions(config, options));
  std::unique_ptr<Model> model(new Model(config, resolved));
  if (resolved.backend == nullptr) {
    BackendOptions b;
    b.device = resolved.device;
    b.num_threads = resolved.num_threads;
    b.device_index = resolved.device_index;
    ASSIGN_OR_RETURN(model->owned_backend_, CreateBackend(b));
    model->options_.backend = model->owned_backend_.get();
  }
  model->backend_ = model->options_.backend;
  kernels::Backend& backend = *model->backend_;
  ASSIGN_OR_RETURN(model->device_weights_, DeviceWeights::Create(weights, backend));

  model->use_decode_graphs_ = resolved.decode_graphs && backend.supports_graphs();
  const bool scratch_page = model->use_decode_graphs_ && config.KvLayers() > 0;
  SequenceTableOptions table;
  table.layout = StateLayout::ForModel(config, resolved.page_size);
  table.max_pages = resolved.max_pages + (scratch_page ? 1 : 0);
  table.max_sequences = resolved.max_sequences;
  ASSIGN_OR_RETURN(model->sequences_, SequenceTable::Create(table, backend));
  if (scratch_page) {
    ASSIGN_OR_RETURN(std::vector<int32_t> page, model->sequences_->kv_pages().Allocate(1));
    model->scratch_page_ = page[0];
  }
  model->workspace_ = std::make_unique<Workspace>(backend);

  LayerEnv env;
  env.backend = &backend;
  env.matmul_mode = resolved.matmul_mode;
  env.kv_pages = &model->sequences_->kv_pages();
  env.state_slots = &model->sequences_->state_slots();
  env.workspace = model->workspace_.get();
  env.residual_multiplier = config.residual_multiplier;

  // The one place that maps layer kinds to runners.
  int64_t mamba_index = 0;
  int64_t attention_index = 0;
  for (int64_t i = 0; i < config.num_layers(); ++i) {
    const DeviceLayerWeights& w = model->device_weights_->layer(i);
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
      case LayerKind::kGatedDeltaNet:
        model->runners_.push_back(NewGatedDeltaNetLayerRunner(model->config_, w.gated_deltanet(), mamba_index++, env));
        break;
      case LayerKind::kMlp:
        model->runners_.push_back(NewMlpLayerRunner(model->config_, w.mlp(), env));
        break;
      case LayerKind::kGatedMlp:
        model->runners_.push_back(NewGatedMlpLayerRunner(model->config_, w.gated_mlp(), env));
        break;
      case LayerKind::kMoe:
        model->runners_.push_back(NewMoeLayerRunner(model->config_, w.moe(), env));
        break;
      case LayerKind::kZambaHybrid: {
        const DeviceZambaHybridWeights& z = w.zamba_hybrid();
        ASSIGN_OR_RETURN(std::unique_ptr<LayerRunner> runner,
                         NewZambaHybridLayerRunner(model->config_, z, model->device_weights_->shared_block(z.block),
                                                   mamba_index++, attention_index++, env));
        model->runners_.push_back(std::move(runner));
        break;
      }
      case LayerKind::kParallel: {
        ASSIGN_OR_RETURN(std::unique_ptr<LayerRunner> runner,
                         NewParallelLayerRunner(model->config_, w.parallel(), mamba_index++, attention_index++, env));
        model->runners_.push_back(std::move(runner));
        break;
      }
    }
  }
  return model;
}

Model::Model(const ModelConfig& config, const ModelOptions& options) : config_(config), options_(options) {}

Model::~Model() { ReleaseDecodeGraphs(); }

void Model::ReleaseDecodeGraphs() {
  for (const auto& [key, graph] : decode_graphs_) {
    if (graph >= 0) backend_->ReleaseGraph(graph);
  }
  decode_graphs_.clear();
  decode_buckets_seen_.clear();
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

absl::Status Model::Embed(const TokenId* tokens, int64_t n) {
  ASSIGN_OR_RETURN(const int32_t* ids, workspace_->Upload(kTokenIds, tokens, n));
  return EmbedOnDevice(ids, n);
}

absl::Status Model::EmbedOnDevice(const int32_t* ids, int64_t n) {
  ASSIGN_OR_RETURN(float* hidden, workspace_->Get<float>(kHidden, n * config_.hidden_size));
  kernels::EmbeddingParams p;
  p.table = device_weights_->embeddings().f32;
  p.table_bf16 = device_weights_->embeddings().bf16;
  p.tokens = ids;
  p.out = hidden;
  p.n_tokens = n;
  p.vocab = config_.vocab_size;
  p.dim = config_.hidden_size;
  RETURN_IF_ERROR(KernelStatusToStatus(backend_->Embedding(p), "Embedding"));
  RETURN_IF_ERROR(Scale(hidden, n * config_.hidden_size, config_.embedding_multiplier, "embedding_multiplier"));
  if (config_.CountLayers(LayerKind::kZambaHybrid) == 0) return absl::OkStatus();
  // Zamba2's shared blocks read the input embeddings beside the residual stream.
  const int64_t bytes = n * config_.hidden_size * static_cast<int64_t>(sizeof(float));
  ASSIGN_OR_RETURN(float* embeddings, workspace_->Get<float>(kEmbeddings, n * config_.hidden_size));
  return KernelStatusToStatus(backend_->CopyOnDevice(embeddings, hidden, bytes), "copying the embeddings");
}

absl::Status Model::Scale(float* x, int64_t count, float alpha, const char* what) {
  if (alpha == 1.0f) return absl::OkStatus();
  kernels::ActivationParams p;
  p.x = x;
  p.out = x;
  p.n_rows = 1;
  p.dim = count;
  p.kind = kernels::ActivationKind::kScale;
  p.alpha = alpha;
  return KernelStatusToStatus(backend_->Activation(p), what);
}

absl::Status Model::NormRows(const float* weight, const float* in, float* out, int64_t n) {
  kernels::RmsNormParams p;
  p.x = in;
  p.weight = weight;
  p.out = out;
  p.n_rows = n;
  p.dim = config_.hidden_size;
  p.eps = config_.norm_eps;
  return KernelStatusToStatus(backend_->RmsNorm(p), "RmsNorm");
}

absl::Status Model::RunSegment(Sequence& seq, const TokenId* tokens, int64_t start, int64_t n) {
  RETURN_IF_ERROR(Embed(tokens, n));
  const int64_t table_len = sequences_->PagesFor(start + n);
  PrefillSegment segment;
  segment.start_pos = start;
  segment.n_tokens = n;
  segment.state_slot = seq.slot;
  if (table_len > 0) {
    ASSIGN_OR_RETURN(segment.block_table, workspace_->Upload(kBlockTables, seq.block_table.data(), table_len));
  }
  ASSIGN_OR_RETURN(float* hidden, workspace_->Get<float>(kHidden, n * config_.hidden_size));
  ASSIGN_OR_RETURN(float* normed, workspace_->Get<float>(kNormed, n * config_.hidden_size));
  for (size_t i = 0; i < runners_.size(); ++i) {
    const float* norm = device_weights_->layer(static_cast<int64_t>(i)).norm;
    if (norm != nullptr) RETURN_IF_ERROR(NormRows(norm, hidden, normed, n));
    RETURN_IF_ERROR(runners_[i]->Prefill(segment, norm != nullptr ? normed : hidden, hidden));
  }
  return absl::OkStatus();
}

absl::StatusOr<const float*> Model::LogitsOnDevice(int64_t first_row, int64_t n_rows) {
  const int64_t hidden_size = config_.hidden_size;
  const int64_t vocab = config_.vocab_size;
  ASSIGN_OR_RETURN(float* hidden, workspace_->Get<float>(kHidden, (first_row + n_rows) * hidden_size));
  ASSIGN_OR_RETURN(float* normed, workspace_->Get<float>(kNormed, n_rows * hidden_size));
  ASSIGN_OR_RETURN(float* out, workspace_->Get<float>(kLogits, n_rows * vocab));
  RETURN_IF_ERROR(NormRows(device_weights_->norm_f(), hidden + first_row * hidden_size, normed, n_rows));
  LayerEnv env;
  env.backend = backend_;
  env.matmul_mode = options_.matmul_mode;
  RETURN_IF_ERROR(Linear(env, normed, n_rows, hidden_size, device_weights_->lm_head(), vocab, /*bias=*/nullptr, out,
                         /*accumulate=*/false, "lm_head"));
  // Granite divides the logits by logits_scaling (multiplying by the
  // reciprocal may differ from that division in the last bit); Falcon-H1
  // multiplies them by lm_head_multiplier (exact: logits_scaling is 1 there).
  RETURN_IF_ERROR(Scale(out, n_rows * vocab, config_.logits_multiplier / config_.logits_scaling, "logits multiplier"));
  return out;
}

absl::Status Model::Logits(int64_t first_row, int64_t n_rows, float* logits) {
  ASSIGN_OR_RETURN(const float* out, LogitsOnDevice(first_row, n_rows));
  return KernelStatusToStatus(
      backend_->CopyToHost(logits, out, n_rows * config_.vocab_size * static_cast<int64_t>(sizeof(float))),
      "copying logits");
}

std::vector<int64_t> Model::SegmentEnds(int64_t begin, int64_t end) const {
  std::vector<int64_t> ends;
  for (int64_t s = begin; s < end;) {
    s = std::min({end, NextMultiple(s, options_.checkpoint_interval), NextMultiple(s, options_.max_segment_tokens)});
    ends.push_back(s);
  }
  return ends;
}

absl::StatusOr<PrefillResult> Model::Prefill(SequenceId id, absl::Span<const TokenId> tokens,
                                             const PrefillOptions& options) {
  ASSIGN_OR_RETURN(Sequence * seq, sequences_->FindLive(id));
  if (tokens.empty()) return absl::InvalidArgumentError(absl::StrCat("prefill of sequence ", id, " with no tokens"));
  RETURN_IF_ERROR(CheckTokens(tokens));
  const int64_t begin = seq->position;
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t vocab = config_.vocab_size;
  if (n > kMaxPositions - begin) {
    return absl::InvalidArgumentError(absl::StrCat("sequence ", id, " would exceed ", kMaxPositions, " tokens"));
  }
  RETURN_IF_ERROR(sequences_->EnsurePages(*seq, begin + n));

  PrefillResult result;
  if (options.all_logits) result.logits.resize(static_cast<size_t>(n * vocab));
  int64_t start = begin;
  for (int64_t end : SegmentEnds(begin, begin + n)) {
    const int64_t len = end - start;
    if (start > begin && options.cancelled && options.cancelled()) {
      seq->last_logits.clear();
      return absl::CancelledError(
          absl::StrCat("prefill of sequence ", id, " cancelled at position ", start, " of ", begin + n));
    }
    RETURN_IF_ERROR(RunSegment(*seq, tokens.data() + (start - begin), start, len));
    if (options.all_logits) RETURN_IF_ERROR(Logits(0, len, result.logits.data() + (start - begin) * vocab));
    seq->position = end;
    if (options.emit_checkpoints && end % options_.checkpoint_interval == 0) {
      ASSIGN_OR_RETURN(SequenceState checkpoint, sequences_->CaptureState(id, /*with_logits=*/false));
      result.checkpoints.push_back(std::move(checkpoint));
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
    ASSIGN_OR_RETURN(Sequence * seq, sequences_->FindLive(id));
    if (!seen.insert(id).second) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", id, " appears twice in one decode step"));
    }
    if (seq->position >= kMaxPositions) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", id, " would exceed ", kMaxPositions, " tokens"));
    }
    new_pages +=
        std::max<int64_t>(0, sequences_->PagesFor(seq->position + 1) - static_cast<int64_t>(seq->block_table.size()));
    seqs.push_back(seq);
  }
  if (new_pages > sequences_->num_free_pages()) {
    return absl::ResourceExhaustedError(absl::StrCat("out of KV pages: the decode step needs ", new_pages, ", ",
                                                     sequences_->num_free_pages(), " free of ",
                                                     sequences_->num_pages()));
  }
  for (Sequence* seq : seqs) RETURN_IF_ERROR(sequences_->EnsurePages(*seq, seq->position + 1));

  size_t stride = 1;
  for (const Sequence* seq : seqs) stride = std::max(stride, seq->block_table.size());
  // With graphs: pad to the bucket (rows and block-table width) so one graph
  // serves every step of that shape.
  const bool graph = use_decode_graphs_ && batch <= kMaxGraphBatch;
  const int64_t rows = graph ? NextPowerOfTwo(batch) : batch;
  if (graph) stride = static_cast<size_t>(NextPowerOfTwo(static_cast<int64_t>(std::max<size_t>(stride, 4))));
  std::vector<int32_t> slots(static_cast<size_t>(rows), -1);           // padding rows: no state slot
  std::vector<int32_t> seq_lens(static_cast<size_t>(rows), 1);         // padding rows: one key, in the scratch page
  std::vector<int32_t> tables(static_cast<size_t>(rows) * stride, 0);  // entries past a row's length are never read
  std::vector<TokenId> ids_host(static_cast<size_t>(rows), 0);         // padding rows: token 0
  for (int64_t b = 0; b < rows; ++b) {
    if (b >= batch) {
      tables[static_cast<size_t>(b) * stride] = std::max(scratch_page_, 0);
      continue;
    }
    const Sequence& seq = *seqs[static_cast<size_t>(b)];
    slots[static_cast<size_t>(b)] = seq.slot;
    seq_lens[static_cast<size_t>(b)] = static_cast<int32_t>(seq.position + 1);
    ids_host[static_cast<size_t>(b)] = tokens[static_cast<size_t>(b)];
    std::copy(seq.block_table.begin(), seq.block_table.end(), tables.begin() + static_cast<std::ptrdiff_t>(b * stride));
  }
  DecodeBatch step;
  step.batch = rows;
  ASSIGN_OR_RETURN(step.state_slots, workspace_->Upload(kStateSlots, slots.data(), rows));
  ASSIGN_OR_RETURN(step.block_tables,
                   workspace_->Upload(kBlockTables, tables.data(), static_cast<int64_t>(tables.size())));
  step.block_table_stride = static_cast<int64_t>(stride);
  ASSIGN_OR_RETURN(step.seq_lens, workspace_->Upload(kSeqLens, seq_lens.data(), rows));
  if (config_.attention.use_rope) {
    std::vector<int64_t> positions(static_cast<size_t>(rows), 0);  // padding rows: position 0
    for (int64_t b = 0; b < batch; ++b) positions[static_cast<size_t>(b)] = seq_lens[static_cast<size_t>(b)] - 1;
    ASSIGN_OR_RETURN(step.positions, workspace_->Upload(kPositions, positions.data(), rows));
  }
  ASSIGN_OR_RETURN(const int32_t* token_ids, workspace_->Upload(kTokenIds, ids_host.data(), rows));

  if (graph) {
    RETURN_IF_ERROR(DecodeThroughGraph(step, token_ids, rows));
  } else {
    RETURN_IF_ERROR(DecodeKernels(step, token_ids, rows));
  }
  const int64_t vocab = config_.vocab_size;
  std::vector<float> logits(static_cast<size_t>(batch * vocab));
  ASSIGN_OR_RETURN(const float* device_logits, workspace_->Get<float>(kLogits, rows * vocab));
  RETURN_IF_ERROR(KernelStatusToStatus(
      backend_->CopyToHost(logits.data(), device_logits, batch * vocab * static_cast<int64_t>(sizeof(float))),
      "copying logits"));
  for (int64_t b = 0; b < batch; ++b) {
    Sequence& seq = *seqs[static_cast<size_t>(b)];
    seq.position += 1;
    seq.last_logits.assign(logits.begin() + b * vocab, logits.begin() + (b + 1) * vocab);
  }
  return logits;
}

absl::Status Model::DecodeKernels(const DecodeBatch& step, const int32_t* ids, int64_t rows) {
  RETURN_IF_ERROR(EmbedOnDevice(ids, rows));
  ASSIGN_OR_RETURN(float* hidden, workspace_->Get<float>(kHidden, rows * config_.hidden_size));
  ASSIGN_OR_RETURN(float* normed, workspace_->Get<float>(kNormed, rows * config_.hidden_size));
  for (size_t i = 0; i < runners_.size(); ++i) {
    const float* norm = device_weights_->layer(static_cast<int64_t>(i)).norm;
    if (norm != nullptr) RETURN_IF_ERROR(NormRows(norm, hidden, normed, rows));
    RETURN_IF_ERROR(runners_[i]->Decode(step, norm != nullptr ? normed : hidden, hidden));
  }
  return LogitsOnDevice(0, rows).status();
}

absl::Status Model::DecodeThroughGraph(const DecodeBatch& step, const int32_t* ids, int64_t rows) {
  // A graph names workspace buffers by address: once one has moved, every
  // graph is stale.
  if (workspace_->generation() != graphs_workspace_generation_) {
    ReleaseDecodeGraphs();
    graphs_workspace_generation_ = workspace_->generation();
  }
  const std::pair<int64_t, int64_t> key(rows, step.block_table_stride);
  if (const auto it = decode_graphs_.find(key); it != decode_graphs_.end()) {
    if (it->second < 0) return DecodeKernels(step, ids, rows);  // recording failed once: no graph for this bucket
    return KernelStatusToStatus(backend_->Replay(it->second), "replaying the decode graph");
  }
  if (decode_buckets_seen_.insert(key).second) {
    // First step of this bucket: run it directly; this also grows the
    // workspace to the bucket's sizes, so the capture below allocates nothing.
    RETURN_IF_ERROR(DecodeKernels(step, ids, rows));
    if (workspace_->generation() != graphs_workspace_generation_) {
      ReleaseDecodeGraphs();  // the buffers other buckets' graphs named have moved
      graphs_workspace_generation_ = workspace_->generation();
      decode_buckets_seen_.insert(key);
    }
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(KernelStatusToStatus(backend_->BeginCapture(), "starting a decode graph capture"));
  const absl::Status recorded = DecodeKernels(step, ids, rows);
  int64_t graph = -1;
  const int ended = backend_->EndCapture(&graph);
  if (!recorded.ok() || ended != kernels::kKernelOk) {
    // Nothing ran: do the step directly, and leave this bucket without a graph.
    LOG(WARNING) << "decode graph for " << rows << " rows could not be recorded ("
                 << (recorded.ok() ? kernels::KernelStatusName(ended) : recorded.ToString())
                 << "): this bucket runs kernel by kernel";
    decode_graphs_[key] = -1;
    return DecodeKernels(step, ids, rows);
  }
  decode_graphs_[key] = graph;
  return KernelStatusToStatus(backend_->Replay(graph), "replaying the decode graph");
}

}  // namespace hybridserve::engine
