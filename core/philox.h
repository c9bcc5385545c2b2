// Counter-based random numbers: Philox4x32-10 (Salmon et al., SC'11).
//
// A draw is a pure function of (seed, counter), so CPU and CUDA kernels produce the same
// bits for the same element, and any element can be regenerated without replaying the
// stream (dropout masks are recomputed in backward instead of stored).
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include "core/philox_block.h"

namespace tessera {

// One Philox4x32-10 block (core/philox_block.h): 4 random 32-bit words for a 128-bit
// counter under a 64-bit key.
inline std::array<uint32_t, 4> philox4x32(uint64_t counter_lo, uint64_t counter_hi, uint64_t key) {
  const PhiloxWords r = philox_block(counter_lo, counter_hi, key);
  return {r.w[0], r.w[1], r.w[2], r.w[3]};
}

// A random stream: a key (seed) and a position in it (offset, counted in 4-word blocks).
// Element i of a tensor drawn at offset o uses word i % 4 of block o + i / 4; the draw
// then advances the offset past the blocks it used.
class Generator {
 public:
  explicit Generator(uint64_t seed = 0, uint64_t offset = 0) : seed_(seed), offset_(offset) {}
  // A generator keyed by (seed, name): parameter initialization is a function of the
  // parameter's name, not of creation order.
  static Generator for_name(uint64_t seed, std::string_view name);

  uint64_t seed() const { return seed_; }
  uint64_t offset() const { return offset_; }
  void set_offset(uint64_t offset) { offset_ = offset; }
  // Returns the current offset and moves past the blocks that `n` words use.
  uint64_t reserve(uint64_t n) {
    const uint64_t start = offset_;
    offset_ += (n + 3) / 4;
    return start;
  }

 private:
  uint64_t seed_;
  uint64_t offset_;
};

// 64-bit FNV-1a of a string, then mixed with `seed` (SplitMix64 finalizer).
uint64_t hash_name(uint64_t seed, std::string_view name);

}  // namespace tessera
