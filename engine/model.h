#ifndef HYBRIDSERVE_ENGINE_MODEL_H_
#define HYBRIDSERVE_ENGINE_MODEL_H_

// One instance of a hybrid Mamba2 + attention + MLP model on the CPU backend,
// with the state of up to `max_sequences` sequences: prefill (with grid
// checkpoints), batched decode, and state capture / restore for the cache.
//
// Block structure (Nemotron-H and Mamba2 alike): h = embed(tokens); per layer
// h = h + mixer(RMSNorm(h)); logits = lm_head(RMSNorm_f(h)). The mixers are
// LayerRunners (engine/layer_runner.h), one per LayerKind.
//
// Determinism (DESIGN.md sections 4 and 5):
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
// Not thread-safe: the owner serializes every call (the kernels use an
// internal pool of num_threads threads).

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "engine/kv_page_pool.h"
#include "engine/model_config.h"
#include "engine/model_weights.h"
#include "engine/sequence_state.h"
#include "engine/state_slot_pool.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/matmul_params.h"

namespace hybridserve::engine {

using TokenId = int32_t;
using SequenceId = int64_t;

class LayerRunner;  // engine/layer_runner.h (internal)
class Workspace;

struct ModelOptions {
  // Tokens per KV page: a power of two dividing the chunk size. 0: min(16, chunk_size).
  int64_t page_size = 0;
  // KV pages shared by all sequences (a page holds page_size tokens of every attention layer).
  int64_t max_pages = 1024;
  // State slots: sequences alive at once.
  int64_t max_sequences = 8;
  kernels::MatmulMode matmul_mode = kernels::MatmulMode::kDeterministic;
  int num_threads = 2;  // kernel threads, the calling thread included
  // Grid checkpoint spacing in tokens, a multiple of the chunk size. 0: 4 * chunk_size.
  int64_t checkpoint_interval = 0;
  // Longest prefill segment in tokens, a multiple of the chunk size (segments
  // are also cut at its absolute multiples). 0: the multiple of chunk_size
  // nearest 2048 from below (at least chunk_size).
  int64_t max_segment_tokens = 0;
};

struct PrefillOptions {
  // Return the logits of every prefilled token ([n_tokens, vocab]) instead of
  // only the last one's ([vocab]).
  bool all_logits = false;
  // Return the grid checkpoints crossed (see PrefillResult::checkpoints).
  bool emit_checkpoints = false;
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
  // feature this engine cannot run.
  static absl::StatusOr<std::unique_ptr<Model>> Create(const ModelConfig& config, const ModelWeights& weights,
                                                       const ModelOptions& options);

  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;
  ~Model();

  // A new empty sequence (position 0) holding one state slot;
  // RESOURCE_EXHAUSTED when all max_sequences slots are taken.
  absl::StatusOr<SequenceId> NewSequence();
  // Frees the sequence's slot and pages; NOT_FOUND for an unknown id.
  absl::Status ReleaseSequence(SequenceId id);

  // Appends `tokens` at the sequence's position and returns logits (see
  // PrefillOptions). Errors leave every sequence unchanged: NOT_FOUND for an
  // unknown id; INVALID_ARGUMENT for no tokens, an id outside [0, vocab) or a
  // sequence longer than 2^31 - 1 tokens;
  // RESOURCE_EXHAUSTED when the KV pages needed are not free.
  absl::StatusOr<PrefillResult> Prefill(SequenceId id, absl::Span<const TokenId> tokens,
                                        const PrefillOptions& options = {});

  // One token for each of `ids` (distinct sequences of any positions), with
  // the one-step kernels; returns logits [ids.size(), vocab] in the order of
  // `ids`. Errors leave every sequence unchanged: NOT_FOUND for an unknown id;
  // INVALID_ARGUMENT for an empty batch, sizes that differ, a repeated id or
  // a token outside [0, vocab); RESOURCE_EXHAUSTED when the new pages needed
  // by the batch are not free.
  absl::StatusOr<std::vector<float>> DecodeStep(absl::Span<const SequenceId> ids, absl::Span<const TokenId> tokens);

  // The exact-prefix state at the sequence's position: SSM and conv states,
  // K/V of the partial last page and, when `with_logits`, the last token's
  // logits if the sequence has them (empty otherwise: position 0, or restored
  // without logits). NOT_FOUND for an unknown id.
  absl::StatusOr<SequenceState> CaptureState(SequenceId id, bool with_logits) const;

