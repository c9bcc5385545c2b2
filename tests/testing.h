// Helpers shared by the tests: element-wise comparison against reference values and
// capturing error messages.
#pragma once

#include <catch2/catch.hpp>
#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"
#include "core/tensor.h"

namespace tessera::testing {

// Largest |a[i] - b[i]|.
inline double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double d = 0.0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::abs(a[i] - b[i]));
  return d;
}

// ||got - want|| / ||want|| in f64 (the sizes must match).
template <class T>
double relative_l2_error(const std::vector<T>& got, const std::vector<T>& want) {
  REQUIRE(got.size() == want.size());
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = static_cast<double>(got[i]) - static_cast<double>(want[i]);
    diff += d * d;
    norm += static_cast<double>(want[i]) * static_cast<double>(want[i]);
  }
  return std::sqrt(diff / norm);
}

// Every element within tol * (1 + |want|); NaN matches NaN.
inline void require_close(const Tensor& got_t, const std::vector<double>& want, double tol) {
  const std::vector<double> got = got_t.to_vector<double>();
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const bool ok = std::isnan(want[i])
                        ? std::isnan(got[i])
                        : std::abs(got[i] - want[i]) <= tol * (1 + std::abs(want[i]));
    if (!ok) {
      INFO("element " << i << ": got " << got[i] << ", want " << want[i]);
      REQUIRE(ok);
    }
  }
}

// Sets the kernels' thread count for a scope (set_num_threads) and restores the previous one,
// so a test reaches chunk boundaries whatever the machine's core count.
class ScopedThreads {
 public:
  explicit ScopedThreads(int n) : previous_(num_threads()) { set_num_threads(n); }
  ~ScopedThreads() { set_num_threads(previous_); }
  ScopedThreads(const ScopedThreads&) = delete;
  ScopedThreads& operator=(const ScopedThreads&) = delete;

 private:
  int previous_;
};

// The message of the tessera::Error that `f` throws (fails the test when none is thrown).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  FAIL("expected a tessera::Error");
  return "";
}

}  // namespace tessera::testing
