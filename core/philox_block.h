// One Philox4x32-10 block (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3",
// SC'11), compiled for the host and, under nvcc, for the device: the single definition
// that core/philox.h and the CUDA dropout kernel (kernels/cuda/dropout.cu) share, so that
// CPU and GPU dropout masks agree bit for bit. Plain C++ without nvcc.
#pragma once

#include <cstdint>

#include "core/host_device.h"

namespace tessera {

struct PhiloxWords {
  uint32_t w[4];
};

// The 4 random words of the block at the 128-bit counter (counter_hi, counter_lo) under
// the 64-bit `key`. The 32 x 32 -> 64-bit products are one mul.wide on the device.
TESSERA_HOST_DEVICE PhiloxWords philox_block(uint64_t counter_lo, uint64_t counter_hi,
                                             uint64_t key) {
  constexpr uint32_t kMul0 = 0xD2511F53u;
  constexpr uint32_t kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u;
  constexpr uint32_t kWeyl1 = 0xBB67AE85u;
  uint32_t c0 = static_cast<uint32_t>(counter_lo);
  uint32_t c1 = static_cast<uint32_t>(counter_lo >> 32);
  uint32_t c2 = static_cast<uint32_t>(counter_hi);
  uint32_t c3 = static_cast<uint32_t>(counter_hi >> 32);
  uint32_t k0 = static_cast<uint32_t>(key);
  uint32_t k1 = static_cast<uint32_t>(key >> 32);
#if defined(__CUDACC__)
#pragma unroll
#endif
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kMul0) * c0;
    const uint64_t p1 = static_cast<uint64_t>(kMul1) * c2;
    const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
    const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
    c0 = n0;
    c1 = static_cast<uint32_t>(p1);
    c2 = n2;
    c3 = static_cast<uint32_t>(p0);
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return {{c0, c1, c2, c3}};
}

// Uniform float in [0, 1) from a word's top 24 bits, exact in float.
TESSERA_HOST_DEVICE float uniform_from_bits(uint32_t bits) {
  return static_cast<float>(bits >> 8) * (1.0f / 16777216.0f);
}

}  // namespace tessera
