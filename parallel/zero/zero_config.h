// The `zero_optimization` section of a DeepSpeed config (deepspeed/runtime/zero/config.py),
// with DeepSpeed's keys and code defaults.
#pragma once

#include <cstdint>
#include <string>

#include "core/direct_file.h"
#include "core/json.h"

namespace tessera::parallel {

// zero_optimization.offload_optimizer (deepspeed/runtime/zero/offload_config.py): where the
// optimizer's state lives between steps (Note [Offloaded optimizer state] in
// parallel/offload/swapped_optimizer_state.h).
struct OffloadOptimizerConfig {
  enum class Device { none, cpu, nvme };
  Device device = Device::none;
  std::string nvme_path;     // the directory of the swap files (nvme)
  int64_t buffer_count = 4;  // staging buffers of the swapper
  // Overlap a sub-group's reads and writes with its neighbours' updates, for memory.
  bool pipeline_read = false;
  bool pipeline_write = false;
  // A GPU run's host masters and gradient copies in pinned memory ("cpu": Note [Offload on a
  // GPU] in zero_optimizer.h), for faster transfers; a CPU run's state is host memory.
  bool pin_memory = false;
};

// zero_optimization.offload_param (deepspeed/runtime/zero/offload_config.py): where stage
// 3's 16-bit parameter partition lives between the module calls that gather it (Note
// [Offloaded parameters] in parallel/zero/partitioned_params.h).
struct OffloadParamConfig {
  enum class Device { none, cpu, nvme };
  Device device = Device::none;
  std::string nvme_path;              // the directory of the swap files (nvme)
  int64_t buffer_count = 5;           // staging buffers of the swapper
  int64_t buffer_size = 100'000'000;  // elements per staging buffer
  // A GPU run's 16-bit shard in pinned host memory with device "cpu" (Note [Offloaded
  // parameters] in partitioned_params.h), for faster copies to the device.
  bool pin_memory = false;
};

struct ZeroConfig {
  int stage = 0;  // 0 plain data parallelism; 1 optimizer state; 2 + gradients; 3 + parameters
  // Elements per gradient reduction block (Note [Flat layout] in flat_layout.h).
  int64_t reduce_bucket_size = 500'000'000;
  // Elements per parameter all-gather; stage 1/2 blocks honour both sizes.
  int64_t allgather_bucket_size = 500'000'000;
  // Reduce gradients from backward hooks as blocks complete (stage 0 and 1; stage 2 always
  // does). DeepSpeed's default: true for stage 3, false otherwise.
  bool overlap_comm = false;
  // Gradients are always copied into contiguous blocks for reduction; kept for DeepSpeed
  // configs.
  bool contiguous_gradients = true;
  // true: each block is reduce-scattered to its owners; false: all-reduced, each rank
  // keeping its chunk (twice the bytes).
  bool reduce_scatter = true;
  // Stage 3 (Note [ZeRO-3 parameters] in partitioned_params.h): elements prefetched ahead
  // of use, parameters of at most this many elements kept whole, the most gathered
  // elements at a time, the reuse distance (elements) under which a parameter stays.
  int64_t stage3_prefetch_bucket_size = 50'000'000;
  int64_t stage3_param_persistence_threshold = 100'000;
  int64_t stage3_max_live_parameters = 1'000'000'000;
  int64_t stage3_max_reuse_distance = 1'000'000'000;

  // Elements of the optimizer's fp32 partition stepped together when its state is
  // offloaded to NVMe (DeepSpeed's sub-groups): consecutive blocks' chunks up to this many.
  int64_t sub_group_size = 1'000'000'000;
  OffloadOptimizerConfig offload_optimizer;
  OffloadParamConfig offload_param;
  // DeepSpeed's top-level `aio` section, here because NVMe offload's swap files use it.
  AioConfig aio;

  // DeepSpeed's top-level prescale_gradients and gradient_predivide_factor, here because
  // ZeRO's reductions apply them (Note [Gradient averaging] in gradient_reducer.h).
  bool prescale_gradients = false;
  double gradient_predivide_factor = 1.0;

  // The elements of a stage 0-2 block: min(reduce_bucket_size, allgather_bucket_size).
  int64_t block_numel() const;
};

// Reads `section` ($.zero_optimization). Features Tessera does not have (parameter offload,
// ZeRO++, MiCS) are errors that say so.
ZeroConfig parse_zero_config(JsonObjectReader section);

}  // namespace tessera::parallel
