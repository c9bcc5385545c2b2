#include "core/caching_allocator.h"

#include <algorithm>

#include "core/error.h"

namespace tessera {

CachingAllocator::CachingAllocator(std::string name, CachingPolicy policy,
                                   std::function<void*(size_t)> raw_alloc,
                                   std::function<void(void*)> raw_free)
    : name_(std::move(name)),
      policy_(policy),
      raw_alloc_(std::move(raw_alloc)),
      raw_free_(std::move(raw_free)) {}

CachingAllocator::~CachingAllocator() { release_cached(); }

size_t CachingAllocator::round_size(size_t n) const {
  const size_t unit = n >= policy_.large_min ? policy_.large_unit : policy_.small_unit;
  return (n + unit - 1) / unit * unit;
}

void* CachingAllocator::allocate(size_t nbytes) {
  if (nbytes == 0) return nullptr;
  const size_t size = round_size(nbytes);
  std::lock_guard<std::mutex> lock(mutex_);
  void* ptr = nullptr;
  auto it = cache_.find(size);
  if (it != cache_.end() && !it->second.empty()) {
    ptr = it->second.back();
    it->second.pop_back();
    cached_ -= size;
  } else {
    ptr = raw_alloc_(size);
    if (ptr == nullptr) {
      // Give the cache back to the system and try once more before failing.
      release_cached_locked();
      ptr = raw_alloc_(size);
    }
    TS_CHECK(ptr != nullptr, "[", name_, "] out of memory: could not allocate ", nbytes, " bytes (",
             stats_.allocated, " bytes allocated, ", stats_.reserved, " reserved)");
    stats_.reserved += static_cast<int64_t>(size);
  }
  ++stats_.num_allocs;
  stats_.allocated += static_cast<int64_t>(size);
  stats_.peak_allocated = std::max(stats_.peak_allocated, stats_.allocated);
  return ptr;
}

void CachingAllocator::deallocate(void* ptr, size_t nbytes) {
  if (ptr == nullptr) return;
  const size_t size = round_size(nbytes);
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.allocated -= static_cast<int64_t>(size);
  if (size >= policy_.min_cached && cached_ + size <= policy_.max_cached) {
    cache_[size].push_back(ptr);
    cached_ += size;
    return;
  }
  stats_.reserved -= static_cast<int64_t>(size);
  raw_free_(ptr);
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void CachingAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.peak_allocated = stats_.allocated;
}

void CachingAllocator::release_cached() {
  std::lock_guard<std::mutex> lock(mutex_);
  release_cached_locked();
}

void CachingAllocator::release_cached_locked() {
  for (auto& [size, ptrs] : cache_) {
    for (void* p : ptrs) raw_free_(p);
    stats_.reserved -= static_cast<int64_t>(size * ptrs.size());
    ptrs.clear();
  }
  cached_ = 0;
}

}  // namespace tessera
