// A training shard of random tokens for the trainer tests.
#pragma once

#include <cstdint>
#include <filesystem>
#include <vector>

#include "core/philox.h"
#include "tools/data/shard.h"

namespace tessera::testing {

// `dir`/train_000000.bin: 8192 tokens below `vocab`, drawn from Philox stream `seed`.
inline void write_random_shard(const std::filesystem::path& dir, uint32_t seed,
                               uint32_t vocab = 29) {
  std::vector<uint16_t> tokens(8192);
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<uint16_t>(philox4x32(i, 0, seed)[0] % vocab);
  }
  std::filesystem::create_directories(dir);
  data::write_shard((dir / "train_000000.bin").string(), tokens);
}

}  // namespace tessera::testing
