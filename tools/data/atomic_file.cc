#include "tools/data/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace tessera::data {
namespace {

// Closes and removes the temporary file unless committed.
class TempFile {
 public:
  explicit TempFile(std::string name) : name_(std::move(name)) {}
  ~TempFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(name_.c_str());
  }
  int& fd() { return fd_; }
  const std::string& name() const { return name_; }
  void commit() { committed_ = true; }

 private:
  std::string name_;
  int fd_ = -1;
  bool committed_ = false;
};

[[noreturn]] void fail(const std::string& what, const std::string& path) {
  TS_FAIL("[file] ", what, " \"", path, "\" failed: ", std::strerror(errno));
}

}  // namespace

void write_file_atomically(const std::string& path, const std::vector<std::string_view>& parts) {
  // open(O_EXCL) with mode 0666 rather than mkstemp, whose 0600 would need a umask dance.
  static std::atomic<uint64_t> counter{0};
  int fd = -1;
  std::string name;
  for (int attempt = 0; fd < 0; ++attempt) {
    name = str_cat(path, ".tmp.", ::getpid(), ".", counter.fetch_add(1));
    fd = ::open(name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && (errno != EEXIST || attempt == 100)) fail("creating", name);
  }
  TempFile tmp(name);
  tmp.fd() = fd;
  for (std::string_view part : parts) {
    const char* p = part.data();
    size_t left = part.size();
    while (left > 0) {
      const ssize_t n = ::write(fd, p, left);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) fail("writing", tmp.name());
      p += n;
      left -= static_cast<size_t>(n);
    }
  }
  if (::fsync(fd) != 0) fail("fsync of", tmp.name());
  const int closed = ::close(fd);
  tmp.fd() = -1;
  if (closed != 0) fail("closing", tmp.name());
  if (::rename(tmp.name().c_str(), path.c_str()) != 0) fail("renaming a temporary file to", path);
  tmp.commit();
  // Make the rename itself durable.
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (dir_fd >= 0) {
    ::fsync(dir_fd);
    ::close(dir_fd);
  }
}

}  // namespace tessera::data
