// DeepSpeed's elasticity (deepspeed/elasticity/elasticity.py): one global batch size that
// many world sizes can train with, each with a micro-batch from a given list, so that a
// job restarted on another number of ranks keeps its batch (and so its learning dynamics).
//
// Note [Elastic batch]
// compute_elastic_config (version 0.1) takes each allowed micro-batch size and their least
// common multiple as bases; a base b at least max_train_batch_size is kept as it is (so the
// batch may exceed the maximum, as DeepSpeed's may), a smaller one is scaled by the largest
// highly composite number H with b * H <= max_train_batch_size. For each candidate batch B,
// the valid world sizes are the g = B / mb in [min_gpus, max_gpus] for every micro-batch mb
// dividing B, and every divisor i <= g / 2 of such a g in that range. The candidate with the
// most valid world sizes wins; ties go to the larger batch (prefer_larger_batch) or the
// smaller. Version 0.2 runs the same on whole nodes of num_gpus_per_node / model_parallel_size
// data-parallel ranks, and scales the result back. A run on `world` data-parallel ranks then
// needs `world` among the valid sizes, and takes the largest micro-batch dividing B / world,
// with B / (micro x world) accumulation steps.
#pragma once

#include <cstdint>
#include <vector>

#include "core/json.h"

namespace tessera::parallel {

// The "elasticity" section, DeepSpeed's keys and defaults.
struct ElasticityConfig {
  bool enabled = false;
  int64_t max_train_batch_size = 2000;
  std::vector<int64_t> micro_batch_sizes{2, 4, 6};
  int64_t min_gpus = 1;
  int64_t max_gpus = 10000;
  int64_t model_parallel_size = 1;
  int64_t num_gpus_per_node = 1;
  bool prefer_larger_batch = true;
  // The batch keys may stay in the config (they are overridden) instead of being an error.
  bool ignore_non_elastic_batch_info = false;
  double version = 0.2;

  // Reads and checks the section (DeepSpeed's ElasticityConfig: max_train_batch_size and
  // micro_batch_sizes required when enabled; min_time accepted without effect, as in
  // DeepSpeed); one-line errors name the key.
  static ElasticityConfig from_json(JsonObjectReader section);
};

// The batch every valid world size trains with (Note [Elastic batch]).
struct ElasticBatch {
  int64_t train_batch_size = 0;
  std::vector<int64_t> valid_world_sizes;  // ascending
};

// compute_elastic_config's batch and valid sizes for `config` (version 0.1 or 0.2); for
// 0.2's fall-back, `world` (data-parallel ranks) decides. Throws when a micro-batch exceeds
// max_train_batch_size.
ElasticBatch elastic_batch(const ElasticityConfig& config, int64_t world);

// The largest micro-batch of config.micro_batch_sizes that divides batch.train_batch_size /
// world. Throws, listing the valid sizes, when `world` is not one of them.
int64_t elastic_micro_batch(const ElasticityConfig& config, const ElasticBatch& batch,
                            int64_t world);

}  // namespace tessera::parallel
