// A bounded cache of built plans (cuDNN execution plans, kernels/cuda/cudnn_attention.cu)
// keyed by the problem they were built for, least recently used out first. Building a
// plan compiles a kernel (seconds), running one takes microseconds, and a training run
// sees a handful of shapes: the bound only keeps a run over many shapes (generation with a
// growing length) from holding every plan it ever built.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <utility>
#include <vector>

#include "core/error.h"

namespace tessera::kernels {

template <class Value>
class PlanCache {
 public:
  using Key = std::vector<int64_t>;

  explicit PlanCache(size_t capacity) : capacity_(capacity) {
    TS_CHECK(capacity > 0, "[PlanCache] expected a capacity of at least 1, found 0");
  }

  // The value cached under `key` (now the most recently used), or null.
  Value* find(const Key& key) {
    const auto it = index_.find(key);
    if (it == index_.end()) return nullptr;
    entries_.splice(entries_.begin(), entries_, it->second);
    return &it->second->second;
  }

  // Caches `value` under `key` (which must be absent), dropping the least recently used
  // entry when full; returns the cached value.
  Value& insert(const Key& key, Value value) {
    TS_CHECK(index_.count(key) == 0, "[PlanCache] a plan is already cached under this key");
    if (entries_.size() == capacity_) {
      index_.erase(entries_.back().first);
      entries_.pop_back();
    }
    entries_.emplace_front(key, std::move(value));
    index_.emplace(key, entries_.begin());
    return entries_.front().second;
  }

  size_t size() const { return entries_.size(); }

 private:
  using Entry = std::pair<Key, Value>;
  size_t capacity_;
  std::list<Entry> entries_;  // most recently used first
  std::map<Key, typename std::list<Entry>::iterator> index_;
};

}  // namespace tessera::kernels
