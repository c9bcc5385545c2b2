// Token shards in llm.c's binary format (write_datafile in llm.c's dev/data/data_common.py).
//
// A shard is a header of 256 little-endian int32 -- [0] = 20240520 (magic), [1] = 1
// (version), [2] = ntok -- followed by ntok uint16 token ids; the file is exactly
// 1024 + 2 * ntok bytes. tools/prepare_data writes them; DataLoader (loader.h) reads them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tessera::data {

inline constexpr int32_t kShardMagic = 20240520;
inline constexpr int32_t kShardVersion = 1;
inline constexpr int64_t kShardHeaderInts = 256;
inline constexpr int64_t kShardHeaderBytes = kShardHeaderInts * 4;

// Writes `tokens` as a shard at `path`, atomically: the bytes go to a temporary file in the
// same directory, which is fsync'ed and then renamed over `path`, so a reader never sees a
// partial shard. Throws when the file cannot be written or holds more than 2^31 - 1 tokens.
void write_shard(const std::string& path, const std::vector<uint16_t>& tokens);

// A shard mapped read-only into memory and validated against the format: magic, version,
// and a file size that matches the token count (truncated and trailing bytes are errors).
// Every error names the file, the field, the expected and the found value. Movable, not
// copyable; the mapping lives as long as the object.
class TokenShard {
 public:
  // Opens and validates the shard at `path`.
  explicit TokenShard(const std::string& path);
  ~TokenShard();
  TokenShard(TokenShard&& other) noexcept;
  TokenShard& operator=(TokenShard&& other) noexcept;
  TokenShard(const TokenShard&) = delete;
  TokenShard& operator=(const TokenShard&) = delete;

  // Throws for the first token id >= `vocab`, naming the file, the token index i and its
  // byte offset 1024 + 2 * i.
  void validate_vocab(int64_t vocab) const;

  // The number of tokens.
  int64_t size() const { return size_; }
  // The tokens (size() of them).
  const uint16_t* data() const { return tokens_; }
  // The file this shard was read from.
  const std::string& path() const { return path_; }

 private:
  void release();

  std::string path_;
  void* map_ = nullptr;  // the whole file (header included); nullptr once moved from
  size_t map_bytes_ = 0;
  const uint16_t* tokens_ = nullptr;
  int64_t size_ = 0;
};

}  // namespace tessera::data
