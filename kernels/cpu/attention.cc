#include "kernels/cpu/attention.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/attention_dot.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/simd.h"
#include "kernels/kernel_status.h"

namespace hybridserve::kernels::cpu {
namespace {

// Entries [0, n_entries) of a block table all name existing pages.
bool ValidPages(const int32_t* table, int64_t n_entries, int64_t num_pages) {
  if (n_entries > 0 && table == nullptr) return false;
  for (int64_t i = 0; i < n_entries; ++i) {
    if (table[i] < 0 || table[i] >= num_pages) return false;
  }
  return true;
}

float ResolvedScale(float scale, int64_t head_dim) {
  return scale != 0.0f ? scale : static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
}

// Online-softmax state of one query row.
struct RowState {
  float m = -std::numeric_limits<float>::infinity();
  float l = 0.0f;
  float* acc = nullptr;  // [head_dim]
};

// Tokens of one prefill task: a tile's pages are read once for all of them.
constexpr int64_t kPrefillTile = 16;
// The smallest tile after a long context (AttentionPrefill).
constexpr int64_t kMinLongContextTile = 4;

// Scratch of one thread.
struct AttnScratch {
  std::vector<float> acc;     // [tokens * group, head_dim]
  std::vector<float> scores;  // [kMaxBlockRows, ScoresStride(page_size)]
  std::vector<RowState> rows;
};

// Rows of one GQA group attended together (AttendBlock), at most.
constexpr int kMaxBlockRows = 8;

// Floats between two rows' scores in the scratch: the page size rounded up to 8.
int64_t ScoresStride(int64_t page_size) { return (page_size + 7) & ~int64_t{7}; }

// acc_r = acc_r * alpha_r, then acc_r[d] = fma(p_r[i], v_i[d], acc_r[d]) for
// the keys i in order, for R rows (row r's weights at scores + r * ld), over
// the dims from d0 in slabs of W vectors of 8 while a whole slab fits below
// D; returns the first dim it left. Each value vector loaded serves R rows,
// and each element sees exactly the operations of a lone row.
template <int R, int W>
int64_t AccumulateRows(RowState* rows, const float* alpha, const float* scores, int64_t ld, const float* vp,
                       int64_t token_stride, int64_t d0, int64_t D, int64_t count) {
  int64_t d = d0;
  for (; d + 8 * W <= D; d += 8 * W) {
    __m256 a[R][W];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const __m256 va = _mm256_set1_ps(alpha[r]);
#pragma unroll
      for (int w = 0; w < W; ++w) a[r][w] = _mm256_mul_ps(_mm256_loadu_ps(rows[r].acc + d + 8 * w), va);
    }
    for (int64_t i = 0; i < count; ++i) {
      const float* vrow = vp + i * token_stride + d;
      __m256 v[W];
#pragma unroll
      for (int w = 0; w < W; ++w) v[w] = _mm256_loadu_ps(vrow + 8 * w);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const __m256 si = _mm256_broadcast_ss(scores + r * ld + i);
#pragma unroll
        for (int w = 0; w < W; ++w) a[r][w] = _mm256_fmadd_ps(si, v[w], a[r][w]);
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
      for (int w = 0; w < W; ++w) _mm256_storeu_ps(rows[r].acc + d + 8 * w, a[r][w]);
    }
  }
  return d;
}

// AccumulateRows on 16-lane vectors (AVX-512, where ActiveKernelPath() has
// it): the same operations on each element, in the same order, so the same
// bits as the 8-lane version; twice the dims per instruction. Between the
// attribute pragmas only; nothing inline is shared with other files.
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq"))), \
                             apply_to = function)
template <int R, int W>
int64_t AccumulateRows16(RowState* rows, const float* alpha, const float* scores, int64_t ld, const float* vp,
                         int64_t token_stride, int64_t d0, int64_t D, int64_t count) {
  int64_t d = d0;
  for (; d + 16 * W <= D; d += 16 * W) {
    __m512 a[R][W];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const __m512 va = _mm512_set1_ps(alpha[r]);
#pragma unroll
      for (int w = 0; w < W; ++w) a[r][w] = _mm512_mul_ps(_mm512_loadu_ps(rows[r].acc + d + 16 * w), va);
    }
    for (int64_t i = 0; i < count; ++i) {
      const float* vrow = vp + i * token_stride + d;
      __m512 v[W];
#pragma unroll
      for (int w = 0; w < W; ++w) v[w] = _mm512_loadu_ps(vrow + 16 * w);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const __m512 si = _mm512_set1_ps(scores[r * ld + i]);
#pragma unroll
        for (int w = 0; w < W; ++w) a[r][w] = _mm512_fmadd_ps(si, v[w], a[r][w]);
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
      for (int w = 0; w < W; ++w) _mm512_storeu_ps(rows[r].acc + d + 16 * w, a[r][w]);
    }
  }
  return d;
}

