#include "tools/data/shard.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "tests/test_files.h"
#include "tests/testing.h"

using Catch::Matchers::Contains;
using tessera::data::TokenShard;
using tessera::data::write_shard;
using tessera::testing::error_of;
using tessera::testing::fresh_dir;
using tessera::testing::read_bytes;
using tessera::testing::write_bytes;

namespace {

// Overwrites the int32 at `index` of the header of the shard at `path`.
void patch_header(const std::filesystem::path& path, int index, int32_t value) {
  std::string bytes = read_bytes(path);
  std::memcpy(bytes.data() + 4 * index, &value, 4);
  write_bytes(path, bytes);
}

}  // namespace

TEST_CASE("write_shard and TokenShard round-trip tokens in llm.c's layout", "[shard]") {
  const auto dir = fresh_dir("shard_round_trip");
  const std::string path = (dir / "train_000000.bin").string();
  const std::vector<uint16_t> tokens = {0, 1, 42, 50256, 65535, 7};
  write_shard(path, tokens);

  const std::string bytes = read_bytes(path);
  REQUIRE(bytes.size() == 1024 + 2 * tokens.size());
  int32_t header[3];
  std::memcpy(header, bytes.data(), sizeof(header));
  CHECK(header[0] == 20240520);
  CHECK(header[1] == 1);
  CHECK(header[2] == 6);
  for (size_t i = 3; i < 256; ++i) CHECK(bytes[4 * i] == 0);

  const TokenShard shard(path);
  CHECK(shard.path() == path);
  REQUIRE(shard.size() == 6);
  CHECK(std::vector<uint16_t>(shard.data(), shard.data() + shard.size()) == tokens);
  CHECK_NOTHROW(shard.validate_vocab(65536));
}

TEST_CASE("write_shard replaces a file atomically and leaves no temporary behind", "[shard]") {
  const auto dir = fresh_dir("shard_atomic");
  const std::string path = (dir / "s.bin").string();
  write_shard(path, {1, 2, 3});
  write_shard(path, {});  // an empty shard is valid: just the header
  CHECK(TokenShard(path).size() == 0);
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    CHECK(entry.path().filename() == "s.bin");
    ++files;
  }
  CHECK(files == 1);
  CHECK_THAT(error_of([&] { write_shard((dir / "missing" / "s.bin").string(), {1}); }),
             Contains("cannot create a temporary file in"));
}

TEST_CASE("a moved TokenShard keeps the mapping", "[shard]") {
  const auto dir = fresh_dir("shard_move");
  const std::string path = (dir / "s.bin").string();
  write_shard(path, {5, 6, 7});
  TokenShard a(path);
  TokenShard b(std::move(a));
  CHECK(b.size() == 3);
  CHECK(b.data()[2] == 7);
  TokenShard c(path);
  c = std::move(b);
  CHECK(c.data()[0] == 5);
}

TEST_CASE("TokenShard names the file, the field, the expected and the found value", "[shard]") {
  const auto dir = fresh_dir("shard_errors");
  const auto path = dir / "bad.bin";
  const std::string p = path.string();

  write_shard(p, {1, 2, 3, 4, 5});
  patch_header(path, 0, 12345);
  CHECK(error_of([&] { TokenShard s(p); }) ==
        "[shard] \"" + p + "\": header[0] (magic) expected 20240520, found 12345");

  write_shard(p, {1, 2, 3, 4, 5});
  patch_header(path, 1, 2);
  CHECK(error_of([&] { TokenShard s(p); }) ==
        "[shard] \"" + p + "\": header[1] (version) expected 1, found 2");

  write_shard(p, {1, 2, 3, 4, 5});
  patch_header(path, 2, -1);
  CHECK_THAT(error_of([&] { TokenShard s(p); }),
             Contains(p) && Contains("header[2] (token count) expected >= 0, found -1"));

  write_shard(p, {1, 2, 3, 4, 5});
  std::string bytes = read_bytes(path);
  write_bytes(path, bytes.substr(0, bytes.size() - 1));
  CHECK(error_of([&] { TokenShard s(p); }) ==
        "[shard] \"" + p +
            "\": file size expected 1034 bytes (1024 + 2 * 5 tokens), found 1033 (truncated)");

  write_bytes(path, bytes + "xy");
  CHECK(error_of([&] { TokenShard s(p); }) ==
        "[shard] \"" + p +
            "\": file size expected 1034 bytes (1024 + 2 * 5 tokens), found 1036 (trailing bytes)");

  write_bytes(path, bytes.substr(0, 10));
  CHECK(error_of([&] { TokenShard s(p); }) ==
        "[shard] \"" + p + "\": expected at least the 1024-byte header, found a file of 10 bytes");

  CHECK_THAT(error_of([&] { TokenShard s((dir / "absent.bin").string()); }),
             Contains("cannot open") && Contains("absent.bin"));
}

TEST_CASE("validate_vocab names the first token outside the vocabulary", "[shard]") {
  const auto dir = fresh_dir("shard_vocab");
  const std::string p = (dir / "s.bin").string();
  write_shard(p, {1, 2, 70, 3, 99});
  const TokenShard shard(p);
  CHECK_NOTHROW(shard.validate_vocab(100));
  CHECK(error_of([&] { shard.validate_vocab(65); }) ==
        "[shard] \"" + p + "\": token 2 (byte offset 1028) expected < vocab size 65, found 70");
  CHECK_THAT(error_of([&] { shard.validate_vocab(99); }),
             Contains("token 4 (byte offset 1032) expected < vocab size 99, found 99"));
}
