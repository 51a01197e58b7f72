#ifndef HYBRIDSERVE_ENGINE_MODEL_H_
#define HYBRIDSERVE_ENGINE_MODEL_H_

// One instance of a hybrid Mamba2 + attention + MLP model on one backend
// (kernels/backend.h: the CPU, or a device), with the state of up to
// `max_sequences` sequences: prefill (with grid checkpoints) and batched
// decode. The sequences' bookkeeping, sharing, import and export live in its
// SequenceTable (engine/sequence_table.h); the Model is the forward pass.
//
// Block structure (Nemotron-H and Mamba2 alike): h = embed(tokens); per layer
// h = h + mixer(RMSNorm(h)); logits = lm_head(RMSNorm_f(h)). The mixers are
// LayerRunners (engine/layer_runner.h), one per LayerKind.
//
// Determinism (docs/ARCHITECTURE.md sections 3 and 6):
//  - Prefill splits [pos, pos + n) into segments at every absolute multiple of
//    checkpoint_interval and of max_segment_tokens, and runs all layers over a
//    segment before the next. A cold prefill of [0, P) and a prefill of [q, P)
//    resumed from the grid checkpoint at q therefore issue identical kernel
//    calls for every segment after q: contract 1 holds bit for bit in both
//    matmul modes. Likewise a restored exact-prefix snapshot continues exactly
//    as the sequence it was captured from (contract 2).
//  - In MatmulMode::kDeterministic every kernel computes a row independently
//    of the others, so a sequence's decode logits do not depend on the rest of
//    the batch, and a prefill's results do not depend on its segmenting except
//    through the SSM scan's chunk grid (which is absolute).
//  - The one-step decode recurrence and the chunk scan round differently, so
//    decoding tokens and prefilling the same tokens agree within tolerance, not
//    bit for bit.
//
// Errors: every documented error leaves every sequence unchanged. INTERNAL
// (a kernel rejected its inputs: an engine bug) may leave the sequence it
// occurred in half-updated; release that sequence.
//
// Not thread-safe: the owner serializes every call (the CPU backend runs
// kernels on an internal pool of num_threads threads).

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/tokens.h"
#include "engine/backend_registry.h"
#include "engine/model_config.h"
#include "engine/model_weights.h"
#include "engine/sequence_state.h"
#include "engine/sequence_table.h"
#include "engine/state_layout.h"
#include "kernels/backend.h"
#include "kernels/matmul_params.h"

