// Model-state memory per rank under ZeRO: Tessera's fp32 training, and DeepSpeed's own
// estimators (estimate_zero2_model_states_mem_needs, estimate_zero3_model_states_mem_needs)
// for mixed-precision GPU training, so a user can size a run before starting it.
#pragma once

#include <cstdint>
#include <functional>

namespace tessera::parallel {

// Note [fp32 model states]
// Tessera's CPU training keeps fp32 parameters (4 bytes), gradients (4) and Adam moments
// (8) per parameter. Stage 1 shards the moments, stage 2 also the gradients, stage 3 also
// the parameters, each into `world` equal shards of ceil(params / world) elements (the
// flat buffer is padded to a multiple of the world size):
//   stage 0: 16 P    stage 1: 8 P + 8 S    stage 2: 4 P + 12 S    stage 3: 16 S
// with S = ceil(P / world). Bucket and gathered-parameter buffers come on top.
int64_t fp32_model_state_bytes(int stage, int64_t params, int world);

// Note [16-bit model states]
// With fp16/bf16 parameters (Note [Mixed precision] in parallel/zero/zero_optimizer.h) a
// rank holds the 16-bit parameters (2 bytes), a 16-bit gradient buffer (2, stages 0-1), the
// f32 averaged gradient (4), f32 masters (4) and Adam moments (8), sharded as
//   stage 0: 20 P    stage 1: 4 P + 16 S    stage 2: 2 P + 16 S    stage 3: 18 S
// with S = ceil(P / world); bf16 accumulation in f32 over several micro-batches adds a
// flat f32 sum at stage 1 (4 P; stage 0 sums in its averaged gradient). DeepSpeed's
// stage_1_and_2.py holds the same at stage 1 and a 16-bit gradient partition more at
// stage 2 (its estimator: 2 P + 18 P / world); its stage 3 estimate is 18 P / world.
// Stage 3's persistent parameters and gathered ones come on top.
int64_t mixed_model_state_bytes(int stage, int64_t params, int world, bool f32_accumulation);

// Note [Expert model states]
// Under expert parallelism with ep_size `ep` (Note [Expert parameters] in
// parallel/zero/zero_optimizer.h) a rank of `world` holds the parameters other than the
// `experts` as above, and 1 / ep of the experts sharded over the world / ep ranks that hold
// the same ones: bytes(params - experts, world) + bytes(experts / ep, world / ep), `bytes`
// being one of the functions above for a stage and precision. Throws unless ep divides
// world.
int64_t expert_split_model_state_bytes(const std::function<int64_t(int64_t, int)>& bytes,
                                       int64_t params, int64_t experts, int world, int ep);

// Note [Offloaded model states]
// With offload_optimizer "nvme" (stages 1-3; Note [ZeRO's offloaded state] in
// parallel/zero/zero_offload.h) part of the bytes above lives in the swap file: the Adam
// moments (8 S), with 16-bit parameters the f32 masters (4 S), and at stages 2-3 the f32
// gradient shard (4 S):
//   16-bit: stage 1: 12 S    stages 2-3: 16 S
//   f32:    stage 1:  8 S    stages 2-3: 12 S  (f32 parameters are their own masters)
// What stays in memory is the rest (16-bit at stage 3: 2 S). A step brings one sub-group
// of it in at a time (sub_group_size elements, with the bytes per element above). The
// gradients are in the file from backward to the step only. offload_param "nvme" (stage 3,
// Note [Offloaded parameters] in partitioned_params.h) adds the 16-bit shard, 2 S, or with
// f32 parameters (and offload_optimizer) their f32 shard, 4 S:
// `optimizer` and `offload_params` say which of the two are offloaded. On a GPU (Note
// [Offload on a GPU] in zero_optimizer.h) the same bytes leave the device for host memory
// ("cpu") or the swap file ("nvme"), but for the gradients, which stay: `gradients` false.
int64_t nvme_model_state_bytes(int stage, int64_t params, int world, bool half_precision,
                               bool optimizer = true, bool offload_params = false,
                               bool gradients = true);

// Device and host bytes, as DeepSpeed's estimators report them.
struct DeviceHostBytes {
  double device = 0;
  double host = 0;
};

// DeepSpeed's ZeRO-2 estimate for `params` parameters on nodes x gpus_per_node GPUs:
// offload: device 2P, host P max(4T, 16) f; otherwise device 2P + 18P/T, host 4P G f, with
// T = nodes x gpus_per_node and f = buffer_factor.
DeviceHostBytes deepspeed_zero2_estimate(int64_t params, int gpus_per_node, int nodes,
                                         bool cpu_offload, double buffer_factor = 1.5);

// DeepSpeed's ZeRO-3 estimate; largest_layer_params is the largest module's parameter count
// (L). With zero_init the model is built partitioned (deepspeed.zero.Init), so the host
// never holds it whole.
DeviceHostBytes deepspeed_zero3_estimate(int64_t params, int64_t largest_layer_params,
                                         int gpus_per_node, int nodes, bool offload_params,
                                         bool offload_optimizer, bool zero_init,
                                         double buffer_factor = 1.5);

}  // namespace tessera::parallel
