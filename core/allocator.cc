#include "core/allocator.h"

#include <sys/mman.h>
#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "core/caching_allocator.h"
#include "core/cuda_runtime.h"
#include "core/error.h"

namespace tessera {
namespace {

class MappedHostAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    // Not populated: a direct read maps the pages as it fills them, on the I/O thread and
    // overlapped with the disk, where MAP_POPULATE would zero them first on the caller's.
    void* p = ::mmap(nullptr, nbytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    TS_CHECK(p != MAP_FAILED, "[mapped host allocator] cannot map ", nbytes,
             " bytes: ", std::strerror(errno));
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.allocated += static_cast<int64_t>(nbytes);
    stats_.reserved = stats_.allocated;
    stats_.peak_allocated = std::max(stats_.peak_allocated, stats_.allocated);
    ++stats_.num_allocs;
    return p;
  }
  void deallocate(void* ptr, size_t nbytes) override {
    if (ptr == nullptr) return;
    ::munmap(ptr, nbytes);
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.allocated -= static_cast<int64_t>(nbytes);
    stats_.reserved = stats_.allocated;
  }
  AllocatorStats stats() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }
  void reset_peak() override {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.peak_allocated = stats_.allocated;
  }

 private:
  mutable std::mutex mutex_;
  AllocatorStats stats_;
};

}  // namespace

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

int64_t peak_resident_bytes() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;  // KiB on Linux
}

void populate_pages(void* data, size_t nbytes) {
#ifdef MADV_POPULATE_WRITE
  ::madvise(data, nbytes, MADV_POPULATE_WRITE);  // a failure leaves the pages to fault
#endif
}

Allocator& mapped_host_allocator() {
  static MappedHostAllocator mapped;
  return mapped;
}

}  // namespace tessera
