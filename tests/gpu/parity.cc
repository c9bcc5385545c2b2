// Helpers shared by the CPU vs CUDA kernel parity tests (see parity.h).
#include "tests/gpu/parity.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "core/factories.h"

namespace tessera::testing {

double tol_for(DType dtype, double f32_tol) {
  if (dtype == DType::f64) return 1e-10;
  if (dtype == DType::f32) return f32_tol;
  return kHalfTol;
}

Input both(const Tensor& host, DType dtype) {
  const Tensor h = host.to(dtype);
  return {h.to(is_floating(dtype) ? DType::f64 : dtype), h.to(kCuda)};
}

Input random(const Shape& shape, uint64_t seed, DType dtype, double lo, double hi) {
  Generator g(seed);
  if (!is_floating(dtype) && lo >= hi) {
    lo = -1000.0;
    hi = 1000.0;
  }
  return both(lo < hi ? rand(shape, g, {DType::f32}, lo, hi) : randn(shape, g), dtype);
}

Input random_t(const Shape& shape, uint64_t seed, DType dtype, double lo, double hi) {
  Shape stored = shape;
  std::swap(stored[stored.size() - 1], stored[stored.size() - 2]);
  Input in = view_of(random(stored, seed, dtype, lo, hi),
                     [](const Tensor& t) { return t.transpose(-1, -2); });
  REQUIRE_FALSE(in.dev.is_contiguous());
  return in;
}

Input random_in(const Shape& shape, uint64_t seed, DType dtype, bool transposed, double lo,
                double hi) {
  return transposed ? random_t(shape, seed, dtype, lo, hi) : random(shape, seed, dtype, lo, hi);
}

void check_close(const Tensor& got, const Tensor& want, DType dtype, double tol, double floor) {
  REQUIRE(got.defined());
  CHECK(got.device() == kCuda);
  REQUIRE(dtype_name(got.dtype()) == dtype_name(dtype));
  REQUIRE(shape_str(got.shape()) == shape_str(want.shape()));
  const std::vector<double> g = got.to_vector<double>();
  const std::vector<double> w = want.to(dtype).to_vector<double>();
  double rms = 0.0;
  for (double v : w) rms += std::isfinite(v) ? v * v : 0.0;
  rms = w.empty() ? 0.0 : std::sqrt(rms / static_cast<double>(w.size()));
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    const bool ok = std::isnan(w[i]) ? std::isnan(g[i])
                    : std::isinf(w[i])
                        ? g[i] == w[i]
                        : std::abs(g[i] - w[i]) <= tol * (std::abs(w[i]) + rms) + floor;
    if (!ok && bad++ == 0) first = i;
  }
  INFO(bad << " of " << w.size() << " elements differ; first at " << first << ": got "
           << (bad ? g[first] : 0.0) << ", want " << (bad ? w[first] : 0.0) << " (tol " << tol
           << ", rms " << rms << ", floor " << floor << ")");
  CHECK(bad == 0);
}

void check_bitwise(const Tensor& a, const Tensor& b) {
  REQUIRE(a.dtype() == b.dtype());
  REQUIRE(a.shape() == b.shape());
  const Tensor ha = a.to(Device::cpu()).contiguous(), hb = b.to(Device::cpu()).contiguous();
  CHECK(std::memcmp(ha.raw_data(), hb.raw_data(), ha.nbytes()) == 0);
}

}  // namespace tessera::testing
