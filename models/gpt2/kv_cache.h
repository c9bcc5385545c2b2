// Keys and values of past positions, for generation in O(T) per new token.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "models/gpt2/config.h"

namespace tessera {

// One (B, H, capacity, D) key and value buffer per layer; positions [0, length) are filled.
struct KvCache {
  // Allocates buffers for `batch` sequences of up to `capacity` positions on `device`.
  KvCache(const GptConfig& cfg, int64_t batch, int64_t capacity, DType dtype = DType::f32,
          Device device = Device::cpu());

  std::vector<Tensor> keys;    // per layer (B, H, capacity, D)
  std::vector<Tensor> values;  // per layer (B, H, capacity, D)
  int64_t length = 0;          // positions already cached
  int64_t capacity = 0;
};

}  // namespace tessera
