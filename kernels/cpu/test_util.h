#ifndef HYBRIDSERVE_KERNELS_CPU_TEST_UTIL_H_
#define HYBRIDSERVE_KERNELS_CPU_TEST_UTIL_H_

// Test helpers for the CPU kernels: seeded random tensors, comparisons, and
// the reader of the transformers fixtures (tests/fixtures/gated_delta).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace hybridserve::kernels::cpu::testing {

// The whole file at `path` (relative to the runfiles root); empty, and a
// failed expectation, when it cannot be read.
inline std::string ReadTextFile(const std::string& path) {
  std::ifstream f(path);
  EXPECT_TRUE(f.good()) << path;
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The numbers of the flat array under "key" at or after *from in a fixture's
// JSON text (a tiny reader for the fixtures' known shape, not a JSON parser);
// *from, when given, moves past it. Empty when there is no such key.
inline std::vector<float> JsonArray(const std::string& text, const std::string& key, size_t* from = nullptr) {
  const size_t at = text.find("\"" + key + "\"", from != nullptr ? *from : 0);
  if (at == std::string::npos) return {};
  const size_t i = text.find('[', at);
  const size_t end = text.find(']', i);
  if (from != nullptr) *from = end;
  std::vector<float> out;
  const char* c = text.c_str() + i + 1;
  const char* stop = text.c_str() + end;
  while (c < stop) {
    char* next = nullptr;
    const double x = std::strtod(c, &next);
    if (next == c) {
      ++c;
      continue;
    }
    out.push_back(static_cast<float>(x));
    c = next;
  }
  return out;
}

// max |a[i] - b[i]| over a's elements (b at least as long).
inline float MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  float m = 0.0f;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

inline std::vector<float> RandomVector(std::mt19937& rng, int64_t n, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& f : v) f = dist(rng);
  return v;
}

// Index of the first element whose bits differ, or -1.
inline int64_t FirstBitMismatch(const float* a, const float* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (std::memcmp(a + i, b + i, sizeof(float)) != 0) return i;
  }
  return -1;
}

// Index of the first element that is NaN or infinite in either array, or -1.
inline int64_t FirstNonFinite(const float* a, const float* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) return i;
  }
  return -1;
}

inline int64_t FirstNonFinite(const float* a, const double* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) return i;
  }
  return -1;
}

// The same bits and every value finite: the kernels' outputs on finite inputs
// are finite, so a NaN or an infinity at the same index of both arrays is two
// wrong answers agreeing and fails.
inline ::testing::AssertionResult BitsEqual(const float* a, const float* b, int64_t n) {
  if (const int64_t i = FirstNonFinite(a, b, n); i >= 0) {
    return ::testing::AssertionFailure() << "non-finite value at element " << i << " of " << n << ": " << a[i] << " vs "
                                         << b[i];
  }
  const int64_t i = FirstBitMismatch(a, b, n);
  if (i < 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "bits differ first at element " << i << " of " << n << ": " << a[i] << " vs "
                                       << b[i];
}

inline ::testing::AssertionResult BitsEqual(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << "sizes differ";
  return BitsEqual(a.data(), b.data(), static_cast<int64_t>(a.size()));
}

// |actual - expected| <= tol * max(|expected|) elementwise: an error bound
// relative to the tensor's scale, robust to elements that cancel to ~0. Fails
// on a NaN or an infinity in either input (an infinite scale would make every
// bound infinite).
inline ::testing::AssertionResult CloseToScale(const float* actual, const double* expected, int64_t n, double tol) {
  if (const int64_t i = FirstNonFinite(actual, expected, n); i >= 0) {
    return ::testing::AssertionFailure() << "non-finite value at element " << i << " of " << n << ": " << actual[i]
                                         << " vs " << expected[i];
  }
  double scale = 0.0;
  for (int64_t i = 0; i < n; ++i) scale = std::max(scale, std::fabs(expected[i]));
  const double bound = tol * std::max(scale, 1e-30);
  double worst = 0.0;
  int64_t worst_i = -1;
  for (int64_t i = 0; i < n; ++i) {
    const double err = std::fabs(static_cast<double>(actual[i]) - expected[i]);
    if (!(err <= bound) && (worst_i < 0 || err > worst)) {
      worst = err;
      worst_i = i;
    }
  }
  if (worst_i < 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "element " << worst_i << ": " << actual[worst_i] << " vs "
                                       << expected[worst_i] << ", error " << worst << " > " << bound << " (tol " << tol
                                       << " x scale " << scale << ")";
}

inline ::testing::AssertionResult CloseToScale(const std::vector<float>& actual, const std::vector<float>& expected,
                                               double tol) {
  if (actual.size() != expected.size()) return ::testing::AssertionFailure() << "sizes differ";
  std::vector<double> e(expected.begin(), expected.end());
  return CloseToScale(actual.data(), e.data(), static_cast<int64_t>(actual.size()), tol);
}

inline ::testing::AssertionResult CloseToScale(const std::vector<float>& actual, const std::vector<double>& expected,
                                               double tol) {
  if (actual.size() != expected.size()) return ::testing::AssertionFailure() << "sizes differ";
  return CloseToScale(actual.data(), expected.data(), static_cast<int64_t>(actual.size()), tol);
}

// |actual - expected| <= atol + rtol * |expected| elementwise. Fails on a NaN
// or an infinity in either input (an infinite expected value would make its
// bound infinite).
inline ::testing::AssertionResult AllClose(const std::vector<float>& actual, const std::vector<double>& expected,
                                           double rtol, double atol) {
  if (actual.size() != expected.size()) return ::testing::AssertionFailure() << "sizes differ";
  const int64_t n = static_cast<int64_t>(actual.size());
  if (const int64_t i = FirstNonFinite(actual.data(), expected.data(), n); i >= 0) {
    return ::testing::AssertionFailure() << "non-finite value at element " << i << " of " << n << ": " << actual[i]
                                         << " vs " << expected[i];
  }
  for (size_t i = 0; i < actual.size(); ++i) {
    const double err = std::fabs(static_cast<double>(actual[i]) - expected[i]);
    if (!(err <= atol + rtol * std::fabs(expected[i]))) {
      return ::testing::AssertionFailure()
             << "element " << i << ": " << actual[i] << " vs " << expected[i] << " (error " << err << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace hybridserve::kernels::cpu::testing

#endif  // HYBRIDSERVE_KERNELS_CPU_TEST_UTIL_H_
