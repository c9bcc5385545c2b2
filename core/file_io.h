// Durable file writing (readers see either the old file or the complete new one), and
// reading a whole file with one-line errors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace tessera {

// Appends `nbytes` at `data` to the file being written.
using WriteBytes = std::function<void(const void* data, size_t nbytes)>;

// Writes a file atomically: `body` receives a function that appends bytes to a temporary
// file in the same directory as `path` (".<name>.tmp.XXXXXX"); the file is then fsync'ed,
// renamed over `path`, and the directory fsync'ed. Its pages are written back as it grows
// (Note [Bounded write-back] in file_io.cc), so a large file holds little memory. On any error
// (including one thrown by `body`) the temporary file is removed, `path` is untouched, and
// tessera::Error names the path and the failing call.
// With `reserve_bytes` (the size the body must write, exactly), the disk space is reserved
// first (fallocate), so that a disk too small fails at once, naming the path and the
// reason, rather than after most of the file is written.
void write_file_atomically(const std::string& path,
                           const std::function<void(const WriteBytes& write)>& body,
                           uint64_t reserve_bytes = 0);
// The same for a file made of `parts`, concatenated.
void write_file_atomically(const std::string& path, const std::vector<std::string_view>& parts);

// Owns a POSIX file descriptor (closed on destruction; -1 means none).
class UniqueFd {
 public:
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd();
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  int get() const { return fd_; }
  // Closes now and returns close()'s result: errors of delayed writes show up here.
  int close();

 private:
  int fd_;
};

// fsync()s a directory, making renames and creations inside it durable.
void fsync_directory(const std::string& dir);

// The whole content of the file at `path`. Errors start with "[<context>]": a directory is
// "expected <what>, found a directory", and a file that cannot be opened or read names the
// system's reason.
std::string read_whole_file(const std::string& path, std::string_view context,
                            std::string_view what);

}  // namespace tessera
