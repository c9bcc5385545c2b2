// The Tiny Shakespeare shards that tools/setup.sh prepared, as a test's runfile
// (//:shakespeare_char).
#pragma once

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>

namespace tessera::testing {

// The directory with train_000000.bin, val_000000.bin and tokenizer.json.
inline std::filesystem::path shakespeare_dir() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  REQUIRE(srcdir != nullptr);
  const std::filesystem::path dir = std::filesystem::path(srcdir) /
                                    (workspace ? workspace : "tessera") / ".data" /
                                    "shakespeare_char";
  INFO("run tools/setup.sh first: it prepares .data/shakespeare_char");
  REQUIRE(std::filesystem::exists(dir / "train_000000.bin"));
  return dir;
}

// The run config's "data" section over those shards: train and val, random windows.
inline nlohmann::json shakespeare_data_section() {
  const std::filesystem::path data = shakespeare_dir();
  return {{"train", (data / "train_*.bin").string()},
          {"val", (data / "val_*.bin").string()},
          {"sampling", "random"}};
}

}  // namespace tessera::testing
