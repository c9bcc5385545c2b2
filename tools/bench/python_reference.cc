#include "tools/bench/python_reference.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <vector>

namespace tessera::bench {

namespace fs = std::filesystem;

std::string find_script(const std::optional<std::string>& flag, const char* argv0,
                        const std::string& name) {
  if (flag) return *flag;
  const std::string rel = "tools/bench/" + name;
  std::vector<fs::path> candidates{fs::path(argv0).parent_path() / name};
  if (const char* ws = std::getenv("BUILD_WORKSPACE_DIRECTORY")) {
    candidates.push_back(fs::path(ws) / rel);
  }
  if (const char* rf = std::getenv("RUNFILES_DIR")) {
    candidates.push_back(fs::path(rf) / "tessera" / rel);
  }
  candidates.push_back(fs::path(std::string(argv0) + ".runfiles") / "tessera" / rel);
  candidates.push_back(fs::path(rel));
  for (const fs::path& p : candidates) {
    if (fs::exists(p)) return p.string();
  }
  return rel;
}

ScriptResult run_script(const std::string& python, const std::string& script,
                        const std::string& args, const char* key) {
  if (!fs::exists(script)) return {std::nullopt, "no script at " + script};
  const std::string cmd = "'" + python + "' '" + script + "' " + args + " 2>&1";
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (pipe == nullptr) return {std::nullopt, "cannot start " + python};
  std::string out;
  std::array<char, 4096> buf{};
  while (std::fgets(buf.data(), static_cast<int>(buf.size()), pipe) != nullptr) out += buf.data();
  const int status = ::pclose(pipe);
  std::optional<nlohmann::json> parsed;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line[0] != '{') continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains(key)) parsed = std::move(j);
  }
  if (status != 0 || !parsed) {
    std::string tail = out.size() > 600 ? out.substr(out.size() - 600) : out;
    std::replace(tail.begin(), tail.end(), '\n', ' ');
    return {std::nullopt, python + " " + script + " exited with status " + std::to_string(status) +
                              ": " + (tail.empty() ? "(no output)" : tail)};
  }
  return {parsed, ""};
}

double json_number(const std::optional<nlohmann::json>& json, const char* key) {
  if (!json || !json->contains(key) || !(*json)[key].is_number()) return std::nan("");
  return (*json)[key].get<double>();
}

}  // namespace tessera::bench
