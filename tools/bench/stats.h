// Summary statistics of timing samples, shared by the benchmarks.
#pragma once

#include <algorithm>
#include <numeric>
#include <vector>

namespace tessera::bench {

// The median of `v` (the mean of the middle two for an even count); `v` is not empty.
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// The mean of `v`; `v` is not empty.
inline double mean(const std::vector<double>& v) {
  return std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

}  // namespace tessera::bench
