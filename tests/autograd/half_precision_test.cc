// Every differentiable op of autograd/op_list.h on f16 and bf16 CPU tensors against the f64
// reference on the same (16-bit) values: forward outputs and input gradients agree within
// a few units in the last place of the format (Note [16-bit math on the CPU] in
// kernels/cpu/widen.h: f32 math, one rounding per result).
#include <algorithm>
#include <catch2/catch.hpp>
#include <set>
#include <string>

#include "autograd/op_list.h"
#include "tests/autograd/op_cases.h"

namespace tessera {
namespace {

using testing::Side;

// Relative to |want| + rms(want): bf16 has 8 significant bits (an ulp is at most 2^-7 =
// 7.8e-3 of the value, a rounding at most half of it), f16 11 (2^-10 = 9.8e-4). A result
// rounded once is within half an ulp; a gradient built from rounded intermediates (an op's
// output feeding its own backward, a sum of two rounded partial gradients) within a few.
double tolerance(DType dtype) { return dtype == DType::bf16 ? 2e-2 : 3e-3; }

TEST_CASE("every listed differentiable op has a 16-bit CPU case", "[half]") {
  std::set<std::string> covered;
  for (const testing::OpCase& c : testing::all_op_cases()) covered.insert(c.op);
  for (std::string_view op : kDifferentiableOps) {
    INFO("op without a case: " << op);
    CHECK(covered.count(std::string(op)) == 1);
  }
}

TEST_CASE("ops on f16 and bf16 CPU tensors match the f64 forward and backward", "[half]") {
  for (DType dtype : {DType::bf16, DType::f16}) {
    double worst = 0.0;
    std::string worst_case;
    for (const testing::OpCase& c : testing::all_op_cases()) {
      INFO(dtype_name(dtype) << ": " << c.op << " / " << c.variant);
      // A case whose own graph rounds to bf16 (cast) keeps its looser f32 tolerance.
      const double tol = std::max(tolerance(dtype), c.tol);
      const testing::OpResult want =
          testing::run_op_case(c, Side(DType::f64, Device::cpu(), dtype));
      const testing::OpResult got = testing::run_op_case(c, Side(dtype, Device::cpu()));
      // Losses may be f32; every other result keeps the inputs' dtype.
      CHECK((got.out.dtype() == dtype || got.out.dtype() == DType::f32));
      double err = 0.0;
      {
        INFO("output");
        err = std::max(err, testing::check_close(got.out, want.out, tol, Device::cpu()));
      }
      for (size_t i = 0; i < got.grads.size(); ++i) {
        INFO("gradient of input " << i);
        if (got.grads[i].defined()) {
          CHECK(dtype_name(got.grads[i].dtype()) == dtype_name(got.inputs[i].dtype()));
        }
        err = std::max(err, testing::check_close(got.grads[i], want.grads[i], tol, Device::cpu()));
      }
      if (err > worst) {
        worst = err;
        worst_case = c.op + " / " + c.variant;
      }
    }
    WARN(dtype_name(dtype) << ": largest error " << worst << " of |want| + rms, in " << worst_case);
  }
}

}  // namespace
}  // namespace tessera
