#include "kernels/torch_topk.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

namespace hybridserve::kernels {

void TorchTopKIndices(const float* p, int64_t n, int64_t k, int32_t* out) {
  // ATen widens to the accumulate type (double) and orders NaN first.
  std::vector<std::pair<double, int64_t>> queue(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) queue[static_cast<size_t>(j)] = {static_cast<double>(p[j]), j};
  auto greater = [](const std::pair<double, int64_t>& a, const std::pair<double, int64_t>& b) {
    return (std::isnan(a.first) && !std::isnan(b.first)) || a.first > b.first;
  };
  if (k * 64 <= n) {
    std::partial_sort(queue.begin(), queue.begin() + k, queue.end(), greater);
  } else {
    std::nth_element(queue.begin(), queue.begin() + k - 1, queue.end(), greater);
    std::sort(queue.begin(), queue.begin() + k - 1, greater);
  }
  for (int64_t j = 0; j < k; ++j) out[j] = static_cast<int32_t>(queue[static_cast<size_t>(j)].second);
}

}  // namespace hybridserve::kernels
