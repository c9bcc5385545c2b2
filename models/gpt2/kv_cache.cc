#include "models/gpt2/kv_cache.h"

#include "core/factories.h"

namespace tessera {

KvCache::KvCache(const GptConfig& cfg, int64_t batch, int64_t capacity_, DType dtype, Device device)
    : capacity(capacity_) {
  TS_CHECK(capacity_ > 0 && capacity_ <= cfg.block_size, "[KvCache] capacity: expected 1..",
           cfg.block_size, " (block_size), found ", capacity_);
  const Shape shape{batch, cfg.n_head, capacity_, cfg.head_dim()};
  for (int64_t l = 0; l < cfg.n_layer; ++l) {
    keys.push_back(zeros(shape, {dtype, device}));
    values.push_back(zeros(shape, {dtype, device}));
  }
}

}  // namespace tessera