#pragma clang attribute pop

// One page of keys for R rows of a GQA group (row r's query at q + r * D):
// scores, the online-softmax update of each row, then the weighted values.
// Every row gets the bits a lone row gets (ScoreKeysRows, AccumulateRows).
template <int R>
void AttendBlock(const float* q, const float* kp, const float* vp, int64_t token_stride, int64_t D, int64_t count,
                 float scale, RowState* rows, float* scores_base, int64_t ld, bool wide) {
  attention_internal::ScoreKeysRows<R>(q, D, kp, token_stride, D, count, scale, scores_base, ld);
  // The rows' maxima and running sums go key by key for all R rows at once:
  // R independent chains the core overlaps, each in a lone row's order (its
  // bits), instead of one row's chain of dependent adds after another.
  float m_blk[R];
  for (int r = 0; r < R; ++r) m_blk[r] = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < count; ++i) {
#pragma unroll
    for (int r = 0; r < R; ++r) m_blk[r] = std::max(m_blk[r], scores_base[r * ld + i]);
  }
  float alpha[R];
  float l[R];
  for (int r = 0; r < R; ++r) {
    RowState& row = rows[r];
    float* scores = scores_base + r * ld;
    const float m_new = std::max(row.m, m_blk[r]);
    const __m256 vm = _mm256_set1_ps(m_new);
    alpha[r] = _mm256_cvtss_f32(simd::Exp(_mm256_set1_ps(row.m - m_new)));
    for (int64_t i = 0; i < count; i += 8) {
      const __m256 sv = simd::LoadPartial(scores + i, count - i);
      simd::StorePartial(scores + i, simd::Exp(_mm256_sub_ps(sv, vm)), count - i);
    }
    l[r] = row.l * alpha[r];
    row.m = m_new;
  }
  for (int64_t i = 0; i < count; ++i) {
#pragma unroll
    for (int r = 0; r < R; ++r) l[r] = l[r] + scores_base[r * ld + i];
  }
  for (int r = 0; r < R; ++r) rows[r].l = l[r];
  // Two vectors a row while R x 2 accumulators fit the registers.
  constexpr int kSlab = R <= 4 ? 2 : 1;
  int64_t d = 0;
  if (wide) d = AccumulateRows16<R, kSlab>(rows, alpha, scores_base, ld, vp, token_stride, d, D, count);
  d = AccumulateRows<R, kSlab>(rows, alpha, scores_base, ld, vp, token_stride, d, D, count);
  d = AccumulateRows<R, 1>(rows, alpha, scores_base, ld, vp, token_stride, d, D, count);
  for (int r = 0; r < R; ++r) {
    const float* scores = scores_base + r * ld;
    for (int64_t e = d; e < D; ++e) {
      float acc = rows[r].acc[e] * alpha[r];
      for (int64_t i = 0; i < count; ++i) acc = std::fma(scores[i], vp[i * token_stride + e], acc);
      rows[r].acc[e] = acc;
    }
  }
}

