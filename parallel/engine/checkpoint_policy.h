// DeepSpeed's activation_checkpointing options as a CheckpointPolicy (autograd/
// checkpoint.h) for the segments a model recomputes (model.checkpoint_activations or
// pipeline.activation_checkpoint_interval).
#pragma once

#include <cstdint>
#include <memory>

#include "autograd/checkpoint.h"
#include "core/device.h"
#include "parallel/comm/communicator.h"
#include "parallel/engine_config.h"

namespace tessera::parallel {

// The checkpointed segments' time since the last reset (activation_checkpointing.profile).
struct CheckpointTimes {
  int64_t segments = 0;   // forward runs
  double forward_s = 0;   // their forward runs
  double backward_s = 0;  // their recomputations with their backward
};

// The policy of `config` for a model on `device` (deepspeed/runtime/activation_checkpointing/
// checkpointing.py):
//   partition_activations: each segment input is kept as this rank's 1/|slices| piece of
//     its flat values (zero-padded), all-gathered over `slices`, the tensor-parallel group
//     (whose ranks hold the same replicated input), for the recomputation; with no group or
//     one of size 1 there is nothing to split.
//   cpu_checkpointing: kept inputs (or pieces) live in host memory and move back to
//     `device` for the recomputation (on the CPU they are there already).
//   synchronize_checkpoint_boundary: the device is synchronized after each segment's
//     forward and around its recomputation (CPU work is synchronous already).
//   profile: the segments' times are added into *times, which must then be non-null (on
//     CUDA the device is synchronized at each boundary, so that the times are the work's).
// Collective over `slices` in backward when partitioning: the ranks recompute in the same
// order. `slices` must outlive the policy and every model holding it.
CheckpointPolicy make_checkpoint_policy(const ActivationCheckpointingConfig& config,
                                        Communicator* slices, Device device,
                                        std::shared_ptr<CheckpointTimes> times);

}  // namespace tessera::parallel
