// DirectFile (Note [Direct I/O] in core/direct_file.h) against plain blocking I/O: what
// it writes, pread reads back, and what pwrite wrote, it reads, at every aio setting; its
// errors name the path, the operation and the reason, a full disk included.
#include "core/direct_file.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "tests/test_files.h"
#include "tests/testing.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

// Random bytes, the same for the same seed.
std::vector<unsigned char> random_bytes(int64_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::vector<unsigned char> out(static_cast<size_t>(n));
  for (unsigned char& b : out) b = static_cast<unsigned char>(gen());
  return out;
}

// The bytes [offset, offset + n) of `path`, read with blocking buffered I/O.
std::vector<unsigned char> pread_bytes(const fs::path& path, int64_t offset, int64_t n) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  REQUIRE(fd >= 0);
  std::vector<unsigned char> out(static_cast<size_t>(n));
  REQUIRE(::pread(fd, out.data(), out.size(), offset) == n);
  ::close(fd);
  return out;
}

void pwrite_bytes(const fs::path& path, int64_t offset, const std::vector<unsigned char>& bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY);
  REQUIRE(fd >= 0);
  REQUIRE(::pwrite(fd, bytes.data(), bytes.size(), offset) == static_cast<ssize_t>(bytes.size()));
  ::fsync(fd);
  ::close(fd);
}

struct Region {
  int64_t offset, bytes;
};

// Regions of random aligned sizes (1 to 300 pages) one after another, some with gaps.
std::vector<Region> random_regions(int count, unsigned seed) {
  std::mt19937 gen(seed);
  std::vector<Region> out;
  int64_t at = 0;
  for (int i = 0; i < count; ++i) {
    const int64_t bytes = (1 + static_cast<int64_t>(gen() % 300)) * kDirectIoAlignment;
    at += static_cast<int64_t>(gen() % 3) * kDirectIoAlignment;  // a gap, sometimes
    out.push_back({at, bytes});
    at += bytes;
  }
  return out;
}

TEST_CASE("direct writes read back with blocking I/O, and blocking writes read direct", "[aio]") {
  const fs::path dir = testing::fresh_dir("direct_file_roundtrip");
  int variant = 0;
  for (const int depth : {1, 2, 8, 32}) {
    for (const int contexts : {1, 3}) {
      for (const bool single : {false, true}) {
        for (const bool overlap : {true, false}) {
          ++variant;
          AioConfig config;
          config.block_size = (variant % 3 + 1) * 64 * 1024;  // 64, 128 or 192 KiB
          config.queue_depth = depth;
          config.intra_op_parallelism = contexts;
          config.single_submit = single;
          config.overlap_events = overlap;
          INFO("queue_depth " << depth << ", contexts " << contexts << ", single_submit " << single
                              << ", overlap_events " << overlap);
          const fs::path path = dir / ("v" + std::to_string(variant) + ".swp");
          const std::vector<Region> regions = random_regions(6, static_cast<unsigned>(variant));
          std::vector<AlignedBuffer> buffers;
          std::vector<std::vector<unsigned char>> want;
          DirectFile file(path.string(), config);
          // Every region's write started before any is waited for.
          for (size_t i = 0; i < regions.size(); ++i) {
            want.push_back(random_bytes(regions[i].bytes, 100 * variant + i));
            buffers.emplace_back(regions[i].bytes);
            std::memcpy(buffers.back().data(), want.back().data(), want.back().size());
            file.start_write(regions[i].offset, buffers.back().data(), regions[i].bytes);
          }
          file.wait();
          CHECK(file.in_flight() == 0);
          for (size_t i = 0; i < regions.size(); ++i) {
            CHECK(pread_bytes(path, regions[i].offset, regions[i].bytes) == want[i]);
          }
          // Overwritten with blocking writes, read back direct, all reads in flight at once.
          for (size_t i = 0; i < regions.size(); ++i) {
            want[i] = random_bytes(regions[i].bytes, 7000 + 100 * variant + i);
            pwrite_bytes(path, regions[i].offset, want[i]);
          }
          for (size_t i = 0; i < regions.size(); ++i) {
            std::memset(buffers[i].data(), 0, static_cast<size_t>(buffers[i].bytes()));
            file.start_read(regions[i].offset, buffers[i].data(), regions[i].bytes);
          }
          file.wait();
          for (size_t i = 0; i < regions.size(); ++i) {
            const auto* got = static_cast<const unsigned char*>(buffers[i].data());
            CHECK(std::vector<unsigned char>(got, got + regions[i].bytes) == want[i]);
          }
        }
      }
    }
  }
}

