// write_file_atomically on a file larger than its write-back window (Note [Bounded
// write-back] in core/file_io.cc): the bytes arrive whole, and the windows behind the
// writer leave the page cache as it goes.
#include "core/file_io.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <string>
#include <vector>

#include "tests/test_files.h"

namespace tessera {
namespace {

constexpr uint32_t kTmpfsMagic = 0x01021994;

// Pages of [0, bytes) of the file at `path` that are in the page cache (mincore).
int64_t cached_pages(const std::string& path, size_t bytes) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  REQUIRE(fd.get() >= 0);
  void* p = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd.get(), 0);
  REQUIRE(p != MAP_FAILED);
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> in((bytes + page - 1) / page);
  REQUIRE(::mincore(p, bytes, in.data()) == 0);
  ::munmap(p, bytes);
  int64_t n = 0;
  for (const unsigned char c : in) n += c & 1;
  return n;
}

TEST_CASE("a large file is written whole, its pages written back as it grows", "[file_io]") {
  const std::string path = testing::temp_path("file_io_large.bin").string();
  constexpr size_t kPiece = size_t{1} << 20;  // 1 MiB writes, 150 of them
  constexpr int kPieces = 150;
  std::vector<uint32_t> piece(kPiece / 4);
  write_file_atomically(path, [&](const WriteBytes& write) {
    for (int i = 0; i < kPieces; ++i) {
      for (size_t k = 0; k < piece.size(); ++k) piece[k] = static_cast<uint32_t>(i * 7919 + k);
      write(piece.data(), kPiece);
    }
  });
  // Every piece arrived, in order: a word of each checked.
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  REQUIRE(fd.get() >= 0);
  CHECK(::lseek(fd.get(), 0, SEEK_END) == static_cast<off_t>(kPiece * kPieces));
  for (int i = 0; i < kPieces; ++i) {
    uint32_t word = 0;
    const size_t k = static_cast<size_t>(i) * 13 % piece.size();
    REQUIRE(::pread(fd.get(), &word, 4, static_cast<off_t>(i * kPiece + k * 4)) == 4);
    CHECK(word == static_cast<uint32_t>(i * 7919 + k));
  }
  // The first 64 MiB window was written back and dropped from the cache while the rest was
  // written (where the file system has a page cache of its own: not tmpfs).
  struct statfs fs;
  REQUIRE(::statfs(path.c_str(), &fs) == 0);
  if (static_cast<uint32_t>(fs.f_type) != kTmpfsMagic) {
    const size_t window = size_t{64} << 20;
    CHECK(cached_pages(path, window) < static_cast<int64_t>(window / 4096 / 4));
  }
  std::filesystem::remove(path);
}

// A full disk: a 1 MiB tmpfs in a mount namespace of this process's own (root only).
TEST_CASE("a file too big for its disk fails at the reservation and keeps the old file",
          "[file_io]") {
  if (::geteuid() != 0) {
    WARN("skipped: mounting a small tmpfs needs root");
    return;
  }
  // Root without CAP_SYS_ADMIN (a container's) may not make the namespace or the mount.
  const std::filesystem::path dir = testing::fresh_dir("file_io_full");
  if (::unshare(CLONE_NEWNS) != 0 ||
      ::mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
      ::mount("tmpfs", dir.c_str(), "tmpfs", 0, "size=1m") != 0) {
    WARN("skipped: cannot mount a small tmpfs here (" << std::strerror(errno) << ")");
    return;
  }
  {
    const std::string path = (dir / "state.bin").string();
    write_file_atomically(path, {std::string_view("old")});
    bool wrote = false;
    CHECK_THROWS_WITH(write_file_atomically(
                          path, [&](const WriteBytes&) { wrote = true; }, uint64_t{4} << 20),
                      Catch::StartsWith("[write] " + path + ": reserving 4194304 bytes for ") &&
                          Catch::EndsWith("failed: No space left on device"));
    CHECK_FALSE(wrote);  // nothing was written
    CHECK(testing::read_bytes(path) == "old");
    CHECK(std::distance(std::filesystem::directory_iterator(dir),
                        std::filesystem::directory_iterator()) == 1);  // no temporary file
  }
  CHECK(::umount(dir.c_str()) == 0);
}

}  // namespace
}  // namespace tessera
