// A caching allocator over raw system allocation functions, shared by the CPU allocator
// and the CUDA allocator.
//
// Note [Block cache]
// Freed blocks are kept in exact-size free lists and handed out again: cudaMalloc and
// cudaFree synchronize the device, and on the host glibc serves large blocks with fresh
// mmap pages whose first touch costs more than the kernel that fills them (a 51 MB
// LM-head output: 30-40 ms). Training allocates the same sizes every step, so exact-size
// reuse hits almost always. Sizes are rounded up so near sizes share a list.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "core/allocator.h"

namespace tessera {

struct CachingPolicy {
  size_t small_unit;  // rounding below `large_min`
  size_t large_unit;  // rounding at or above `large_min`
  size_t large_min;
  size_t min_cached;  // smaller blocks go straight back to the system
  size_t max_cached;  // bytes kept in the cache at most
};

class CachingAllocator final : public Allocator {
 public:
  // `raw_alloc(bytes)` returns nullptr on failure; `raw_free(ptr)` returns a block.
  // `name` leads error messages ("cpu allocator", "cuda:0 allocator").
  CachingAllocator(std::string name, CachingPolicy policy, std::function<void*(size_t)> raw_alloc,
                   std::function<void(void*)> raw_free);
  ~CachingAllocator() override;

  void* allocate(size_t nbytes) override;
  void deallocate(void* ptr, size_t nbytes) override;
  AllocatorStats stats() const override;
  void reset_peak() override;
  // Returns every cached block to the system.
  void release_cached() override;

 private:
  size_t round_size(size_t n) const;
  void release_cached_locked();

  std::string name_;
  CachingPolicy policy_;
  std::function<void*(size_t)> raw_alloc_;
  std::function<void(void*)> raw_free_;
  mutable std::mutex mutex_;
  std::map<size_t, std::vector<void*>> cache_;
  size_t cached_ = 0;
  AllocatorStats stats_;
};

}  // namespace tessera
