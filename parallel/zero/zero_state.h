// ZeRO's sharded optimizer state (stages 1-3) and the whole per-parameter state that
// checkpoints reshard through (Note [ZeRO stages] in parallel/zero/zero_optimizer.h).
//
// A sharded stage's optimizer steps one parameter per block chunk this rank owns, named
// chunk_name(b), so its state has keys "<kind>.zero_block_<b>". A rank's shard file holds
// one tensor per kind of layout.shard_numel() elements that those chunks tile; the whole
// state holds "<kind>.<parameter name>" with each parameter's shape, whatever the world.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "autograd/module.h"
#include "parallel/zero/flat_layout.h"

namespace tessera::parallel {

// The optimizer parameter of block `block`'s chunk: "zero_block_<block>".
std::string chunk_name(int64_t block);

// Chunk states ("step", "<kind>.zero_block_<b>") -> "step" and one shard tensor per kind.
StateDict chunks_to_shard(const StateDict& chunk_state, const FlatLayout& layout);

// Whole per-parameter state ("step", "<kind>.<parameter name>") -> rank `rank`'s chunk
// states. Throws when a kind lacks a parameter or a key is not "<kind>.<name>".
StateDict whole_to_chunks(const StateDict& whole, const FlatLayout& layout, int rank);

// The whole per-parameter optimizer state ("step", "<kind>.<parameter name>") from the
// shards that the ranks of a stage 1-3 run saved (ZeroOptimizer::state_dict(), rank order)
// under `layout`. All must agree on the step and the kinds.
StateDict whole_state(const FlatLayout& layout, const std::vector<StateDict>& shards);

}  // namespace tessera::parallel
