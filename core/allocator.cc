#include "core/allocator.h"

#include <cstdlib>

#include "core/caching_allocator.h"
#include "core/cuda_runtime.h"

namespace tessera {

Allocator& allocator_for(Device device) {
  if (device.is_cpu()) {
    // 64-byte aligned blocks; blocks of 1 MiB and more are cached (Note [Block cache]).
    static CachingAllocator cpu(
        "cpu allocator",
        {.small_unit = kCpuAlignment,
         .large_unit = size_t{64} << 10,
         .large_min = size_t{1} << 20,
         .min_cached = size_t{1} << 20,
         .max_cached = size_t{4} << 30},
        [](size_t n) { return std::aligned_alloc(kCpuAlignment, n); },
        [](void* p) { std::free(p); });
    return cpu;
  }
  return cuda::allocator(device.index);
}

}  // namespace tessera
