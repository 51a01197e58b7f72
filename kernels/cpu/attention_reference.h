#ifndef HYBRIDSERVE_KERNELS_CPU_ATTENTION_REFERENCE_H_
#define HYBRIDSERVE_KERNELS_CPU_ATTENTION_REFERENCE_H_

// Naive attention oracle for tests: dense contiguous K/V, double precision,
// a full softmax per query. Not for production use.

#include <cstdint>
#include <vector>

namespace hybridserve::kernels::cpu::reference {

// q: [n_q, n_heads, head_dim] for positions [q_start, q_start + n_q);
// k, v: [n_keys, n_kv_heads, head_dim] for positions [0, n_keys), n_keys >= q_start + n_q.
// Query at position t attends keys [0, t]. Returns [n_q, n_heads, head_dim].
std::vector<double> CausalAttention(const std::vector<float>& q, const std::vector<float>& k,
                                    const std::vector<float>& v, int64_t q_start, int64_t n_q, int64_t n_heads,
                                    int64_t n_kv_heads, int64_t head_dim, double scale);

}  // namespace hybridserve::kernels::cpu::reference

#endif  // HYBRIDSERVE_KERNELS_CPU_ATTENTION_REFERENCE_H_
