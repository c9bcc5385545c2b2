// Note [One-pass mixed-precision step] in parallel/zero/zero_optimizer.h on a CUDA device:
// the squared norm summed, the clip factor computed and the f16 overflow found there, and
// AdamW's pass reading the factor and writing the 16-bit model, against clip_grad_norm() +
// step(), bit for bit (tests/parallel/one_pass_step.h; the CPU runs it at 1 and 2 ranks).
#include <catch2/catch.hpp>

#include "core/cuda_runtime.h"
#include "core/device.h"
#include "tests/parallel/one_pass_step.h"

namespace tessera {
namespace {

TEST_CASE("a one-pass step on the GPU gives the separate passes' bits", "[gpu]") {
  REQUIRE(cuda::device_count() > 0);
  parallel::testing::check_one_pass_step(Device::cuda(0), {1});
}

}  // namespace
}  // namespace tessera
