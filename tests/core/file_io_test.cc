// write_file_atomically on a file larger than its write-back window (Note [Bounded
// write-back] in core/file_io.cc): the bytes arrive whole, and the windows behind the
// writer leave the page cache as it goes.
#include "core/file_io.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdint>
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

}  // namespace
}  // namespace tessera