// Attends the `group` query heads of one KV head at `tokens` consecutive
// positions: row (t, g) is query head g of token t (at q + t * q_stride +
// g * head_dim), attends keys [0, first_n_keys + t) and writes out + t *
// out_stride + g * head_dim. Pages are the outer loop and the tokens of the
// tile the inner one, so a page's keys and values are read from memory once
// per tile instead of once per token; each row still sees the pages in order
// with exactly the operations a lone row performs, so its output has the same
// bits whatever the tile (decode is the one-token tile).
void AttendTile(const PagedKvCache& cache, const int32_t* block_table, int64_t kv_head, const float* q,
                int64_t q_stride, int64_t group, int64_t tokens, int64_t first_n_keys, float scale, float* out,
                int64_t out_stride, AttnScratch& s, bool wide) {
  const int64_t D = cache.head_dim;
  const int64_t token_stride = cache.n_kv_heads * D;
  const int64_t page_stride = cache.page_size * token_stride;
  const int64_t n_rows = tokens * group;
  s.acc.assign(n_rows * D, 0.0f);
  const int64_t ld = ScoresStride(cache.page_size);
  s.scores.resize(kMaxBlockRows * ld);
  s.rows.assign(n_rows, RowState{});
  for (int64_t r = 0; r < n_rows; ++r) s.rows[r].acc = s.acc.data() + r * D;

  const int64_t n_blocks = PagedKvPagesFor(first_n_keys + tokens - 1, cache.page_size);
  for (int64_t b = 0; b < n_blocks; ++b) {
    const int64_t page_offset = block_table[b] * page_stride + kv_head * D;
    const float* kp = cache.k + page_offset;
    const float* vp = cache.v + page_offset;
    for (int64_t t = 0; t < tokens; ++t) {
      const int64_t n_keys = first_n_keys + t;
      if (b * cache.page_size >= n_keys) continue;  // this page is past the row's last key
      const int64_t count = std::min(cache.page_size, n_keys - b * cache.page_size);
      // The group's rows share this page's keys and values: in blocks of R
      // rows (8, 4, 2, 1) each key and value vector loaded serves R rows.
      for (int64_t g = 0; g < group;) {
        const int64_t left = group - g;
        const int R = left >= 8 ? 8 : left >= 4 ? 4 : left >= 2 ? 2 : 1;
        RowState* rows = &s.rows[t * group + g];
        const float* qg = q + t * q_stride + g * D;
        switch (R) {
          case 8:
            AttendBlock<8>(qg, kp, vp, token_stride, D, count, scale, rows, s.scores.data(), ld, wide);
            break;
          case 4:
            AttendBlock<4>(qg, kp, vp, token_stride, D, count, scale, rows, s.scores.data(), ld, wide);
            break;
          case 2:
            AttendBlock<2>(qg, kp, vp, token_stride, D, count, scale, rows, s.scores.data(), ld, wide);
            break;
          default:
            AttendBlock<1>(qg, kp, vp, token_stride, D, count, scale, rows, s.scores.data(), ld, wide);
        }
        g += R;
      }
    }
  }
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t g = 0; g < group; ++g) {
      const RowState& r = s.rows[t * group + g];
      float* o = out + t * out_stride + g * D;
      for (int64_t d = 0; d < D; ++d) o[d] = r.acc[d] / r.l;
    }
  }
}

void CopyTokenKv(const PagedKvCache& c, int32_t page, int64_t slot, const float* k, const float* v) {
  const int64_t n = c.n_kv_heads * c.head_dim;
  const int64_t offset = (page * c.page_size + slot) * n;
  std::memcpy(c.k + offset, k, n * sizeof(float));
  std::memcpy(c.v + offset, v, n * sizeof(float));
}

}  // namespace

int KvAppend(const KvAppendParams& p, ThreadPool* pool) {
  const PagedKvCache& c = p.cache;
  if (const int status = CheckKvAppendParams(p); status != kKernelOk) return status;
  if (!ValidPages(p.block_table, PagedKvPagesFor(p.start_pos + p.n_tokens, c.page_size), c.num_pages)) {
    return kKernelInvalidArgument;
  }
  const int64_t ks = p.k_token_stride ? p.k_token_stride : c.n_kv_heads * c.head_dim;
  const int64_t vs = p.v_token_stride ? p.v_token_stride : c.n_kv_heads * c.head_dim;
  ParallelFor(pool, p.n_tokens, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t pos = p.start_pos + t;
      CopyTokenKv(c, p.block_table[pos / c.page_size], pos % c.page_size, p.k + t * ks, p.v + t * vs);
    }
  });
  return kKernelOk;
}

int KvAppendDecode(const KvAppendDecodeParams& p, ThreadPool* pool) {
  const PagedKvCache& c = p.cache;
  if (const int status = CheckKvAppendDecodeParams(p); status != kKernelOk) return status;
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t pages = PagedKvPagesFor(p.seq_lens[b], c.page_size);
    if (p.seq_lens[b] < 1 || pages > p.block_table_stride ||
        !ValidPages(p.block_tables + b * p.block_table_stride, pages, c.num_pages)) {
      return kKernelInvalidArgument;
    }
  }
  const int64_t ks = p.k_batch_stride ? p.k_batch_stride : c.n_kv_heads * c.head_dim;
  const int64_t vs = p.v_batch_stride ? p.v_batch_stride : c.n_kv_heads * c.head_dim;
  ParallelFor(pool, p.batch, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const int64_t pos = p.seq_lens[b] - 1;
      CopyTokenKv(c, p.block_tables[b * p.block_table_stride + pos / c.page_size], pos % c.page_size, p.k + b * ks,
                  p.v + b * vs);
    }
  });
  return kKernelOk;
}

