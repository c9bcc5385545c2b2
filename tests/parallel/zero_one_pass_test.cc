// Note [One-pass mixed-precision step] in parallel/zero/zero_optimizer.h on the CPU, at 1
// and 2 thread ranks (tests/parallel/one_pass_step.h; the CUDA run is in tests/gpu), and
// where steps take one pass.
#include <catch2/catch.hpp>

#include "models/gpt2/gpt.h"
#include "optim/config.h"
#include "parallel/comm/thread_comm.h"
#include "parallel/zero/zero_optimizer.h"
#include "tests/parallel/one_pass_step.h"
#include "tests/parallel/zero_test_gpt.h"
#include "tests/testing.h"

namespace tessera::parallel {
namespace {

constexpr int64_t kT = 6;

TEST_CASE("a one-pass step gives the separate passes' bits", "[zero][one_pass]") {
  testing::check_one_pass_step(Device::cpu(), {1, 2});
}

TEST_CASE("steps take one pass only where the optimizer and the stage allow it",
          "[zero][one_pass]") {
  run_thread_ranks(1, [&](Communicator& comm) {
    const auto one_pass = [&](optim::OptimizerType type, int stage) {
      Gpt model(tessera::testing::zero_test_gpt(kT), 1234);
      optim::OptimizerConfig config = tessera::testing::zero_test_adamw();
      config.type = type;
      ZeroConfig zero;
      zero.stage = stage;
      ZeroOptimizer opt(
          comm, model,
          optim::decay_groups(model.named_parameters(), config.lr, config.weight_decay, true, {}),
          config, zero);
      return opt.one_pass_step();
    };
    CHECK(one_pass(optim::OptimizerType::adam, 0));
    CHECK(one_pass(optim::OptimizerType::adam, 2));
    CHECK_FALSE(one_pass(optim::OptimizerType::adam, 3));  // stage 3 rounds its own shard
    CHECK_FALSE(one_pass(optim::OptimizerType::lamb, 0));
    CHECK_FALSE(one_pass(optim::OptimizerType::sgd, 1));
  });
}

}  // namespace
}  // namespace tessera::parallel
