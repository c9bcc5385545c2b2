#include "core/allocator.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <new>

#include "core/cuda_runtime.h"
#include "core/error.h"

namespace tessera {
namespace {

class CpuAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    const size_t rounded = (nbytes + kCpuAlignment - 1) / kCpuAlignment * kCpuAlignment;
    void* ptr = std::aligned_alloc(kCpuAlignment, rounded);
    TS_CHECK(ptr != nullptr, "[cpu allocator] out of memory: could not allocate ", nbytes,
             " bytes (", stats().allocated, " bytes already allocated)");
    const int64_t now = allocated_.fetch_add(static_cast<int64_t>(nbytes)) + nbytes;
    int64_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
    num_allocs_.fetch_add(1);
    return ptr;
  }

  void deallocate(void* ptr, size_t nbytes) override {
    if (ptr == nullptr) return;
    std::free(ptr);
    allocated_.fetch_sub(static_cast<int64_t>(nbytes));
  }

  AllocatorStats stats() const override {
    const int64_t a = allocated_.load();
    return {a, a, peak_.load(), num_allocs_.load()};
  }

  void reset_peak() override { peak_.store(allocated_.load()); }

 private:
  std::atomic<int64_t> allocated_{0};
  std::atomic<int64_t> peak_{0};
  std::atomic<int64_t> num_allocs_{0};
};

}  // namespace

Allocator& allocator_for(Device device) {
  if (device.is_cpu()) {
    static CpuAllocator cpu;
    return cpu;
  }
  return cuda::allocator(device.index);
}

}  // namespace tessera
