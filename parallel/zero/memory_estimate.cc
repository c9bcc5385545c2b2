#include "parallel/zero/memory_estimate.h"

#include <algorithm>

#include "core/error.h"

namespace tessera::parallel {

namespace {

// ceil(params / world), after checking the arguments of the model-state formulas.
int64_t checked_shard(int stage, int64_t params, int world) {
  TS_CHECK(stage >= 0 && stage <= 3, "[estimate_memory] expected a ZeRO stage in 0..3, found ",
           stage);
  TS_CHECK(params >= 0, "[estimate_memory] expected a parameter count >= 0, found ", params);
  TS_CHECK(world >= 1, "[estimate_memory] expected a world size >= 1, found ", world);
  return (params + world - 1) / world;
}

}  // namespace

int64_t fp32_model_state_bytes(int stage, int64_t params, int world) {
  const int64_t shard = checked_shard(stage, params, world);
  switch (stage) {
    case 0:
      return 16 * params;
    case 1:
      return 8 * params + 8 * shard;
    case 2:
      return 4 * params + 12 * shard;
    default:
      return 16 * shard;
  }
}

int64_t nvme_model_state_bytes(int stage, int64_t params, int world, bool half_precision,
                               bool optimizer, bool offload_params, bool gradients) {
  const int64_t shard = checked_shard(stage, params, world);
  TS_CHECK(!optimizer || stage >= 1,
           "[estimate_memory] offload_optimizer needs ZeRO stage 1 to 3, found ", stage);
  TS_CHECK(!offload_params || (stage == 3 && (half_precision || optimizer)),
           "[estimate_memory] offload_param needs ZeRO stage 3, and with f32 parameters (their "
           "own masters) offload_optimizer too; found stage ",
           stage, half_precision ? " with 16-bit" : " with f32", " parameters",
           optimizer ? "" : " and no offload_optimizer");
  const int64_t masters = half_precision ? 4 : 0;
  const int64_t gradient_bytes = stage >= 2 && gradients ? 4 : 0;
  // The shard the gathers send: 16-bit, or the f32 parameters themselves.
  const int64_t shard_bytes = offload_params ? (half_precision ? 2 : 4) : 0;
  return (optimizer ? 8 + masters + gradient_bytes : 0) * shard + shard_bytes * shard;
}

int64_t expert_split_model_state_bytes(const std::function<int64_t(int64_t, int)>& bytes,
                                       int64_t params, int64_t experts, int world, int ep) {
  TS_CHECK(ep >= 1 && world % ep == 0 && experts >= 0 && experts <= params,
           "[memory] expected ep_size dividing the world and experts among the parameters, "
           "found ep_size ",
           ep, ", world ", world, ", ", experts, " experts of ", params, " parameters");
  const int64_t others = bytes(params - experts, world);
  return experts > 0 ? others + bytes(experts / ep, world / ep) : others;
}

int64_t mixed_model_state_bytes(int stage, int64_t params, int world, bool f32_accumulation) {
  const int64_t shard = checked_shard(stage, params, world);
  switch (stage) {
    case 0:
      return 20 * params;
    case 1:
      return 4 * params + 16 * shard + (f32_accumulation ? 4 * params : 0);
    case 2:
      return 2 * params + 16 * shard;
    default:
      return 18 * shard;
  }
}

namespace {

void check_cluster(int64_t params, int gpus_per_node, int nodes) {
  TS_CHECK(params >= 0, "[estimate_memory] expected a parameter count >= 0, found ", params);
  TS_CHECK(gpus_per_node >= 1 && nodes >= 1,
           "[estimate_memory] expected at least 1 GPU per node and 1 node, found ", gpus_per_node,
           " and ", nodes);
}

}  // namespace

DeviceHostBytes deepspeed_zero2_estimate(int64_t params, int gpus_per_node, int nodes,
                                         bool cpu_offload, double buffer_factor) {
  check_cluster(params, gpus_per_node, nodes);
  const double p = static_cast<double>(params);
  const double total_gpus = static_cast<double>(gpus_per_node) * nodes;
  if (cpu_offload) {
    return {2 * p, p * std::max(4 * total_gpus, 16.0) * buffer_factor};
  }
  return {2 * p + 18 * p / total_gpus, 4 * p * gpus_per_node * buffer_factor};
}

DeviceHostBytes deepspeed_zero3_estimate(int64_t params, int64_t largest_layer_params,
                                         int gpus_per_node, int nodes, bool offload_params,
                                         bool offload_optimizer, bool zero_init,
                                         double buffer_factor) {
  check_cluster(params, gpus_per_node, nodes);
  const double p = static_cast<double>(params);
  const double g = gpus_per_node;
  const double n = nodes;
  const double total_gpus = g * n;
  const double largest_layer = 4.0 * static_cast<double>(largest_layer_params);
  if (offload_params && offload_optimizer) {
    return {largest_layer,
            zero_init ? 18 * p * buffer_factor / n : p * std::max(4 * g, 18 / n) * buffer_factor};
  }
  if (offload_optimizer) {
    return {largest_layer + 2 * p / total_gpus,
            zero_init ? 16 * p * buffer_factor / n : p * std::max(4 * g, 16 / n) * buffer_factor};
  }
  TS_CHECK(!offload_params,
           "[estimate_memory] DeepSpeed offloads parameters only together with the optimizer "
           "state; expected offload_optimizer with offload_params");
  return {largest_layer + 18 * p / total_gpus,
          zero_init ? largest_layer * g * buffer_factor : 4 * p * g * buffer_factor};
}

}  // namespace tessera::parallel