int AttentionPrefill(const AttentionPrefillParams& p, ThreadPool* pool) {
  return AttentionPrefillOnPath(p, ActiveKernelPath(), pool);
}

int AttentionPrefillOnPath(const AttentionPrefillParams& p, KernelPath path, ThreadPool* pool) {
  // 16-lane value accumulation where the CPU has AVX-512 (the same bits).
  const bool wide = path != KernelPath::kAvx2;
  const PagedKvCache& c = p.cache;
  if (const int status = CheckAttentionPrefillParams(p); status != kKernelOk) return status;
  if (!ValidPages(p.block_table, PagedKvPagesFor(p.start_pos + p.n_tokens, c.page_size), c.num_pages)) {
    return kKernelInvalidArgument;
  }
  const int64_t D = c.head_dim;
  const int64_t group = p.n_heads / c.n_kv_heads;
  const int64_t qs = p.q_token_stride ? p.q_token_stride : p.n_heads * D;
  const int64_t os = p.out_token_stride ? p.out_token_stride : p.n_heads * D;
  const float scale = ResolvedScale(p.scale, D);
  // Tokens per tile. Every tile streams all of its KV head's pages, so a few
  // tokens after a long context (a resumed turn: 65 after 16K) take as few
  // tiles as keep every thread busy, each tile about the same work; a prompt
  // from near the start takes tiles of kPrefillTile, task u covering tiles u
  // and n_tiles-1-u so that causal work pairs up evenly. The tile never
  // changes a bit (AttendTile).
  const bool long_context = p.start_pos >= 4 * p.n_tokens;
  int64_t tile = kPrefillTile;
  if (long_context) {
    const int64_t threads = pool != nullptr ? pool->num_threads() : 1;
    const int64_t tiles_wanted = (threads + c.n_kv_heads - 1) / c.n_kv_heads;
    tile = std::max<int64_t>(kMinLongContextTile, (p.n_tokens + tiles_wanted - 1) / tiles_wanted);
  }
  const int64_t n_tiles = (p.n_tokens + tile - 1) / tile;
  const int64_t units = long_context ? n_tiles : (n_tiles + 1) / 2;
  ParallelFor(pool, units * c.n_kv_heads, [&](int64_t begin, int64_t end) {
    AttnScratch scratch;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t u = task / c.n_kv_heads;
      const int64_t kvh = task % c.n_kv_heads;
      auto attend = [&](int64_t tile_index) {
        const int64_t t0 = tile_index * tile;
        const int64_t tokens = std::min(tile, p.n_tokens - t0);
        AttendTile(c, p.block_table, kvh, p.q + t0 * qs + kvh * group * D, qs, group, tokens, p.start_pos + t0 + 1,
                   scale, p.out + t0 * os + kvh * group * D, os, scratch, wide);
      };
      attend(u);
      if (!long_context && n_tiles - 1 - u != u) attend(n_tiles - 1 - u);
    }
  });
  return kKernelOk;
}

int AttentionDecode(const AttentionDecodeParams& p, ThreadPool* pool) {
  const PagedKvCache& c = p.cache;
  if (const int status = CheckAttentionDecodeParams(p); status != kKernelOk) return status;
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t pages = PagedKvPagesFor(p.seq_lens[b], c.page_size);
    if (p.seq_lens[b] < 1 || pages > p.block_table_stride ||
        !ValidPages(p.block_tables + b * p.block_table_stride, pages, c.num_pages)) {
      return kKernelInvalidArgument;
    }
  }
  const int64_t D = c.head_dim;
  const int64_t group = p.n_heads / c.n_kv_heads;
  const int64_t qs = p.q_batch_stride ? p.q_batch_stride : p.n_heads * D;
  const int64_t os = p.out_batch_stride ? p.out_batch_stride : p.n_heads * D;
  const float scale = ResolvedScale(p.scale, D);
  const bool wide = ActiveKernelPath() != KernelPath::kAvx2;
  ParallelFor(pool, p.batch * c.n_kv_heads, [&](int64_t begin, int64_t end) {
    AttnScratch scratch;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / c.n_kv_heads;
      const int64_t kvh = task % c.n_kv_heads;
      AttendTile(c, p.block_tables + b * p.block_table_stride, kvh, p.q + b * qs + kvh * group * D, /*q_stride=*/0,
                 group, /*tokens=*/1, p.seq_lens[b], scale, p.out + b * os + kvh * group * D, /*out_stride=*/0, scratch,
                 wide);
    }
  });
  return kKernelOk;
}

}  // namespace hybridserve::kernels::cpu
