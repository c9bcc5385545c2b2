// Helpers shared by the CPU vs CUDA kernel parity tests (tests/gpu/*kernels_parity_test.cc):
// inputs held on both sides, tolerances and result comparisons.
#pragma once

#include <cstdint>

#include "core/device.h"
#include "core/dtype.h"
#include "core/shape.h"
#include "core/tensor.h"

namespace tessera::testing {

// The device every parity test runs on.
inline constexpr Device kCuda{DeviceType::cuda, 0};

// 16-bit results are compared with the f64 reference rounded to the same dtype; 2e-2 is
// about five bf16 ulps (2^-8) and covers the f32-accumulated kernels' last rounding.
inline constexpr double kHalfTol = 2e-2;

// The relative tolerance of a result of `dtype`, given the one for f32.
double tol_for(DType dtype, double f32_tol);

// One operand on both sides: the same values (and layout) as an exact CPU reference and
// as the tested dtype on the device.
struct Input {
  Tensor ref;  // f64 (integers: their own dtype) on the CPU
  Tensor dev;  // the tested dtype on the device
};

// Rounds CPU values to `dtype` and places them on both sides.
Input both(const Tensor& host, DType dtype);

// N(0, 1) values, or uniform in [lo, hi) when lo < hi (integers: in [-1000, 1000)).
Input random(const Shape& shape, uint64_t seed, DType dtype, double lo = 0.0, double hi = 0.0);

// The same view of both sides.
template <class F>
Input view_of(const Input& in, F f) {
  return {f(in.ref), f(in.dev)};
}

// Like random(), stored with the last two dims swapped: a non-contiguous (..., M, N).
Input random_t(const Shape& shape, uint64_t seed, DType dtype, double lo = 0.0, double hi = 0.0);

// random_t() when `transposed`, else random().
Input random_in(const Shape& shape, uint64_t seed, DType dtype, bool transposed, double lo = 0.0,
                double hi = 0.0);

// `got` (on the device, of `dtype`) against the f64 reference `want` rounded to `dtype`:
// |got - want| <= tol (|want| + rms(want)) element by element, NaN matching NaN and
// infinities matching exactly. The rms term keeps the bound meaningful where results
// cancel to near zero (matmul, reductions). tol = 0 asks for exact equality.
// `floor` (default 0) is an absolute allowance for results that are exactly 0 in exact
// arithmetic but sums of cancelling terms on the device, where tol x rms would be 0 too.
void check_close(const Tensor& got, const Tensor& want, DType dtype, double tol,
                 double floor = 0.0);

// Two device results hold the same bits (run-to-run determinism).
void check_bitwise(const Tensor& a, const Tensor& b);

}  // namespace tessera::testing