namespace hybridserve::engine {

using ::hybridserve::TokenId;

class DeviceWeights;
class LayerRunner;   // engine/layer_runner.h (internal)
struct DecodeBatch;  // engine/layer_runner.h (internal)
class Workspace;

struct ModelOptions {
  // Tokens per KV page: a power of two (common/tokens.h), smaller than the
  // chunk size or not. 0: min(16, chunk_size).
  int64_t page_size = 0;
  // KV pages shared by all sequences (a page holds page_size tokens of every attention layer).
  int64_t max_pages = 1024;
  // State slots: sequences alive at once.
  int64_t max_sequences = 8;
  kernels::MatmulMode matmul_mode = kernels::MatmulMode::kDeterministic;
  int num_threads = 2;  // CPU backend: kernel threads, the calling thread included
  // Grid checkpoint spacing in tokens, a multiple of the chunk size. 0: 4 * chunk_size.
  int64_t checkpoint_interval = 0;
  // Longest prefill segment in tokens, a multiple of the chunk size (segments
  // are also cut at its absolute multiples). 0: the multiple of chunk_size
  // nearest 2048 from below (at least chunk_size).
  int64_t max_segment_tokens = 0;
  // Where the model runs (engine/backend_registry.h): UNIMPLEMENTED from
  // Create when that backend is not compiled in or no device is present.
  Device device = Device::kCpu;
  int device_index = 0;  // CUDA: which GPU
  // On a backend with graphs (CUDA): each decode step pads its batch to a
  // bucket (1, 2, 4, ..., 256 sequences; block tables to a power-of-two width)
  // and replays a graph recorded for that bucket: the first step of a bucket
  // runs kernel by kernel (and sizes the workspace), the second records the
  // graph, later ones replay it. Padding rows read and write only a reserved
  // scratch page (one page more than max_pages is allocated) and no state
  // slot; with deterministic matmuls the logits are the bits of an unpadded
  // step. A workspace that grows (a longer prefill) drops the graphs. False:
  // every step is issued kernel by kernel. Ignored on the CPU.
  bool decode_graphs = true;
  // Optional: run on this backend instead of one made for `device` (tests
  // wrap one to observe it). Must outlive the model; null: the model makes
  // and owns its backend.
  kernels::Backend* backend = nullptr;
};

struct PrefillOptions {
  // Return the logits of every prefilled token ([n_tokens, vocab]) instead of
  // only the last one's ([vocab]).
  bool all_logits = false;
  // Return the grid checkpoints crossed (see PrefillResult::checkpoints).
  bool emit_checkpoints = false;
  // Polled before every segment but the first (segments end at multiples of
  // checkpoint_interval and max_segment_tokens): once it returns true the
  // prefill stops with CANCELLED. Null: never.
  std::function<bool()> cancelled;
};

struct PrefillResult {
  std::vector<float> logits;  // [vocab], or [n_tokens, vocab] with all_logits
  // With emit_checkpoints: for every multiple q of checkpoint_interval with
  // pos < q <= pos + n, ascending, the state at q (SSM and conv states; no
  // tail KV since q is on a page boundary; no logits). Its KV pages
  // [0, q / page_size) are the sequence's (ExportPage).
  std::vector<SequenceState> checkpoints;
};

class Model {
 public:
  // `weights` must outlive the model; `config` must describe it (the same
  // CanonicalString, else INVALID_ARGUMENT). INVALID_ARGUMENT for options that
  // break the grid rules above or are non-positive; UNIMPLEMENTED for a layer
  // feature this engine cannot run, or a device this build cannot use;
  // RESOURCE_EXHAUSTED when the device cannot hold the weights and pools.
  static absl::StatusOr<std::unique_ptr<Model>> Create(const ModelConfig& config, const ModelWeights& weights,
                                                       const ModelOptions& options);

  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;
  ~Model();

  // ---- The forward pass ----

  // Appends `tokens` at the sequence's position and returns logits (see
  // PrefillOptions). CANCELLED (options.cancelled) is the one error that
  // leaves the sequence changed: advanced to the end of the last segment run,
  // with no last logits (release it, or prefill the rest). Other errors leave
  // every sequence unchanged: NOT_FOUND for an
  // unknown id; FAILED_PRECONDITION for a sequence still importing;
  // INVALID_ARGUMENT for no tokens, an id outside [0, vocab) or a sequence
  // longer than 2^31 - 1 tokens; RESOURCE_EXHAUSTED when the KV pages needed
  // are not free.
  absl::StatusOr<PrefillResult> Prefill(SequenceId id, absl::Span<const TokenId> tokens,
                                        const PrefillOptions& options = {});

  // One token for each of `ids` (distinct live sequences of any positions),
  // with the one-step kernels; returns logits [ids.size(), vocab] in the order
  // of `ids`. Errors leave every sequence unchanged: NOT_FOUND for an unknown
  // id; FAILED_PRECONDITION for a sequence still importing; INVALID_ARGUMENT
  // for an empty batch, sizes that differ, a repeated id or a token outside
  // [0, vocab); RESOURCE_EXHAUSTED when the new pages needed by the batch are
  // not free.
  absl::StatusOr<std::vector<float>> DecodeStep(absl::Span<const SequenceId> ids, absl::Span<const TokenId> tokens);

  // ---- Sequences ----

