// Files for tests: a fresh directory per test, and raw reads and writes.
#pragma once

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>

namespace tessera::testing {

// `name` under the test's temporary directory ($TEST_TMPDIR under Bazel).
inline std::filesystem::path temp_path(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::filesystem::path root =
      tmp != nullptr ? std::filesystem::path(tmp) : std::filesystem::temp_directory_path();
  return root / name;
}

// An empty directory temp_path(name), emptied first when it exists.
inline std::filesystem::path fresh_dir(const std::string& name) {
  const std::filesystem::path dir = temp_path(name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

inline void write_bytes(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}

inline std::string read_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.good());
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace tessera::testing
