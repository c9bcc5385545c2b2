#include "parallel/zero/memory_estimate.h"

#include <catch2/catch.hpp>
#include <cmath>

#include "tests/testing.h"

namespace tessera::parallel {
namespace {

double gib(double bytes) { return std::round(bytes / (1 << 30) * 100) / 100; }

}  // namespace

TEST_CASE("fp32 model states per rank follow Note [fp32 model states]", "[zero]") {
  const int64_t p = 1001;  // not divisible by 2, 3 or 4
  for (int world : {1, 2, 3, 4}) {
    const int64_t shard = (p + world - 1) / world;
    REQUIRE(fp32_model_state_bytes(0, p, world) == 16 * p);
    REQUIRE(fp32_model_state_bytes(1, p, world) == 8 * p + 8 * shard);
    REQUIRE(fp32_model_state_bytes(2, p, world) == 4 * p + 12 * shard);
    REQUIRE(fp32_model_state_bytes(3, p, world) == 16 * shard);
  }
  REQUIRE(fp32_model_state_bytes(3, 124475904, 4) == 16 * 31118976);
  REQUIRE(testing::error_of([] { fp32_model_state_bytes(4, 10, 1); }) ==
          "[estimate_memory] expected a ZeRO stage in 0..3, found 4");
}

TEST_CASE("16-bit model states per rank follow Note [16-bit model states]", "[zero]") {
  const int64_t p = 1001;
  for (int world : {1, 2, 3, 4}) {
    const int64_t shard = (p + world - 1) / world;
    REQUIRE(mixed_model_state_bytes(0, p, world, false) == 20 * p);
    REQUIRE(mixed_model_state_bytes(0, p, world, true) == 20 * p);
    REQUIRE(mixed_model_state_bytes(1, p, world, false) == 4 * p + 16 * shard);
    REQUIRE(mixed_model_state_bytes(1, p, world, true) == 8 * p + 16 * shard);
    REQUIRE(mixed_model_state_bytes(2, p, world, true) == 2 * p + 16 * shard);
    REQUIRE(mixed_model_state_bytes(3, p, world, true) == 18 * shard);
  }
  // Note [Offloaded model states].
  for (const int world : {1, 3, 8}) {
    const int64_t p = 1000003, shard = (p + world - 1) / world;
    REQUIRE(nvme_model_state_bytes(1, p, world, true) == 12 * shard);
    REQUIRE(nvme_model_state_bytes(2, p, world, true) == 16 * shard);
    REQUIRE(nvme_model_state_bytes(3, p, world, true) == 16 * shard);
    REQUIRE(nvme_model_state_bytes(1, p, world, false) == 8 * shard);
    REQUIRE(nvme_model_state_bytes(3, p, world, false) == 12 * shard);
    REQUIRE(nvme_model_state_bytes(3, p, world, true, true, true) == 18 * shard);  // all of it
    REQUIRE(nvme_model_state_bytes(3, p, world, true, false, true) == 2 * shard);
    // On a GPU the gradient shard stays on the device (Note [Offload on a GPU]).
    REQUIRE(nvme_model_state_bytes(2, p, world, true, true, false, false) == 12 * shard);
    REQUIRE(nvme_model_state_bytes(3, p, world, true, true, true, false) == 14 * shard);
    REQUIRE(nvme_model_state_bytes(1, p, world, true, true, false, false) == 12 * shard);
    // 16-bit stage 3 keeps its 16-bit shard in memory.
    REQUIRE(mixed_model_state_bytes(3, p, world, false) -
                nvme_model_state_bytes(3, p, world, true) ==
            2 * shard);
  }
  REQUIRE(testing::error_of([] { nvme_model_state_bytes(0, 10, 1, true); }) ==
          "[estimate_memory] offload_optimizer needs ZeRO stage 1 to 3, found 0");
  REQUIRE(testing::error_of([] { mixed_model_state_bytes(4, 10, 1, false); }) ==
          "[estimate_memory] expected a ZeRO stage in 0..3, found 4");
}

// DeepSpeed's reference vectors (deepspeed.md 5.5): 2851e6 parameters, largest layer
// 32e6, one node of 8 GPUs, GiB rounded to two decimals.
TEST_CASE("DeepSpeed's ZeRO-2 and ZeRO-3 estimates match its reference values", "[zero]") {
  const int64_t p = 2851000000;
  const int64_t layer = 32000000;
  DeviceHostBytes z2 = deepspeed_zero2_estimate(p, 8, 1, true);
  REQUIRE(gib(z2.device) == 5.31);
  REQUIRE(gib(z2.host) == 127.45);
  z2 = deepspeed_zero2_estimate(p, 8, 1, false);
  REQUIRE(gib(z2.device) == 11.28);
  REQUIRE(gib(z2.host) == 127.45);

  DeviceHostBytes z3 = deepspeed_zero3_estimate(p, layer, 8, 1, true, true, true);
  REQUIRE(gib(z3.device) == 0.12);
  REQUIRE(gib(z3.host) == 71.69);
  z3 = deepspeed_zero3_estimate(p, layer, 8, 1, false, true, true);
  REQUIRE(gib(z3.device) == 0.78);
  REQUIRE(gib(z3.host) == 63.72);
  z3 = deepspeed_zero3_estimate(p, layer, 8, 1, false, false, true);
  REQUIRE(gib(z3.device) == 6.09);
  REQUIRE(gib(z3.host) == 1.43);
  // Without zero_init the host holds the whole model per GPU process.
  z3 = deepspeed_zero3_estimate(p, layer, 8, 1, false, false, false);
  REQUIRE(gib(z3.host) == gib(4.0 * p * 8 * 1.5));
}

}  // namespace tessera::parallel

namespace tessera::parallel {
namespace {

TEST_CASE("expert parallelism: 1 / ep of the experts, sharded over world / ep", "[memory]") {
  const auto fp32 = [](int stage) {
    return [stage](int64_t p, int w) { return fp32_model_state_bytes(stage, p, w); };
  };
  // 40 other parameters whole at stage 0 (16 bytes each), 60 / 2 = 30 experts whole.
  CHECK(expert_split_model_state_bytes(fp32(0), 100, 60, 4, 2) == 16 * 40 + 16 * 30);
  // Stage 3: 40 over 4 ranks, 30 over 2.
  CHECK(expert_split_model_state_bytes(fp32(3), 100, 60, 4, 2) == 16 * 10 + 16 * 15);
  CHECK(expert_split_model_state_bytes(fp32(1), 100, 0, 4, 1) == fp32_model_state_bytes(1, 100, 4));
  CHECK_THROWS_WITH(expert_split_model_state_bytes(fp32(0), 100, 60, 3, 2),
                    Catch::Contains("expected ep_size dividing the world"));
}

}  // namespace
}  // namespace tessera::parallel