  // Restores an empty sequence (position 0, fresh from NewSequence) to
  // `state`: `pages` are the bytes of its full pages [0, position / page_size)
  // in order (as ExportPage writes them; a model without attention layers may
  // pass none). All or nothing: NOT_FOUND for an unknown id;
  // FAILED_PRECONDITION if the sequence is not empty; INVALID_ARGUMENT,
  // naming the array, for any shape or size that does not match the model;
  // RESOURCE_EXHAUSTED when the pages needed are not free.
  absl::Status RestoreState(SequenceId id, const SequenceState& state, absl::Span<const absl::string_view> pages);

  // The bytes of full page `page_index` (tokens [page_index * page_size,
  // (page_index + 1) * page_size)) of a sequence: for each attention layer in
  // model order, K then V, each [page_size, n_kv_heads, head_dim] fp32 in host
  // byte order; page_bytes() in all (empty for a model without attention).
  // NOT_FOUND for an unknown id; OUT_OF_RANGE unless the page is full
  // (page_index < position / page_size).
  absl::StatusOr<std::string> ExportPage(SequenceId id, int64_t page_index) const;

  // Tokens processed by the sequence; NOT_FOUND for an unknown id.
  absl::StatusOr<int64_t> Position(SequenceId id) const;

  const ModelConfig& config() const { return config_; }
  // The options with every default resolved.
  const ModelOptions& options() const { return options_; }
  int64_t page_size() const { return options_.page_size; }
  int64_t page_bytes() const;
  int64_t num_mamba_layers() const { return state_slots_->num_layers(); }
  int64_t num_attention_layers() const { return kv_pages_->num_layers(); }
  int64_t num_free_pages() const { return kv_pages_->num_free(); }
  int64_t num_free_sequences() const { return state_slots_->num_free(); }

 private:
  struct Sequence {
    int32_t slot = -1;
    std::vector<int32_t> block_table;  // KV page ids of pages [0, ceil(position / page_size))
    int64_t position = 0;
    std::vector<float> last_logits;  // [vocab] or empty
  };

  Model(const ModelConfig& config, const ModelWeights& weights, const ModelOptions& options);

  absl::StatusOr<Sequence*> Find(SequenceId id);
  absl::StatusOr<const Sequence*> Find(SequenceId id) const;
  absl::Status CheckTokens(absl::Span<const TokenId> tokens) const;
  // KV pages needed to hold `positions` tokens (0 for a model without attention).
  int64_t PagesFor(int64_t positions) const;
  // Grows the sequence's block table to hold `positions` tokens.
  absl::Status EnsurePages(Sequence& seq, int64_t positions);

  // Runs every layer over tokens [start, start + n) of `seq`, whose KV pages
  // exist; leaves the final hidden states in hidden_.
  absl::Status RunSegment(Sequence& seq, const TokenId* tokens, int64_t start, int64_t n);
  // The ends of the segments of [begin, end) (see the file comment).
  std::vector<int64_t> SegmentEnds(int64_t begin, int64_t end) const;
  // logits[r] = lm_head(norm_f(hidden_[first_row + r])) for r < n_rows.
  absl::Status Logits(int64_t first_row, int64_t n_rows, float* logits);
  void Embed(const TokenId* tokens, int64_t n);
  SequenceState CaptureSsm(const Sequence& seq, int64_t position) const;

  const ModelConfig config_;
  const ModelWeights& weights_;
  ModelOptions options_;
  std::unique_ptr<kernels::cpu::ThreadPool> pool_;
  std::unique_ptr<KvPagePool> kv_pages_;
  std::unique_ptr<StateSlotPool> state_slots_;
  std::unique_ptr<Workspace> workspace_;
  std::vector<std::unique_ptr<LayerRunner>> runners_;  // [num_layers]

  absl::flat_hash_map<SequenceId, Sequence> sequences_;
  SequenceId next_id_ = 1;

  // Scratch of the block loop: [rows, hidden] each.
  std::vector<float> hidden_;
  std::vector<float> normed_;
};

}  // namespace hybridserve::engine

#endif  // HYBRIDSERVE_ENGINE_MODEL_H_
