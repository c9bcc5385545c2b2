// Decodes a TensorBoard event file with the independent reader read_tfevents.py (Debian's
// python3-protobuf and its own CRC-32C), for the tests of Tessera's writer.
#pragma once

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"

namespace tessera::testing {

// One JSON object per record value (read_tfevents.py's output); throws with the reader's
// error when it rejects the file.
inline std::vector<nlohmann::json> read_tfevents(const std::string& path) {
  const std::string command =
      "/usr/bin/python3 tests/tools/trainer/read_tfevents.py '" + path + "' 2>&1";
  FILE* pipe = ::popen(command.c_str(), "r");
  TS_CHECK(pipe != nullptr, "cannot run ", command);
  std::string output;
  char buf[4096];
  while (const size_t n = std::fread(buf, 1, sizeof(buf), pipe)) output.append(buf, n);
  const int status = ::pclose(pipe);
  TS_CHECK(status == 0, "read_tfevents.py ", path, " failed (python3-protobuf is installed by ",
           "tools/setup.sh): ", output);
  std::vector<nlohmann::json> records;
  size_t start = 0;
  while (start < output.size()) {
    const size_t end = output.find('\n', start);
    records.push_back(nlohmann::json::parse(output.substr(start, end - start)));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return records;
}

}  // namespace tessera::testing
