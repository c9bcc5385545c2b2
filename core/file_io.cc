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
                           const std::function<void(const WriteBytes& write)>& body) {
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
    const WriteBytes write = [&](const void* bytes, size_t n) {
      const char* p = static_cast<const char*>(bytes);
      while (n > 0) {
        const ssize_t put = ::write(fd.get(), p, std::min<size_t>(n, size_t{1} << 30));
        if (put < 0 && errno == EINTR) continue;
        TS_CHECK(put > 0, where, "write to ", tmp, " failed: ", errno_str());
        p += put;
        n -= static_cast<size_t>(put);
      }
    };
    body(write);
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
