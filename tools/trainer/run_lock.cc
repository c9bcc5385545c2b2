#include "tools/trainer/run_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>

#include "core/error.h"

namespace tessera::train {
namespace {

int open_lock_file(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  TS_CHECK(!ec, "[train] expected a run directory that can be created, found ", dir, " (",
           ec.message(), ")");
  const std::string path = dir + "/.lock";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  TS_CHECK(fd >= 0, "[train] cannot open the run lock ", path, ": ", std::strerror(errno));
  return fd;
}

// The pid the holder wrote, or "?" when the file is empty or unreadable.
std::string holder_of(int fd) {
  char buf[32] = {};
  const ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
  std::string pid = n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
  while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
  return pid.empty() ? "?" : pid;
}

}  // namespace

RunLock::RunLock(const std::string& dir) : dir_(dir), fd_(open_lock_file(dir)) {
  if (::flock(fd_.get(), LOCK_EX | LOCK_NB) != 0) {
    TS_CHECK(errno == EWOULDBLOCK, "[train] cannot lock ", dir, "/.lock: ", std::strerror(errno));
    TS_FAIL("[train] ", dir, " is in use by process ", holder_of(fd_.get()), " (it holds ", dir,
            "/.lock); expected one trainer per run directory");
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  TS_CHECK(::ftruncate(fd_.get(), 0) == 0 &&
               ::pwrite(fd_.get(), pid.data(), pid.size(), 0) == static_cast<ssize_t>(pid.size()),
           "[train] cannot write the run lock ", dir, "/.lock: ", std::strerror(errno));
}

}  // namespace tessera::train
