// DataLoader: (B, T) batches of next-token training pairs from llm.c token shards.
//
// Every batch row is T + 1 consecutive tokens of one shard: inputs are the first T,
// targets the last T. Shards are read in sorted path order, one mapped at a time.
//
// Note [Loader cursor]
// The cursor is (shard, position, epoch, step), the same on every rank. `position` is the
// token offset in the shard where the next group of world_size batches starts; after each
// batch it moves on by B*T*world_size, and when the next group would not fit
// (position + B*T*world_size + 1 > ntok) the loader moves to the next shard, or back to
// the first one with epoch + 1. So every rank takes the same number of batches from each
// shard and changes shard at the same step.
//   sequential (llm.c): rank r reads the B*T + 1 tokens at position + r*B*T; row b is
//     tokens [b*T, b*T + T] of them. Ranks read disjoint inputs.
//   random (nanoGPT): row b starts at a uniform offset in [0, ntok - T - 1] drawn by
//     Philox from key = seed, counter = (step, rank * B + b); the cursor moves as in
//     sequential mode, so a shard gets as many batches per epoch in both modes (at least
//     one).
// In both modes the W ranks' batches of B rows are, row for row, the one batch of W*B rows
// that a single rank would read at the same step: data parallelism does not change the
// data a global batch holds.
// state() and restore() save and reinstate the cursor: batches after restore() are those
// of an uninterrupted run.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "tools/data/shard.h"

namespace tessera::data {

enum class LoaderMode { kSequential, kRandom };

struct LoaderOptions {
  int64_t batch_size = 1;  // B: rows per batch, per rank
  int64_t seq_len = 1;     // T: tokens per row
  uint64_t seed = 0;       // random mode's Philox key
  int64_t rank = 0;        // in [0, world_size)
  int64_t world_size = 1;  // data-parallel ranks reading the same shards
  LoaderMode mode = LoaderMode::kSequential;
  int64_t vocab_size = 65536;  // every token must be below it; in [1, 65536]
};

// The resumable cursor of a DataLoader (see Note [Loader cursor]).
struct LoaderState {
  int64_t shard = 0;     // index into DataLoader::shards()
  int64_t position = 0;  // token offset of the next group of batches in that shard
  int64_t epoch = 0;     // completed passes over all shards
  int64_t step = 0;      // batches returned so far, over all epochs

  // {"shard": s, "position": p, "epoch": e, "step": n}.
  nlohmann::json to_json() const;
  // Reads to_json()'s object strictly (all four keys, integers >= 0, no other key); errors
  // name the JSON path inside `source`.
  static LoaderState from_json(const nlohmann::json& doc,
                               const std::string& source = "loader state");
  bool operator==(const LoaderState&) const = default;
};

// A batch of next-token pairs.
struct Batch {
  Tensor inputs;   // (B, T) i32
  Tensor targets;  // (B, T) i32: each row's inputs shifted left by one token
};

// The paths that match the glob `pattern` ("dir/train_*.bin"), sorted; throws when none
// matches.
std::vector<std::string> expand_glob(const std::string& pattern);

class DataLoader {
 public:
  // Reads the shards that match the glob `pattern` (expand_glob()).
  DataLoader(const std::string& pattern, const LoaderOptions& options);
  // Reads `paths` in the given order. Throws for invalid options, and for a shard whose
  // header or size is wrong or that has fewer tokens than one batch needs (B*T + 1; in
  // sequential mode B*T*world_size + 1); all shards are checked here. A shard's tokens are
  // checked against vocab_size when it is first read.
  DataLoader(std::vector<std::string> paths, const LoaderOptions& options);

  // The next batch; moves the cursor. Errors of a shard read for the first time (tokens
  // outside the vocabulary) come from here and leave the cursor where it was.
  Batch next();

  // The cursor, to be saved with a checkpoint.
  LoaderState state() const;
  // Moves the cursor to `state`. Throws when its shard does not exist or its position lies
  // past the end of the shard; a position where the next group no longer fits (the world
  // size changed) moves on to the next shard.
  void restore(const LoaderState& state);
  // Back to the start: restore(LoaderState{}).
  void reset();

  // Completed passes over all shards.
  int64_t epoch() const { return epoch_; }
  // Tokens in one batch of this rank: B * T.
  int64_t tokens_per_batch() const { return options_.batch_size * options_.seq_len; }
  // The shard paths, in reading order.
  const std::vector<std::string>& shards() const { return paths_; }
  const LoaderOptions& options() const { return options_; }

 private:
  // The fewest tokens a shard must hold.
  int64_t min_shard_tokens() const;
  // Tokens the whole group of ranks consumes per step: B * T * world_size.
  int64_t group_tokens() const { return tokens_per_batch() * options_.world_size; }
  // Whether the group of batches at position_ fits in shard_ (which must be mapped).
  bool group_fits() const;
  // Maps shard `index` (unless it is the mapped one) and checks its tokens.
  void open_shard(int64_t index);
  // Moves the cursor to the next shard (or the first, with epoch + 1) at position 0; the
  // shard is mapped by the next call of next(), so that its errors come from there.
  void next_shard();

  std::vector<std::string> paths_;
  LoaderOptions options_;
  std::optional<TokenShard> current_;  // the mapped shard
  int64_t current_index_ = -1;         // its index, or -1
  int64_t shard_ = 0;
  int64_t position_ = 0;
  int64_t epoch_ = 0;
  int64_t step_ = 0;
};

}  // namespace tessera::data
