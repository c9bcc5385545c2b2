// The groups of expert parallelism: DeepSpeed's _create_expert_and_data_parallel
// (deepspeed/utils/groups.py) over one data-parallel group.
//
// Note [Expert groups]
// A data group of D ranks with ep_size P (P divides D) splits two ways, as DeepSpeed's
// default "E + D" layout: the expert-parallel groups are consecutive blocks of P data
// ranks, [0, P), [P, 2P), ...; a rank holds E / P of each MoE layer's experts and trades
// tokens with its block (models/moe/moe_layer.h, Note [Expert parallelism]). The
// expert-data-parallel groups are the ranks at the same place in every block, {i, i + P,
// i + 2P, ...}: the D / P ranks that hold the same experts, over which the experts'
// gradients are reduced and their optimizer state sharded (parallel/zero/zero_optimizer.h,
// Note [Expert parameters]). With D = 4 and P = 2: expert groups {0, 1}, {2, 3}; expert-data
// groups {0, 2}, {1, 3}. Within each group a rank's rank follows its data rank.
#pragma once

#include <memory>

#include "parallel/comm/communicator.h"

namespace tessera::parallel {

struct ExpertGroups {
  std::unique_ptr<Communicator> expert;       // P ranks: the token all-to-alls
  std::unique_ptr<Communicator> expert_data;  // D / P ranks: the experts' gradients
};

// Splits `data` (D ranks) for ep_size `ep` (Note [Expert groups]). Collective over `data`;
// throws on every rank, naming both numbers, unless ep >= 1 divides D.
ExpertGroups make_expert_groups(Communicator& data, int ep);

}  // namespace tessera::parallel
