#include "kernels/cpu/attention.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/attention_dot.h"
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

// Scratch of one thread.
struct AttnScratch {
  std::vector<float> acc;     // [tokens * group, head_dim]
  std::vector<float> scores;  // [page_size rounded up to 8]
  std::vector<RowState> rows;
};

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
                int64_t out_stride, AttnScratch& s) {
  const int64_t D = cache.head_dim;
  const int64_t token_stride = cache.n_kv_heads * D;
  const int64_t page_stride = cache.page_size * token_stride;
  const int64_t n_rows = tokens * group;
  s.acc.assign(n_rows * D, 0.0f);
  s.scores.resize((cache.page_size + 7) & ~int64_t{7});
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
      for (int64_t g = 0; g < group; ++g) {
        RowState& r = s.rows[t * group + g];
        const float* qg = q + t * q_stride + g * D;
        float* scores = s.scores.data();
        float m_blk = -std::numeric_limits<float>::infinity();
        attention_internal::ScoreKeys(qg, kp, token_stride, D, count, scale, scores);
        for (int64_t i = 0; i < count; ++i) m_blk = std::max(m_blk, scores[i]);
        const float m_new = std::max(r.m, m_blk);
        const __m256 vm = _mm256_set1_ps(m_new);
        const float alpha = _mm256_cvtss_f32(simd::Exp(_mm256_set1_ps(r.m - m_new)));
        for (int64_t i = 0; i < count; i += 8) {
          const __m256 sv = simd::LoadPartial(scores + i, count - i);
          simd::StorePartial(scores + i, simd::Exp(_mm256_sub_ps(sv, vm)), count - i);
        }
        float l = r.l * alpha;
        for (int64_t i = 0; i < count; ++i) l = l + scores[i];
        r.l = l;
        r.m = m_new;
        const __m256 va = _mm256_set1_ps(alpha);
        int64_t d = 0;
        // Four independent FMA chains (32 dims) per pass over the keys: one
        // chain would wait on each FMA's latency. Every element still sees
        // acc * alpha, then its FMAs in key order: the same bits.
        for (; d + 32 <= D; d += 32) {
          __m256 a0 = _mm256_mul_ps(_mm256_loadu_ps(r.acc + d), va);
          __m256 a1 = _mm256_mul_ps(_mm256_loadu_ps(r.acc + d + 8), va);
          __m256 a2 = _mm256_mul_ps(_mm256_loadu_ps(r.acc + d + 16), va);
          __m256 a3 = _mm256_mul_ps(_mm256_loadu_ps(r.acc + d + 24), va);
          for (int64_t i = 0; i < count; ++i) {
            const __m256 si = _mm256_set1_ps(scores[i]);
            const float* vrow = vp + i * token_stride + d;
            a0 = _mm256_fmadd_ps(si, _mm256_loadu_ps(vrow), a0);
            a1 = _mm256_fmadd_ps(si, _mm256_loadu_ps(vrow + 8), a1);
            a2 = _mm256_fmadd_ps(si, _mm256_loadu_ps(vrow + 16), a2);
            a3 = _mm256_fmadd_ps(si, _mm256_loadu_ps(vrow + 24), a3);
          }
          _mm256_storeu_ps(r.acc + d, a0);
          _mm256_storeu_ps(r.acc + d + 8, a1);
          _mm256_storeu_ps(r.acc + d + 16, a2);
          _mm256_storeu_ps(r.acc + d + 24, a3);
        }
        for (; d + 8 <= D; d += 8) {
          __m256 acc = _mm256_mul_ps(_mm256_loadu_ps(r.acc + d), va);
          for (int64_t i = 0; i < count; ++i) {
            acc = _mm256_fmadd_ps(_mm256_set1_ps(scores[i]), _mm256_loadu_ps(vp + i * token_stride + d), acc);
          }
          _mm256_storeu_ps(r.acc + d, acc);
        }
        for (; d < D; ++d) {
          float acc = r.acc[d] * alpha;
          for (int64_t i = 0; i < count; ++i) acc = std::fma(scores[i], vp[i * token_stride + d], acc);
          r.acc[d] = acc;
        }
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
  // Task u covers tiles u and n_tiles-1-u (causal work pairs up evenly) for one KV head.
  const int64_t n_tiles = (p.n_tokens + kPrefillTile - 1) / kPrefillTile;
  const int64_t pairs = (n_tiles + 1) / 2;
  ParallelFor(pool, pairs * c.n_kv_heads, [&](int64_t begin, int64_t end) {
    AttnScratch scratch;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t u = task / c.n_kv_heads;
      const int64_t kvh = task % c.n_kv_heads;
      auto attend = [&](int64_t tile) {
        const int64_t t0 = tile * kPrefillTile;
        const int64_t tokens = std::min(kPrefillTile, p.n_tokens - t0);
        AttendTile(c, p.block_table, kvh, p.q + t0 * qs + kvh * group * D, qs, group, tokens, p.start_pos + t0 + 1,
                   scale, p.out + t0 * os + kvh * group * D, os, scratch);
      };
      attend(u);
      if (n_tiles - 1 - u != u) attend(n_tiles - 1 - u);
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
  ParallelFor(pool, p.batch * c.n_kv_heads, [&](int64_t begin, int64_t end) {
    AttnScratch scratch;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / c.n_kv_heads;
      const int64_t kvh = task % c.n_kv_heads;
      AttendTile(c, p.block_tables + b * p.block_table_stride, kvh, p.q + b * qs + kvh * group * D, /*q_stride=*/0,
                 group, /*tokens=*/1, p.seq_lens[b], scale, p.out + b * os + kvh * group * D, /*out_stride=*/0,
                 scratch);
    }
  });
  return kKernelOk;
}

}  // namespace hybridserve::kernels::cpu
