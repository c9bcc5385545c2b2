// What a run config resolves to, for `train --check-config`: the batch triple, the rank
// layout, precision and ZeRO stage, optimizer and schedule, the model, its model-state
// memory per rank and the data the run would read.
#pragma once

#include <string>
#include <vector>

#include "tools/trainer/run_config.h"

namespace tessera::train {

// The resolved configuration of `config` over `world_size` ranks, one line each. Checks
// that the data globs match shards (expand_glob's error otherwise), as the run would when
// it starts.
std::vector<std::string> describe_run_config(const RunConfig& config, int64_t world_size);

}  // namespace tessera::train
