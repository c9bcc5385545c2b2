// Token shards with a fixed successor rule, for the GPU trainer tests: a model learns them
// in a few steps, so CUDA runs can be compared with CPU runs that visibly train.
#pragma once

#include <cstdint>
#include <filesystem>
#include <vector>

#include "tools/data/shard.h"

namespace tessera::testing {

// The vocabulary of write_cycle_shards' tokens.
inline constexpr int64_t kCycleVocab = 29;

// `dir`/train_000000.bin (4096 tokens) and val_000000.bin (1024): token i is
// (7 i + offset) mod 29, offsets 0 and 3, so every token's successor is fixed (random tokens
// would leave the loss at ln 29, where it starts).
inline void write_cycle_shards(const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  auto tokens = [](size_t n, size_t offset) {
    std::vector<uint16_t> t(n);
    for (size_t i = 0; i < n; ++i) t[i] = static_cast<uint16_t>((7 * i + offset) % kCycleVocab);
    return t;
  };
  data::write_shard((dir / "train_000000.bin").string(), tokens(4096, 0));
  data::write_shard((dir / "val_000000.bin").string(), tokens(1024, 3));
}

}  // namespace tessera::testing
