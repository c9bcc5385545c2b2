// TensorSwapper (Note [Swapped storages] in parallel/offload/tensor_swapper.h): storages of
// random sizes, unaligned tails included, swapped out and in through pools smaller and
// larger than they are, at queue depths 1-32, come back with their bytes; the file holds
// exactly those bytes where a blocking read finds them; released storages free their
// memory; discarded ones come back as zeros, in memory or out, without disturbing the
// others' regions; misuse and file errors are named.
#include "parallel/offload/tensor_swapper.h"

#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/error.h"
#include "tests/test_files.h"
#include "tests/testing.h"

namespace tessera::parallel {
namespace {

std::vector<unsigned char> random_bytes(int64_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::vector<unsigned char> out(static_cast<size_t>(n));
  for (unsigned char& b : out) b = static_cast<unsigned char>(gen());
  return out;
}

std::vector<unsigned char> bytes_of(const Storage& s) {
  const auto* p = static_cast<const unsigned char*>(s.data());
  return std::vector<unsigned char>(p, p + s.nbytes());
}

Storage storage_with(const std::vector<unsigned char>& bytes) {
  Storage s = Storage::allocate(bytes.size(), Device::cpu());
  std::memcpy(s.data(), bytes.data(), bytes.size());
  return s;
}

TEST_CASE("swapped storages come back with their bytes at every pool and queue depth", "[swap]") {
  const auto dir = testing::fresh_dir("tensor_swapper");
  int variant = 0;
  for (const int depth : {1, 4, 32}) {
    for (const int buffers : {1, 3}) {
      for (const int64_t buffer_size : {int64_t{4096}, int64_t{10000}, int64_t{1} << 20}) {
        ++variant;
        INFO("queue_depth " << depth << ", " << buffers << " buffers of " << buffer_size);
        AioConfig aio;
        aio.queue_depth = depth;
        aio.block_size = 8192;
        const std::string path = (dir / ("v" + std::to_string(variant) + ".swp")).string();
        TensorSwapper swapper(path, aio, buffers, buffer_size);
        std::mt19937 gen(static_cast<unsigned>(variant));
        std::vector<Storage> storages;
        std::vector<std::vector<unsigned char>> want;
        std::vector<int64_t> ids;
        for (int i = 0; i < 7; ++i) {
          const int64_t n = 1 + static_cast<int64_t>(gen() % 50000);  // unaligned tails
          want.push_back(random_bytes(n, 1000 * variant + i));
          storages.push_back(storage_with(want.back()));
          ids.push_back(swapper.add(storages.back()));
        }
        swapper.swap_out(ids);
        for (size_t i = 0; i < storages.size(); ++i) {
          CHECK(storages[i].nbytes() == 0);  // released
          CHECK(!swapper.resident(ids[i]));
        }
        swapper.wait();
        // The file holds each storage's bytes at its region, as a blocking read sees them.
        const int fd = ::open(path.c_str(), O_RDONLY);
        REQUIRE(fd >= 0);
        int64_t offset = 0;
        for (const auto& w : want) {
          std::vector<unsigned char> got(w.size());
          REQUIRE(::pread(fd, got.data(), got.size(), offset) == static_cast<ssize_t>(got.size()));
          CHECK(got == w);
          offset += round_up_to_direct_io(static_cast<int64_t>(w.size()));
        }
        ::close(fd);
        CHECK(swapper.file_bytes() == offset);
        // Back in a different order, in two batches; then out and in again after a change.
        swapper.swap_in({ids[5], ids[1], ids[3]});
        swapper.swap_in({ids[0], ids[6], ids[2], ids[4]});
        for (size_t i = 0; i < storages.size(); ++i) CHECK(bytes_of(storages[i]) == want[i]);
        want[2] = random_bytes(static_cast<int64_t>(want[2].size()), 77);
        std::memcpy(storages[2].data(), want[2].data(), want[2].size());
        swapper.swap_out({ids[2], ids[3]});
        swapper.swap_in({ids[3], ids[2]});  // right after: the writes may still travel
        CHECK(bytes_of(storages[2]) == want[2]);
        CHECK(bytes_of(storages[3]) == want[3]);
      }
    }
  }
}

TEST_CASE("discarded storages come back as zeros and keep their regions", "[swap]") {
  const auto dir = testing::fresh_dir("tensor_swapper_discard");
  AioConfig aio;
  aio.queue_depth = 2;
  TensorSwapper swapper((dir / "d.swp").string(), aio, 2, 4096);
  std::vector<std::vector<unsigned char>> want;
  std::vector<Storage> storages;
  std::vector<int64_t> ids;
  for (int i = 0; i < 3; ++i) {
    want.push_back(random_bytes(5000 + 999 * i, 10 + static_cast<unsigned>(i)));
    storages.push_back(storage_with(want.back()));
    ids.push_back(swapper.add(storages.back()));
  }
  swapper.swap_out({ids[0], ids[1]});
  swapper.discard({ids[1], ids[2]});  // one out, one in memory
  CHECK(storages[2].nbytes() == 0);
  CHECK(swapper.swapped_bytes() == static_cast<int64_t>(want[0].size()));
  swapper.swap_in({ids[2], ids[1], ids[0]});
  CHECK(bytes_of(storages[0]) == want[0]);
  for (int i : {1, 2}) {
    CHECK(bytes_of(storages[i]) == std::vector<unsigned char>(want[i].size(), 0));
  }
  // Written again, a discarded storage's region holds its new bytes.
  want[1] = random_bytes(static_cast<int64_t>(want[1].size()), 42);
  std::memcpy(storages[1].data(), want[1].data(), want[1].size());
  swapper.swap_out({ids[1], ids[0]});
  swapper.swap_in({ids[0], ids[1]});
  CHECK(bytes_of(storages[0]) == want[0]);
  CHECK(bytes_of(storages[1]) == want[1]);
  CHECK_THROWS_WITH(swapper.swap_in({ids[2]}), Catch::Contains("storage 2 is resident"));
}

TEST_CASE("read_each brings storages in one at a time and lets them go unwritten", "[swap]") {
  const auto dir = testing::fresh_dir("tensor_swapper_read_each");
  TensorSwapper swapper((dir / "r.swp").string(), AioConfig{}, 2, 4096);
  std::vector<std::vector<unsigned char>> want;
  std::vector<Storage> storages;
  std::vector<int64_t> ids;
  for (int i = 0; i < 4; ++i) {
    want.push_back(random_bytes(3000 + 1000 * i, 20 + static_cast<unsigned>(i)));
    storages.push_back(storage_with(want.back()));
    ids.push_back(swapper.add(storages.back()));
  }
  swapper.swap_out({ids[0], ids[1], ids[3]});
  swapper.wait();
  swapper.discard({ids[3]});  // zeros, never read
  // Storage 2 stays in memory; an id of -1 is a storage not swapped.
  const std::vector<int64_t> order = {ids[0], -1, ids[2], ids[1], ids[3]};
  std::vector<std::vector<unsigned char>> seen;
  swapper.read_each(order, [&](size_t i) {
    if (order[i] < 0) {
      seen.emplace_back();
      return;
    }
    const Storage& s = storages[static_cast<size_t>(order[i])];
    seen.push_back(bytes_of(s));
    // At most this one and the next (its read under way) of the swapped ones are in memory.
    int64_t in_memory = 0;
    for (size_t k = 0; k < storages.size(); ++k) in_memory += storages[k].nbytes() > 0 && k != 2;
    CHECK(in_memory <= 2);
  });
  CHECK(seen[0] == want[0]);
  CHECK(seen[2] == want[2]);
  CHECK(seen[3] == want[1]);
  CHECK(seen[4] == std::vector<unsigned char>(want[3].size(), 0));
  CHECK(storages[2].nbytes() > 0);  // as it was
  for (int i : {0, 1, 3}) CHECK_FALSE(swapper.resident(ids[static_cast<size_t>(i)]));
  swapper.swap_in({ids[0]});
  CHECK(bytes_of(storages[0]) == want[0]);  // let go unwritten: the region's bytes
  swapper.evict({ids[0]});
  // A failure in `use` lets the storage in use and the next one go again, and is reported.
  CHECK_THROWS_WITH(swapper.read_each({ids[0], ids[1]}, [](size_t) { throw Error("[test] stop"); }),
                    "[test] stop");
  for (int i : {0, 1}) CHECK_FALSE(swapper.resident(ids[static_cast<size_t>(i)]));
  swapper.swap_in({ids[1]});
  CHECK(bytes_of(storages[1]) == want[1]);
}

TEST_CASE("swapped-in storages are written from their own memory, which goes once written",
          "[swap]") {
  const auto dir = testing::fresh_dir("tensor_swapper_direct");
  AioConfig aio;
  aio.block_size = 8192;
  TensorSwapper swapper((dir / "m.swp").string(), aio, 1, 4096);  // a pool of one page
  std::vector<std::vector<unsigned char>> want;
  std::vector<Storage> storages;
  std::vector<int64_t> ids;
  for (const int64_t n : {5000, 70000, 123457}) {
    want.push_back(random_bytes(n, static_cast<unsigned>(n)));
    storages.push_back(storage_with(want.back()));
    ids.push_back(swapper.add(storages.back()));
  }
  swapper.swap_out(ids);  // memory of their own: staged through the pool
  swapper.wait();
  Allocator& mapped = mapped_host_allocator();
  const int64_t before = mapped.stats().allocated;
  // Prefetched: memory now, readable after swap_in.
  swapper.prefetch({ids[0], ids[1]});
  CHECK(!swapper.resident(ids[0]));
  CHECK(mapped.stats().allocated == before + 5000 + 70000);
  swapper.swap_in(ids);
  for (size_t i = 0; i < ids.size(); ++i) CHECK(bytes_of(storages[i]) == want[i]);
  // Out from their own memory: released at once, the memory gone when written.
  for (size_t i = 0; i < ids.size(); ++i) {
    want[i] = random_bytes(static_cast<int64_t>(want[i].size()), 50 + static_cast<unsigned>(i));
    std::memcpy(storages[i].data(), want[i].data(), want[i].size());
  }
  swapper.swap_out({ids[2]});
  swapper.swap_out({ids[0], ids[1]});  // first waits for ids[2]'s write: over the pool's bytes
  CHECK(mapped.stats().allocated <= before + 5000 + 70000);
  for (const Storage& s : storages) CHECK(s.nbytes() == 0);
  swapper.wait();
  CHECK(mapped.stats().allocated == before);
  // A read in flight is waited for before its storage is discarded.
  swapper.prefetch({ids[1]});
  swapper.discard({ids[1]});
  swapper.swap_in({ids[2], ids[1], ids[0]});
  CHECK(bytes_of(storages[0]) == want[0]);
  CHECK(bytes_of(storages[1]) == std::vector<unsigned char>(want[1].size(), 0));
  CHECK(bytes_of(storages[2]) == want[2]);
}

TEST_CASE("swapping names misuse and the file's errors", "[swap]") {
  const auto dir = testing::fresh_dir("tensor_swapper_errors");
  const std::string path = (dir / "a.swp").string();
  TensorSwapper swapper(path, AioConfig{}, 2, 4096);
  CHECK(swapper.pool_bytes() == 2 * 4096);
  const Storage s = storage_with(random_bytes(100, 1));
  const int64_t id = swapper.add(s);
  CHECK_THROWS_WITH(
      swapper.swap_in({id}),
      "[swap] " + path +
          ": storage 0 is resident; expected it swapped out or discarded before swapping it in");
  swapper.swap_out({id});
  CHECK_THROWS_WITH(swapper.swap_out({id}),
                    "[swap] " + path +
                        ": storage 0 of 100 bytes is not resident (found 0 bytes); expected it "
                        "swapped in before swapping it out");
  CHECK_THROWS_WITH(swapper.add(Storage()),
                    "[swap] " + path + ": expected an allocated host storage to swap, found none");
  CHECK_THROWS_WITH(TensorSwapper((dir / "b.swp").string(), AioConfig{}, 0, 4096),
                    Catch::Contains("expected buffer_count >= 1, found 0"));
  CHECK_THROWS_WITH(TensorSwapper("/nonexistent-dir/c.swp", AioConfig{}, 1, 4096),
                    Catch::StartsWith("[aio] cannot create the swap file /nonexistent-dir/c.swp"));
}

}  // namespace
}  // namespace tessera::parallel
