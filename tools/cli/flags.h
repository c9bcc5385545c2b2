// Command-line flags for the tools: "--name VALUE", "--name=VALUE" and switches "--name".
//
//   Flags f(argc, argv, {{"config", Flag::kValue}, {"resume", Flag::kSwitch}});
//   if (f.has("help")) ...;            // --help / -h is always accepted
//   std::string path = f.required("config");
//
// Unknown flags, a missing value, a repeated flag or a stray argument throw UsageError, one
// line naming the flag; tools print it with their usage and exit with code 2.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace tessera::cli {

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Flag {
  enum Kind { kValue, kSwitch };
  std::string name;  // without the leading "--"
  Kind kind;
};

class Flags {
 public:
  Flags(int argc, char** argv, const std::vector<Flag>& known);

  bool has(const std::string& name) const { return values_.count(name) > 0; }
  std::optional<std::string> get(const std::string& name) const;
  std::string get(const std::string& name, const std::string& fallback) const;
  // Throws UsageError "--name is required" when absent.
  std::string required(const std::string& name) const;
  // Parsed numbers; the whole value must be a number ("--top-k expected an integer, found
  // \"ten\"").
  int64_t get_int(const std::string& name, int64_t fallback) const;
  // Comma-separated integers ("1,2,4"); `fallback` is parsed the same way when absent.
  // Throws UsageError "--worlds expected integers separated by commas, found \"1,x\"".
  std::vector<int64_t> get_int_list(const std::string& name, const std::string& fallback) const;
  double get_double(const std::string& name, double fallback) const;

 private:
  std::map<std::string, std::string> values_;
};

// `bazel run` starts binaries in their runfiles tree: moves to the directory the command
// was started from ($BUILD_WORKING_DIRECTORY), so relative paths resolve as the user typed
// them. Does nothing outside `bazel run`.
void enter_working_directory();

// The exit code of a tool that needed a CUDA device and found none usable (NoDeviceError), so
// scripts (tools/gpu/run.sh) tell "no GPU here" from a failure (1) and bad usage (2).
inline constexpr int kExitNoDevice = 3;

// Runs `body` the way every tool's main does: UsageError -> the message and `usage` on
// stderr, exit code 2; NoDeviceError -> its message, kExitNoDevice; any other exception ->
// its one-line message, exit code 1.
int run_tool(const char* tool, const char* usage, int (*body)(int argc, char** argv), int argc,
             char** argv);

}  // namespace tessera::cli
