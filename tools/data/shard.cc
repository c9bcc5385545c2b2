#include "tools/data/shard.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <string_view>
#include <utility>

#include "core/error.h"
#include "core/file_io.h"

namespace tessera::data {

// The format is little-endian and we read it in place.
static_assert(std::endian::native == std::endian::little, "token shards assume little-endian");

void write_shard(const std::string& path, const std::vector<uint16_t>& tokens) {
  TS_CHECK(tokens.size() <= static_cast<size_t>(std::numeric_limits<int32_t>::max()), "[shard] \"",
           path, "\": a shard holds at most 2147483647 tokens, found ", tokens.size());
  int32_t header[kShardHeaderInts] = {};
  header[0] = kShardMagic;
  header[1] = kShardVersion;
  header[2] = static_cast<int32_t>(tokens.size());
  write_file_atomically(path,
                        {std::string_view(reinterpret_cast<const char*>(header), sizeof(header)),
                         std::string_view(reinterpret_cast<const char*>(tokens.data()),
                                          tokens.size() * sizeof(uint16_t))});
}

TokenShard::TokenShard(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  TS_CHECK(fd >= 0, "[shard] cannot open \"", path, "\": ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    TS_FAIL("[shard] cannot stat \"", path, "\": ", std::strerror(err));
  }
  const int64_t file_bytes = st.st_size;
  if (file_bytes < kShardHeaderBytes) {
    ::close(fd);
    TS_FAIL("[shard] \"", path, "\": expected at least the ", kShardHeaderBytes,
            "-byte header, found a file of ", file_bytes, " bytes");
  }
  map_ = ::mmap(nullptr, static_cast<size_t>(file_bytes), PROT_READ, MAP_PRIVATE, fd, 0);
  const int err = errno;
  ::close(fd);  // the mapping keeps the file
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    TS_FAIL("[shard] cannot map \"", path, "\": ", std::strerror(err));
  }
  map_bytes_ = static_cast<size_t>(file_bytes);
  try {
    const auto* header = static_cast<const int32_t*>(map_);
    TS_CHECK(header[0] == kShardMagic, "[shard] \"", path, "\": header[0] (magic) expected ",
             kShardMagic, ", found ", header[0]);
    TS_CHECK(header[1] == kShardVersion, "[shard] \"", path, "\": header[1] (version) expected ",
             kShardVersion, ", found ", header[1]);
    TS_CHECK(header[2] >= 0, "[shard] \"", path,
             "\": header[2] (token count) expected >= 0, found ", header[2]);
    const int64_t ntok = header[2];
    const int64_t want = kShardHeaderBytes + 2 * ntok;
    TS_CHECK(file_bytes == want, "[shard] \"", path, "\": file size expected ", want,
             " bytes (1024 + 2 * ", ntok, " tokens), found ", file_bytes, " (",
             file_bytes < want ? "truncated" : "trailing bytes", ")");
    size_ = ntok;
    tokens_ = reinterpret_cast<const uint16_t*>(static_cast<const char*>(map_) + kShardHeaderBytes);
  } catch (...) {
    release();
    throw;
  }
}

TokenShard::~TokenShard() { release(); }

TokenShard::TokenShard(TokenShard&& other) noexcept
    : path_(std::move(other.path_)),
      map_(std::exchange(other.map_, nullptr)),
      map_bytes_(std::exchange(other.map_bytes_, 0)),
      tokens_(std::exchange(other.tokens_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

TokenShard& TokenShard::operator=(TokenShard&& other) noexcept {
  if (this != &other) {
    release();
    path_ = std::move(other.path_);
    map_ = std::exchange(other.map_, nullptr);
    map_bytes_ = std::exchange(other.map_bytes_, 0);
    tokens_ = std::exchange(other.tokens_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void TokenShard::release() {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
  map_ = nullptr;
  map_bytes_ = 0;
  tokens_ = nullptr;
  size_ = 0;
}

void TokenShard::validate_vocab(int64_t vocab) const {
  for (int64_t i = 0; i < size_; ++i) {
    TS_CHECK(tokens_[i] < vocab, "[shard] \"", path_, "\": token ", i, " (byte offset ",
             kShardHeaderBytes + 2 * i, ") expected < vocab size ", vocab, ", found ", tokens_[i]);
  }
}

}  // namespace tessera::data
