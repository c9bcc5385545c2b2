// The CUDA runtime behind core/cuda_runtime.h (linked when the toolkit is found).
#include <cuda_runtime_api.h>

#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "core/cuda/check.h"
#include "core/cuda/copy_kernel.h"
#include "core/cuda_runtime.h"

namespace tessera::cuda {
namespace {

// Note [CUDA caching allocator]
// cudaMalloc/cudaFree synchronize the device and cost tens of microseconds, so freed blocks
// are kept in per-size-class free lists and handed out again. Sizes round up to 512 bytes
// below 1 MiB and to 2 MiB above. All work runs on one compute stream per device, so a
// block freed on the host may be reused by later work on that stream without an event.
class CachingAllocator final : public Allocator {
 public:
  explicit CachingAllocator(int device) : device_(device) {}

  void* allocate(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    const size_t size = round_size(nbytes);
    std::lock_guard<std::mutex> lock(mutex_);
    ++stats_.num_allocs;
    void* ptr = nullptr;
    auto it = free_.find(size);
    if (it != free_.end() && !it->second.empty()) {
      ptr = it->second.back();
      it->second.pop_back();
    } else {
      TS_CUDA_CHECK(cudaSetDevice(device_), device_);
      cudaError_t status = cudaMalloc(&ptr, size);
      if (status == cudaErrorMemoryAllocation) {
        // Return the cache to the driver and try once more before giving up.
        cudaGetLastError();
        release_cached_locked();
        status = cudaMalloc(&ptr, size);
      }
      TS_CHECK(status == cudaSuccess, "[cuda allocator] cudaMalloc of ", size,
               " bytes on cuda:", device_, " failed: ", cudaGetErrorString(status), " (",
               stats_.allocated, " bytes allocated, ", stats_.reserved, " reserved)");
      stats_.reserved += static_cast<int64_t>(size);
    }
    stats_.allocated += static_cast<int64_t>(size);
    stats_.peak_allocated = std::max(stats_.peak_allocated, stats_.allocated);
    return ptr;
  }

  void deallocate(void* ptr, size_t nbytes) override {
    if (ptr == nullptr) return;
    const size_t size = round_size(nbytes);
    std::lock_guard<std::mutex> lock(mutex_);
    free_[size].push_back(ptr);
    stats_.allocated -= static_cast<int64_t>(size);
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
  static size_t round_size(size_t n) {
    constexpr size_t kSmall = 512, kLarge = size_t{2} << 20, kLargeMin = size_t{1} << 20;
    const size_t unit = n < kLargeMin ? kSmall : kLarge;
    return (n + unit - 1) / unit * unit;
  }

  void release_cached_locked() {
    for (auto& [size, ptrs] : free_) {
      for (void* p : ptrs) {
        cudaFree(p);
        stats_.reserved -= static_cast<int64_t>(size);
      }
      ptrs.clear();
    }
  }

  int device_;
  mutable std::mutex mutex_;
  std::map<size_t, std::vector<void*>> free_;
  AllocatorStats stats_;
};

}  // namespace

bool is_built() { return true; }

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // no driver or no device: report zero and clear the sticky error
    return 0;
  }
  return n;
}

void check_device(int index) {
  const int n = device_count();
  TS_CHECK(n > 0, "[cuda] no CUDA device: expected a GPU for cuda:", index,
           ", found none (cudaGetDeviceCount reports 0 or no driver is loaded)");
  TS_CHECK(index >= 0 && index < n, "[cuda] no CUDA device cuda:", index,
           ": expected an index in [0, ", n, ")");
}

Allocator& allocator(int index) {
  check_device(index);
  // One allocator per device for the process lifetime, created on first use.
  static std::mutex mutex;
  static std::vector<std::unique_ptr<CachingAllocator>> allocators;
  std::lock_guard<std::mutex> lock(mutex);
  if (allocators.size() <= static_cast<size_t>(index)) allocators.resize(index + 1);
  if (!allocators[index]) allocators[index] = std::make_unique<CachingAllocator>(index);
  return *allocators[index];
}

void memcpy(void* dst, const void* src, size_t nbytes, CopyKind kind, int device) {
  check_device(device);
  TS_CUDA_CHECK(cudaSetDevice(device), device);
  const cudaMemcpyKind k = kind == CopyKind::host_to_device   ? cudaMemcpyHostToDevice
                           : kind == CopyKind::device_to_host ? cudaMemcpyDeviceToHost
                                                              : cudaMemcpyDeviceToDevice;
  TS_CUDA_CHECK(cudaMemcpy(dst, src, nbytes, k), device);
}

void copy_strided(const StridedView& dst, const StridedView& src, const Shape& shape, int device) {
  check_device(device);
  TS_CUDA_CHECK(cudaSetDevice(device), device);
  launch_copy_strided(dst, src, shape);
  TS_CUDA_CHECK(cudaGetLastError(), device);
}

void synchronize(int device) {
  check_device(device);
  TS_CUDA_CHECK(cudaSetDevice(device), device);
  TS_CUDA_CHECK(cudaDeviceSynchronize(), device);
}

}  // namespace tessera::cuda
