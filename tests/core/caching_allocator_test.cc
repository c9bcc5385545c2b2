// The block cache behind the CPU and CUDA allocators, over a fake system allocator.
#include "core/caching_allocator.h"

#include <catch2/catch.hpp>
#include <cstdlib>
#include <set>

#include "core/factories.h"

namespace tessera {
namespace {

struct FakeSystem {
  std::set<void*> live;
  int mallocs = 0;
  size_t budget = ~size_t{0};  // bytes the system can still hand out
};

CachingAllocator make(FakeSystem& sys, size_t max_cached) {
  return CachingAllocator(
      "test allocator", {64, 1024, 4096, 4096, max_cached},
      [&sys](size_t n) -> void* {
        if (n > sys.budget) return nullptr;
        sys.budget -= n;
        ++sys.mallocs;
        void* p = std::malloc(n);
        sys.live.insert(p);
        return p;
      },
      [&sys](void* p) {
        sys.live.erase(p);
        std::free(p);
      });
}

TEST_CASE("large blocks are reused by size; small ones go back at once", "[allocator]") {
  FakeSystem sys;
  {
    CachingAllocator a = make(sys, 1 << 20);
    void* big = a.allocate(5000);  // rounds to 5120
    a.deallocate(big, 5000);
    CHECK(a.stats().allocated == 0);
    CHECK(a.stats().reserved == 5120);
    void* again = a.allocate(5100);  // same size class
    CHECK(again == big);
    CHECK(sys.mallocs == 1);
    CHECK(a.stats().peak_allocated == 5120);
    a.deallocate(again, 5100);
    void* small = a.allocate(100);
    a.deallocate(small, 100);
    CHECK(a.stats().reserved == 5120);  // the small block was not kept
    CHECK(sys.live.size() == 1);
  }
  CHECK(sys.live.empty());  // destruction returns the cache
}

TEST_CASE("the cache is bounded and is released when memory runs out", "[allocator]") {
  FakeSystem sys;
  CachingAllocator a = make(sys, 8192);
  void* p1 = a.allocate(8192);
  void* p2 = a.allocate(8192);
  a.deallocate(p1, 8192);
  a.deallocate(p2, 8192);  // over max_cached: freed
  CHECK(sys.live.size() == 1);
  sys.budget = 0;
  void* reused = a.allocate(8192);
  CHECK(reused == p1);  // still served from the cache
  a.deallocate(reused, 8192);
  sys.budget = 16384;
  void* p3 = a.allocate(16384);  // releases the cached block to find room
  a.deallocate(p3, 16384);       // over the bound: back to the system
  sys.budget = 0;
  REQUIRE_THROWS_WITH(a.allocate(16384), Catch::Contains("[test allocator] out of memory") &&
                                             Catch::Contains("16384 bytes"));
}

TEST_CASE("CPU tensors are 64-byte aligned and counted", "[allocator]") {
  Allocator& cpu = allocator_for(Device::cpu());
  const int64_t before = cpu.stats().allocated;
  {
    Tensor t = empty({3, 5});
    CHECK(reinterpret_cast<uintptr_t>(t.raw_data()) % kCpuAlignment == 0);
    CHECK(cpu.stats().allocated >= before + 60);
  }
  CHECK(cpu.stats().allocated == before);
}

}  // namespace
}  // namespace tessera