  // The one way to this model's sequences: their bookkeeping (New, Release,
  // Fork, Position, free pages and slots), state capture and restore, and
  // page import and export (engine/sequence_table.h).
  SequenceTable& sequences() { return *sequences_; }
  const SequenceTable& sequences() const { return *sequences_; }

  const ModelConfig& config() const { return config_; }
  // The options with every default resolved (`backend` is the one in use).
  const ModelOptions& options() const { return options_; }
  const StateLayout& layout() const { return sequences_->layout(); }
  kernels::Backend& backend() const { return *backend_; }
  int64_t page_size() const { return options_.page_size; }
  int64_t page_bytes() const { return layout().page_bytes(); }
  int64_t num_mamba_layers() const { return layout().mamba_layers; }
  int64_t num_attention_layers() const { return layout().attention_layers; }

 private:
  using Sequence = SequenceTable::Sequence;

  Model(const ModelConfig& config, const ModelOptions& options);

  absl::Status CheckTokens(absl::Span<const TokenId> tokens) const;
  // Runs every layer over tokens [start, start + n) of `seq`, whose KV pages
  // exist; leaves the final hidden states in the kHidden workspace buffer.
  absl::Status RunSegment(Sequence& seq, const TokenId* tokens, int64_t start, int64_t n);
  // The ends of the segments of [begin, end) (see the file comment).
  std::vector<int64_t> SegmentEnds(int64_t begin, int64_t end) const;
  // logits[r] = lm_head(norm_f(hidden[first_row + r])) for r < n_rows, copied to the host.
  absl::Status Logits(int64_t first_row, int64_t n_rows, float* logits);
  // hidden[t] = embeddings[tokens[t]] for t < n (device workspace).
  absl::Status Embed(const TokenId* tokens, int64_t n);
  // The same from token ids already in device memory.
  absl::Status EmbedOnDevice(const int32_t* ids, int64_t n);
  // normed = RMSNorm(hidden) * weight over n rows.
  absl::Status NormRows(const float* weight, const float* in, float* out, int64_t n);
  // x[0, count) *= alpha in place (no-op for 1): the μP multipliers.
  absl::Status Scale(float* x, int64_t count, float alpha, const char* what);
  // The kernels of Logits() without the copy: the device rows of logits.
  absl::StatusOr<const float*> LogitsOnDevice(int64_t first_row, int64_t n_rows);
  // The kernels of one decode step over `rows` rows whose index arrays and
  // token ids are uploaded (step, ids): embedding, every layer, the final norm
  // and the LM head, leaving the logits in the kLogits workspace buffer. Host
  // copies and allocations never happen here, so it can be recorded as a graph.
  absl::Status DecodeKernels(const DecodeBatch& step, const int32_t* ids, int64_t rows);
  // Runs DecodeKernels through the bucket's graph (decode_graphs): replays it,
  // records it, or runs eagerly the first time.
  absl::Status DecodeThroughGraph(const DecodeBatch& step, const int32_t* ids, int64_t rows);
  void ReleaseDecodeGraphs();

  const ModelConfig config_;
  ModelOptions options_;
  std::unique_ptr<kernels::Backend> owned_backend_;  // null when options.backend was given
  kernels::Backend* backend_ = nullptr;
  std::unique_ptr<DeviceWeights> device_weights_;
  std::unique_ptr<SequenceTable> sequences_;
  std::unique_ptr<Workspace> workspace_;
  std::vector<std::unique_ptr<LayerRunner>> runners_;  // [num_layers]

  // Decode graphs (ModelOptions::decode_graphs), keyed by (rows, block-table width).
  bool use_decode_graphs_ = false;
  int32_t scratch_page_ = -1;  // the padding rows' page (models with attention)
  absl::flat_hash_map<std::pair<int64_t, int64_t>, int64_t> decode_graphs_;
  absl::flat_hash_set<std::pair<int64_t, int64_t>> decode_buckets_seen_;
  int64_t graphs_workspace_generation_ = 0;
};

}  // namespace hybridserve::engine

#endif  // HYBRIDSERVE_ENGINE_MODEL_H_
