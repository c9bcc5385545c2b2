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

// The key of a rank's f32 parameter shard in its optimizer shard (checkpoints of ZeRO stage
// 3 and of 16-bit stages 1-2 hold no whole weights: ZeroOptimizer::shard_pieces).
inline constexpr const char* kParameterShard = "param";

// The optimizer parameter of block `block`'s chunk: "zero_block_<block>".
std::string chunk_name(int64_t block);

// Whole per-parameter state ("step", "<kind>.<parameter name>") -> rank `rank`'s chunk
// states. Throws when a kind lacks a parameter or a key is not "<kind>.<name>".
StateDict whole_to_chunks(const StateDict& whole, const FlatLayout& layout, int rank);

// The whole per-parameter optimizer state ("step", "<kind>.<parameter name>") from the
// shards that the ranks of a stage 1-3 run saved (ZeroOptimizer::state_dict(), rank order)
// under `layout`. All must agree on the step and the kinds.
StateDict whole_state(const FlatLayout& layout, const std::vector<StateDict>& shards);

}  // namespace tessera::parallel
