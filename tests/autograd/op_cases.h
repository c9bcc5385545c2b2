// One forward-and-backward case or more for every differentiable op of autograd/op_list.h,
// built on either side of a comparison: an exact f64 CPU reference and the dtype and
// device under test (tests/gpu/autograd_parity_test.cc: f32 on CUDA;
// tests/autograd/half_precision_test.cc: f16 and bf16 on the CPU). Both sides draw the
// same values, so results differ only by the tested side's arithmetic.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "autograd/node.h"
#include "autograd/ops.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/tensor.h"

namespace tessera::testing {

// The f32 tolerance of a case (relative to |want| + rms(want), see check_close): f32
// round-off through a few kernels...
inline constexpr double kTol = 1e-5;
// ... or, for matmul, linear and attention, TF32 tensor cores on CUDA (10-bit mantissa).
inline constexpr double kTf32Tol = 5e-3;

// Makes the inputs of one side. Every floating value is an f32 draw rounded to
// `value_dtype` (the tested side's dtype, so the f64 reference holds the same numbers), then
// stored as `dtype` on `device`.
class Side {
 public:
  Side(DType dtype, Device device, DType value_dtype = DType::f32)
      : dtype_(dtype), device_(device), value_dtype_(value_dtype) {}
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }

  // A contiguous leaf with N(0, 1) entries.
  Tensor leaf(const Shape& shape, uint64_t seed) const;
  // A non-contiguous leaf: the transpose of a contiguous tensor (last two dims).
  Tensor nc_leaf(const Shape& shape, uint64_t seed) const;
  // A leaf with entries uniform in [lo, hi), for ops defined on positive inputs.
  Tensor leaf_in(const Shape& shape, uint64_t seed, double lo, double hi) const;
  // N(0, 1) values that take no gradient.
  Tensor data(const Shape& shape, uint64_t seed) const;
  // An i64 index tensor on this side's device.
  Tensor ids(const std::vector<int64_t>& values, const Shape& shape) const;
  // f32 host values rounded to this side's values, as `dtype` on its device.
  Tensor place(const Tensor& host_f32) const;

 private:
  DType dtype_;
  Device device_;
  DType value_dtype_;
};

struct OpCase {
  std::string op;                                 // its name in kDifferentiableOps
  std::string variant;                            // what this case exercises
  std::function<Tensor(const TensorList&)> fn;    // the graph from the inputs to one output
  std::function<TensorList(const Side&)> inputs;  // the inputs, made on a side
  double tol = kTol;                              // for f32 results
};

// Every case; each op of kDifferentiableOps has at least one.
std::vector<OpCase> all_op_cases();

// The forward output and the gradient of every input (undefined where none is taken).
struct OpResult {
  Tensor out;
  TensorList inputs;
  TensorList grads;
};

// Runs the case on `side`: forward, then backward from N(0, 1) upstream gradients (the same
// draws on every side, rounded like the inputs).
OpResult run_op_case(const OpCase& c, const Side& side);

// |got - want| <= tol (|want| + rms(want)) element by element, with shapes and definedness
// equal; `got` must live on `device`. Returns the largest |got - want| / (|want| + rms).
double check_close(const Tensor& got, const Tensor& want, double tol, Device device);

}  // namespace tessera::testing
