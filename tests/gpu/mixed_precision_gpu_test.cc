// fp16 training with DeepSpeed's dynamic loss scaler on CUDA: the trajectory of
// tests/parallel/fp16_trajectory.h (tests/parallel/mixed_precision_test.cc runs it on the
// CPU).
#include <catch2/catch.hpp>

#include "core/cuda_runtime.h"
#include "tests/parallel/fp16_trajectory.h"

namespace tessera::parallel {
namespace {

TEST_CASE("fp16 on CUDA: the loss scale trajectory and the f32 masters against CPU AdamW",
          "[gpu][zero][mixed]") {
  REQUIRE(cuda::device_count() > 0);
  testing::check_fp16_trajectory(Device::cuda(0));
}

}  // namespace
}  // namespace tessera::parallel
