// Device memory allocators.
//
// The CPU allocator hands out 64-byte aligned blocks (one cache line, one AVX-512
// vector). The CUDA allocator is a stream-ordered caching allocator; its implementation
// lives behind core/cuda_runtime.h so that this header stays free of CUDA.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/device.h"

namespace tessera {

// Byte counters an allocator keeps; `peak_allocated` is the high-water mark since the
// last reset_peak().
struct AllocatorStats {
  int64_t allocated = 0;       // bytes handed out and not yet returned
  int64_t reserved = 0;        // bytes held from the system (>= allocated when caching)
  int64_t peak_allocated = 0;  // maximum of `allocated`
  int64_t num_allocs = 0;      // number of allocate() calls
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  // Returns a block of at least `nbytes` bytes (nullptr for 0 bytes); throws on failure.
  virtual void* allocate(size_t nbytes) = 0;
  // Returns a block obtained from allocate() with the same `nbytes`.
  virtual void deallocate(void* ptr, size_t nbytes) = 0;
  virtual AllocatorStats stats() const = 0;
  virtual void reset_peak() = 0;
  // Returns the blocks a caching allocator keeps for reuse to the system
  // (torch.cuda.empty_cache); nothing for the others.
  virtual void release_cached() {}
};

inline constexpr size_t kCpuAlignment = 64;

// The allocator of a device. The CPU allocator always exists; asking for a CUDA device
// throws when Tessera was built without CUDA or no such device is present.
Allocator& allocator_for(Device device);

// Host memory that goes back to the system the moment it is freed: each block is an
// anonymous mapping of its own, page-aligned, whole pages, uncached, and zero-filled. For
// storages whose point is to leave memory when released (NVMe offload's swapped storages),
// where the CPU allocator would keep them cached. Its pages are mapped where first touched,
// or by a direct read into them (which maps them in bulk), or by populate_pages().
Allocator& mapped_host_allocator();

// The most bytes this process has had resident in memory (getrusage's ru_maxrss).
int64_t peak_resident_bytes();

// Maps the pages of [data, data + nbytes) now, in one call to the kernel, where first
// touches would fault a page at a time (madvise's MADV_POPULATE_WRITE, Linux 5.14; a no-op
// on older kernels, whose pages then fault on first touch).
void populate_pages(void* data, size_t nbytes);

}  // namespace tessera
