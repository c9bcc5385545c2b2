// CPU vs CUDA parity of every differentiable op in autograd/op_list.h: one graph built on
// f64 CPU leaves and on f32 CUDA leaves holding the same values, run forward and backward
// with the same upstream gradient; outputs and input gradients must agree. The cases are
// tests/autograd/op_cases.h's; a test fails when a listed op has none (as gradcheck_test
// does for gradcheck).
#include <catch2/catch.hpp>
#include <set>
#include <string>

#include "autograd/op_list.h"
#include "core/cuda_runtime.h"
#include "tests/autograd/op_cases.h"

namespace tessera {
namespace {

const Device kCuda = Device::cuda(0);

TEST_CASE("every listed differentiable op has a CUDA parity case", "[gpu]") {
  REQUIRE(cuda::device_count() > 0);
  std::set<std::string> covered;
  for (const testing::OpCase& c : testing::all_op_cases()) covered.insert(c.op);
  for (std::string_view op : kDifferentiableOps) {
    INFO("op without a CUDA parity case: " << op);
    CHECK(covered.count(std::string(op)) == 1);
  }
}

TEST_CASE("ops on f32 CUDA tensors match the f64 CPU forward and backward", "[gpu]") {
  REQUIRE(cuda::device_count() > 0);
  using testing::check_close;
  using testing::Side;
  for (const testing::OpCase& c : testing::all_op_cases()) {
    DYNAMIC_SECTION(c.op << " / " << c.variant) {
      const testing::OpResult want = testing::run_op_case(c, Side(DType::f64, Device::cpu()));
      const testing::OpResult got = testing::run_op_case(c, Side(DType::f32, kCuda));
      {
        INFO("output");
        check_close(got.out, want.out, c.tol, kCuda);
      }
      for (size_t i = 0; i < got.grads.size(); ++i) {
        INFO("gradient of input " << i);
        if (got.grads[i].defined()) {
          CHECK(dtype_name(got.grads[i].dtype()) == dtype_name(got.inputs[i].dtype()));
        }
        check_close(got.grads[i], want.grads[i], c.tol, kCuda);
      }
    }
  }
}

}  // namespace
}  // namespace tessera
