// The pinned host allocator and the asynchronous copy from it (Note [Pinned host memory]).
#include <cuda_runtime_api.h>

#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

#include "core/caching_allocator.h"
#include "core/cuda/check.h"
#include "core/cuda_runtime.h"

namespace tessera::cuda {
namespace {

// A CachingAllocator of cudaHostAlloc blocks that takes a freed block back only once the
// device work queued before the free has finished.
class PinnedHostAllocator final : public Allocator {
 public:
  PinnedHostAllocator()
      : cache_(
            "pinned host allocator",
            {.small_unit = 512,
             .large_unit = size_t{2} << 20,
             .large_min = size_t{1} << 20,
             .min_cached = 0,
             .max_cached = size_t{4} << 30},
            [](size_t n) -> void* {
              void* p = nullptr;
              // Portable: usable for copies to every device, not only the current one.
              if (cudaHostAlloc(&p, n, cudaHostAllocPortable) != cudaSuccess) {
                cudaGetLastError();  // the cache reports the failure
                return nullptr;
              }
              return p;
            },
            [](void* p) { cudaFreeHost(p); }) {
    check_device(0);  // page-locking needs a driver and a device
  }

  void* allocate(size_t nbytes) override {
    std::lock_guard<std::mutex> lock(mutex_);
    reclaim_locked(/*wait=*/false);
    void* ptr = nullptr;
    try {
      ptr = cache_.allocate(nbytes);
    } catch (const Error&) {
      // Blocks still waiting on copies may free enough: wait for them and retry once.
      reclaim_locked(/*wait=*/true);
      cache_.release_cached();
      ptr = cache_.allocate(nbytes);
    }
    if (ptr != nullptr) live_[static_cast<const char*>(ptr)] = nbytes;
    return ptr;
  }

  void deallocate(void* ptr, size_t nbytes) override {
    if (ptr == nullptr) return;
    std::lock_guard<std::mutex> lock(mutex_);
    Pending p{ptr, nbytes, {}};
    for (int device : used_devices_) {
      p.events.push_back(std::make_unique<Event>(device));
      p.events.back()->record();
    }
    pending_.push_back(std::move(p));
  }

  AllocatorStats stats() const override { return cache_.stats(); }
  void reset_peak() override { cache_.reset_peak(); }

  bool owns(const void* ptr) const {
    std::lock_guard<std::mutex> lock(mutex_);
    const char* c = static_cast<const char*>(ptr);
    auto it = live_.upper_bound(c);
    if (it == live_.begin()) return false;
    --it;
    return c < it->first + it->second;
  }

  // Called before queuing a copy from pinned memory to `device`: later frees wait for it.
  void note_use(int device) {
    std::lock_guard<std::mutex> lock(mutex_);
    used_devices_.insert(device);
  }

 private:
  struct Pending {
    void* ptr;
    size_t nbytes;
    std::vector<std::unique_ptr<Event>> events;  // one per device copies were queued to
  };

  // Hands blocks whose events have completed back to the cache (all of them with `wait`).
  void reclaim_locked(bool wait) {
    std::vector<Pending> still;
    for (Pending& p : pending_) {
      bool done = true;
      for (const std::unique_ptr<Event>& e : p.events) {
        if (wait) e->synchronize();
        done = done && (wait || e->done());
      }
      if (!done) {
        still.push_back(std::move(p));
        continue;
      }
      live_.erase(static_cast<const char*>(p.ptr));
      cache_.deallocate(p.ptr, p.nbytes);
    }
    pending_ = std::move(still);
  }

  CachingAllocator cache_;
  mutable std::mutex mutex_;
  std::map<const char*, size_t> live_;  // blocks handed out or pending, by address
  std::vector<Pending> pending_;
  std::set<int> used_devices_;
};

PinnedHostAllocator& pinned() {
  // One allocator for the process, created on first use like the device allocators.
  static PinnedHostAllocator allocator;
  return allocator;
}

}  // namespace

Allocator& pinned_host_allocator() { return pinned(); }

bool is_pinned(const void* ptr) {
  if (ptr == nullptr || device_count() == 0) return false;
  return pinned().owns(ptr);
}

namespace {

// Queues a copy between pinned host memory (`host`, the side named `side`) and `device` on
// its compute stream (stream 0).
void queue_pinned_copy(void* dst, const void* src, size_t nbytes, int device, const void* host,
                       const char* side, cudaMemcpyKind kind) {
  check_device(device);
  TS_CHECK(pinned().owns(host), "[cuda] asynchronous copy: expected a ", side,
           " in pinned host memory (Tensor::pin_memory), found pageable memory");
  pinned().note_use(device);
  TS_CUDA_CHECK(cudaSetDevice(device), device);
  TS_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, kind, 0), device);
}

}  // namespace

void memcpy_from_pinned_async(void* dst, const void* pinned_src, size_t nbytes, int device) {
  queue_pinned_copy(dst, pinned_src, nbytes, device, pinned_src, "source", cudaMemcpyHostToDevice);
}

void memcpy_to_pinned_async(void* pinned_dst, const void* src, size_t nbytes, int device) {
  queue_pinned_copy(pinned_dst, src, nbytes, device, pinned_dst, "destination",
                    cudaMemcpyDeviceToHost);
}

}  // namespace tessera::cuda