TEST_CASE("a transfer is waited for alone; a write's memory goes when it is done", "[aio]") {
  const fs::path dir = testing::fresh_dir("direct_file_transfers");
  AioConfig config;
  config.block_size = 64 * 1024;
  config.queue_depth = 2;  // many more requests than slots: the I/O thread feeds them
  const fs::path path = dir / "t.swp";
  DirectFile file(path.string(), config);
  const std::vector<unsigned char> first = random_bytes(1 << 20, 1),
                                   second = random_bytes(65536, 2);
  auto handed = std::make_shared<AlignedBuffer>(1 << 20);
  std::memcpy(handed->data(), first.data(), first.size());
  const std::weak_ptr<AlignedBuffer> watch = handed;
  const Transfer t1 = file.start_write(0, handed->data(), handed->bytes(), handed);
  handed.reset();  // the file holds it until written
  AlignedBuffer buffer(65536);
  std::memcpy(buffer.data(), second.data(), second.size());
  const Transfer t2 = file.start_write(1 << 20, buffer.data(), buffer.bytes());
  CHECK(t1.end - t1.first == 16);  // requests of block_size
  CHECK(t2.first == t1.end);
  CHECK(t2.end == t2.first + 1);
  file.wait_for(t1);
  CHECK(file.done(t1));
  CHECK(watch.expired());
  CHECK(pread_bytes(path, 0, 1 << 20) == first);
  file.wait_for(t2);
  CHECK(file.done(t2));
  CHECK(file.in_flight() == 0);
  CHECK(pread_bytes(path, 1 << 20, 65536) == second);
}

TEST_CASE("direct I/O refuses unaligned transfers and bad settings, naming them", "[aio]") {
  const fs::path path = testing::fresh_dir("direct_file_errors") / "a.swp";
  DirectFile file(path.string(), AioConfig{});
  AlignedBuffer buffer(2 * kDirectIoAlignment);
  const auto* base = static_cast<char*>(buffer.data());
  CHECK_THROWS_WITH(file.start_write(0, base + 512, kDirectIoAlignment),
                    Catch::Contains("expected the buffer address, offset and length of a direct "
                                    "write to be multiples of 4096") &&
                        Catch::Contains(path.string()));
  CHECK_THROWS_WITH(file.start_read(100, buffer.data(), kDirectIoAlignment),
                    Catch::Contains("offset 100"));
  CHECK_THROWS_WITH(file.start_read(0, buffer.data(), 1000), Catch::Contains("length 1000"));
  // Past the end of the file: a short read, reported by wait().
  file.start_read(0, buffer.data(), kDirectIoAlignment);
  CHECK_THROWS_WITH(file.wait(), "[aio] read of 4096 bytes at offset 0 of " + path.string() +
                                     ": expected 4096 bytes, transferred 0 (the file ends before)");
  file.wait();  // the failure was reported once

  AioConfig bad;
  bad.block_size = 1000;
  CHECK_THROWS_WITH(DirectFile((path.parent_path() / "b.swp").string(), bad),
                    "[aio] block_size: expected a positive multiple of 4096 bytes up to "
                    "1073741824, found 1000");
  bad = AioConfig{};
  bad.queue_depth = 0;
  CHECK_THROWS_WITH(check_aio_config(bad, "[aio]"),
                    "[aio] queue_depth: expected 1 to 1024, found 0");
  // Someone else's file is neither opened nor removed.
  testing::write_bytes(path.parent_path() / "theirs.swp", "keep");
  CHECK_THROWS_WITH(DirectFile((path.parent_path() / "theirs.swp").string(), AioConfig{}),
                    Catch::EndsWith("File exists (errno 17)"));
  CHECK(testing::read_bytes(path.parent_path() / "theirs.swp") == "keep");
  CHECK_THROWS_WITH(DirectFile("/nonexistent-dir/x.swp", AioConfig{}),
                    "[aio] cannot create the swap file /nonexistent-dir/x.swp: No such file or "
                    "directory (errno 2)");
}

// A full disk: a 1 MiB tmpfs in a mount namespace of this process's own (root only; the
// mount goes with the namespace when the process exits, and is unmounted before).
TEST_CASE(
    "a full disk fails the write or the reservation with the path and ENOSPC, and keeps "
    "earlier data",
    "[aio]") {
  if (::geteuid() != 0) {
    WARN("skipped: mounting a small tmpfs needs root");
    return;
  }
  REQUIRE(::unshare(CLONE_NEWNS) == 0);
  REQUIRE(::mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) == 0);
  const fs::path dir = testing::fresh_dir("direct_file_full");
  REQUIRE(::mount("tmpfs", dir.c_str(), "tmpfs", 0, "size=1m") == 0);
  {
    const fs::path path = dir / "full.swp";
    DirectFile file(path.string(), AioConfig{});
    const std::vector<unsigned char> first = random_bytes(256 * 1024, 1);
    AlignedBuffer small(static_cast<int64_t>(first.size()));
    std::memcpy(small.data(), first.data(), first.size());
    file.start_write(0, small.data(), small.bytes());
    file.wait();
    AlignedBuffer big(4 << 20);
    file.start_write(small.bytes(), big.data(), big.bytes());
    CHECK_THROWS_WITH(file.wait(), Catch::StartsWith("[aio] write of ") &&
                                       Catch::Contains(path.string()) &&
                                       Catch::EndsWith("No space left on device (errno 28)"));
    CHECK(pread_bytes(path, 0, static_cast<int64_t>(first.size())) == first);
    // Reserving the space first reports the same at once, before any write.
    CHECK_THROWS_WITH(file.reserve(4 << 20),
                      "[aio] cannot reserve 4194304 bytes for the swap file " + path.string() +
                          ": No space left on device (errno 28)");
    CHECK(pread_bytes(path, 0, static_cast<int64_t>(first.size())) == first);
  }
  CHECK(::umount(dir.c_str()) == 0);
}

}  // namespace
}  // namespace tessera
