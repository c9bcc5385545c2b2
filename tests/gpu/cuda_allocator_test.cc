// The CUDA caching allocator (Note [Block cache] in core/caching_allocator.h) through device
// tensors: a freed block is handed out again for the same rounded size, the counters follow
// (allocated: bytes in use; reserved: bytes held from cudaMalloc; peak_allocated: the
// high-water mark since reset_peak()), release_cached() gives the cache back, and a failed
// cudaMalloc is an error that leaves the device usable. tests/core/caching_allocator_test.cc
// covers the same cache over a fake system allocator.
#include <catch2/catch.hpp>
#include <cstdint>
#include <vector>

#include "core/allocator.h"
#include "core/caching_allocator.h"
#include "core/cuda_runtime.h"
#include "core/factories.h"

namespace tessera {
namespace {

const Device kCuda = Device::cuda(0);
constexpr int64_t kMiB = int64_t{1} << 20;

// The device allocator, its cache emptied so that every test starts with reserved ==
// allocated (other live device tensors, if any, count in both).
CachingAllocator& fresh_allocator() {
  REQUIRE(cuda::device_count() > 0);
  Allocator& a = cuda::allocator(0);
  CHECK(&a == &allocator_for(kCuda));
  auto* caching = dynamic_cast<CachingAllocator*>(&a);
  REQUIRE(caching != nullptr);
  caching->release_cached();
  const AllocatorStats s = caching->stats();
  REQUIRE(s.reserved == s.allocated);
  return *caching;
}

// An uninitialized f32 device tensor of `bytes` bytes (a multiple of 4).
Tensor device_bytes(int64_t bytes) {
  REQUIRE(bytes % 4 == 0);
  return empty({bytes / 4}, {DType::f32, kCuda});
}

TEST_CASE("a freed device block is reused for the same size", "[gpu][allocator]") {
  CachingAllocator& alloc = fresh_allocator();
  const AllocatorStats base = alloc.stats();
  // 3 MiB + 100 bytes: at least 1 MiB, so rounded up to the 2 MiB unit: 4 MiB.
  const int64_t bytes = 3 * kMiB + 100;
  const int64_t block = 4 * kMiB;
  void* first = nullptr;
  {
    Tensor t = device_bytes(bytes);
    first = t.raw_data();
    const AllocatorStats s = alloc.stats();
    CHECK(s.allocated == base.allocated + block);
    CHECK(s.reserved == base.reserved + block);  // the cache was empty: a new cudaMalloc
    CHECK(s.num_allocs == base.num_allocs + 1);
  }
  // Freed into the cache, not back to the device.
  AllocatorStats s = alloc.stats();
  CHECK(s.allocated == base.allocated);
  CHECK(s.reserved == base.reserved + block);
  {
    Tensor t = device_bytes(bytes);
    CHECK(t.raw_data() == first);
    s = alloc.stats();
    CHECK(s.allocated == base.allocated + block);
    CHECK(s.reserved == base.reserved + block);  // no new cudaMalloc
    CHECK(s.num_allocs == base.num_allocs + 2);
    // The reused block is ordinary device memory.
    t.fill_(2.5);
    const std::vector<float> v = t.narrow(0, t.numel() - 3, 3).to_vector<float>();
    CHECK(v == std::vector<float>{2.5f, 2.5f, 2.5f});
  }
  CHECK(alloc.stats().allocated == base.allocated);
}

TEST_CASE("near sizes share a rounded device block", "[gpu][allocator]") {
  CachingAllocator& alloc = fresh_allocator();
  const AllocatorStats base = alloc.stats();
  // Large blocks round to 2 MiB: 3 MiB + 4 bytes and 4 MiB share the 4 MiB size.
  void* large = nullptr;
  { large = device_bytes(3 * kMiB + 4).raw_data(); }
  {
    Tensor t = device_bytes(4 * kMiB);
    CHECK(t.raw_data() == large);
    CHECK(alloc.stats().allocated == base.allocated + 4 * kMiB);
  }
  // A size past the unit takes a new block: 4 MiB + 4 bytes rounds to 6 MiB.
  {
    Tensor t = device_bytes(4 * kMiB + 4);
    CHECK(t.raw_data() != large);
    CHECK(alloc.stats().allocated == base.allocated + 6 * kMiB);
    CHECK(alloc.stats().reserved == base.reserved + 10 * kMiB);
  }
  // Small blocks round to 512 bytes: 600 and 1020 bytes share the 1024-byte size.
  void* small = nullptr;
  { small = device_bytes(600).raw_data(); }
  {
    Tensor t = device_bytes(1020);
    CHECK(t.raw_data() == small);
    CHECK(alloc.stats().allocated == base.allocated + 1024);
  }
  CHECK(alloc.stats().allocated == base.allocated);
  CHECK(alloc.stats().reserved == base.reserved + 10 * kMiB + 1024);
}

TEST_CASE("peak_allocated tracks the high-water mark until reset_peak()", "[gpu][allocator]") {
  CachingAllocator& alloc = fresh_allocator();
  alloc.reset_peak();
  const AllocatorStats base = alloc.stats();
  CHECK(base.peak_allocated == base.allocated);
  {
    Tensor b = device_bytes(4 * kMiB);
    {
      Tensor a = device_bytes(8 * kMiB);
      CHECK(alloc.stats().peak_allocated == base.allocated + 12 * kMiB);
    }
    // The peak stays after the free, and a smaller allocation does not move it.
    Tensor c = device_bytes(2 * kMiB);
    AllocatorStats s = alloc.stats();
    CHECK(s.allocated == base.allocated + 6 * kMiB);
    CHECK(s.peak_allocated == base.allocated + 12 * kMiB);
    // reset_peak() starts again from the bytes in use now.
    alloc.reset_peak();
    s = alloc.stats();
    CHECK(s.peak_allocated == base.allocated + 6 * kMiB);
    Tensor d = device_bytes(2 * kMiB);
    CHECK(alloc.stats().peak_allocated == base.allocated + 8 * kMiB);
  }
  CHECK(alloc.stats().allocated == base.allocated);
  CHECK(alloc.stats().peak_allocated == base.allocated + 8 * kMiB);
}

TEST_CASE("release_cached() returns the cache: reserved falls back to allocated",
          "[gpu][allocator]") {
  CachingAllocator& alloc = fresh_allocator();
  const AllocatorStats base = alloc.stats();
  Tensor kept = device_bytes(2 * kMiB);
  kept.fill_(7.0);
  {
    std::vector<Tensor> freed = {device_bytes(4 * kMiB), device_bytes(6 * kMiB),
                                 device_bytes(1024)};
  }
  AllocatorStats s = alloc.stats();
  CHECK(s.allocated == base.allocated + 2 * kMiB);
  CHECK(s.reserved == base.reserved + 12 * kMiB + 1024);
  alloc.release_cached();
  s = alloc.stats();
  CHECK(s.reserved == s.allocated);
  CHECK(s.allocated == base.allocated + 2 * kMiB);
  // The allocator keeps working: the next block comes from cudaMalloc again.
  { const Tensor t = device_bytes(4 * kMiB); }
  CHECK(alloc.stats().reserved == s.reserved + 4 * kMiB);
  // The live block was not released with the cache.
  CHECK(kept.narrow(0, kept.numel() - 2, 2).to_vector<float>() == std::vector<float>{7.0f, 7.0f});
}

TEST_CASE("an allocation the device cannot hold fails with a message and harms nothing",
          "[gpu][allocator]") {
  CachingAllocator& alloc = fresh_allocator();
  Tensor kept = full({1000}, 3.0, {DType::f32, kCuda});
  { const Tensor cached = device_bytes(4 * kMiB); }  // the failed attempt releases this block
  const AllocatorStats before = alloc.stats();
  // 1 PiB: cudaMalloc fails, the allocator gives its cache back, retries and reports.
  CHECK_THROWS_WITH(empty({int64_t{1} << 48}, {DType::f32, kCuda}),
                    Catch::Contains("[cuda:0 allocator] out of memory"));
  const AllocatorStats after = alloc.stats();
  CHECK(after.allocated == before.allocated);
  CHECK(after.reserved == after.allocated);
  // cudaMalloc's error was cleared: the device and the allocator still work.
  CHECK(kept.to_vector<float>() == std::vector<float>(1000, 3.0f));
  Tensor t = full({4096}, -1.0, {DType::f32, kCuda});
  CHECK(t.narrow(0, 4090, 6).to_vector<float>() == std::vector<float>(6, -1.0f));
}

}  // namespace
}  // namespace tessera
