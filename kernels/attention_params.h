#ifndef HYBRIDSERVE_KERNELS_ATTENTION_PARAMS_H_
#define HYBRIDSERVE_KERNELS_ATTENTION_PARAMS_H_

#include <cstdint>

#include "kernels/kernel_status.h"

namespace hybridserve::kernels {

// One attention layer's paged KV pools. Logical page j of a sequence (keys at
// absolute positions [j * page_size, (j + 1) * page_size)) lives in physical page
// block_table[j]. K and V have the same layout.
struct PagedKvCache {
  float* k = nullptr;  // [num_pages, page_size, n_kv_heads, head_dim]
  float* v = nullptr;  // [num_pages, page_size, n_kv_heads, head_dim]
  int64_t num_pages = 0;
  int64_t page_size = 0;  // tokens per page
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
};

// Both pools set and every shape >= 1.
inline bool ValidPagedKvCache(const PagedKvCache& c) {
  return c.k != nullptr && c.v != nullptr && c.num_pages > 0 && c.page_size > 0 && c.n_kv_heads > 0 && c.head_dim > 0;
}

// Pages holding positions [0, n_tokens) at page_size tokens per page (page_size >= 1).
inline int64_t PagedKvPagesFor(int64_t n_tokens, int64_t page_size) { return (n_tokens + page_size - 1) / page_size; }

// The attention checks below cover the host-visible fields, those every
// backend checks before a kernel runs (kKernelInvalidArgument, nothing
// written). Block tables and seq_lens are device memory: each backend checks
// their entries its own way (kernels/cpu rejects the call; kernels/cuda skips
// the token or query and raises its error flag).

// Writes the K and V of tokens at positions [start_pos, start_pos + n_tokens)
// of one sequence into its pages.
struct KvAppendParams {
  PagedKvCache cache;
  const float* k = nullptr;              // [n_tokens, n_kv_heads, head_dim], token stride k_token_stride
  const float* v = nullptr;              // [n_tokens, n_kv_heads, head_dim], token stride v_token_stride
  const int32_t* block_table = nullptr;  // [>= ceil((start_pos + n_tokens) / page_size)]
  int64_t start_pos = 0;
  int64_t n_tokens = 0;
  int64_t k_token_stride = 0;  // 0: n_kv_heads * head_dim
  int64_t v_token_stride = 0;  // 0: n_kv_heads * head_dim
};

inline KernelStatus CheckKvAppendParams(const KvAppendParams& p) {
  const PagedKvCache& c = p.cache;
  if (!ValidPagedKvCache(c) || p.start_pos < 0 || p.n_tokens < 0 ||
      (p.n_tokens > 0 && (p.k == nullptr || p.v == nullptr)) ||
      (PagedKvPagesFor(p.start_pos + p.n_tokens, c.page_size) > 0 && p.block_table == nullptr)) {
    return kKernelInvalidArgument;
  }
  return kKernelOk;
}

// Writes one token's K and V for each sequence of a decode batch, at position
// seq_lens[b] - 1.
struct KvAppendDecodeParams {
  PagedKvCache cache;
  const float* k = nullptr;               // [batch, n_kv_heads, head_dim], row stride k_batch_stride
  const float* v = nullptr;               // [batch, n_kv_heads, head_dim], row stride v_batch_stride
  const int32_t* block_tables = nullptr;  // [batch, block_table_stride]
  const int32_t* seq_lens = nullptr;      // [batch], tokens including the new one (>= 1)
  int64_t batch = 0;
  int64_t block_table_stride = 0;  // entries per row of block_tables
  int64_t k_batch_stride = 0;      // 0: n_kv_heads * head_dim
  int64_t v_batch_stride = 0;      // 0: n_kv_heads * head_dim
};

inline KernelStatus CheckKvAppendDecodeParams(const KvAppendDecodeParams& p) {
  if (!ValidPagedKvCache(p.cache) || p.batch < 0 ||
      (p.batch > 0 && (p.k == nullptr || p.v == nullptr || p.seq_lens == nullptr || p.block_tables == nullptr))) {
    return kKernelInvalidArgument;
  }
  return kKernelOk;
}

// Causal grouped-query attention. Query head h reads KV head
// h / (n_heads / n_kv_heads). The reduction over keys is an online softmax over
// key blocks of page_size keys aligned to absolute positions, always from key 0
// upward, with one fixed arithmetic per query: a query's output bits depend only
// on its position, its query vector and the keys/values at positions <= its own,
// never on the batch, the other queries of the call, where a prefill segment
// started, the physical page placement or the thread count. Decode and prefill
// share that arithmetic, so decoding position t gives the bits of prefill row t.

// Prefill: queries of one sequence at positions [start_pos, start_pos + n_tokens),
// attending to keys [0, position] each. Their K/V must already be in the pages
// (KvAppend first).
struct AttentionPrefillParams {
  PagedKvCache cache;                    // read only
  const float* q = nullptr;              // [n_tokens, n_heads, head_dim], token stride q_token_stride
  float* out = nullptr;                  // [n_tokens, n_heads, head_dim], token stride out_token_stride
  const int32_t* block_table = nullptr;  // [>= ceil((start_pos + n_tokens) / page_size)]
  int64_t start_pos = 0;
  int64_t n_tokens = 0;
  int64_t n_heads = 0;           // multiple of cache.n_kv_heads
  float scale = 0.0f;            // softmax scale; 0: 1 / sqrt(head_dim)
  int64_t q_token_stride = 0;    // 0: n_heads * head_dim
  int64_t out_token_stride = 0;  // 0: n_heads * head_dim
};

inline KernelStatus CheckAttentionPrefillParams(const AttentionPrefillParams& p) {
  const PagedKvCache& c = p.cache;
  if (!ValidPagedKvCache(c) || p.start_pos < 0 || p.n_tokens < 0 || p.n_heads <= 0 || p.n_heads % c.n_kv_heads != 0 ||
      !(p.scale >= 0.0f) || (p.n_tokens > 0 && (p.q == nullptr || p.out == nullptr)) ||
      (PagedKvPagesFor(p.start_pos + p.n_tokens, c.page_size) > 0 && p.block_table == nullptr)) {
    return kKernelInvalidArgument;
  }
  return kKernelOk;
}

// Decode: one query per sequence, sequence b at position seq_lens[b] - 1,
// attending to keys [0, seq_lens[b]). Its K/V must already be appended.
struct AttentionDecodeParams {
  PagedKvCache cache;                     // read only
  const float* q = nullptr;               // [batch, n_heads, head_dim], row stride q_batch_stride
  float* out = nullptr;                   // [batch, n_heads, head_dim], row stride out_batch_stride
  const int32_t* block_tables = nullptr;  // [batch, block_table_stride]
  const int32_t* seq_lens = nullptr;      // [batch], >= 1
  int64_t batch = 0;
  int64_t n_heads = 0;
  int64_t block_table_stride = 0;
  float scale = 0.0f;            // 0: 1 / sqrt(head_dim)
  int64_t q_batch_stride = 0;    // 0: n_heads * head_dim
  int64_t out_batch_stride = 0;  // 0: n_heads * head_dim
};

inline KernelStatus CheckAttentionDecodeParams(const AttentionDecodeParams& p) {
  const PagedKvCache& c = p.cache;
  if (!ValidPagedKvCache(c) || p.batch < 0 || p.n_heads <= 0 || p.n_heads % c.n_kv_heads != 0 || !(p.scale >= 0.0f) ||
      (p.batch > 0 && (p.q == nullptr || p.out == nullptr || p.seq_lens == nullptr || p.block_tables == nullptr))) {
    return kKernelInvalidArgument;
  }
  return kKernelOk;
}

// Rotary position embedding, rotate-half (GPT-NeoX / Llama) convention, in place
// on the first rotary_dim dims of each head: for i < rotary_dim / 2, with
// angle = pos * theta^(-2i / rotary_dim) (computed in double, rounded to fp32 cos/sin):
//   x[i]                 <- x[i] * cos - x[i + rotary_dim/2] * sin
//   x[i + rotary_dim/2]  <- x[i + rotary_dim/2] * cos + x[i] * sin
struct RopeParams {
  float* x = nullptr;                  // [n_tokens, n_heads, head_dim], token stride x_token_stride; in place
  const int64_t* positions = nullptr;  // [n_tokens]; null: start_pos + t
  int64_t start_pos = 0;
  int64_t n_tokens = 0;
  int64_t n_heads = 0;
  int64_t head_dim = 0;
  int64_t rotary_dim = 0;  // even, <= head_dim; 0: head_dim
  double theta = 10000.0;
  int64_t x_token_stride = 0;  // 0: n_heads * head_dim
};

// kKernelInvalidArgument for a null x, a negative n_tokens, n_heads or
// head_dim < 1, a resolved rotary_dim that is odd, < 1 or > head_dim, or
// theta <= 0 (or NaN).
inline KernelStatus CheckRopeParams(const RopeParams& p) {
  const int64_t rot = p.rotary_dim ? p.rotary_dim : p.head_dim;
  if (p.x == nullptr || p.n_tokens < 0 || p.n_heads <= 0 || p.head_dim <= 0 || rot <= 0 || rot % 2 != 0 ||
      rot > p.head_dim || !(p.theta > 0.0)) {
    return kKernelInvalidArgument;
  }
  return kKernelOk;
}

}  // namespace hybridserve::kernels

#endif  // HYBRIDSERVE_KERNELS_ATTENTION_PARAMS_H_
