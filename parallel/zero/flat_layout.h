// FlatLayout: where every trainable parameter lives in ZeRO's flat buffers, and which
// rank owns which elements.
//
// Note [Flat layout]
// Parameters are laid end to end in optimizer-group order (the order of the groups, then
// of the parameters inside each group), as DeepSpeed flattens its groups. The sequence is
// cut into blocks on parameter boundaries: a block holds consecutive parameters of one
// group, at most `block_numel` elements of them, or a single parameter larger than that.
// Each block is padded with zeros to a multiple of the world size W and split into W equal
// chunks; rank r owns chunk r of every block, and its shard is the concatenation of its
// chunks in block order. So
//   - a block's gradient is reduced with one equal-block reduce_scatter (each rank
//     receives exactly the elements it owns) and its parameters re-assembled with one
//     all_gather, the volumes ZeRO's analysis assumes;
//   - every element belongs to exactly one rank, and every rank's shard has the same size;
//   - a chunk lies in one optimizer group, so the sharded optimizer steps each chunk with
//     its group's hyperparameters.
// Blocks are the reduce buckets (reduce_bucket_size) for stages 0-2. DeepSpeed's stage 1/2
// instead splits the whole flat buffer into W contiguous partitions; per-bucket chunks
// give the same ownership fractions with exact reduce-scatters. Unshard()/shard() convert
// between per-rank shards and whole per-parameter tensors, which is how checkpoints change
// world size.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/shape.h"
#include "core/tensor.h"

namespace tessera::parallel {

// A parameter as the layout sees it.
struct FlatParamInfo {
  std::string name;
  Shape shape;
  int group = 0;  // optimizer group index
};

struct FlatLayout {
  struct Param {
    std::string name;
    Shape shape;
    int group = 0;
    int64_t offset = 0;  // first element in the padded flat buffer
    int64_t numel = 0;
    int64_t block = 0;  // the block that holds it
  };
  struct Block {
    int64_t offset = 0;        // first element in the padded flat buffer
    int64_t numel = 0;         // padded: a multiple of world
    int64_t chunk = 0;         // numel / world: the elements each rank owns
    int64_t shard_offset = 0;  // where each rank's chunk of it starts in the rank's shard
    int64_t first_param = 0;   // params [first_param, end_param)
    int64_t end_param = 0;
    int group = 0;
  };

  int world = 1;
  int64_t block_numel = 0;    // the largest block of several parameters
  std::vector<Param> params;  // flat order
  std::vector<Block> blocks;
  int64_t numel = 0;        // padded flat buffer size: the sum of block sizes
  int64_t param_numel = 0;  // parameters' elements (without padding)

  // Elements of each rank's shard: numel / world.
  int64_t shard_numel() const { return numel / world; }
  // Where rank r's chunk of block b starts in the flat buffer.
  int64_t chunk_offset(int64_t block, int rank) const {
    return blocks[block].offset + rank * blocks[block].chunk;
  }

  // {"world": W, "block_numel": n, "params": [{"name", "shape", "group"}, ...]}: the
  // inputs of make_flat_layout(), enough to unshard a checkpoint without the model.
  nlohmann::json to_json() const;
  // Rebuilds the layout from to_json()'s output, read strictly; errors name `source`.
  static FlatLayout from_json(const nlohmann::json& doc, const std::string& source);
};

// Lays out `params` (flat order; groups must be non-decreasing) for `world` ranks with
// blocks of at most `block_numel` elements (>= 1). See Note [Flat layout].
FlatLayout make_flat_layout(const std::vector<FlatParamInfo>& params, int world,
                            int64_t block_numel);

// The whole per-parameter tensors (name -> tensor of the parameter's shape, flat order)
// from the `world` shards of one state kind, each of layout.shard_numel() elements.
std::vector<std::pair<std::string, Tensor>> unshard(const FlatLayout& layout,
                                                    const std::vector<Tensor>& shards);
// Rank `rank`'s shard (shard_numel() elements, padding zero) of a state given as whole
// per-parameter tensors; `whole` must hold every parameter of the layout, with its shape.
Tensor shard(const FlatLayout& layout, int rank,
             const std::vector<std::pair<std::string, Tensor>>& whole);

}  // namespace tessera::parallel
