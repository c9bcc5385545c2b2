#include "core/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace tessera {
namespace {

std::string errno_str() { return std::strerror(errno); }

// Note [Bounded write-back]
// A file written through the page cache leaves its pages dirty until the kernel decides to
// write them, so a checkpoint of many GiB would fill memory (and a cgroup's limit, which
// counts the page cache: tools/memory_limit.sh) with them before the final fsync. Every
// kFlushWindow bytes the writer starts the write-back of the window just filled and waits
// for the one before it, whose pages it then drops from the cache: at most two windows are
// dirty or cached at a time, and the disk works while the writer produces the next bytes.
constexpr uint64_t kFlushWindow = uint64_t{64} << 20;

// sync_file_range() where the file system has it (tmpfs and some others return EINVAL or
// ENOSYS: their pages are memory anyway); other failures are the disk's.
void sync_range(int fd, uint64_t offset, uint64_t bytes, unsigned flags, const std::string& where) {
  const int rc =
      ::sync_file_range(fd, static_cast<off_t>(offset), static_cast<off_t>(bytes), flags);
  TS_CHECK(rc == 0 || errno == EINVAL || errno == ENOSYS || errno == ESPIPE, where,
           "write-back failed: ", errno_str());
}

}  // namespace

UniqueFd::~UniqueFd() {
  if (fd_ >= 0) ::close(fd_);
}

int UniqueFd::close() {
  const int rc = ::close(fd_);
  fd_ = -1;
  return rc;
}

void fsync_directory(const std::string& dir) {
  UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  TS_CHECK(fd.get() >= 0 && ::fsync(fd.get()) == 0, "[write] fsync of directory ", dir,
           " failed: ", errno_str());
}

void write_file_atomically(const std::string& path,
                           const std::function<void(const WriteBytes& write)>& body,
                           uint64_t reserve_bytes) {
  const std::string where = str_cat("[write] ", path, ": ");
  const std::filesystem::path target(path);
  TS_CHECK(target.has_filename(), where, "expected a file path, found a directory path");
  const std::filesystem::path dir = target.has_parent_path() ? target.parent_path() : ".";
  std::string tmp = (dir / ("." + target.filename().string() + ".tmp.XXXXXX")).string();
  UniqueFd fd(::mkstemp(tmp.data()));
  TS_CHECK(fd.get() >= 0, where, "cannot create a temporary file in ", dir.string(), ": ",
           errno_str());
  try {
    TS_CHECK(::fchmod(fd.get(), 0644) == 0, where, "fchmod failed: ", errno_str());
    if (reserve_bytes > 0) {
      // fallocate itself, not posix_fallocate, which would write every block where the file
      // system has none; those (EOPNOTSUPP, ENOSYS, EINVAL) find out at the write instead.
      int rc = 0;
      do {
        rc = ::fallocate(fd.get(), 0, 0, static_cast<off_t>(reserve_bytes));
      } while (rc != 0 && errno == EINTR);
      TS_CHECK(rc == 0 || errno == EOPNOTSUPP || errno == ENOSYS || errno == EINVAL, where,
               "reserving ", reserve_bytes, " bytes for ", tmp, " failed: ", errno_str());
    }
    uint64_t written = 0, flushing = 0;  // bytes written; bytes whose write-back started
    const WriteBytes write = [&](const void* bytes, size_t n) {
      const char* p = static_cast<const char*>(bytes);
      while (n > 0) {
        const ssize_t put = ::write(fd.get(), p, std::min<size_t>(n, size_t{1} << 30));
        if (put < 0 && errno == EINTR) continue;
        TS_CHECK(put > 0, where, "write to ", tmp, " failed: ", errno_str());
        p += put;
        n -= static_cast<size_t>(put);
        written += static_cast<uint64_t>(put);
      }
      for (; written - flushing >= kFlushWindow;
           flushing += kFlushWindow) {  // Note [Bounded write-back]
        sync_range(fd.get(), flushing, kFlushWindow, SYNC_FILE_RANGE_WRITE, where);
        if (flushing < kFlushWindow) continue;
        const uint64_t previous = flushing - kFlushWindow;
        sync_range(fd.get(), previous, kFlushWindow,
                   SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER,
                   where);
        ::posix_fadvise(fd.get(), static_cast<off_t>(previous), static_cast<off_t>(kFlushWindow),
                        POSIX_FADV_DONTNEED);  // advice only: its failure changes nothing
      }
    };
    body(write);
    TS_CHECK(reserve_bytes == 0 || written == reserve_bytes, where, "expected ", reserve_bytes,
             " bytes (as reserved), the writer gave ", written);
    TS_CHECK(::fsync(fd.get()) == 0, where, "fsync of ", tmp, " failed: ", errno_str());
    TS_CHECK(fd.close() == 0, where, "close of ", tmp, " failed: ", errno_str());
    TS_CHECK(::rename(tmp.c_str(), path.c_str()) == 0, where, "rename from ", tmp,
             " failed: ", errno_str());
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  fsync_directory(dir.string());
}

void write_file_atomically(const std::string& path, const std::vector<std::string_view>& parts) {
  write_file_atomically(path, [&](const WriteBytes& write) {
    for (const std::string_view p : parts) write(p.data(), p.size());
  });
}

std::string read_whole_file(const std::string& path, std::string_view context,
                            std::string_view what) {
  std::error_code ec;
  TS_CHECK(!std::filesystem::is_directory(path, ec), "[", context, "] \"", path, "\": expected ",
           what, ", found a directory");
  std::ifstream in(path, std::ios::binary);
  TS_CHECK(in.good(), "[", context, "] cannot open \"", path, "\": ", std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  TS_CHECK(!in.bad(), "[", context, "] cannot read \"", path, "\": ", std::strerror(errno));
  return text.str();
}

}  // namespace tessera
